"""Every dashboard query and every rule expression returns data from a real Prometheus.

A real Prometheus scrapes real exporters: two engine simulators (`poolpilot engine-sim`, a
prefill and a decode), the router (`poolpilot router`) in front of them with streaming
requests flowing, and the autoscaler (`poolpilot autoscaler` against the Kubernetes API
emulator). Targets carry namespace/pool/role as the chart's relabelling gives them. Each
panel query (template variables substituted as Grafana would), each variable query, each
annotation and each recording rule and alert input must return at least one series with a
number: no panel that can never show data. The rule file itself is loaded into Prometheus
and every rule must evaluate healthily.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from poolpilot.dashboards import grafana, rules
from poolpilot.testkit.polling import wait_for
from poolpilot.testkit.prometheus import PrometheusProcess, Target

from poolpilot import metrics as m

pytestmark = pytest.mark.adapter

NS, POOL = "llm", "demo"
SCRAPE = 0.5
WINDOW = "5s"  # $__rate_interval and the rules' windows: 10 scrapes
PARAMS = rules.RuleParams(rate_window=WINDOW, fast_short=WINDOW, fast_long="10s",
                          slow_short=WINDOW, slow_long="15s")
POOLPILOT = [sys.executable, "-m", "poolpilot.cli"]
SOURCES = ("engine", "router", "autoscaler")


# --- the catalogue of queries ---------------------------------------------------------------


@dataclass(frozen=True)
class Q:
    id: str
    expr: str
    # An annotation: Grafana runs it as a range query over the dashboard's time, so a scale
    # event shows wherever it happened, not only while it is within the last minute.
    ranged: bool = False

    @property
    def source(self) -> str:
        """Which exporter the query needs (to report what was not exercised)."""
        if "poolpilot_autoscaler" in self.expr:
            return "autoscaler"
        if "poolpilot_operator" in self.expr:
            return "operator"
        if m.ENGINE_COLD_START in self.expr:
            return "launcher"
        if "vllm" in self.expr:
            return "engine"
        if "poolpilot_router" in self.expr:
            return "router"
        return "engine"  # `up` of the pool's targets


def substitute(expr: str) -> str:
    """What Grafana sends for namespace=NS, pool=POOL and a 5s rate interval."""
    return (expr.replace("$namespace", NS).replace("$pool", POOL)
            .replace("$__rate_interval", WINDOW).replace("$__interval", WINDOW))


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def dashboard_queries() -> list[Q]:
    out = []
    for name, build in grafana.DASHBOARDS.items():
        d = build()
        for panel in d["panels"]:
            for t in panel.get("targets", []):
                out.append(Q(f"{name}/{_slug(panel['title'])}/{t['refId']}",
                             substitute(t["expr"])))
        for a in d["annotations"]["list"]:
            if "expr" in a:
                # Shows only when a scale happened; its inputs must exist.
                assert a["expr"] == grafana.SCALE_EVENTS
                for i, expr in enumerate(grafana.SCALE_EVENTS_INPUTS):
                    out.append(Q(f"{name}/annotation/{_slug(a['name'])}/input{i}",
                                 substitute(expr), ranged=True))
    return out


def rule_queries() -> list[Q]:
    out = []
    groups = rules.rule_groups(PARAMS)["groups"]
    for rule in groups[0]["rules"]:
        quantile = rule.get("labels", {}).get("quantile", "")
        out.append(Q(f"record/{rule['record']}/{quantile}".rstrip("/"),
                     rule["expr"]))
    for alert in [*rules.alerts(PARAMS), *rules.autoscaler_alerts(PARAMS)]:
        for i, expr in enumerate(alert.inputs):
            out.append(Q(f"alert/{alert.name}/input{i}", expr))
    return out


def variable_queries() -> list[tuple[str, str, str]]:
    """(id, label, match[] selector) of every `label_values(selector, label)` variable."""
    out = []
    for name, build in grafana.DASHBOARDS.items():
        for v in build()["templating"]["list"]:
            if v["type"] == "query":
                match = re.fullmatch(r"label_values\((.*), (\w+)\)", v["query"]["query"])
                assert match, v["query"]
                out.append((f"{name}/${v['name']}", match.group(2), substitute(match.group(1))))
    return out


QUERIES = dashboard_queries() + rule_queries()


# --- processes ---------------------------------------------------------------------------------


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[str]
    url: str = ""
    lines: list[str] = field(default_factory=list)

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()


def start(name: str, cmd: list[str], url_pattern: str, timeout: float = 60.0) -> Proc:
    """Start a command and wait for the line announcing its URL (a readiness signal, not a
    sleep)."""
    popen = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env={**os.environ, "PYTHONUNBUFFERED": "1"},
                             start_new_session=True)
    proc = Proc(name, popen)
    found = threading.Event()

    def pump() -> None:
        assert popen.stdout is not None
        for line in popen.stdout:
            proc.lines.append(line)
            if not found.is_set() and (match := re.search(url_pattern, line)):
                proc.url = match.group(1)
                found.set()

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + timeout
    while not found.wait(0.1):
        if popen.poll() is not None or time.monotonic() > deadline:
            proc.stop()
            raise RuntimeError(f"{name} did not start:\n{''.join(proc.lines[-30:])}")
    return proc


def available(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


# --- the stack ---------------------------------------------------------------------------------


@dataclass
class Stack:
    prom: PrometheusProcess
    missing: dict[str, str]  # source -> why it is not running
    started: float  # unix time before the first process started

    def query(self, expr: str) -> list[dict[str, Any]]:
        return self._result("/api/v1/query", query=expr)

    def query_range(self, expr: str) -> list[dict[str, Any]]:
        """`expr` over the stack's whole life, every second (as Grafana runs an annotation
        over the dashboard's time range); each series' `values` are [time, value] pairs."""
        return self._result("/api/v1/query_range", query=expr, start=f"{self.started:.3f}",
                            end=f"{time.time():.3f}", step="1")

    def _result(self, path: str, **params: str) -> list[dict[str, Any]]:
        url = f"{self.prom.url}{path}?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                body = json.load(r)
        except urllib.error.HTTPError as exc:  # 400/422 carry Prometheus' reason
            body = json.load(exc)
        assert body["status"] == "success", (params, body)
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def get(self, path: str, **params: str) -> Any:
        url = f"{self.prom.url}{path}?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=10) as r:
            return json.load(r)["data"]


def _drive(router_url: str, stop: threading.Event, counts: dict[str, int]) -> None:
    """Streaming chat requests through the router, one after another, until stopped."""
    prompt = " ".join(f"word{i}" for i in range(300))
    with httpx.Client(base_url=router_url, timeout=30) as client:
        while not stop.is_set():
            body = {"model": "sim", "stream": True, "max_tokens": 16, "ignore_eos": True,
                    "messages": [{"role": "user", "content": prompt}]}
            try:
                with client.stream("POST", "/v1/chat/completions", json=body) as r:
                    for _ in r.iter_lines():
                        pass
                    counts[str(r.status_code)] = counts.get(str(r.status_code), 0) + 1
            except httpx.HTTPError as exc:
                counts[type(exc).__name__] = counts.get(type(exc).__name__, 0) + 1


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("dashprom")
    started = time.time()
    procs: list[Proc] = []
    # The launcher measures a real vLLM's start: test_vllm_cold_start.py runs those panels'
    # queries on a real Prometheus scraping it.
    missing: dict[str, str] = {"launcher": "the cold-start phases come from the launcher in "
                               "front of real vLLM (tests/adapter/test_vllm_cold_start.py)"}
    targets: list[Target] = []
    stop = threading.Event()
    prom: PrometheusProcess | None = None
    try:
        engines: dict[str, Proc] = {}
        if available("poolpilot.engine_sim.server"):
            for role in ("prefill", "decode"):
                engines[role] = start(f"engine-{role}", [
                    *POOLPILOT, "engine-sim", "--host", "127.0.0.1", "--port", "0",
                    "--role", role, "--served-name", "sim",
                    # the prefill engine keeps a CPU offload tier (its hit-rate panel's series)
                    *(("--kv-offloading-size", "1") if role == "prefill" else ())],
                    r"listening on (http://127\.0\.0\.1:\d+)")
                procs.append(engines[role])
                targets.append(Target(engines[role].url.removeprefix("http://"),
                                      {"namespace": NS, "pool": POOL, "role": role}))
        else:
            missing["engine"] = "poolpilot engine-sim is not built yet"
        router: Proc | None = None
        if engines and available("poolpilot.router.main"):
            router = start("router", [
                *POOLPILOT, "router", "--host", "127.0.0.1", "--port", "0", "--pool", POOL,
                "--prefill", engines["prefill"].url, "--decode", engines["decode"].url,
            ], r"listening on (http://127\.0\.0\.1:\d+)")
            procs.append(router)
            targets.append(Target(router.url.removeprefix("http://"),
                                  {"namespace": NS, "pool": POOL, "role": "router"}))
        else:
            missing["router"] = "poolpilot router (or the engines it needs) is not available"
        rule_file = tmp / "rules.yaml"
        rule_file.write_text(rules.to_yaml(rules.rule_groups(PARAMS)))
        prom = PrometheusProcess(scrape_interval=SCRAPE, rule_files=[rule_file]).start(targets)
        if available("poolpilot.autoscaler.main") and available("poolpilot.emulator.server"):
            scaler, kubeconfig = _start_autoscaler(tmp, procs, prom.url)
            # No target labels: its series carry the pool's namespace/pool/role themselves
            # (the chart's ServiceMonitor sets honorLabels for the same reason).
            targets.append(Target(scaler))
            # The operator reconciles the same pool (its children are already there, so it
            # writes little); the drift timer reconciles it every second.
            targets.append(Target(_start_operator(kubeconfig, procs)))
            prom.set_targets(targets)
        else:
            missing["autoscaler"] = "poolpilot autoscaler is not built yet"
            missing["operator"] = "the operator needs the Kubernetes API emulator"
        counts: dict[str, int] = {}
        if router is not None:
            threading.Thread(target=_drive, args=(router.url, stop, counts), daemon=True).start()
            wait_for(lambda: counts.get("200", 0) >= 3, 60, f"requests to succeed: {counts}")
        yield Stack(prom, missing, started)
    finally:
        stop.set()
        if prom is not None:
            prom.stop()
        for p in reversed(procs):
            p.stop()


ROOT = Path(__file__).resolve().parents[2]


def _kubectl(kubeconfig: Path, *args: str, stdin: str | None = None) -> str:
    from shutil import which

    binary = which("kubectl") or which("kubectl", path=str(ROOT / ".cache" / "bin"))
    if binary is None:
        raise RuntimeError("kubectl is not installed; run ./dev setup")
    proc = subprocess.run([binary, "--kubeconfig", str(kubeconfig), *args], input=stdin,
                          capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)}: {proc.stderr}")
    return proc.stdout


UNSCHEDULABLE_POD = f"""
apiVersion: v1
kind: Pod
metadata:
  name: {POOL}-prefill-pending
  namespace: {NS}
  labels: {{app.kubernetes.io/managed-by: poolpilot, poolpilot.dev/pool: {POOL},
           poolpilot.dev/role: prefill}}
spec:
  containers: [{{name: engine, image: engine}}]
"""
UNSCHEDULABLE_STATUS = json.dumps({"status": {"phase": "Pending", "conditions": [{
    "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
    "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."}]}})


def _start_operator(kubeconfig: Path, procs: list[Proc]) -> str:
    operator = start("operator", [
        *POOLPILOT, "operator", "--kubeconfig", str(kubeconfig), "--standalone",
        "-n", NS, "--drift-interval", "1", "--liveness", "",
        "--metrics-host", "127.0.0.1", "--metrics-port", "0",
    ], r"operator metrics on (http://127\.0\.0\.1:\d+)")
    procs.append(operator)
    return operator.url.removeprefix("http://")


def _start_autoscaler(tmp: Path, procs: list[Proc], prometheus_url: str) -> tuple[str, Path]:
    """The emulated cluster holds the pool and its Deployments as the operator would leave
    them, in a state that makes the autoscaler use every series the dashboards show: decode
    over-provisioned for the light load (a scale-down: direction, annotation), prefill with a
    pod that cannot be scheduled (ScalingLimited)."""
    kubeconfig = tmp / "kubeconfig"
    procs.append(start("emulator", [*POOLPILOT, "emulator", "--host", "127.0.0.1", "--port",
                                    "0", "--write-kubeconfig", str(kubeconfig)],
                       r"(http://127\.0\.0\.1:\d+)"))
    pool = yaml.safe_load((ROOT / "examples" / "sandbox-pool.yaml").read_text())
    pool["metadata"] = {"name": POOL, "namespace": NS}
    pool["spec"]["prefill"]["replicas"] = 2
    pool["spec"]["decode"]["replicas"] = 3
    # Scale-downs at once; decode sized by its sequences (no decode profile), so the light
    # load over-provisions it. A known prefill capacity: the capacity model sizes prefill,
    # and its demand signals (PromptTokensDemand/Ahead) fill the token-throughput panel.
    pool["spec"]["autoscaling"].update(
        scaleDown={"stabilizationWindowSeconds": 0, "maxStep": 1, "cooldownSeconds": 0},
        targets={"prefillQueuePerReplica": 2, "decodeSequencesPerReplica": 2,
                 "prefillTokensPerSecondPerReplica": 5000})
    (tmp / "pool.yaml").write_text(yaml.safe_dump(pool))
    _kubectl(kubeconfig, "apply", "-f", str(ROOT / "crds" / "inferencepool.yaml"))
    _kubectl(kubeconfig, "apply", "-f", str(tmp / "pool.yaml"))
    children = subprocess.run([*POOLPILOT, "render", "--no-rbac", str(tmp / "pool.yaml")],
                              capture_output=True, text=True, timeout=60, check=True).stdout
    _kubectl(kubeconfig, "apply", "-f", "-", stdin=children)
    # The router serves (else the autoscaler holds every role: NoReadyReplicas).
    for role, replicas, ready in (("prefill", 2, 1), ("decode", 3, 3), ("router", 1, 1)):
        _kubectl(kubeconfig, "scale", "deployment", f"{POOL}-{role}", "-n", NS,
                 f"--replicas={replicas}")
        _kubectl(kubeconfig, "patch", "deployment", f"{POOL}-{role}", "-n", NS,
                 "--subresource=status", "--type=merge", "-p",
                 json.dumps({"status": {"replicas": replicas, "readyReplicas": ready}}))
    _kubectl(kubeconfig, "apply", "-f", "-", stdin=UNSCHEDULABLE_POD)
    _kubectl(kubeconfig, "patch", "pod", f"{POOL}-prefill-pending", "-n", NS,
             "--subresource=status", "--type=merge", "-p", UNSCHEDULABLE_STATUS)
    scaler = start("autoscaler", [
        *POOLPILOT, "autoscaler", "--prometheus", prometheus_url, "--all-namespaces",
        "--kubeconfig", str(kubeconfig), "--interval", "1", "--rate-window", "5",
        "--metrics-host", "127.0.0.1", "--metrics-port", "0",
    ], r"metrics on (http://127\.0\.0\.1:\d+)")
    procs.append(scaler)
    return scaler.url.removeprefix("http://"), kubeconfig


def _has_number(result: list[dict[str, Any]]) -> bool:
    samples = [v for r in result for v in (r["values"] if "values" in r else [r["value"]])]
    return any(math.isfinite(float(v[1])) for v in samples)


@pytest.mark.parametrize("q", QUERIES, ids=[q.id for q in QUERIES])
def test_query_returns_data(q: Q, stack: Stack) -> None:
    if q.source in stack.missing:
        pytest.skip(f"not exercised: {stack.missing[q.source]}")
    result: list[dict[str, Any]] = []

    def ok() -> bool:
        nonlocal result
        result = stack.query_range(q.expr) if q.ranged else stack.query(q.expr)
        return _has_number(result)

    try:
        wait_for(ok, 30, q.id)
    except AssertionError:  # wait_for's timeout
        pytest.fail(f"{q.id}: no series with a number for\n{q.expr}\ngot {result}")


@pytest.mark.parametrize("var", variable_queries(), ids=[v[0] for v in variable_queries()])
def test_template_variable_lists_the_pool(var: tuple[str, str, str], stack: Stack) -> None:
    if "engine" in stack.missing:
        pytest.skip(f"not exercised: {stack.missing['engine']}")
    _, label, selector = var
    values = stack.get(f"/api/v1/label/{label}/values", **{"match[]": selector})
    assert {"namespace": NS, "pool": POOL}[label] in values


def test_rule_file_loads_and_every_rule_evaluates(stack: Stack) -> None:
    if "engine" in stack.missing:
        pytest.skip(f"not exercised: {stack.missing['engine']}")

    def healthy() -> bool:
        groups = stack.get("/api/v1/rules")["groups"]
        rules_ = [r for g in groups for r in g["rules"]]
        return (len(rules_) == sum(len(g["rules"]) for g in rules.rule_groups(PARAMS)["groups"])
                and all(r["health"] == "ok" for r in rules_))

    wait_for(healthy, 30, "every rule evaluated with health ok")
    wait_for(lambda: _has_number(stack.query('poolpilot:queue_depth{role="prefill"}')), 30,
               "a recorded series")


def test_a_misspelt_metric_shows_no_data(stack: Stack) -> None:
    """The check above can fail: a panel on a metric nobody exports returns nothing."""
    if "engine" in stack.missing:
        pytest.skip(f"not exercised: {stack.missing['engine']}")
    wait_for(lambda: _has_number(stack.query(substitute(QUERIES[0].expr))), 30, "data")
    assert stack.query('sum by (namespace, pool, role) ({__name__=~"vllm[:_]num_request_wait"})'
                       ) == []


def test_scale_events_show_as_annotations(stack: Stack) -> None:
    """The autoscaler scales the over-provisioned decode role down: the Pool dashboard's
    annotation query marks it."""
    if "autoscaler" in stack.missing or "engine" in stack.missing:
        pytest.skip("not exercised: needs the autoscaler and the engines")
    expr = substitute(grafana.SCALE_EVENTS)
    events = wait_for(lambda: [r["metric"] for r in stack.query_range(expr)
                               if r["metric"].get("role") == "decode"], 30,
                      f"a decode scale event from {expr}")
    # What the annotation shows: the role, the direction, the new size and the reason.
    assert all(e["direction"] == "down" and e["reason"] for e in events), events
    desired = stack.query_range(substitute(
        f'max by (namespace, pool, role) ({m.AUTOSCALER_DESIRED}{{role="decode"}})'))
    sizes = {v[1] for r in desired for v in r["values"]}
    assert {e["replicas"] for e in events} <= sizes, (events, sizes)

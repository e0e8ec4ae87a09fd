"""Real vLLM on CPU through the launcher, started twice on one compile cache as two replicas of
a role that share their cache volume: the phases of each start are on the engine's own
/metrics (what Prometheus scrapes), the annotation the autoscaler writes from them says the
same, and the second start found the compiled artifacts the first one left.

torch.compile is on here (no --enforce-eager): that is the work the cache is for. The phases
measured are printed (`-s`); docs/operator.md ("Cold-start phases") has them with the ratios.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from poolpilot.autoscaler.observe import PrometheusSource, cold_start_annotation
from poolpilot.autoscaler.queries import COMPILE_CACHE_PHASE
from poolpilot.dashboards import grafana
from poolpilot.runtime.launcher import vllm_cpu_env
from poolpilot.sandbox.tinymodel import ensure_tiny_model
from poolpilot.testkit.polling import wait_for
from poolpilot.testkit.prometheus import PrometheusProcess, Target, free_port
from prometheus_client.parser import text_string_to_metric_families
from router_support import (
    POOLPILOT,
    REPO,
    VLLM_PYTHON,
    Proc,
    spawn,
    vllm_available,
    wait_vllm_ready,
)

from poolpilot import metrics as m

pytestmark = [pytest.mark.vllm, pytest.mark.adapter,
              pytest.mark.skipif(not vllm_available(), reason="needs the vLLM-CPU venv "
                                 "(./dev setup-vllm)")]
SERVED = "tiny-llama"
# torch.compile on; POOLPILOT_COLD_START_EAGER=1: off (--enforce-eager, as this repository's
# other vLLM tests run), for the docs' compile-off rows.
EAGER = os.environ.get("POOLPILOT_COLD_START_EAGER") == "1"
ENGINE_ARGS = ("dtype=float32", "maxModelLen=512", *(("enforceEager=true",) if EAGER else ()))


def prometheus_available() -> bool:
    return shutil.which("prometheus") is not None


NS, POOL, ROLE, POD = "serving", "tiny", "decode", "tiny-decode-0"


@dataclass
class Start:
    phases: dict[str, float]
    cache_hit: float | None
    log: str
    waiting_series: bool  # vLLM's own series still on /metrics (after a request)
    completion: str | None
    # Through a real Prometheus scraping this engine (the second start only): the Pool
    # dashboard's cold-start panel, query by query, and the autoscaler's per-pod answer.
    panel: list[list[dict[str, Any]]] | None = None
    autoscaler: dict[str, dict[str, float]] | None = None


def through_prometheus(url: str) -> tuple[list[list[dict[str, Any]]], dict[str, dict[str, float]]]:
    """Scrape the engine with the labels the chart's relabelling gives a pod, then run the
    panel's queries (as Grafana sends them for this pool) and the autoscaler's."""
    panel = next(p for p in grafana.pool_dashboard()["panels"]
                 if p["title"].startswith("Cold-start phases"))
    exprs = [t["expr"].replace("$namespace", NS).replace("$pool", POOL)
             for t in panel["targets"]]
    labels = {"namespace": NS, "pool": POOL, "role": ROLE, "pod": POD}
    with PrometheusProcess(scrape_interval=1.0).start(
            [Target(url.removeprefix("http://"), labels)]) as prom:
        def answers() -> list[list[dict[str, Any]]] | None:
            out = [httpx.get(prom.url + "/api/v1/query", params={"query": e}, timeout=5)
                   .json()["data"]["result"] for e in exprs]
            return out if all(out) else None

        results = wait_for(answers, timeout=60, what="the panel's series in Prometheus")
        measured = PrometheusSource(prom.url).cold_starts(NS, POOL, ROLE)
    return results, measured


def scrape(url: str) -> tuple[dict[str, float], float | None]:
    phases: dict[str, float] = {}
    hit = None
    for family in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=5).text):
        for s in family.samples:
            if s.name == m.ENGINE_COLD_START:
                phases[s.labels["phase"]] = s.value
            elif s.name == m.ENGINE_COMPILE_CACHE_HIT:
                hit = s.value
    return phases, hit


def start(scratch: Path, cache: Path, side_channel: int, with_prometheus: bool = False
          ) -> Start:
    scratch.mkdir(parents=True)
    model = ensure_tiny_model(REPO / ".cache" / "tiny-llama")
    port = free_port()
    cmd = [POOLPILOT, "launch", "--python", str(VLLM_PYTHON), "--role", "aggregated",
           "--model", str(model), "--served-name", SERVED, "--host", "127.0.0.1",
           "--port", str(port)]
    for arg in ENGINE_ARGS:
        cmd += ["--engine-arg", arg]
    # The cache folders as the operator's engine pods have them, on one shared folder.
    # (vLLM keys its compile cache with its environment, VLLM_NIXL_SIDE_CHANNEL_PORT included:
    # a role's replicas share it, so the two starts do too)
    env = {**vllm_cpu_env(str(scratch), 0, side_channel, cache_root=str(cache / "vllm")),
           "XDG_CACHE_HOME": str(cache), "TORCHINDUCTOR_CACHE_DIR": str(cache / "torchinductor")}
    log = scratch / "vllm.log"
    proc = Proc(spawn(cmd, env=env, cwd=scratch, log=log), port, f"aggregated:{log}")
    try:
        wait_vllm_ready(proc, timeout=400)
        # The watcher exports once it has seen /health answer 200 itself.
        found = wait_for(lambda: (s := scrape(proc.url))[0].get("total") is not None and s,
                         timeout=30, what="the cold-start phases on /metrics")
        r = httpx.post(proc.url + "/v1/completions", timeout=60, json={
            "model": SERVED, "prompt": "hello", "max_tokens": 4, "ignore_eos": True})
        completion = r.json()["choices"][0]["text"] if r.status_code == 200 else None
        after = httpx.get(proc.url + "/metrics", timeout=5).text
        (scratch / "metrics.txt").write_text(after)
        seen = through_prometheus(proc.url) if with_prometheus else (None, None)
    finally:
        proc.stop(timeout=30)
    phases, hit = found
    waiting = any(line.startswith((m.VLLM_WAITING + "{", m.VLLM_WAITING.replace(":", "_") + "{"))
                  for line in after.splitlines())
    return Start(phases, hit, log.read_text(), waiting, completion, *seen)


@pytest.fixture(scope="module")
def starts(tmp_path_factory: pytest.TempPathFactory) -> tuple[Start, Start, Path]:
    base = tmp_path_factory.mktemp("cold-start")
    cache = base / "cache"
    side_channel = free_port()
    first = start(base / "first", cache, side_channel)
    second = start(base / "second", cache, side_channel, with_prometheus=prometheus_available())
    for name, s in (("first (empty cache)", first), ("second (same cache)", second)):
        print(f"\n{name}: " + ", ".join(f"{k} {v:.1f}" for k, v in s.phases.items())
              + f"; compile cache hit {s.cache_hit}")
    return first, second, cache


def test_every_phase_is_on_the_engines_metrics(starts: tuple[Start, Start, Path]) -> None:
    for s in starts[:2]:
        assert set(s.phases) == {"import", "engine", "weights", "warmup", "server", "ready",
                                 "total", *(() if EAGER else ("compile",))}, s.log[-3000:]
        # (no CUDA graphs on CPU)
        assert sum(v for k, v in s.phases.items() if k != "total") == pytest.approx(
            s.phases["total"], abs=1e-6)
        assert s.phases["total"] > 0
        # vLLM serves its own series as before, and requests.
        assert s.waiting_series and s.completion is not None
        # The pod's log says it too, and every line of vLLM's still passed through.
        assert "poolpilot launch: cold start" in s.log
        assert "Starting vLLM server on" in s.log and "Application startup complete" in s.log


def test_the_second_start_finds_the_first_ones_compiled_artifacts(
        starts: tuple[Start, Start, Path]) -> None:
    first, second, cache = starts
    if EAGER:
        assert (first.cache_hit, second.cache_hit) == (None, None)  # nothing compiled
        return
    compiled = cache / "vllm" / "torch_compile_cache"
    assert any(compiled.rglob("*")), "the first start left no compiled artifacts"
    assert first.cache_hit == 0  # an empty cache: compiled
    # The second start looked up the first one's artifacts in the shared folder: a load
    # ("Directly load ...", the hit gauge at 1), or on vLLM-CPU 0.32 with torch 2.13 a load
    # that fails on an incompatibility ("Compiling model again due to a load failure from
    # <the shared folder>"), and the inductor artifacts beside it that make the compile
    # phase shorter (docs/operator.md has the numbers).
    looked_up = [line for line in second.log.splitlines()
                 if str(compiled) in line and ("Directly load" in line
                                               or "load failure from" in line)]
    assert looked_up, second.log[-3000:]
    assert second.cache_hit == (1 if "Directly load" in looked_up[0] else 0)


def test_the_dashboard_and_the_autoscaler_read_the_phases_from_prometheus(
        starts: tuple[Start, Start, Path]) -> None:
    s = starts[1]
    if s.panel is None:
        pytest.skip("needs prometheus (apt-get install -y --no-install-recommends prometheus)")
    phases, total = s.panel
    shown = {r["metric"]["phase"]: float(r["value"][1]) for r in phases}
    assert shown == pytest.approx({k: v for k, v in s.phases.items() if k != "total"})
    assert [r["metric"]["role"] for r in total] == [ROLE]
    assert float(total[0]["value"][1]) == pytest.approx(s.phases["total"])
    cache = {} if s.cache_hit is None else {COMPILE_CACHE_PHASE: s.cache_hit}
    assert s.autoscaler == {POD: pytest.approx({**s.phases, **cache})}


def test_the_annotation_says_what_the_metrics_say(starts: tuple[Start, Start, Path]) -> None:
    """What the autoscaler writes on the pod (poolpilot.dev/cold-start) from the scraped
    series, with the pod's own timestamps for the phases before the container started."""
    s = starts[1]
    note = cold_start_annotation(s.phases, s.cache_hit, created=100.0, scheduled=101.5,
                                 started=104.0)
    assert note["scheduled"] == 1.5 and note["container"] == 2.5
    assert note["engine"] == {k: round(v, 2) for k, v in s.phases.items() if k != "total"}
    assert note["total"] == round(4.0 + s.phases["total"], 2)
    assert note.get("compileCache") == (None if s.cache_hit is None
                                        else "hit" if s.cache_hit == 1 else "miss")


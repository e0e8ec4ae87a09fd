"""Builders: golden YAML per example pool, Kubernetes schema validation, and the pod contract.

Regenerate the golden files after an intended change with
`POOLPILOT_UPDATE_GOLDEN=1 .venv/bin/pytest tests/unit/operator/test_operator_builders.py`
and review the diff.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from poolpilot.operator import builders, render

from poolpilot import api, names
from poolpilot.validate import parse_spec

ROOT = Path(__file__).resolve().parents[3]
# examples/model-cache/: one pool per cache option (docs/operator.md).
EXAMPLES = sorted([*(ROOT / "examples").glob("*.yaml"),
                   *(ROOT / "examples" / "model-cache").glob("*.yaml")])
GOLDEN = Path(__file__).parent / "golden"
K8S_VERSION = kubernetes_validate.latest_version()
UID = "6a1c1d4e-0000-4000-8000-000000000001"


def _pool(spec: dict[str, Any], name: str = "p", uid: str | None = UID) -> builders.Pool:
    return builders.Pool(name=name, namespace="ns", spec=parse_spec(spec), uid=uid)


def _by_kind_name(objs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objs}


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_render_matches_golden(example: Path) -> None:
    pools = render.pools_from_file(example)
    for monitoring in (False, True):
        text = render.render(pools, builders.Capabilities(monitoring=monitoring), "yaml")
        golden = GOLDEN / f"{example.stem}{'.monitoring' if monitoring else ''}.yaml"
        if os.environ.get("POOLPILOT_UPDATE_GOLDEN"):
            golden.write_text(text)
        assert golden.exists(), f"missing {golden}; run with POOLPILOT_UPDATE_GOLDEN=1"
        assert text == golden.read_text(), f"{example.name} renders differently from {golden}"


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_rendered_objects_pass_kubernetes_schema(example: Path) -> None:
    for pool in render.pools_from_file(example):
        owned = builders.Pool(pool.name, pool.namespace, pool.spec, uid=UID)
        for obj in builders.build_children(owned, builders.Capabilities(monitoring=True)):
            if obj["apiVersion"].startswith("monitoring.coreos.com"):
                continue  # not a core type; checked below
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_schema_check_can_fail() -> None:
    dep = builders.build_engine_deployment(_pool({"model": {"name": "m"}}), "prefill")
    dep["spec"]["template"]["spec"]["containers"][0]["imagePullPolcy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(dep, K8S_VERSION, strict=True)


@dataclass(frozen=True)
class ChildrenCase:
    id: str
    spec: dict[str, Any]
    monitoring: bool
    expected: set[tuple[str, str]]


_BASE = {("ConfigMap", "p-router"), ("ServiceAccount", "p-router"), ("Role", "p-router"),
         ("RoleBinding", "p-router"), ("Service", "p-router"), ("Deployment", "p-router"),
         ("PodDisruptionBudget", "p-router")}  # fmt: skip
_PD = {(k, f"p-{r}") for r in ("prefill", "decode") for k in
       ("Service", "Deployment", "PodDisruptionBudget")}  # fmt: skip
_AGG = {(k, "p-engine") for k in ("Service", "Deployment", "PodDisruptionBudget")}
_MON = {("ServiceMonitor", "p-router"), ("PodMonitor", "p-engines")}
# On by default (the operator's --no-network-policies turns the default off).
_NP = {("NetworkPolicy", "p-engines"), ("NetworkPolicy", "p-router")}

CHILDREN_CASES = [
    ChildrenCase("disaggregated", {"model": {"name": "m"}}, False, _BASE | _PD | _NP),
    ChildrenCase("aggregated", {"model": {"name": "m"}, "mode": "Aggregated"}, False,
                 _BASE | _AGG | _NP),
    ChildrenCase("with-prometheus-operator", {"model": {"name": "m"}}, True,
                 _BASE | _PD | _MON | _NP),
    ChildrenCase(
        "monitors-turned-off",
        {"model": {"name": "m"}, "monitoring": {"serviceMonitor": False, "podMonitor": False}},
        True,
        _BASE | _PD | _NP,
    ),
    ChildrenCase("network-policies-off", {"model": {"name": "m"},
                                          "networkPolicy": {"enabled": False}}, False,
                 _BASE | _PD),
]


@pytest.mark.parametrize("case", CHILDREN_CASES, ids=[c.id for c in CHILDREN_CASES])
def test_children_per_mode(case: ChildrenCase) -> None:
    objs = builders.build_children(
        _pool(case.spec), builders.Capabilities(monitoring=case.monitoring)
    )
    assert set(_by_kind_name(objs)) == case.expected
    for obj in objs:
        assert obj["metadata"]["labels"][names.MANAGED_BY] == "poolpilot"
        assert obj["metadata"]["labels"][names.POOL_LABEL] == "p"
        ref = obj["metadata"]["ownerReferences"][0]
        assert (ref["kind"], ref["name"], ref["uid"], ref["controller"]) == (
            api.KIND, "p", UID, True
        )


def test_scrape_annotations_only_without_prometheus_operator() -> None:
    pool = _pool({"model": {"name": "m"}})
    plain = builders.build_engine_deployment(pool, "decode", builders.Capabilities())
    mon = builders.build_engine_deployment(pool, "decode", builders.Capabilities(monitoring=True))
    assert plain["spec"]["template"]["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    assert "annotations" not in mon["spec"]["template"]["metadata"]


@dataclass(frozen=True)
class ReplicasCase:
    id: str
    autoscaling: dict[str, Any]
    expected_engine: int | None  # None: left out of what the operator applies


REPLICAS_CASES = [
    ReplicasCase("autoscaling-apply-leaves-replicas-out", {"enabled": True, "mode": "Apply"}, None),
    ReplicasCase("advisory-enforces-spec", {"enabled": True, "mode": "Advisory"}, 3),
    ReplicasCase("autoscaling-off-enforces-spec", {"enabled": False}, 3),
]


@pytest.mark.parametrize("case", REPLICAS_CASES, ids=[c.id for c in REPLICAS_CASES])
def test_replicas_ownership(case: ReplicasCase) -> None:
    pool = _pool({"model": {"name": "m"}, "decode": {"replicas": 3, "maxReplicas": 4},
                  "router": {"replicas": 2}, "autoscaling": case.autoscaling})  # fmt: skip
    dep = builders.build_engine_deployment(pool, "decode")
    assert dep["spec"].get("replicas") == case.expected_engine
    assert builders.build_router_deployment(pool)["spec"]["replicas"] == 2  # always enforced


@dataclass(frozen=True)
class CommandCase:
    id: str
    spec: dict[str, Any]
    role: str
    expected: list[str]


COMMAND_CASES = [
    CommandCase(
        "prefill-nixl-engine-args",
        {"model": {"name": "org/m", "servedName": "m"},
         "runtime": {"engineArgs": {"maxModelLen": 8192, "enforceEager": True}},
         "prefill": {"engineArgs": {"maxModelLen": 4096}}},
        "prefill",
        # The KV lease from the router's handoff limits (5 s connect x 3 attempts + 10 s).
        ["poolpilot", "launch", "--role", "prefill", "--model", "org/m", "--port", "8000",
         "--metrics-port", "8090", "--served-name", "m", "--kv-connector", "NixlConnector",
         "--kv-lease-seconds", "25", "--tensor-parallel", "1", "--grace-seconds", "120",
         "--prestop-seconds", "10", "--engine-arg", "enforceEager=true",
         "--engine-arg", "maxModelLen=4096"],
    ),
    CommandCase(
        "aggregated-has-no-connector",
        {"model": {"name": "org/m"}, "mode": "Aggregated", "kvTransfer": {"extraConfig": {"a": 1}}},
        "engine",
        ["poolpilot", "launch", "--role", "engine", "--model", "org/m", "--port", "8000",
         "--metrics-port", "8090", "--served-name", "org/m", "--kv-connector", "none",
         "--tensor-parallel", "1", "--grace-seconds", "120", "--prestop-seconds", "10"],
    ),
    CommandCase(
        "decode-pvc-tp2-kv-config",
        {"model": {"name": "org/m", "source": {"pvc": {"claimName": "w", "path": "/x/y"}}},
         "kvTransfer": {"connector": "ExampleConnector",
                        "extraConfig": {"shared_storage_path": "/s"}},
         "decode": {"gpus": 2, "tensorParallelSize": 2, "terminationGracePeriodSeconds": 300}},
        "decode",
        # The grace period is the role's: vLLM drains for 300 - 10 - 5 s.
        ["poolpilot", "launch", "--role", "decode", "--model", "/models/x/y", "--port", "8000",
         "--metrics-port", "8090", "--served-name", "org/m", "--kv-connector", "ExampleConnector",
         "--kv-config", '{"shared_storage_path":"/s"}', "--tensor-parallel", "2",
         "--grace-seconds", "300", "--prestop-seconds", "10"],
    ),
]  # fmt: skip


@pytest.mark.parametrize("case", COMMAND_CASES, ids=[c.id for c in COMMAND_CASES])
def test_launch_command(case: CommandCase) -> None:
    dep = builders.build_engine_deployment(_pool(case.spec), case.role)
    assert dep["spec"]["template"]["spec"]["containers"][0]["command"] == case.expected


@dataclass(frozen=True)
class PrefixCase:
    id: str
    spec: dict[str, Any]
    router_flags: list[str]  # after --prefix-routing
    events: bool  # the engines publish KV events (launcher flags and container ports)


_EVENTS = ["--kv-events-port", "5557", "--kv-replay-port", "5558"]
PREFIX_CASES = [
    PrefixCase("default approximate", {"model": {"name": "m"}}, ["approximate"], False),
    PrefixCase("precise, disaggregated",
               {"model": {"name": "m"}, "router": {"prefixRouting": "Precise"}},
               ["precise", *_EVENTS], True),
    PrefixCase("precise, aggregated",
               {"model": {"name": "m"}, "mode": "Aggregated",
                "router": {"prefixRouting": "Precise"}}, ["precise", *_EVENTS], True),
    PrefixCase("off", {"model": {"name": "m"}, "router": {"prefixRouting": "Disabled"}}, ["off"],
               False),
]


@pytest.mark.parametrize("case", PREFIX_CASES, ids=[c.id for c in PREFIX_CASES])
def test_prefix_routing_configures_router_and_engines(case: PrefixCase) -> None:
    pool = _pool(case.spec)
    router = _container(builders.build_router_deployment(pool))["command"]
    assert router[router.index("--prefix-routing") + 1:] == case.router_flags
    for role in pool.spec.engine_roles():
        engine = _container(builders.build_engine_deployment(pool, role))
        cmd = engine["command"]
        assert (cmd[cmd.index("--tensor-parallel") + 2:][:4] == _EVENTS) == case.events
        ports = {p["name"]: p["containerPort"] for p in engine["ports"]}
        expected = {"http": 8000, "metrics": 8090, "kv-events": 5557, "kv-replay": 5558} \
            if case.events else {"http": 8000, "metrics": 8090}
        if pool.spec.mode == api.Mode.DISAGGREGATED:
            expected["nixl"] = 5600  # NIXL's side channel
        assert ports == expected


def test_a_bad_prefix_routing_names_the_field_and_the_choices(tmp_path: Path) -> None:
    bad = tmp_path / "pool.yaml"
    bad.write_text("apiVersion: poolpilot.dev/v1alpha1\nkind: InferencePool\n"
                   "metadata: {name: p}\n"
                   "spec: {model: {name: m}, router: {prefixRouting: Exact}}\n")
    out = subprocess.run([str(Path(sys.executable).parent / "poolpilot"), "validate", str(bad)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert "spec.router.prefixRouting: Input should be 'Approximate', 'Precise' or 'Disabled'" \
        in out.stdout + out.stderr


def _container(dep: dict[str, Any]) -> dict[str, Any]:
    c: dict[str, Any] = dep["spec"]["template"]["spec"]["containers"][0]
    return c


def test_engine_pod_contract() -> None:
    pool = _pool({
        "model": {"name": "m", "source": {"huggingFace": {"tokenSecret": {"name": "hf"}}}},
        "prefill": {"gpus": 4, "tensorParallelSize": 4},
    })  # fmt: skip
    dep = builders.build_engine_deployment(pool, "prefill")
    pod = dep["spec"]["template"]["spec"]
    c = _container(dep)
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert c["readinessProbe"]["httpGet"]["path"] == "/health"
    startup = c["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 20 * 60
    assert c["lifecycle"]["preStop"]["exec"]["command"][0] == "sleep"
    assert pod["terminationGracePeriodSeconds"] > builders.PRESTOP_SLEEP_SECONDS
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}} in pod["volumes"]
    assert {"name": "model-cache", "emptyDir": {"sizeLimit": "100Gi"}} in pod["volumes"]
    # The disk-backed emptyDirs' limits, requested: /tmp 4Gi + compile cache 10Gi + 100Gi.
    assert c["resources"]["requests"]["ephemeral-storage"] == "114Gi"
    hf = next(e for e in c["env"] if e["name"] == "HF_TOKEN")
    assert hf["valueFrom"]["secretKeyRef"] == {"name": "hf", "key": "token"}
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["topologySpreadConstraints"][0]["topologyKey"] == "kubernetes.io/hostname"
    assert dep["spec"]["template"]["metadata"]["labels"] == {
        **names.labels("p", "prefill"), names.POOL_UID_LABEL: UID}


def test_every_engine_pod_has_a_bounded_shm_and_a_cpu_pod_no_gpu_limit() -> None:
    pool = _pool({"model": {"name": "m"}, "decode": {"gpus": 0},
                  "runtime": {"storage": {"shm": "512Mi"}}})
    prefill = builders.build_engine_deployment(pool, "prefill")
    decode = builders.build_engine_deployment(pool, "decode")
    for dep in (prefill, decode):
        shm = next(v for v in dep["spec"]["template"]["spec"]["volumes"] if v["name"] == "dshm")
        assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "512Mi"}
        assert {"name": "dshm", "mountPath": "/dev/shm"} in _container(dep)["volumeMounts"]
    assert "nvidia.com/gpu" not in _container(decode)["resources"].get("limits", {})


def test_a_pvc_model_has_no_cache_to_request_disk_for() -> None:
    pool = _pool({"model": {"name": "m", "source": {"pvc": {"claimName": "w"}}}})
    c = _container(builders.build_engine_deployment(pool, "decode"))
    assert c["resources"]["requests"]["ephemeral-storage"] == "14Gi"  # /tmp and compile cache
    # A request the user sets is kept.
    pool = _pool({"model": {"name": "m"},
                  "runtime": {"resources": {"requests": {"ephemeral-storage": "300Gi"}}}})
    c = _container(builders.build_engine_deployment(pool, "decode"))
    assert c["resources"]["requests"]["ephemeral-storage"] == "300Gi"


def test_router_pod_contract() -> None:
    pool = _pool({"model": {"name": "m"}})
    dep = builders.build_router_deployment(pool)
    c = _container(dep)
    assert c["command"] == [
        "poolpilot", "router", "--host", "0.0.0.0", "--port", "8000", "--metrics-port", "8090",
        "--discover", "kubernetes", "--namespace", "ns", "--pool", "p",
        *(("--pool-uid", pool.uid) if pool.uid else ()),  # the pods' selector in discovery
        "--prefill-hold", "1", "--prefix-routing", "approximate",
    ]  # fmt: skip
    config = json.loads(builders.build_router_configmap(pool)["data"]["router.json"])
    assert config["mode"] == "Disaggregated" and config["model"] == "m"
    assert dep["spec"]["template"]["spec"]["volumes"] == [
        {"name": "config", "configMap": {"name": "p-router"}}]


def test_router_api_keys_from_a_mounted_secret() -> None:
    pool = _pool({"model": {"name": "m"},
                  "router": {"apiKeySecret": {"name": "llm-keys", "key": "keys"}}})
    dep = builders.build_router_deployment(pool)
    c = _container(dep)
    path = c["command"][c["command"].index("--api-key-file") + 1]
    [mount] = [m for m in c["volumeMounts"] if m["name"] == "api-keys"]
    assert path == f"{mount['mountPath']}/api-keys" and mount["readOnly"]
    [vol] = [v for v in dep["spec"]["template"]["spec"]["volumes"] if v["name"] == "api-keys"]
    assert vol["secret"]["secretName"] == "llm-keys"
    assert vol["secret"]["items"] == [{"key": "keys", "path": "api-keys"}]
    assert "env" not in c or all("llm-keys" not in str(e) for e in c["env"])


BASE = {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"}}


@pytest.mark.parametrize("change,rolls", [
    ({"model": {"name": "other"}}, True),  # the local-prefill profile
    ({"mode": "Aggregated"}, True),  # the Services it discovers
    # The targets its local prefill holds to, not the quantiles.
    ({"slo": {"ttft": {"quantile": 0.9, "seconds": 2.5}}}, True),
    ({"model": {**BASE["model"], "servedName": "alias"}}, False),
    ({"slo": {"ttft": {"quantile": 0.99, "seconds": 1.0}}}, False),
    ({"kvTransfer": {"connector": "ExampleConnector"}}, False),
    ({"decode": {"replicas": 4, "maxReplicas": 8}}, False),
    ({"autoscaling": {"mode": "Advisory"}}, False),
    ({"runtime": {"engineArgs": {"maxModelLen": 4096}}}, False),
], ids=["model", "mode", "slo-seconds", "served-name", "slo-quantile", "connector",
        "decode-size", "autoscaling", "engine-args"])
def test_only_what_the_router_reads_rolls_the_routers(change: dict[str, Any], rolls: bool
                                                      ) -> None:
    a = builders.build_router_deployment(_pool(BASE))
    b = builders.build_router_deployment(_pool({**BASE, **change}))
    assert (a["spec"]["template"] != b["spec"]["template"]) is rolls


def test_the_router_reads_every_key_of_its_config(tmp_path: Path) -> None:
    """Each key of the config changes what the router ends up with (router/main.py)."""
    from poolpilot.router import main as router_main

    from poolpilot import cli

    config = builders.router_config(_pool({**BASE, "mode": "Aggregated"}))

    def parsed(cfg: dict[str, Any]) -> dict[str, Any]:
        path = tmp_path / "router.json"
        path.write_text(json.dumps(cfg))
        argv = ["router", "--discover", "kubernetes", "--namespace", "ns", "--pool", "p",
                "--config", str(path)]
        args = cli.build_parser(argv).parse_args(argv)
        router_main.apply_config_file(args)
        return dict(vars(args))

    full = parsed(config)
    for key in config:
        assert parsed({k: v for k, v in config.items() if k != key}) != full, key
    for role in ("ttft", "itl"):
        slo = {r: v for r, v in config["slo"].items() if r != role}
        assert parsed({**config, "slo": slo}) != full, role


def test_render_cli_reports_bad_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "apiVersion: poolpilot.dev/v1alpha1\nkind: InferencePool\n"
        "metadata: {name: x}\nspec: {model: {name: m}, decode: {maxReplicass: 3}}\n"
    )
    from poolpilot import cli

    assert cli.main(["render", str(bad)]) == 1
    assert "spec.decode.maxReplicass: unknown field; did you mean maxReplicas?" in (
        capsys.readouterr().err
    )


_role = st.fixed_dictionaries(
    {"replicas": st.integers(0, 3), "gpus": st.integers(1, 8)},
    optional={"engineArgs": st.dictionaries(st.sampled_from(["maxModelLen", "seed", "dtype"]),
                                            st.integers(1, 9000) | st.booleans(), max_size=3)},
)  # fmt: skip


@settings(max_examples=40, deadline=None)
@given(
    name=st.from_regex(r"[a-z]([a-z0-9-]{0,20}[a-z0-9])?", fullmatch=True),
    mode=st.sampled_from(["Aggregated", "Disaggregated"]),
    role=_role,
    monitoring=st.booleans(),
)
def test_children_are_deterministic_valid_and_uniquely_named(
    name: str, mode: str, role: dict[str, Any], monitoring: bool
) -> None:
    role = {**role, "minReplicas": 0 if role["replicas"] == 0 else 1, "maxReplicas": 4}
    spec = {"model": {"name": "m"}, "mode": mode, "prefill": role, "decode": role,
            "engine": role, "autoscaling": {"scaleToZero": True}}  # fmt: skip
    pool = _pool(spec, name=name)
    caps = builders.Capabilities(monitoring=monitoring)
    objs = builders.build_children(pool, caps)
    assert objs == builders.build_children(_pool(spec, name=name), caps)
    keys = [builders.object_key(o) for o in objs]
    assert len(keys) == len(set(keys))
    for obj in objs:
        assert obj["metadata"]["name"].startswith(f"{name}-")
        if not obj["apiVersion"].startswith("monitoring.coreos.com"):
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


@dataclass(frozen=True)
class OffloadCase:
    id: str
    spec: dict[str, Any]
    offload: dict[str, str | None]  # role -> --kv-offload-bytes (None: absent)
    entries: str | None  # the router's --prefix-max-entries (None: absent, its default)


OFFLOAD_CASES = [
    OffloadCase("none", {"model": {"name": "m"}}, {"prefill": None, "decode": None}, None),
    # 8 prefill engines x 256 GiB at 128 KiB a token, 32 tokens a key: 524288 keys more
    OffloadCase("prefill 256Gi", {"model": {"name": "m"}, "prefill": {"kvOffload": "256Gi"}},
                {"prefill": str(256 * 2**30), "decode": None}, str(131072 + 524288)),
    OffloadCase("aggregated, capped",
                {"model": {"name": "m"}, "mode": "Aggregated",
                 "engine": {"kvOffload": "1Ti", "maxReplicas": 32}},
                {"engine": str(2**40)}, str(2**21)),
    OffloadCase("entries set by the user win",
                {"model": {"name": "m"}, "prefill": {"kvOffload": "64Gi"},
                 "router": {"prefixIndexEntries": 300000}},
                {"prefill": str(64 * 2**30), "decode": None}, "300000"),
    OffloadCase("entries without offload", {"model": {"name": "m"},
                                            "router": {"prefixIndexEntries": 5}},
                {"prefill": None, "decode": None}, "5"),
]


@pytest.mark.parametrize(("router", "flag"), [({}, "1"), ({"prefillHoldSeconds": 2.5}, "2.5"),
                                              ({"prefillHoldSeconds": 0}, "0")],
                         ids=["default", "set", "off"])
def test_the_routers_late_binding_comes_from_the_spec(router: dict, flag: str) -> None:
    pool = _pool({"model": {"name": "m"}, "router": router})
    cmd = _container(builders.build_router_deployment(pool))["command"]
    assert cmd[cmd.index("--prefill-hold") + 1] == flag
    aggregated = _pool({"model": {"name": "m"}, "mode": "Aggregated", "router": router})
    assert "--prefill-hold" not in _container(
        builders.build_router_deployment(aggregated))["command"]  # no prefill engines


@pytest.mark.parametrize("case", OFFLOAD_CASES, ids=[c.id for c in OFFLOAD_CASES])
def test_a_cpu_offload_tier_reaches_the_engines_and_sizes_the_routers_record(
        case: OffloadCase) -> None:
    pool = _pool(case.spec)
    for role, expected in case.offload.items():
        cmd = _container(builders.build_engine_deployment(pool, api.Role(role)))["command"]
        got = cmd[cmd.index("--kv-offload-bytes") + 1] if "--kv-offload-bytes" in cmd else None
        assert got == expected, role
    router = _container(builders.build_router_deployment(pool))["command"]
    got = (router[router.index("--prefix-max-entries") + 1]
           if "--prefix-max-entries" in router else None)
    assert got == case.entries

"""The sandbox controller's pure pieces: ReplicaSet planning, pod command lines, env, endpoints."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from poolpilot.emulator.cluster import pods as P

PY = [sys.executable, "-m", "poolpilot.cli"]


def deployment(replicas: int, image: str = "img:1") -> dict[str, Any]:
    return {
        "metadata": {"name": "demo-prefill", "namespace": "ns", "uid": "u1", "generation": 2},
        "spec": {
            "replicas": replicas,
            "template": {
                "metadata": {"labels": {"poolpilot.dev/pool": "demo",
                                        "poolpilot.dev/role": "prefill"},
                             "annotations": {"prometheus.io/scrape": "true"}},
                "spec": {"containers": [{"name": "engine", "image": image}]},
            },
        },
    }


def pod(name: str, template_of: dict[str, Any], created: str = "2026-01-01T00:00:00Z",
        deleting: bool = False) -> dict[str, Any]:
    p = P.build_pod(template_of, suffix=name)
    p["metadata"]["name"] = name
    p["metadata"]["creationTimestamp"] = created
    if deleting:
        p["metadata"]["deletionTimestamp"] = "2026-01-01T00:01:00Z"
    return p


def test_build_pod_is_owned_labelled_and_finalized() -> None:
    d = deployment(1)
    p = P.build_pod(d, suffix="abcde")
    assert p["metadata"]["name"].startswith("demo-prefill-") and p["metadata"]["name"].endswith(
        "-abcde")
    assert P.owned_by(p, d)
    assert p["metadata"]["labels"]["poolpilot.dev/role"] == "prefill"
    assert p["metadata"]["labels"][P.TEMPLATE_HASH] == P.template_hash(d["spec"]["template"])
    assert p["metadata"]["finalizers"] == [P.FINALIZER]
    assert p["metadata"]["annotations"] == {"prometheus.io/scrape": "true"}


@dataclass(frozen=True)
class PlanCase:
    name: str
    replicas: int
    current: list[tuple[str, bool, str]]  # (name, ready, created)
    old: list[tuple[str, bool]] = field(default_factory=list)
    deleting: list[str] = field(default_factory=list)
    create: int = 0
    delete: list[str] = field(default_factory=list)


PLANS = [
    PlanCase("scale-up-from-zero", 3, [], create=3),
    PlanCase("steady", 2, [("a", True, "1"), ("b", True, "2")]),
    PlanCase("scale-down-newest-first", 1, [("a", True, "1"), ("b", True, "2"), ("c", True, "3")],
             delete=["c", "b"]),
    PlanCase("scale-down-not-ready-first", 1, [("a", True, "3"), ("b", False, "1")],
             delete=["b"]),
    PlanCase("terminating-pods-do-not-count", 2, [("a", True, "1")], deleting=["z"], create=1),
    PlanCase("template-change-surges-first", 1, [], old=[("o", True)], create=1),
    PlanCase("old-pod-goes-once-new-is-ready", 1, [("n", True, "5")], old=[("o", True)],
             delete=["o"]),
    PlanCase("old-pod-stays-while-new-starts", 1, [("n", False, "5")], old=[("o", True)]),
    PlanCase("at-zero-everything-goes", 0, [("a", True, "1")], old=[("o", True)],
             delete=["a", "o"]),
]


@pytest.mark.parametrize("case", PLANS, ids=[c.name for c in PLANS])
def test_plan_replicas(case: PlanCase) -> None:
    d = deployment(case.replicas)
    old_d = deployment(case.replicas, image="img:0")
    pods = [pod(n, d, created=c) for n, _, c in case.current]
    pods += [pod(n, old_d) for n, _ in case.old]
    pods += [pod(n, d, deleting=True) for n in case.deleting]
    ready = {n: r for n, r, _ in case.current} | dict(case.old)
    plan = P.plan_replicas(d, pods, ready)
    assert plan.create == case.create
    assert plan.delete == case.delete


@given(st.integers(0, 6), st.lists(st.booleans(), max_size=8))
def test_plan_converges_to_replicas(replicas: int, readiness: list[bool]) -> None:
    d = deployment(replicas)
    pods = [pod(f"p{i}", d, created=f"{i:03d}") for i in range(len(readiness))]
    plan = P.plan_replicas(d, pods, {f"p{i}": r for i, r in enumerate(readiness)})
    assert len(pods) + plan.create - len(plan.delete) == replicas
    assert plan.create == 0 or not plan.delete


def test_deployment_status_counts_ready_and_updated() -> None:
    d = deployment(3)
    pods = [pod("a", d), pod("b", d), pod("o", deployment(3, "img:0")), pod("x", d, deleting=True)]
    s = P.deployment_status(d, pods, {"a": True, "o": True, "x": True})
    assert (s["replicas"], s["readyReplicas"], s["updatedReplicas"]) == (3, 2, 2)
    assert s["observedGeneration"] == 2
    assert s["conditions"][0]["status"] == "False"


@dataclass(frozen=True)
class CommandCase:
    name: str
    argv: list[str]
    mapping: P.EngineMapping
    expected: list[str]
    itl_budget: float | None = None


LAUNCH = ["poolpilot", "launch", "--role", "prefill", "--model",
          "meta-llama/Llama-3.1-8B-Instruct", "--port", "8000", "--served-name", "llama",
          "--kv-connector", "NixlConnector", "--tensor-parallel", "1",
          "--engine-arg", "maxModelLen=8192"]

COMMANDS = [
    CommandCase(
        "launch-becomes-engine-sim", LAUNCH, P.EngineMapping(speed=4, sim_gpu="a100"),
        [*PY, "engine-sim", "--role", "prefill", "--model", "llama-3.1-8b", "--gpu", "a100",
         "--tensor-parallel", "1", "--host", "127.0.0.7", "--port", "8000", "--speed", "4",
         "--served-name", "llama", "--max-model-len", "8192"],
    ),
    *(CommandCase(
        f"aggregated-engine-as-{role}", [(role if a == "prefill" else a) for a in LAUNCH],
        P.EngineMapping(speed=4, sim_gpu="a100"),
        # engine-sim takes both names of the aggregated engine, as the launcher does (pods an
        # older operator rendered say aggregated).
        [*PY, "engine-sim", "--role", role, "--model", "llama-3.1-8b", "--gpu", "a100",
         "--tensor-parallel", "1", "--host", "127.0.0.7", "--port", "8000", "--speed", "4",
         "--served-name", "llama", "--max-model-len", "8192"],
    ) for role in ("engine", "aggregated")),
    CommandCase(
        "sim-without-the-prefix-cache-when-the-pool-turns-it-off",
        [*LAUNCH, "--engine-arg", "enablePrefixCaching=false"],
        P.EngineMapping(speed=4, sim_gpu="a100"),
        [*PY, "engine-sim", "--role", "prefill", "--model", "llama-3.1-8b", "--gpu", "a100",
         "--tensor-parallel", "1", "--host", "127.0.0.7", "--port", "8000", "--speed", "4",
         "--served-name", "llama", "--max-model-len", "8192", "--no-enable-prefix-caching"],
    ),
    CommandCase(
        "sim-decode-keeps-a-local-prefill-within-the-itl-target",
        [("decode" if a == "prefill" else a) for a in LAUNCH],
        P.EngineMapping(speed=4, sim_gpu="a100"),
        [*PY, "engine-sim", "--role", "decode", "--model", "llama-3.1-8b", "--gpu", "a100",
         "--tensor-parallel", "1", "--host", "127.0.0.7", "--port", "8000", "--speed", "4",
         "--served-name", "llama", "--max-model-len", "8192", "--itl-budget", "0.05"],
        itl_budget=0.05,
    ),
    CommandCase(
        "sim-prefill-gets-no-itl-budget", LAUNCH, P.EngineMapping(speed=4, sim_gpu="a100"),
        [*PY, "engine-sim", "--role", "prefill", "--model", "llama-3.1-8b", "--gpu", "a100",
         "--tensor-parallel", "1", "--host", "127.0.0.7", "--port", "8000", "--speed", "4",
         "--served-name", "llama", "--max-model-len", "8192"],
        itl_budget=0.05,
    ),
    CommandCase(
        "launch-on-vllm-cpu-serves-the-tiny-model",
        LAUNCH,
        P.EngineMapping(engine="vllm-cpu", tiny_model="/m", vllm_python="/v/bin/python"),
        [*PY, "launch", *[("/m" if a == "meta-llama/Llama-3.1-8B-Instruct" else a)
                          for a in LAUNCH[2:-2]],
         "--kv-config", '{"kv_buffer_device":"cpu"}',
         "--engine-arg", "dtype=float32", "--engine-arg", "enforce-eager=true",
         "--engine-arg", "max-model-len=512", "--host", "127.0.0.7", "--python", "/v/bin/python"],
    ),
    CommandCase(
        "router-runs-on-the-pod-address-reporting-simulated-seconds",
        ["poolpilot", "router", "--port", "8000", "--discover", "kubernetes"],
        P.EngineMapping(speed=4),
        [*PY, "router", "--port", "8000", "--discover", "kubernetes", "--host", "127.0.0.7",
         "--speed", "4"],
    ),
    CommandCase(
        "python-m-form", ["python3", "-m", "poolpilot.cli", "router", "--port", "8000"],
        P.EngineMapping(), [*PY, "router", "--port", "8000", "--host", "127.0.0.7", "--speed", "1"],
    ),
]


@pytest.mark.parametrize("case", COMMANDS, ids=[c.name for c in COMMANDS])
def test_local_command(case: CommandCase) -> None:
    assert P.local_command(case.argv, "127.0.0.7", case.mapping, case.itl_budget) \
        == case.expected


def test_vllm_cpu_overrides_the_pools_gpu_settings() -> None:
    argv = [*LAUNCH, "--kv-config", '{"kv_buffer_device":"cuda","x":1}',
            "--engine-arg", "dtype=bfloat16", "--engine-arg", "gpuMemoryUtilization=0.9"]
    cmd = P.local_command(argv, "127.0.0.7", P.EngineMapping(engine="vllm-cpu", tiny_model="/m"))
    args = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--engine-arg"]
    assert args == ["gpuMemoryUtilization=0.9", "dtype=float32", "enforce-eager=true",
                    "max-model-len=512"]
    assert cmd[cmd.index("--kv-config") + 1] == '{"kv_buffer_device":"cuda","x":1}'


@pytest.mark.parametrize("argv", [["nginx"], ["/bin/sh", "-c", "x"], []],
                         ids=["nginx", "shell", "empty"])
def test_non_poolpilot_commands_are_refused(argv: list[str]) -> None:
    with pytest.raises(P.PodSpecError):
        P.local_command(argv, "127.0.0.7", P.EngineMapping())


def test_env_resolves_downward_api_secrets_and_references() -> None:
    p = pod("a", deployment(1))
    container = {"env": [
        {"name": "A", "value": "x"},
        {"name": "B", "value": "$(A)-y"},
        {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}},
        {"name": "MISSING", "valueFrom": {"secretKeyRef": {"name": "no", "key": "k"}}},
    ]}
    env = P.resolve_env(p, container, "127.0.0.9", {("hf", "token"): "s3cret"})
    assert env == {"A": "x", "B": "x-y", "IP": "127.0.0.9", "NS": "ns", "TOKEN": "s3cret",
                   "MISSING": ""}


def test_remap_paths_longest_mount_wins() -> None:
    mounts = {"/etc/poolpilot/router": "/w/cfg", "/tmp": "/w/tmp", "/etc": "/w/etc"}
    assert P.remap_paths(
        ["/etc/poolpilot/router/router.json", "/tmp", "/tmpx", "/etc/hosts", "--port"], mounts
    ) == ["/w/cfg/router.json", "/w/tmp", "/tmpx", "/w/etc/hosts", "--port"]


def test_host_paths_under_a_mount_path_are_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkout under /tmp (as CI's may be) must not have its Python remapped into the pod's
    /tmp volume: only the container's own arguments name container paths."""
    monkeypatch.setattr(P, "POOLPILOT", ["/tmp/ci/.venv/bin/python3", "-m", "poolpilot.cli"])
    argv = ["poolpilot", "router", "--port", "8000", "--log-dir", "/tmp/logs"]
    assert P.pod_command(argv, "127.0.0.7", P.EngineMapping(), {"/tmp": "/w/tmp"}) == [
        "/tmp/ci/.venv/bin/python3", "-m", "poolpilot.cli", "router", "--port", "8000",
        "--log-dir", "/w/tmp/logs", "--host", "127.0.0.7", "--speed", "1"]


def test_probe_url_and_prestop() -> None:
    c = {"name": "e", "ports": [{"name": "http", "containerPort": 8000}],
         "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}},
         "lifecycle": {"preStop": {"exec": {"command": ["sleep", "10"]}}}}
    assert P.probe_url(c, "127.0.0.3") == "http://127.0.0.3:8000/health"
    assert P.probe_url({"name": "x"}, "127.0.0.3") is None
    assert P.prestop_seconds(c) == 10.0
    with pytest.raises(P.PodSpecError, match="no port named 'metrics'"):
        P.container_port(c, "metrics")


def test_endpoint_slice_marks_ready_and_terminating() -> None:
    d = deployment(2)
    d["spec"]["template"]["spec"]["containers"][0]["ports"] = [
        {"name": "http", "containerPort": 8000}]
    svc = {"metadata": {"name": "demo-prefill", "namespace": "ns", "uid": "s1",
                        "labels": {"poolpilot.dev/pool": "demo"}},
           "spec": {"selector": {"poolpilot.dev/role": "prefill"},
                    "ports": [{"name": "http", "port": 8000, "targetPort": "http"}]}}
    views = [
        P.PodView(pod("a", d), "127.0.0.2", ready=True, terminating=False),
        P.PodView(pod("b", d), "127.0.0.3", ready=True, terminating=True),
        P.PodView(pod("c", d), "127.0.0.4", ready=False, terminating=False),
        P.PodView(pod("d", d), None, ready=False, terminating=False),  # no address yet
    ]
    s = P.endpoint_slice(svc, views)
    assert s["metadata"]["labels"]["kubernetes.io/service-name"] == "demo-prefill"
    assert s["ports"] == [{"name": "http", "port": 8000, "protocol": "TCP"}]
    got = {e["addresses"][0]: e["conditions"] for e in s["endpoints"]}
    assert got == {
        "127.0.0.2": {"ready": True, "serving": True, "terminating": False},
        "127.0.0.3": {"ready": False, "serving": True, "terminating": True},
        "127.0.0.4": {"ready": False, "serving": False, "terminating": False},
    }


def test_scrape_target_relabels_pool_and_role() -> None:
    p = pod("a", deployment(1))
    p["metadata"]["annotations"]["prometheus.io/port"] = "8000"
    t = P.scrape_target(P.PodView(p, "127.0.0.5", True, False))
    assert t is not None and t.address == "127.0.0.5:8000"
    assert t.labels == {"namespace": "ns", "pool": "demo", "role": "prefill", "pod": "a"}
    p["metadata"]["annotations"] = {}
    assert P.scrape_target(P.PodView(p, "127.0.0.5", True, False)) is None


@pytest.mark.parametrize(
    "pod_model,override,expected",
    [("meta-llama/Llama-3.1-70B-Instruct", None, "llama-3.1-70b"),
     ("my-org/unknown-model", None, "llama-3.1-8b"),
     ("meta-llama/Llama-3.1-70B-Instruct", "llama-3.1-8b", "llama-3.1-8b")],
    ids=["known-shape", "unknown-falls-back", "override"],
)
def test_sim_model(pod_model: str, override: str | None, expected: str) -> None:
    assert P.sim_model(pod_model, override) == expected


def test_a_conditions_transition_time_moves_only_when_its_status_does() -> None:
    from poolpilot.emulator.cluster.kubelet import ConditionTimes

    clock = iter(f"2026-12-06T12:00:{s:02d}Z" for s in range(60))
    times = ConditionTimes(now=lambda: next(clock))

    def ready(status: str) -> dict[str, Any]:
        s = {"conditions": [{"type": "PodScheduled", "status": "True"},
                            {"type": "Ready", "status": status}]}
        times.stamp(("ns", "p"), s)
        return {c["type"]: c["lastTransitionTime"] for c in s["conditions"]}

    first = ready("False")
    assert ready("False") == first  # rewritten unchanged: the times stay
    back = ready("True")  # the container came up
    assert back["Ready"] > first["Ready"] and back["PodScheduled"] == first["PodScheduled"]
    assert ready("True") == back
    killed, restarted = ready("False"), ready("True")  # a restart moves it twice
    assert back["Ready"] < killed["Ready"] < restarted["Ready"]
    times.forget(("ns", "p"))  # a new pod of the same name starts afresh
    assert ready("True")["PodScheduled"] > restarted["PodScheduled"]


def test_readiness_follows_the_probes_thresholds_as_the_kubelet_does() -> None:
    """One slow answer does not pull a ready pod out of its Service: it takes
    failureThreshold failures in a row (3 by default), and successThreshold successes to come
    back; a process that is gone is not ready at once."""
    rule = P.ProbeRule.of({"readinessProbe": {"httpGet": {"path": "/health"},
                                              "failureThreshold": 3, "timeoutSeconds": 3}})
    assert (rule.failure_threshold, rule.success_threshold, rule.timeout_s) == (3, 1, 3.0)
    ready, streak = False, 0
    seen = []
    for ok in (True, False, False, True, False, False, False, True):
        ready, streak = rule.next(ready, streak, ok)
        seen.append(ready)
    assert seen == [True, True, True, True, True, True, False, True]
    assert rule.next(True, 0, True, running=False) == (False, 0)
    # Kubernetes' defaults when the probe sets none
    assert P.ProbeRule.of({"readinessProbe": {"httpGet": {}}}) == P.ProbeRule(3, 1, 1.0)
    two = P.ProbeRule.of({"readinessProbe": {"successThreshold": 2}})
    assert two.next(False, 0, True) == (False, 1) and two.next(False, 1, True) == (True, 0)

"""The operator (Kopf, in a thread via KopfRunner) against a cluster: the Kubernetes API
emulator by default, or a real cluster when KUBECONFIG_E2E names a kubeconfig. Tests that need
the emulator's request log or fault injection are skipped on a real cluster.

The operator runs with a 1 s drift timer; every wait polls for the condition with a deadline.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from poolpilot.emulator.server import KubeEmulator
from poolpilot.operator.handlers import OperatorConfig
from poolpilot.operator.metrics import OperatorMetrics
from poolpilot.testkit.cluster import cluster_from_env
from poolpilot.testkit.operator import Kubectl, install, running_operator
from poolpilot.testkit.polling import wait_for

from poolpilot import names

pytestmark = [pytest.mark.adapter, pytest.mark.cluster]

ROOT = Path(__file__).resolve().parents[2]
DRIFT = 1.0
# Permanent API errors back off 0.5 s, 1 s, 2 s, ... (5 s, 10 s, ... by default).
CONFIG = OperatorConfig(drift_interval=DRIFT, cutover_poll=0.3, request_timeout=10.0,
                        permanent_backoff=(0.5, 8.0))
# Every kind of child the operator makes (the monitors when the cluster serves them).
CHILD_KINDS = ("configmaps", "serviceaccounts", "roles", "rolebindings", "services",
               "deployments", "poddisruptionbudgets")
MONITOR_KINDS = ("podmonitors", "servicemonitors")
_names = (f"t{i}" for i in itertools.count())


class Cluster:
    def __init__(self, kubeconfig: Path, emu: KubeEmulator | None) -> None:
        self.kubectl = Kubectl(kubeconfig)
        self.kubeconfig = kubeconfig
        self.emu = emu

    def need_emulator(self) -> KubeEmulator:
        if self.emu is None:
            pytest.skip("needs the emulator's request log or fault injection")
        return self.emu

    def pool(self, name: str, ns: str = "ops", **spec: Any) -> dict[str, Any]:
        body = {"model": {"name": "org/model"}, "prefill": {"gpus": 0}, "decode": {"gpus": 0},
                "engine": {"gpus": 0}, **spec}
        return {"apiVersion": "poolpilot.dev/v1alpha1", "kind": "InferencePool",
                "metadata": {"name": name, "namespace": ns}, "spec": body}

    def get(self, kind: str, name: str, ns: str = "ops") -> dict[str, Any] | None:
        return self.kubectl.get(kind, name, ns)

    def condition(self, pool: str, ctype: str, ns: str = "ops") -> dict[str, Any] | None:
        obj = self.get("inferencepool", pool, ns) or {}
        for cond in (obj.get("status") or {}).get("conditions") or []:
            if cond["type"] == ctype:
                return cond
        return None

    def events(self, pool: str, reason: str, ns: str = "ops") -> list[dict[str, Any]]:
        items = self.kubectl.list("events", ns)
        return [e for e in items if e.get("reason") == reason
                and e.get("involvedObject", {}).get("name") == pool]

    def settled(self, pool: str, ns: str = "ops") -> bool:
        """The operator handled the pool's current generation (status written)."""
        obj = self.get("inferencepool", pool, ns) or {}
        gen = obj.get("metadata", {}).get("generation")
        return bool(gen) and (obj.get("status") or {}).get("observedGeneration") == gen

    def timer_ticks(self, pool: str, ns: str = "ops") -> int:
        """How many times the operator read the pool's router Deployment (once per reconcile)."""
        emu = self.need_emulator()
        path = f"/apis/apps/v1/namespaces/{ns}/deployments/{pool}-router"
        return sum(1 for r in list(emu.requests) if r.method == "GET" and r.path == path
                   and r.user_agent.startswith("poolpilot-operator"))

    def wait_reconciles(self, pool: str, n: int = 2, ns: str = "ops") -> None:
        start = self.timer_ticks(pool, ns)
        wait_for(lambda: self.timer_ticks(pool, ns) >= start + n, timeout=60,
                 what=f"{n} more reconciles of {pool}")

    def children(self, pool: str, ns: str = "ops") -> dict[tuple[str, str], str]:
        """(kind, name) -> resourceVersion of every child labelled with the pool."""
        kinds = CHILD_KINDS + (MONITOR_KINDS if self.emu is not None else ())
        return {(kind, o["metadata"]["name"]): o["metadata"]["resourceVersion"]
                for kind in kinds
                for o in self.kubectl.list(kind, ns, f"{names.POOL_LABEL}={pool}")}

    def writes_for(self, pool: str, ns: str = "ops") -> int:
        emu = self.need_emulator()
        return sum(1 for r in list(emu.requests)
                   if (r.is_write and f"/namespaces/{ns}/" in r.path and f"/{pool}-" in r.path)
                   or (r.is_write and r.path.endswith(f"/inferencepools/{pool}/status")))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with cluster_from_env(tmp_path_factory.mktemp("kube")) as (kubeconfig, emu):
        c = Cluster(kubeconfig, emu)
        # The CRD without CEL rules: the invalid-spec test must get a bad spec past the server.
        install(c.kubectl, strict_crd=False, monitoring=emu is not None)
        for ns in ("ops", "serving"):
            c.kubectl.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        yield c


METRICS = OperatorMetrics()


def reconciles(result: str, trigger: str = "change") -> float:
    value = METRICS.registry.get_sample_value(
        "poolpilot_operator_reconciles_total", {"trigger": trigger, "result": result})
    return value or 0.0


@pytest.fixture(scope="module")
def operator(cluster: Cluster) -> Iterator[None]:
    with running_operator(cluster.kubeconfig, CONFIG, standalone=True, metrics=METRICS):
        yield


def test_example_pool_gets_its_children_and_printer_columns(cluster: Cluster,
                                                            operator: None) -> None:
    k = cluster.kubectl
    k("apply", "-f", str(ROOT / "examples" / "llama-8b-disaggregated.yaml"))
    wait_for(lambda: cluster.settled("llama-8b", "serving"), what="llama-8b status")
    pool = k.get("inferencepool", "llama-8b", "serving")
    assert pool is not None
    expected = {("Deployment", f"llama-8b-{r}") for r in ("prefill", "decode", "router")}
    expected |= {("Service", f"llama-8b-{r}") for r in ("prefill", "decode", "router")}
    expected |= {("PodDisruptionBudget", f"llama-8b-{r}") for r in ("prefill", "decode", "router")}
    expected |= {("ConfigMap", "llama-8b-router")}
    if cluster.emu is not None:  # the fixture installed the Prometheus Operator CRDs
        expected |= {("ServiceMonitor", "llama-8b-router"), ("PodMonitor", "llama-8b-engines")}
    found = {}
    for kind, name in expected:
        obj = k.get(kind, name, "serving")
        assert obj is not None, f"{kind}/{name} missing"
        found[(kind, name)] = obj
        ref = obj["metadata"]["ownerReferences"][0]
        assert (ref["kind"], ref["name"], ref["uid"]) == (
            "InferencePool", "llama-8b", pool["metadata"]["uid"])
        assert obj["metadata"]["labels"][names.POOL_LABEL] == "llama-8b"
    # Autoscaling applies: replicas came from the scale subresource, not from our apply.
    assert found[("Deployment", "llama-8b-decode")]["spec"]["replicas"] == 2
    headers = k("get", "ipool", "-n", "serving").splitlines()[0].split()
    assert headers[:7] == ["NAME", "MODE", "PREFILL", "DECODE", "TTFT", "READY", "REASON"]
    row = k("get", "ipool", "llama-8b", "-n", "serving", "--no-headers").split()
    assert row[:4] == ["llama-8b", "Disaggregated", "0/1", "0/2"]
    assert row[4] == "False"  # no TTFT yet (empty column), Ready False: no pods run


def test_noop_reconcile_makes_zero_writes(cluster: Cluster, operator: None) -> None:
    name = next(_names)
    cluster.kubectl.apply(cluster.pool(name))
    wait_for(lambda: cluster.settled(name), what="first reconcile")
    cluster.wait_reconciles(name, 1)  # let the create's follow-up events pass
    before = cluster.writes_for(name)
    no_ops = reconciles("no_op", "timer")
    cluster.wait_reconciles(name, 3)
    assert cluster.writes_for(name) == before
    # The operator's metrics tell the same: the timer's reconciles found nothing to write.
    assert reconciles("no_op", "timer") >= no_ops + 3
    assert reconciles("converged") >= 1


def test_drift_is_repaired_within_a_timer_period_with_an_event(cluster: Cluster,
                                                               operator: None) -> None:
    name = next(_names)
    k = cluster.kubectl
    k.apply(cluster.pool(name))
    wait_for(lambda: cluster.settled(name), what="first reconcile")
    k("set", "image", f"deployment/{name}-decode", "engine=evil:latest", "-n", "ops")
    k("label", "deployment", f"{name}-prefill", f"{names.POOL_LABEL}-", "-n", "ops")
    k("delete", "service", f"{name}-router", "-n", "ops")

    def repaired() -> bool:
        dec = cluster.get("deployment", f"{name}-decode")
        pre = cluster.get("deployment", f"{name}-prefill")
        svc = cluster.get("service", f"{name}-router")
        if not (dec and pre and svc):
            return False
        return bool(dec["spec"]["template"]["spec"]["containers"][0]["image"] != "evil:latest"
                    and pre["metadata"]["labels"].get(names.POOL_LABEL) == name)

    wait_for(repaired, what="drift repaired")
    wait_for(lambda: cluster.events(name, "DriftRepaired"), what="a DriftRepaired event")


def test_invalid_spec_degrades_and_leaves_children_untouched(
    cluster: Cluster, operator: None, caplog: pytest.LogCaptureFixture
) -> None:
    name = next(_names)
    k = cluster.kubectl
    k.apply(cluster.pool(name))
    wait_for(lambda: cluster.settled(name), what="first reconcile")
    before = cluster.children(name)
    kinds = {kind for kind, _ in before}
    assert kinds >= set(CHILD_KINDS), kinds  # every kind is watched, not just Deployments
    k.apply(cluster.pool(name, decode={"gpus": 0, "minReplicas": 5, "maxReplicas": 2,
                                       "replicas": 5}))
    cond = wait_for(lambda: (c := cluster.condition(name, "Degraded")) and
                    c["reason"] == "InvalidSpec" and c, what="Degraded/InvalidSpec")
    assert cond["status"] == "True"
    assert "spec.decode.maxReplicas" in cond["message"]
    events = wait_for(lambda: cluster.events(name, "InvalidSpec"), what="an InvalidSpec event")
    assert events[0]["type"] == "Warning"
    # The drift timer sees the bad spec again and again and still touches nothing.
    seen = f"ops/{name}: invalid spec"
    wait_for(lambda: sum(seen in r.getMessage() for r in caplog.records) >= 3,
             what="the timer to run over the invalid spec")
    assert reconciles("invalid_spec", "timer") >= 2
    assert cluster.children(name) == before
    # Fixing the spec recovers.
    k.apply(cluster.pool(name, decode={"gpus": 0, "replicas": 2, "maxReplicas": 4}))
    wait_for(lambda: (c := cluster.condition(name, "Degraded")) and c["status"] == "False",
             what="Degraded=False after the fix")


QUOTA = ('deployments.apps "{d}" is forbidden: exceeded quota: gpus, requested: '
         'requests.nvidia.com/gpu=1, used: requests.nvidia.com/gpu=8, limited: '
         'requests.nvidia.com/gpu=8')


def _refuse(cluster: Cluster, name: str, status: int, message: str) -> tuple[str, Any]:
    """Every apply of the pool's decode Deployment refused with `status` and `message`."""
    dep = f"{name}-decode"
    message = message.format(d=dep)
    fault = cluster.need_emulator().faults.add("PATCH", rf"/deployments/{dep}$", status,
                                               times=None, message=message)
    return message, fault


def _degraded(cluster: Cluster, name: str, reason: str, status: int, message: str) -> None:
    cond = wait_for(lambda: (c := cluster.condition(name, "Degraded")) and
                    c["reason"] == reason and c, what=f"Degraded/{reason}")
    assert cond["status"] == "True"
    assert cond["message"] == f"apply Deployment/{name}-decode: HTTP {status}: {message}"
    progressing = cluster.condition(name, "Progressing") or {}
    assert (progressing.get("status"), progressing.get("reason")) == ("False", reason)
    events = wait_for(lambda: cluster.events(name, reason), what=f"a {reason} Event")
    assert events[0]["type"] == "Warning" and message in events[0]["message"]


def test_a_quota_refusal_degrades_backs_off_and_recovers(cluster: Cluster,
                                                         operator: None) -> None:
    emu = cluster.need_emulator()
    name = next(_names)
    message, fault = _refuse(cluster, name, 403, QUOTA)
    tries: list[float] = []

    def count() -> bool:
        if fault.hits > len(tries):
            tries.extend([time.monotonic()] * (fault.hits - len(tries)))
        return len(tries) >= 4

    try:
        cluster.kubectl.apply(cluster.pool(name))
        _degraded(cluster, name, "QuotaExceeded", 403, message)
        # Retried, each wait longer than the last (0.5 s, 1 s, 2 s here), not every 2 s.
        wait_for(count, interval=0.02, timeout=60, what="four tries")
        gaps = [b - a for a, b in itertools.pairwise(tries)]
        assert gaps[-1] > 2.5 * gaps[0], gaps
        assert len(cluster.events(name, "QuotaExceeded")) == 1  # one Event, not one per try
    finally:
        emu.faults.clear()
    # The quota raised: converged within the backoff, without touching the pool.
    wait_for(lambda: (c := cluster.condition(name, "Degraded")) and c["status"] == "False",
             timeout=30, what="Degraded=False once the API accepts the write")
    assert cluster.get("deployment", f"{name}-decode") is not None


@pytest.mark.parametrize("status,message,reason", [
    (403, 'deployments.apps "{d}" is forbidden: User "system:serviceaccount:poolpilot:op" '
          'cannot patch resource "deployments" in API group "apps"', "Forbidden"),
    (422, 'Deployment.apps "{d}" is invalid: spec.template.spec.containers[0].image: '
          'Required value (admission webhook "policy.example.com" denied the request)',
     "Rejected"),
], ids=["403-rbac", "422-webhook"])
def test_permanent_api_errors_degrade_with_the_api_message(
    cluster: Cluster, operator: None, status: int, message: str, reason: str
) -> None:
    name = next(_names)
    message, _ = _refuse(cluster, name, status, message)
    try:
        cluster.kubectl.apply(cluster.pool(name))
        _degraded(cluster, name, reason, status, message)
    finally:
        cluster.need_emulator().faults.clear()


@pytest.mark.parametrize("status,times", [(503, 2), (403, None)],
                         ids=["transient-503", "permanent-403"])
def test_an_error_while_writing_the_invalid_spec_status(cluster: Cluster, operator: None,
                                                        status: int, times: int | None) -> None:
    emu = cluster.need_emulator()
    name = next(_names)
    k = cluster.kubectl
    k.apply(cluster.pool(name))
    wait_for(lambda: cluster.settled(name), what="first reconcile")
    before = cluster.children(name)
    message = f'inferencepools.poolpilot.dev "{name}" is forbidden: cannot patch status'
    fault = emu.faults.add("PATCH", rf"/inferencepools/{name}/status$", status, times=times,
                           message=message)
    try:
        k.apply(cluster.pool(name, decode={"gpus": 0, "minReplicas": 5, "maxReplicas": 2,
                                           "replicas": 5}))
        if times is None:
            # The status cannot carry it: a Warning Event does, with the API's message.
            events = wait_for(lambda: cluster.events(name, "Forbidden"),
                              what="a Forbidden Event")
            assert events[0]["type"] == "Warning" and message in events[0]["message"]
            wait_for(lambda: fault.hits >= 2, what="a retry")
            assert (cluster.condition(name, "Degraded") or {}).get("reason") != "InvalidSpec"
    finally:
        emu.faults.clear()
    cond = wait_for(lambda: (c := cluster.condition(name, "Degraded")) and
                    c["reason"] == "InvalidSpec" and c, timeout=30,
                    what="Degraded/InvalidSpec once the status can be written")
    assert "spec.decode.maxReplicas" in cond["message"]
    assert cluster.children(name) == before  # nothing touched meanwhile


@pytest.mark.parametrize("force", [False, True], ids=["delete", "delete-finalizer-removed"])
def test_a_pool_deleted_mid_reconcile_leaves_nothing_behind(
    cluster: Cluster, operator: None, caplog: pytest.LogCaptureFixture, force: bool
) -> None:
    emu = cluster.need_emulator()
    name = next(_names)
    selector = f"{names.POOL_LABEL}={name}"

    def left() -> list[str]:
        return [f"{kind}/{o['metadata']['name']}" for kind in CHILD_KINDS + MONITOR_KINDS
                for o in emu.objects(kind, "ops", selector)]

    # The reconcile is held at its decode Deployment (the children before it exist) while the
    # pool is deleted; then it goes on writing. Kopf's finalizer keeps the pool until the
    # handler ends; with it removed by hand (force), the pool is gone and collected at once.
    held = emu.faults.add("PATCH", rf"/deployments/{name}-decode$", "delay", delay_s=60)
    try:
        cluster.kubectl.apply(cluster.pool(name))
        wait_for(lambda: held.hits >= 1, what="the reconcile to reach the decode Deployment")
        assert emu.get("configmaps", f"{name}-router", "ops") is not None
        emu.delete("inferencepools", name, "ops")
        if force:
            emu.patch("inferencepools", name, {"metadata": {"finalizers": None}}, "ops")
            wait_for(lambda: not left() or None, what="the collector to remove the children")
    finally:
        held.release()
    wait_for(lambda: emu.get("inferencepools", name, "ops") is None, what="the pool gone")
    if force:  # what it wrote after the pool was gone it deleted itself
        # (waited for: the held write may land after the collector emptied the namespace)
        gone = f"ops/{name}: deleted while being reconciled"
        wait_for(lambda: any(gone in r.getMessage() for r in caplog.records) or None,
                 timeout=30, what="the operator to delete what it wrote after the pool went")
    wait_for(lambda: not left() or None, timeout=30, what="no child left behind")
    errors = [r.getMessage() for r in caplog.records
              if f"ops/{name}" in r.getMessage() and r.levelname == "ERROR"]
    assert errors == []
    cluster.kubectl.apply(cluster.pool(name))  # the name is free for a new pool
    wait_for(lambda: cluster.settled(name), what="the new pool reconciled")


def test_api_faults_are_retried_and_converge(cluster: Cluster, operator: None) -> None:
    emu = cluster.need_emulator()
    name = next(_names)
    emu.faults.add("PATCH", rf"/deployments/{name}-decode$", 409, times=2)
    emu.faults.add("PATCH", rf"/configmaps/{name}-router$", 500, times=1)
    emu.faults.add("PATCH", rf"/services/{name}-prefill$", "timeout", times=1, delay_s=5)
    # The write lands but the answer is lost: the retry must not double anything.
    emu.faults.add("PATCH", rf"/poddisruptionbudgets/{name}-router$", 503, times=1, when="after")
    cluster.kubectl.apply(cluster.pool(name))
    wait_for(lambda: cluster.settled(name), timeout=90, what="convergence through faults")
    for kind, role in [("deployment", "decode"), ("configmap", "router"),
                       ("service", "prefill"), ("poddisruptionbudget", "router")]:
        assert cluster.get(kind, f"{name}-{role}") is not None
    assert not [f for f in emu.faults.rules if name in f.path]
    # A dropped watch: the operator reconnects and still sees the next change.
    assert emu.disconnect_watches(abrupt=True) > 0
    cluster.kubectl.apply(cluster.pool(name, router={"replicas": 3}))
    wait_for(lambda: (d := cluster.get("deployment", f"{name}-router")) and
             d["spec"]["replicas"] == 3, what="change seen after a watch disconnect")


def test_mode_switch_creates_new_workloads_before_removing_old(cluster: Cluster,
                                                               operator: None) -> None:
    emu = cluster.need_emulator()
    name = next(_names)
    k = cluster.kubectl
    k.apply(cluster.pool(name))
    wait_for(lambda: cluster.settled(name), what="first reconcile")
    k.apply(cluster.pool(name, mode="Aggregated"))
    wait_for(lambda: cluster.get("deployment", f"{name}-engine"), what="the engine Deployment")
    cluster.wait_reconciles(name, 2)
    # No engine pod is ready yet (nothing runs pods here): the old roles keep serving.
    assert cluster.get("deployment", f"{name}-prefill") is not None
    assert cluster.get("deployment", f"{name}-decode") is not None
    k("patch", "deployment", f"{name}-engine", "-n", "ops", "--subresource=status",
      "--type=merge", "-p", '{"status": {"replicas": 1, "readyReplicas": 1}}')
    wait_for(lambda: cluster.get("deployment", f"{name}-prefill") is None
             and cluster.get("deployment", f"{name}-decode") is None
             and cluster.get("service", f"{name}-decode") is None, what="old roles removed")
    writes = [(r.method, r.path) for r in emu.requests if r.is_write]
    created = writes.index(("PATCH", f"/apis/apps/v1/namespaces/ops/deployments/{name}-engine"))
    removed = writes.index(("DELETE", f"/apis/apps/v1/namespaces/ops/deployments/{name}-prefill"))
    assert created < removed
    status = (cluster.get("inferencepool", name) or {}).get("status") or {}
    assert "engine" in status and "prefill" not in status


@pytest.mark.parametrize("autoscaling,expected", [
    ({"enabled": True}, 5), ({"enabled": False}, 1), ({"enabled": True, "mode": "Advisory"}, 1),
    # KEDA's ScaledObject (through its HPA) or a plain HPA writes the scale subresource.
    ({"enabled": True, "mode": "External"}, 5),
], ids=["autoscaling-on-leaves-replicas", "autoscaling-off-enforces-spec",
        "advisory-enforces-spec", "external-leaves-replicas-to-keda"])
def test_replicas_ownership_with_autoscaling(cluster: Cluster, operator: None,
                                             autoscaling: dict[str, Any], expected: int) -> None:
    name = next(_names)
    k = cluster.kubectl
    k.apply(cluster.pool(name, autoscaling=autoscaling))
    wait_for(lambda: cluster.settled(name), what="first reconcile")
    k("scale", f"deployment/{name}-decode", "--replicas=5", "-n", "ops")  # as the autoscaler

    def decode_replicas() -> int:
        return int((cluster.get("deployment", f"{name}-decode") or {})["spec"]["replicas"])

    if cluster.emu is not None:
        cluster.wait_reconciles(name, 3)
        assert decode_replicas() == expected
    else:
        wait_for(lambda: decode_replicas() == expected, what=f"decode replicas == {expected}")
    # A spec change re-applies the Deployment: the size stays where its owner put it.
    k.apply(cluster.pool(name, autoscaling=autoscaling,
                         runtime={"engineArgs": {"maxModelLen": 1024}}))
    wait_for(lambda: "maxModelLen=1024" in (cluster.get("deployment", f"{name}-decode") or {})[
        "spec"]["template"]["spec"]["containers"][0]["command"], what="the new engine args")
    assert decode_replicas() == expected


def test_turning_autoscaling_on_keeps_the_current_size(cluster: Cluster, operator: None) -> None:
    name = next(_names)
    k = cluster.kubectl
    k.apply(cluster.pool(name, autoscaling={"enabled": False},
                         decode={"gpus": 0, "replicas": 3, "maxReplicas": 4}))
    wait_for(lambda: cluster.settled(name), what="first reconcile")
    k.apply(cluster.pool(name, autoscaling={"enabled": True},
                         decode={"gpus": 0, "replicas": 3, "maxReplicas": 4}))
    wait_for(lambda: cluster.settled(name), what="reconcile of the switch")
    assert (cluster.get("deployment", f"{name}-decode") or {})["spec"]["replicas"] == 3
    k("scale", f"deployment/{name}-decode", "--replicas=4", "-n", "ops")
    if cluster.emu is not None:
        cluster.wait_reconciles(name, 2)
    assert (cluster.get("deployment", f"{name}-decode") or {})["spec"]["replicas"] == 4


def test_a_pool_deleted_while_its_drift_timer_reconciles_goes_in_seconds(
    cluster: Cluster, operator: None
) -> None:
    # Kopf keeps its finalizer until the timer's reconcile has returned, then looks again after
    # `settings.background.cancellation_polling` (60 s by default): `kubectl delete` waited a
    # minute whenever a deletion met a drift repair.
    emu = cluster.need_emulator()
    name = next(_names)
    cluster.kubectl.apply(cluster.pool(name))
    wait_for(lambda: cluster.settled(name), what="first reconcile")
    # The timer's next reconcile reads the router's Deployment: held for 3 s.
    held = emu.faults.add("GET", rf"/deployments/{name}-router$", "delay", delay_s=3)
    wait_for(lambda: held.hits >= 1, what="the drift timer's reconcile held")
    cluster.kubectl("delete", "inferencepool", name, "-n", "ops", "--wait=false")
    wait_for(lambda: emu.get("inferencepools", name, "ops") is None, timeout=20,
             what="the pool gone once the held reconcile returned (not a minute later)")


def test_deleting_the_pool_garbage_collects_children(cluster: Cluster, operator: None) -> None:
    name = next(_names)
    k = cluster.kubectl
    k.apply(cluster.pool(name))
    wait_for(lambda: cluster.get("deployment", f"{name}-router"), what="children")
    k("delete", "inferencepool", name, "-n", "ops")

    def leftovers() -> list[str]:
        sel = f"{names.POOL_LABEL}={name}"
        return [o["metadata"]["name"] for kind in ("deployments", "services", "configmaps")
                for o in k.list(kind, "ops", sel)]

    wait_for(lambda: not leftovers() or None, what="children garbage-collected")
    assert leftovers() == []


def test_network_policies_follow_the_pool(cluster: Cluster, operator: None) -> None:
    name = next(_names)
    k = cluster.kubectl
    k.apply(cluster.pool(name, networkPolicy={"enabled": True}))
    wait_for(lambda: cluster.settled(name), what="first reconcile")
    for suffix in ("engines", "router"):
        policy = cluster.get("networkpolicy", f"{name}-{suffix}")
        assert policy is not None, suffix
        assert policy["metadata"]["ownerReferences"][0]["name"] == name
    k.apply(cluster.pool(name, networkPolicy={"enabled": False}))
    wait_for(lambda: cluster.get("networkpolicy", f"{name}-engines") is None
             and cluster.get("networkpolicy", f"{name}-router") is None,
             what="the NetworkPolicies removed")
    assert cluster.get("deployment", f"{name}-decode") is not None


def test_changes_the_router_does_not_read_leave_the_routers_running(cluster: Cluster,
                                                                    operator: None) -> None:
    name = next(_names)
    k = cluster.kubectl
    k.apply(cluster.pool(name))
    wait_for(lambda: cluster.settled(name), what="first reconcile")
    router = cluster.get("deployment", f"{name}-router") or {}
    decode = cluster.get("deployment", f"{name}-decode") or {}
    # Served name and SLO quantile: the engines' command changes, the router's config does not.
    k.apply(cluster.pool(name, model={"name": "org/model", "servedName": "alias"},
                         slo={"ttft": {"quantile": 0.99, "seconds": 1.0}}))
    wait_for(lambda: cluster.settled(name), what="the change reconciled")
    wait_for(lambda: (d := cluster.get("deployment", f"{name}-decode")) and
             d["metadata"]["generation"] > decode["metadata"]["generation"],
             what="the engines rolled")
    after = cluster.get("deployment", f"{name}-router") or {}
    assert after["metadata"]["generation"] == router["metadata"]["generation"]
    assert after["spec"]["template"] == router["spec"]["template"]
    # What the router reads (the SLO seconds) rolls it.
    k.apply(cluster.pool(name, model={"name": "org/model", "servedName": "alias"},
                         slo={"ttft": {"quantile": 0.99, "seconds": 2.5}}))
    wait_for(lambda: (d := cluster.get("deployment", f"{name}-router")) and
             d["metadata"]["generation"] > router["metadata"]["generation"],
             what="the routers rolled")


def test_names_taken_by_objects_not_the_pools_are_left_alone(cluster: Cluster,
                                                             operator: None) -> None:
    """A ConfigMap, a RoleBinding and a Deployment that a user made under the names the pool's
    children would have: the operator leaves each byte-identical, says which in a NameConflict
    condition, makes the rest of the pool, and deleting the pool leaves the three in place."""
    name = next(_names)
    k = cluster.kubectl
    labels = {"app": "mine"}
    theirs = [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{name}-router",
         "namespace": "ops"}, "data": {"keep": "me"}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": f"{name}-router", "namespace": "ops"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": "view"},
         "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": "ops"}]},
        {"apiVersion": "apps/v1", "kind": "Deployment",
         "metadata": {"name": f"{name}-decode", "namespace": "ops"},
         "spec": {"replicas": 0, "selector": {"matchLabels": labels},
                  "template": {"metadata": {"labels": labels}, "spec": {"containers": [
                      {"name": "app", "image": "example.com/app:1"}]}}}},
    ]
    for obj in theirs:
        k.apply(obj)
    kinds = {"ConfigMap": "configmap", "RoleBinding": "rolebinding", "Deployment": "deployment"}
    before = {o["kind"]: cluster.get(kinds[o["kind"]], o["metadata"]["name"]) for o in theirs}
    k.apply(cluster.pool(name))

    def conflict() -> dict[str, Any] | None:
        cond = cluster.condition(name, "Degraded")
        return cond if cond and cond.get("reason") == "NameConflict" else None

    conflicts = reconciles("name_conflict") + reconciles("name_conflict", "timer")
    cond = wait_for(conflict, what="Degraded=NameConflict")
    wait_for(lambda: reconciles("name_conflict") + reconciles("name_conflict", "timer")
             > conflicts or None, what="the operator's metrics count the conflict")
    for obj in theirs:
        assert f"{obj['kind']}/{obj['metadata']['name']}" in cond["message"]
    wait_for(lambda: cluster.get("deployment", f"{name}-prefill"), what="the pool's own children")
    cluster.wait_reconciles(name) if cluster.emu is not None else None
    for kind, obj in before.items():
        assert cluster.get(kinds[kind], obj["metadata"]["name"]) == obj, kind

    k("delete", "inferencepool", name, "-n", "ops")
    wait_for(lambda: cluster.get("deployment", f"{name}-prefill") is None or None,
             what="the pool's own children garbage-collected")
    for kind, obj in before.items():
        assert cluster.get(kinds[kind], obj["metadata"]["name"]) == obj, kind
    for obj in theirs:
        k("delete", kinds[obj["kind"]], obj["metadata"]["name"], "-n", "ops")

"""Pod templates, RDMA, drain and resource defaults: what a platform team adds to the pods the
operator renders reaches them, merged as a strategic merge patch would; what the operator must
own is refused with the field named; every result is a valid Kubernetes object."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from poolpilot.operator import builders, render

from poolpilot import api, names
from poolpilot.validate import InvalidPool, parse_spec

ROOT = Path(__file__).resolve().parents[3]
PRODUCTION = ROOT / "examples" / "llama-8b-production.yaml"
K8S_VERSION = kubernetes_validate.latest_version()
UID = "6a1c1d4e-0000-4000-8000-000000000002"


def _pool(spec: dict[str, Any]) -> builders.Pool:
    return builders.Pool("p", "ns", parse_spec({"model": {"name": "m"}, **spec}), uid=UID)


def _template(dep: dict[str, Any]) -> dict[str, Any]:
    t: dict[str, Any] = dep["spec"]["template"]
    return t


def _container(dep: dict[str, Any]) -> dict[str, Any]:
    c: dict[str, Any] = _template(dep)["spec"]["containers"][0]
    return c


def _production() -> builders.Pool:
    (pool,) = render.pools_from_file(PRODUCTION)
    return builders.Pool(pool.name, pool.namespace, pool.spec, uid=UID)


def test_every_overlay_field_reaches_the_pods_and_every_object_is_valid() -> None:
    pool = _production()
    objs = builders.build_children(pool, builders.Capabilities(monitoring=True))
    for obj in objs:
        if not obj["apiVersion"].startswith("monitoring.coreos.com"):
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    deps = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Deployment"}
    decode, prefill = deps["llama-8b-prod-decode"], deps["llama-8b-prod-prefill"]
    router = deps["llama-8b-prod-router"]
    meta, pod, c = _template(decode)["metadata"], _template(decode)["spec"], _container(decode)
    # The pool's template, then the role's over it.
    assert meta["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-serving"
    assert meta["labels"]["capacity"] == "spot"
    assert meta["labels"][names.POOL_UID_LABEL] == UID  # the operator's labels stay
    assert meta["annotations"]["cluster-autoscaler.kubernetes.io/safe-to-evict"] == "false"
    assert (pod["priorityClassName"], pod["runtimeClassName"], pod["schedulerName"],
            pod["serviceAccountName"]) == ("inference-high", "nvidia", "default-scheduler",
                                           "llm-engines")
    assert [s["name"] for s in pod["imagePullSecrets"]] == ["registry-example-com",
                                                           "registry-mirror"]
    assert [t["key"] for t in pod["tolerations"]] == ["nvidia.com/gpu",
                                                     "karpenter.sh/capacity-type"]
    assert "preferredDuringSchedulingIgnoredDuringExecution" in pod["affinity"]["nodeAffinity"]
    assert "requiredDuringSchedulingIgnoredDuringExecution" in \
        _template(prefill)["spec"]["affinity"]["nodeAffinity"]
    assert {"name": "ca-bundle", "configMap": {"name": "corporate-ca"}} in pod["volumes"]
    assert {"name": "ca-bundle", "mountPath": "/etc/ssl/corporate", "readOnly": True} \
        in c["volumeMounts"]
    env = {e["name"]: e for e in c["env"]}
    assert env["VLLM_LOGGING_LEVEL"]["value"] == "INFO"
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert c["envFrom"] == [{"configMapRef": {"name": "platform-env"}}]
    assert c["resources"]["limits"]["hugepages-2Mi"] == "1Gi"
    assert pod["terminationGracePeriodSeconds"] == 110  # the role's
    cmd = c["command"]
    assert cmd[cmd.index("--grace-seconds") + 1] == "110"
    # Engine-pod fields stay off the routers; the router's own template reaches them.
    rpod = _template(router)["spec"]
    assert "tolerations" not in rpod and rpod["serviceAccountName"] == "llama-8b-prod-router"
    assert rpod["priorityClassName"] == "inference-high"
    assert {"name": "PYTHONUNBUFFERED", "value": "1"} in _container(router)["env"]


def test_rdma_configures_the_device_capability_ucx_and_networks() -> None:
    dep = builders.build_engine_deployment(_production(), "prefill")
    c, meta = _container(dep), _template(dep)["metadata"]
    assert c["resources"]["requests"]["rdma/ib"] == c["resources"]["limits"]["rdma/ib"] == "1"
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["UCX_TLS"] == "rc,ud,sm,self,cuda_copy,cuda_ipc"
    assert env["UCX_NET_DEVICES"] == "mlx5_0:1"
    assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5600"
    assert {"name": "nixl", "containerPort": 5600, "protocol": "TCP"} in c["ports"]
    assert meta["annotations"][builders.MULTUS_NETWORKS] == "serving/ib-net"


def test_without_rdma_nothing_of_it_is_rendered() -> None:
    c = _container(builders.build_engine_deployment(_pool({}), "decode"))
    assert "add" not in c["securityContext"]["capabilities"]
    assert not {"UCX_TLS", "UCX_NET_DEVICES"} & {e["name"] for e in c["env"]}
    agg = _container(builders.build_engine_deployment(_pool({"mode": "Aggregated"}), "engine"))
    assert [p["name"] for p in agg["ports"]] == ["http", "metrics"]  # no NIXL side channel


@dataclass(frozen=True)
class MergeCase:
    id: str
    pool_template: dict[str, Any]
    role_template: dict[str, Any]
    check: str  # a path into the rendered pod template
    expected: Any


def _node_affinity(zone: str) -> dict[str, Any]:
    return {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In",
                               "values": [zone]}]}]}}


_NODE_A, _NODE_B = _node_affinity("a"), _node_affinity("b")
_ANTI = {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 10, "podAffinityTerm": {
    "topologyKey": "kubernetes.io/hostname",
    "labelSelector": {"matchLabels": {"team": "x"}}}}]}

MERGE_CASES = [
    MergeCase("labels merge, role over pool",
              {"metadata": {"labels": {"a": "pool", "b": "pool"}}},
              {"metadata": {"labels": {"b": "role"}}},
              "metadata.labels", {"a": "pool", "b": "role"}),
    MergeCase("an annotation replaces the operator's of the same key",
              {"metadata": {"annotations": {"prometheus.io/scrape": "false"}}}, {},
              "metadata.annotations.prometheus.io/scrape", "false"),
    MergeCase("affinity: the role's replaces the pool's per kind",
              {"spec": {"affinity": {"nodeAffinity": _NODE_A, "podAntiAffinity": _ANTI}}},
              {"spec": {"affinity": {"nodeAffinity": _NODE_B}}},
              "spec.affinity", {"nodeAffinity": _NODE_B, "podAntiAffinity": _ANTI}),
    MergeCase("node selectors merge over runtime's",
              {"spec": {"nodeSelector": {"pool": "gpu"}}},
              {"spec": {"nodeSelector": {"zone": "a"}}},
              "spec.nodeSelector", {"gpu": "h100", "pool": "gpu", "zone": "a"}),
    MergeCase("scalars: the role's over the pool's",
              {"spec": {"priorityClassName": "low", "schedulerName": "volcano"}},
              {"spec": {"priorityClassName": "high"}},
              "spec.priorityClassName", "high"),
    MergeCase("volumes merge by name",
              {"spec": {"volumes": [{"name": "data", "emptyDir": {}}]}},
              {"spec": {"volumes": [{"name": "data", "configMap": {"name": "c"}}]}},
              "spec.volumes[-1]", {"name": "data", "configMap": {"name": "c"}}),
    MergeCase("env merges by name over the operator's",
              {"spec": {"containers": [{"name": "engine", "env": [
                  {"name": "HF_HOME", "value": "/cache"}]}]}}, {},
              "env.HF_HOME", "/cache"),
    MergeCase("capabilities add up",
              {"spec": {"containers": [{"name": "engine", "securityContext": {
                  "capabilities": {"add": ["NET_RAW"]}}}]}},
              {"spec": {"containers": [{"name": "engine", "securityContext": {
                  "capabilities": {"add": ["SYS_NICE"]}}}]}},
              "c.securityContext.capabilities", {"drop": ["ALL"], "add": ["NET_RAW", "SYS_NICE"]}),
    MergeCase("resources: the template's over the role's, GPUs from gpus",
              {"spec": {"containers": [{"name": "engine", "resources": {
                  "requests": {"cpu": "4"}, "limits": {"memory": "64Gi"}}}]}}, {},
              "c.resources.limits", {"memory": "64Gi", "nvidia.com/gpu": "1"}),
]


def _at(template: dict[str, Any], path: str) -> Any:
    c = template["spec"]["containers"][0]
    if path.startswith("env."):
        return next(e["value"] for e in c["env"] if e["name"] == path[4:])
    node: Any = c if path.startswith("c.") else template
    parts = path.removeprefix("c.").split(".", 2)
    if parts[:2] == ["metadata", "annotations"]:
        return node["metadata"]["annotations"][parts[2]]
    for part in path.removeprefix("c.").split("."):
        node = node[part[:-4]][-1] if part.endswith("[-1]") else node[part]
    return node


@pytest.mark.parametrize("case", MERGE_CASES, ids=[c.id for c in MERGE_CASES])
def test_templates_merge_like_a_strategic_merge_patch(case: MergeCase) -> None:
    pool = _pool({"runtime": {"nodeSelector": {"gpu": "h100"}},
                  "podTemplate": case.pool_template, "decode": {"podTemplate": case.role_template}})
    dep = builders.build_engine_deployment(pool, "decode")
    got = _at(_template(dep), case.check)
    if case.check == "metadata.labels":
        got = {k: v for k, v in got.items() if k in case.expected}
    assert got == case.expected
    kubernetes_validate.validate(dep, K8S_VERSION, strict=True)


@dataclass(frozen=True)
class RefusedCase:
    id: str
    spec: dict[str, Any]
    error: str  # the start of one error line: the field's path, then why


def _engine(**fields: Any) -> dict[str, Any]:
    return {"podTemplate": {"spec": {"containers": [{"name": "engine", **fields}]}}}


REFUSED = [
    RefusedCase("the container's image", _engine(image="x"),
                "spec.podTemplate.spec.containers[0].image: set by the operator from "
                "spec.runtime.image"),
    RefusedCase("its command", _engine(command=["sh"]),
                "spec.podTemplate.spec.containers[0].command: set by the operator"),
    RefusedCase("its ports", _engine(ports=[{"containerPort": 1}]),
                "spec.podTemplate.spec.containers[0].ports: set by the operator"),
    RefusedCase("a probe", _engine(readinessProbe={}),
                "spec.podTemplate.spec.containers[0].readinessProbe: set by the operator"),
    RefusedCase("another container", {"podTemplate": {"spec": {"containers": [
        {"name": "router"}]}}},
        "spec.podTemplate.spec.containers: these pods' container is engine"),
    RefusedCase("a label the selectors use",
                {"podTemplate": {"metadata": {"labels": {"poolpilot.dev/role": "decode"}}}},
                "spec.podTemplate.metadata.labels: poolpilot.dev/role is set by the operator"),
    RefusedCase("app.kubernetes.io/managed-by",
                {"decode": {"podTemplate": {"metadata": {"labels": {
                    "app.kubernetes.io/managed-by": "me"}}}}},
                "spec.decode.podTemplate.metadata.labels: app.kubernetes.io/managed-by is set"),
    RefusedCase("the model volume",
                {"podTemplate": {"spec": {"volumes": [{"name": "model-cache", "emptyDir": {}}]}}},
                "spec.podTemplate.spec.volumes: model-cache: a volume of the operator's"),
    RefusedCase("a mount over the model cache", _engine(volumeMounts=[
        {"name": "x", "mountPath": "/model-cache"}]),
        "spec.podTemplate.spec.containers[0].volumeMounts: /model-cache: the operator mounts"),
    RefusedCase("the pod's securityContext", {"podTemplate": {"spec": {"securityContext": {}}}},
                "spec.podTemplate.spec.securityContext: set by the operator"),
    RefusedCase("privileged", _engine(securityContext={"privileged": True}),
                "spec.podTemplate.spec.containers[0].securityContext.privileged: set by the "
                "operator"),
    RefusedCase("the grace period in the template",
                {"prefill": {"podTemplate": {"spec": {"terminationGracePeriodSeconds": 5}}}},
                "spec.prefill.podTemplate.spec.terminationGracePeriodSeconds: set by the "
                "operator from the role's terminationGracePeriodSeconds"),
    RefusedCase("an env the launcher reads", _engine(env=[{"name": "POOLPILOT_ROLE",
                                                           "value": "x"}]),
                "spec.podTemplate.spec.containers[0].env: POOLPILOT_ROLE: set by the operator"),
    RefusedCase("GPUs through the template", _engine(resources={"limits": {
        "nvidia.com/gpu": 2}}),
        "spec.podTemplate.spec.containers[0].resources.limits: nvidia.com/gpu is set from"),
    RefusedCase("the router's service account",
                {"router": {"podTemplate": {"spec": {"serviceAccountName": "x"}}}},
                "spec.router.podTemplate.spec.serviceAccountName: the router's discovery"),
    RefusedCase("a field pod templates do not take",
                {"podTemplate": {"spec": {"hostPID": True}}},
                "spec.podTemplate.spec.hostPID: unknown field"),
]


@pytest.mark.parametrize("case", REFUSED, ids=[c.id for c in REFUSED])
def test_fields_the_operator_owns_are_refused_by_name(case: RefusedCase) -> None:
    with pytest.raises(InvalidPool) as exc:
        parse_spec({"model": {"name": "m"}, **case.spec})
    assert any(e.startswith(case.error) for e in exc.value.errors), exc.value.errors


def test_an_owned_field_set_to_null_is_unset_as_the_api_server_reads_it() -> None:
    """The API server prunes nulls before validating; the models agree (found by the fuzz)."""
    spec = parse_spec({"model": {"name": "m"}, "podTemplate": {
        "metadata": {"name": None}, "spec": {"containers": [{"name": "engine", "image": None}]}}})
    assert spec.pod_template.metadata.labels == {}
    assert spec.pod_template.spec.containers[0].name == "engine"


@dataclass(frozen=True)
class RouterResourcesCase:
    id: str
    resources: dict[str, Any]
    expected: dict[str, Any] = field(default_factory=dict)


ROUTER_RESOURCES = [
    RouterResourcesCase("defaults", {}, {"requests": {"cpu": "500m", "memory": "512Mi"},
                                         "limits": {"memory": "2Gi"}}),
    RouterResourcesCase("the user's over the defaults", {"requests": {"cpu": "2"}},
                        {"requests": {"cpu": "2", "memory": "512Mi"},
                         "limits": {"memory": "2Gi"}}),
    # A default request above the user's limit would be refused by the API server.
    RouterResourcesCase("a default request lowered to the user's limit",
                        {"limits": {"cpu": "250m", "memory": "256Mi"}},
                        {"requests": {"cpu": "250m", "memory": "256Mi"},
                         "limits": {"cpu": "250m", "memory": "256Mi"}}),
]


@pytest.mark.parametrize("case", ROUTER_RESOURCES, ids=[c.id for c in ROUTER_RESOURCES])
def test_router_resources(case: RouterResourcesCase) -> None:
    dep = builders.build_router_deployment(_pool({"router": {"resources": case.resources}}))
    assert _container(dep)["resources"] == case.expected
    kubernetes_validate.validate(dep, K8S_VERSION, strict=True)


@pytest.mark.parametrize(("role", "grace", "shutdown"), [
    ("prefill", 120, 105), ("decode", 120, 105), ("decode", 16, 1), ("prefill", 40, 25),
], ids=["prefill-default", "decode-default", "decode-least", "prefill-least-with-nixl"])
def test_the_drain_vllm_gets_is_the_role_grace_less_prestop_and_teardown(
        role: str, grace: int, shutdown: int) -> None:
    from poolpilot.runtime import launcher

    pool = _pool({role: {"terminationGracePeriodSeconds": grace}})
    dep = builders.build_engine_deployment(pool, role)
    pod, c = _template(dep)["spec"], _container(dep)
    assert pod["terminationGracePeriodSeconds"] == grace
    assert c["lifecycle"]["preStop"]["exec"]["command"] == ["sleep",
                                                            str(builders.PRESTOP_SLEEP_SECONDS)]
    # What the launcher in the pod makes of its command line.
    parser = __import__("argparse").ArgumentParser()
    launcher.add_arguments(parser)
    args = parser.parse_args(c["command"][2:])
    vllm = launcher.build_command(launcher.spec_from_args(args))
    assert vllm[vllm.index("--shutdown-timeout") + 1] == str(shutdown)
    if role == "prefill":  # it holds KV for its decode engines as long as the lease
        assert shutdown >= api.MIN_PREFILL_NIXL_GRACE_SECONDS - builders.PRESTOP_SLEEP_SECONDS \
            - launcher.TEARDOWN_MARGIN_S


def test_every_volume_the_operator_renders_is_one_templates_may_not_take() -> None:
    pool = _pool({"router": {"apiKeySecret": {"name": "k"}}})
    rendered = {v["name"]: m["mountPath"]
                for dep in (builders.build_engine_deployment(pool, "decode"),
                            builders.build_router_deployment(pool))
                for v in _template(dep)["spec"]["volumes"]
                for m in _container(dep)["volumeMounts"] if m["name"] == v["name"]}
    pvc = _pool({"model": {"name": "m", "source": {"pvc": {"claimName": "w"}}}})
    rendered.update({m["name"]: m["mountPath"] for m in
                     _container(builders.build_engine_deployment(pvc, "decode"))["volumeMounts"]})
    assert rendered == api.OWNED_VOLUMES


_KEYS = st.from_regex(r"\A([a-z]{1,8}\.)?[a-z]{1,8}/?[a-z][a-z0-9-]{0,10}[a-z0-9]\Z")
_VALUES = st.from_regex(r"\A([A-Za-z0-9]([-A-Za-z0-9_.]{0,20}[A-Za-z0-9])?)?\Z")


@settings(max_examples=60, deadline=None)
@given(pool_labels=st.dictionaries(_KEYS, _VALUES, max_size=4),
       role_labels=st.dictionaries(_KEYS, _VALUES, max_size=4),
       role=st.sampled_from(["prefill", "decode"]))
def test_no_template_label_can_take_a_pod_out_of_its_services(
        pool_labels: dict[str, str], role_labels: dict[str, str], role: str) -> None:
    """Whatever labels the templates add, the role's Service, budget and policies still select
    its pods, and every added label is on them (the role's winning)."""
    try:
        pool = _pool({"podTemplate": {"metadata": {"labels": pool_labels}},
                      role: {"podTemplate": {"metadata": {"labels": role_labels}}}})
    except InvalidPool:
        return  # a key the API refuses (an owned one, or not a qualified name)
    labels = _template(builders.build_engine_deployment(pool, role))["metadata"]["labels"]
    service = builders.build_engine_service(pool, role)
    assert service["spec"]["selector"].items() <= labels.items()
    assert builders.build_pdb(pool, role)["spec"]["selector"]["matchLabels"].items() \
        <= labels.items()
    assert {**pool_labels, **role_labels}.items() <= labels.items()

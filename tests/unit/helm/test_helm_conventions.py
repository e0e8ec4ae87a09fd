"""Chart conventions users expect: every value described, ServiceAccounts (created or yours),
priority classes, pod labels, securityContext overrides (OpenShift), the autoscaler's two
replicas with leader election, and every container's arguments accepted by the real CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from chartlib import CHART, by_kind, one, pod_spec, render, restricted_violations

from poolpilot import cli


def _paths(values: dict[str, Any], schema: dict[str, Any], prefix: str = ""
           ) -> list[tuple[str, dict[str, Any] | None]]:
    """(path, schema node or None) of every key in values.yaml, descending where the schema
    lists properties (free-form maps such as podLabels or resources are leaves)."""
    out: list[tuple[str, dict[str, Any] | None]] = []
    for key, value in values.items():
        node = (schema.get("properties") or {}).get(key)
        path = f"{prefix}{key}"
        out.append((path, node))
        if node is not None and isinstance(value, dict) and "properties" in node:
            out += _paths(value, node, path + ".")
    return out


def test_every_value_is_described_in_the_schema() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    schema = json.loads((CHART / "values.schema.json").read_text())
    paths = _paths(values, schema)
    assert len(paths) > 100
    missing = [p for p, node in paths if node is None]
    assert missing == [], f"values.yaml keys the schema does not know: {missing}"
    undescribed = [p for p, node in paths if not (node or {}).get("description")]
    assert undescribed == [], f"values without a description in values.schema.json: {undescribed}"


def _pod(objs: list[dict[str, Any]], component: str) -> dict[str, Any]:
    spec = pod_spec(one(objs, "Deployment", f"-{component}"))
    assert spec is not None
    return spec


def test_serviceaccounts_created_or_brought(tmp_path: Path) -> None:
    default = render(tmp=tmp_path)
    assert sorted(s["metadata"]["name"] for s in by_kind(default, "ServiceAccount")) == [
        "pp-poolpilot-autoscaler", "pp-poolpilot-operator"]
    mine = render({"serviceAccount": {"create": False, "name": "platform-sa"}}, tmp=tmp_path)
    assert by_kind(mine, "ServiceAccount") == []
    for component in ("operator", "autoscaler"):
        assert _pod(mine, component)["serviceAccountName"] == "platform-sa"
    subjects = {s["name"] for kind in ("RoleBinding", "ClusterRoleBinding")
                for b in by_kind(mine, kind) for s in b["subjects"]}
    assert subjects == {"platform-sa"}
    one_created = render({"serviceAccount": {"name": "shared"}}, tmp=tmp_path)
    assert [s["metadata"]["name"] for s in by_kind(one_created, "ServiceAccount")] == ["shared"]


def test_priority_classes_and_pod_labels(tmp_path: Path) -> None:
    objs = render({"priorityClassName": "platform", "podLabels": {"team": "ml"},
                   "autoscaler": {"priorityClassName": "critical", "podLabels": {"team": "ops"}},
                   "imagePullSecrets": [{"name": "regcred"}]}, tmp=tmp_path)
    assert _pod(objs, "operator")["priorityClassName"] == "platform"
    assert _pod(objs, "autoscaler")["priorityClassName"] == "critical"
    op_labels = one(objs, "Deployment", "-operator")["spec"]["template"]["metadata"]["labels"]
    as_labels = one(objs, "Deployment", "-autoscaler")["spec"]["template"]["metadata"]["labels"]
    assert (op_labels["team"], as_labels["team"]) == ("ml", "ops")
    assert op_labels["app.kubernetes.io/component"] == "operator"  # the chart's still there
    test_pod = one(objs, "Pod", "-test")
    assert test_pod["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
    assert test_pod["spec"]["priorityClassName"] == "platform"
    # Pod labels cannot take over the selector's labels.
    clash = render({"podLabels": {"app.kubernetes.io/component": "x"}}, tmp=tmp_path)
    assert one(clash, "Deployment", "-operator")["spec"]["template"]["metadata"]["labels"][
        "app.kubernetes.io/component"] == "operator"


def test_openshift_drops_the_fixed_ids(tmp_path: Path) -> None:
    objs = render({"podSecurityContext": {"runAsUser": None, "runAsGroup": None,
                                          "fsGroup": None}}, tmp=tmp_path)
    for component in ("operator", "autoscaler"):
        sc = _pod(objs, component)["securityContext"]
        assert not {"runAsUser", "runAsGroup", "fsGroup"} & set(sc), sc
        assert sc["runAsNonRoot"] is True
        assert restricted_violations(_pod(objs, component)) == []
    custom = render({"securityContext": {"readOnlyRootFilesystem": True,
                                         "allowPrivilegeEscalation": False,
                                         "capabilities": {"drop": ["ALL"]},
                                         "runAsNonRoot": True,
                                         "seccompProfile": {"type": "Localhost",
                                                            "localhostProfile": "p.json"}}},
                    tmp=tmp_path)
    c = _pod(custom, "operator")["containers"][0]
    assert c["securityContext"]["seccompProfile"]["type"] == "Localhost"


def test_autoscaler_runs_two_replicas_with_leader_election(tmp_path: Path) -> None:
    objs = render(tmp=tmp_path)
    dep = one(objs, "Deployment", "-autoscaler")
    assert dep["spec"]["replicas"] == 2
    assert dep["spec"]["strategy"]["type"] == "RollingUpdate"
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--leader-elect" in args
    assert args[args.index("--leader-election-name") + 1] == "pp-poolpilot-autoscaler"
    assert args[args.index("--lease-duration") + 1] == "15"
    env = {e["name"] for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert {"POD_NAME", "POD_NAMESPACE"} <= env  # identity and the Lease's namespace
    role = one(objs, "Role", "-autoscaler-leader")
    assert role["metadata"]["namespace"] == "poolpilot-system"
    named = [r for r in role["rules"] if r.get("resourceNames")]
    assert named == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                      "resourceNames": ["pp-poolpilot-autoscaler"], "verbs": ["get", "update"]}]
    assert one(objs, "PodDisruptionBudget", "-autoscaler")["spec"]["minAvailable"] == 1
    single = render({"autoscaler": {"replicas": 1}}, tmp=tmp_path)
    assert "--leader-elect" not in _pod(single, "autoscaler")["containers"][0]["args"]
    assert [r for r in by_kind(single, "Role") if "leader" in r["metadata"]["name"]] == []
    assert [p for p in by_kind(single, "PodDisruptionBudget")
            if p["metadata"]["name"].endswith("-autoscaler")] == []


SECURED = {"prometheus": {"url": "https://thanos.monitoring.svc:9091",
                          "tls": {"caConfigMap": "openshift-service-ca.crt",
                                  "caKey": "service-ca.crt", "clientCertSecret": "prom-client"},
                          "basicAuth": {"secret": "prom-basic"},
                          "headers": {"X-Scope-OrgID": "team-a"}},
           "monitoring": {"labels": {"release": "kps", "team": "ml"}}}


@pytest.mark.parametrize("values", [
    {}, SECURED, {"watchNamespaces": ["team-a", "team-b"]},
    {"prometheus": {"bearerToken": {"serviceAccountToken": True},
                    "tls": {"insecureSkipVerify": True}}},
    {"autoscaler": {"replicas": 1, "interval": "7.5", "dryRun": True}},
], ids=["defaults", "secured-basic-auth-mtls", "namespaced", "sa-token-insecure",
        "single-dry-run"])
@pytest.mark.parametrize("component", ["operator", "autoscaler"])
def test_container_args_are_accepted_by_the_real_cli(values: dict[str, Any], component: str,
                                                     tmp_path: Path) -> None:
    container = _pod(render(values, tmp=tmp_path), component)["containers"][0]
    env = {e["name"]: "value-from-secret" for e in container.get("env", [])}
    args = [a.replace("$(PROMETHEUS_USERNAME)", env.get("PROMETHEUS_USERNAME", "?"))
            for a in container["args"]]
    try:
        parsed = cli.build_parser(args).parse_args(args)
    except SystemExit as exc:
        pytest.fail(f"poolpilot {' '.join(args)} is rejected ({exc})")
    assert parsed.command == component
    assert parsed.namespace == values.get("watchNamespaces", [])
    if component == "operator":
        assert parsed.require_peering and parsed.peering == "poolpilot"
    if component == "autoscaler" and values is SECURED:
        mounts = {m["mountPath"] for m in container["volumeMounts"]}
        for flag in ("prometheus_ca_file", "prometheus_cert_file", "prometheus_key_file",
                     "prometheus_password_file"):
            path = getattr(parsed, flag)
            assert path and str(Path(path).parent) in mounts, flag
        assert parsed.prometheus_username == "value-from-secret"
        assert parsed.prometheus_header == ["X-Scope-OrgID: team-a"]
    if component == "operator" and values is SECURED:
        assert sorted(parsed.monitor_label) == ["release=kps", "team=ml"]

"""The Helm chart: lint, render with several values files, validate every manifest, RBAC and
security checks, and the generated rules/dashboards/CRD kept identical to their sources."""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from chartlib import (
    CHART,
    K8S_VERSION,
    ROOT,
    by_kind,
    helm,
    one,
    pod_spec,
    render,
    restricted_violations,
    tool,
)
from monitoring_schemas import SCHEMAS
from poolpilot.autoscaler.shard import Shard
from poolpilot.dashboards import generate, rules
from poolpilot.emulator import crd_validation

MONITORING = {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True},
              "labels": {"release": "kube-prometheus-stack"}}


@dataclass(frozen=True)
class Case:
    id: str
    values: dict[str, Any] = field(default_factory=dict)


CASES = [
    Case("defaults"),
    Case("namespaced", {"watchNamespaces": ["team-a", "team-b"]}),
    Case("monitoring-on", {"monitoring": MONITORING, "prometheusRule": {"enabled": True}}),
    Case("monitoring-on-namespaced", {"watchNamespaces": ["serving"], "monitoring": MONITORING,
                                      "prometheusRule": {"enabled": True}}),
    Case("monitoring-off", {"monitoring": {"serviceMonitor": {"enabled": False},
                                           "podMonitor": {"enabled": False}},
                            "prometheusRule": {"enabled": False},
                            "grafana": {"dashboards": {"enabled": False}}}),
    Case("custom-images", {"image": {"repository": "registry.example.com/ml/poolpilot",
                                     "tag": "1.2.3", "pullPolicy": "Always"},
                           "imagePullSecrets": [{"name": "regcred"}],
                           "prometheus": {"url": "http://prom.monitoring:9090"}}),
    Case("autoscaler-only", {"operator": {"enabled": False}}),
    Case("sharded", {"autoscaler": {"shards": 3}}),
    Case("prepull", {"prepull": {"enabled": True, "extraImages": ["registry.example.com/rt:2"],
                                 "nodeSelector": {"nvidia.com/gpu.present": "true"},
                                 "tolerations": [{"key": "nvidia.com/gpu",
                                                  "operator": "Exists"}]}}),
]


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    out = {}
    for case in CASES:
        out[case.id] = render(case.values, tmp=tmp_path_factory.mktemp(case.id))
    return out


def test_chart_crd_is_identical_to_the_generated_crd() -> None:
    chart_crd = (CHART / "files" / "crds" / "inferencepool.yaml").read_text()
    assert chart_crd == (ROOT / "crds" / "inferencepool.yaml").read_text(), (
        "charts/poolpilot/files/crds/inferencepool.yaml drifted; run: "
        "poolpilot dashboards --write"
    )


def test_generated_dashboards_and_rules_are_current() -> None:
    diff = generate.drift(CHART)
    assert diff == "", f"stale generated files; run: poolpilot dashboards --write\n{diff}"


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_helm_lint(case: Case, tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(case.values))
    proc = helm("lint", "--strict", str(CHART), "--values", str(values), check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_every_rendered_manifest_is_valid(case: Case,
                                          rendered: dict[str, list[dict[str, Any]]]) -> None:
    crds = {o["metadata"]["name"]: o for o in by_kind(rendered[case.id],
                                                      "CustomResourceDefinition")}
    for obj in rendered[case.id]:
        name = f"{obj['kind']}/{obj['metadata']['name']}"
        group = obj["apiVersion"].split("/")[0]
        if group == "monitoring.coreos.com":
            jsonschema.validate(obj, SCHEMAS[obj["kind"]])
        elif group == "kopf.dev":
            # The API server checks apiVersion/kind/metadata itself; the CRD schema the rest.
            crd = crds[f"{obj['kind'].lower()}s.kopf.dev"]
            body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
            _, errors = crd_validation.validate(crd, body)
            assert not errors, f"{name}: {errors}"
        else:
            try:
                kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(f"{name}: {exc.message} at {list(exc.path)}")


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_pods_meet_the_restricted_pod_security_standard(
        case: Case, rendered: dict[str, list[dict[str, Any]]]) -> None:
    pods = [(o, pod_spec(o)) for o in rendered[case.id]]
    pods = [(o, s) for o, s in pods if s is not None]
    assert pods
    for obj, spec in pods:
        assert restricted_violations(spec) == [], obj["metadata"]["name"]
        for c in spec["containers"]:
            assert c["securityContext"]["readOnlyRootFilesystem"] is True
            assert "limits" in c["resources"] and "requests" in c["resources"]


def test_restricted_checker_flags_a_root_privileged_pod() -> None:
    bad = {"containers": [{"name": "c", "securityContext": {"privileged": True,
                                                            "runAsUser": 0}}]}
    assert len(restricted_violations(bad)) >= 4


def _args(objs: list[dict[str, Any]], component: str) -> list[str]:
    dep = one(objs, "Deployment", f"-{component}")
    args: list[str] = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    return args


def test_defaults_watch_all_namespaces_with_two_peered_operator_replicas(
        rendered: dict[str, list[dict[str, Any]]]) -> None:
    objs = rendered["defaults"]
    op = one(objs, "Deployment", "-operator")
    assert op["spec"]["replicas"] == 2
    args = _args(objs, "operator")
    assert args[:2] == ["operator", "--all-namespaces"]
    assert args[args.index("--peering") + 1] == "poolpilot"
    assert [p["metadata"]["name"] for p in by_kind(objs, "ClusterKopfPeering")] == ["poolpilot"]
    # The one namespaced Role: the autoscaler's leader Lease in the release namespace.
    assert [(r["metadata"]["namespace"], r["metadata"]["name"]) for r in by_kind(objs, "Role")
            ] == [("poolpilot-system", "pp-poolpilot-autoscaler-leader")]
    assert by_kind(objs, "KopfPeering") == []
    image = op["spec"]["template"]["spec"]["containers"][0]["image"]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert image == f"ghcr.io/poolpilot/poolpilot:{chart['appVersion']}"


def test_autoscaler_gets_the_prometheus_url_and_metrics_port(
        rendered: dict[str, list[dict[str, Any]]]) -> None:
    args = _args(rendered["custom-images"], "autoscaler")
    assert args[0] == "autoscaler"
    assert args[args.index("--prometheus") + 1] == "http://prom.monitoring:9090"
    assert args[args.index("--metrics-port") + 1] == "9090"
    dep = one(rendered["custom-images"], "Deployment", "-autoscaler")
    pod = dep["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == "registry.example.com/ml/poolpilot:1.2.3"
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    svc = one(rendered["custom-images"], "Service", "-autoscaler")
    assert svc["spec"]["ports"][0]["port"] == 9090


def test_shards_render_one_autoscaler_each_with_its_own_lease(
        rendered: dict[str, list[dict[str, Any]]]) -> None:
    objs = rendered["sharded"]
    base = "pp-poolpilot-autoscaler"
    deps = {d["metadata"]["name"]: d for d in by_kind(objs, "Deployment")
            if d["metadata"]["name"].startswith(base)}
    assert sorted(deps) == [f"{base}-{i}" for i in range(3)]
    selectors = []
    for i in range(3):
        dep = deps[f"{base}-{i}"]
        args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
        assert args[args.index("--shard") + 1] == str(i)
        assert args[args.index("--total-shards") + 1] == "3"
        assert args[args.index("--leader-election-name") + 1] == base
        selector = dep["spec"]["selector"]["matchLabels"]
        assert selector.items() <= dep["spec"]["template"]["metadata"]["labels"].items()
        selectors.append(selector)
        pdb = one(objs, "PodDisruptionBudget", f"-autoscaler-{i}")
        assert pdb["spec"]["selector"]["matchLabels"] == selector
    # No Deployment adopts another shard's pods.
    assert len({tuple(sorted(s.items())) for s in selectors}) == 3
    # RBAC names exactly the Leases the shards campaign for.
    role = one(objs, "Role", "-autoscaler-leader")
    named = [r for r in role["rules"] if r.get("resourceNames")]
    assert named[0]["resourceNames"] == [Shard(i, 3).lease_name(base) for i in range(3)]
    # One Service still scrapes them all.
    svc = one(objs, "Service", "-autoscaler")
    assert svc["spec"]["selector"].items() <= selectors[0].items()


def test_namespaced_install_uses_roles_per_namespace(
        rendered: dict[str, list[dict[str, Any]]]) -> None:
    objs = rendered["namespaced"]
    args = _args(objs, "operator")
    assert "--all-namespaces" not in args
    assert [args[i + 1] for i, a in enumerate(args) if a == "--namespace"] == ["team-a",
                                                                               "team-b"]
    roles = {(r["metadata"]["namespace"], r["metadata"]["name"]) for r in by_kind(objs, "Role")}
    assert roles == {(ns, f"pp-poolpilot-{c}") for ns in ("team-a", "team-b")
                     for c in ("operator", "autoscaler")} | {
                         ("poolpilot-system", "pp-poolpilot-autoscaler-leader")}
    bindings = by_kind(objs, "RoleBinding")
    assert {b["subjects"][0]["namespace"] for b in bindings} == {"poolpilot-system"}
    # The only cluster-wide right left is reading CRDs (discovery of monitoring.coreos.com).
    cluster_roles = by_kind(objs, "ClusterRole")
    assert [r["metadata"]["name"] for r in cluster_roles] == ["pp-poolpilot-operator"]
    assert cluster_roles[0]["rules"] == [{"apiGroups": ["apiextensions.k8s.io"],
                                          "resources": ["customresourcedefinitions"],
                                          "verbs": ["list", "watch"]}]
    peerings = by_kind(objs, "KopfPeering")
    assert {p["metadata"]["namespace"] for p in peerings} == {"team-a", "team-b"}


def _rules(objs: list[dict[str, Any]], component: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for kind in ("ClusterRole", "Role"):
        for r in by_kind(objs, kind):
            if r["metadata"]["name"].endswith(f"-{component}"):
                out += r["rules"]
    return out


def _allowed(rules_: list[dict[str, Any]], group: str, resource: str, verb: str) -> bool:
    return any(group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"]
               for r in rules_)


@pytest.mark.parametrize("case_id", ["defaults", "namespaced"])
def test_rbac_is_least_privilege(case_id: str,
                                 rendered: dict[str, list[dict[str, Any]]]) -> None:
    objs = rendered[case_id]
    for role in by_kind(objs, "ClusterRole") + by_kind(objs, "Role"):
        for rule in role["rules"]:
            for key in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[key], f"{role['metadata']['name']}: wildcard {key}"
            if "secrets" in rule["resources"]:  # the routers' default keys: made, never read
                assert rule["resources"] == ["secrets"] and rule["verbs"] == ["create"]
    op = _rules(objs, "operator")
    assert _allowed(op, "", "secrets", "create")
    for verb in ("get", "list", "watch", "patch", "update", "delete"):
        assert not _allowed(op, "", "secrets", verb)
    scaler = _rules(objs, "autoscaler")
    assert not any(_allowed(scaler, "", "secrets", v) for v in ("get", "list", "create"))
    assert _allowed(scaler, "apps", "deployments/scale", "patch")
    assert _allowed(scaler, "poolpilot.dev", "inferencepools/status", "patch")
    # pods: annotated before a scale-down (deletion cost, draining), never made or deleted
    assert _allowed(scaler, "", "pods", "patch")
    for verb in ("create", "update", "patch", "delete"):
        assert not _allowed(scaler, "apps", "deployments", verb)
        assert not _allowed(scaler, "poolpilot.dev", "inferencepools", verb)
        if verb != "patch":
            assert not _allowed(scaler, "", "pods", verb)


def test_operator_may_apply_every_child_it_renders(
        rendered: dict[str, list[dict[str, Any]]], tmp_path: Path) -> None:
    """Cross-check with the operator's real builders: RBAC covers each kind it applies, and it
    holds the rights it grants the routers (RBAC forbids granting more than you hold)."""
    out = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "poolpilot"), "render", "--prometheus-operator",
         str(ROOT / "examples" / "llama-8b-disaggregated.yaml")],
        capture_output=True, text=True, timeout=60, check=True,
    )
    children = [d for d in yaml.safe_load_all(out.stdout) if d]
    assert len(children) >= 8
    for case_id in ("defaults", "namespaced"):
        op = _rules(rendered[case_id], "operator")
        for child in children:
            group = child["apiVersion"].rpartition("/")[0]
            resource = _plural(child["kind"])
            for verb in ("get", "create", "patch", "delete"):
                assert _allowed(op, group, resource, verb), (case_id, resource, verb)
            if child["kind"] == "Role":
                for rule in child["rules"]:
                    for g in rule["apiGroups"]:
                        for res in rule["resources"]:
                            for verb in rule["verbs"]:
                                assert _allowed(op, g, res, verb), (case_id, res, verb)


def _plural(kind: str) -> str:
    special = {"PodDisruptionBudget": "poddisruptionbudgets", "NetworkPolicy": "networkpolicies"}
    return special.get(kind, kind.lower() + "s")


@dataclass(frozen=True)
class BadValues:
    id: str
    values: dict[str, Any]
    message: str


BAD_VALUES = [
    BadValues("unknown-key", {"operatr": {"replicas": 3}}, "operatr"),
    BadValues("namespaces-not-a-list", {"watchNamespaces": "default"}, "watchNamespaces"),
    BadValues("bad-namespace-name", {"watchNamespaces": ["Team_A"]}, "watchNamespaces.0"),
    BadValues("pull-policy", {"image": {"pullPolicy": "Sometimes"}}, "image.pullPolicy"),
    BadValues("ttft-not-a-bucket", {"prometheusRule": {"slo": {"ttftSeconds": 0.3}}},
              "prometheusRule.slo.ttftSeconds"),
    BadValues("objective-above-one", {"prometheusRule": {"slo": {"objective": 1.5}}},
              "prometheusRule.slo.objective"),
    BadValues("window-not-a-duration", {"prometheusRule": {"rateWindow": "two minutes"}},
              "prometheusRule.rateWindow"),
    BadValues("no-autoscaler-replica", {"autoscaler": {"replicas": 0}}, "autoscaler.replicas"),
    BadValues("no-autoscaler-shard", {"autoscaler": {"shards": 0}}, "autoscaler.shards"),
    BadValues("interval-not-a-number", {"autoscaler": {"interval": "ten"}},
              "autoscaler.interval"),
    BadValues("two-cas", {"prometheus": {"tls": {"caSecret": "a", "caConfigMap": "b"}}},
              "prometheus.tls: set caSecret or caConfigMap, not both"),
    BadValues("token-and-basic-auth", {"prometheus": {"bearerToken": {"secret": "t"},
                                                      "basicAuth": {"secret": "b"}}},
              "a bearer token and basicAuth exclude each other"),
    BadValues("ca-and-insecure", {"prometheus": {"tls": {"caSecret": "a",
                                                         "insecureSkipVerify": True}}},
              "a CA and insecureSkipVerify exclude each other"),
    BadValues("bad-serviceaccount-name", {"serviceAccount": {"name": "Not_A_Name"}},
              "serviceAccount.name"),
    BadValues("prometheus-url", {"prometheus": {"url": "prometheus:9090"}}, "prometheus.url"),
]


@pytest.mark.parametrize("bad", BAD_VALUES, ids=[b.id for b in BAD_VALUES])
def test_schema_rejects_bad_values_naming_the_field(bad: BadValues, tmp_path: Path) -> None:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(bad.values))
    proc = helm("template", "x", str(CHART), "--values", str(path), check=False)
    assert proc.returncode != 0
    assert bad.message in proc.stderr, proc.stderr


def _rule_spec(objs: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = one(objs, "PrometheusRule", "poolpilot")["spec"]
    return spec


def test_prometheus_rule_equals_the_generator_with_default_values(
        rendered: dict[str, list[dict[str, Any]]]) -> None:
    assert _rule_spec(rendered["monitoring-on"]) == rules.rule_groups(rules.RuleParams())


def test_prometheus_rule_takes_slo_values(tmp_path: Path) -> None:
    values = {"prometheusRule": {"enabled": True, "rateWindow": "5m",
                                 "slo": {"ttftSeconds": 2.5, "itlSeconds": 0.1,
                                         "objective": 0.95},
                                 "burn": {"fastFactor": 14.4}, "scalingLimitedFor": "30m"}}
    spec = _rule_spec(render(values, tmp=tmp_path))
    want = rules.rule_groups(rules.RuleParams(
        rate_window="5m", ttft_seconds="2.5", itl_seconds="0.1", objective="0.95",
        fast_factor="14.4", scaling_limited_for="30m"), autoscaler_scraped=False)
    assert spec == want
    text = json.dumps(spec)
    assert 'le=~\\"2.5(\\\\\\\\.0)?\\"' in text and "(14.4 * (1 - 0.95))" in text


@pytest.mark.parametrize("case_id", ["monitoring-on", "monitoring-on-namespaced"])
def test_promtool_accepts_the_rule_groups(case_id: str, tmp_path: Path,
                                          rendered: dict[str, list[dict[str, Any]]]) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(_rule_spec(rendered[case_id])))
    proc = subprocess.run([tool("promtool"), "check", "rules", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_pod_monitor_relabels_pool_and_role(rendered: dict[str, list[dict[str, Any]]]) -> None:
    pm = one(rendered["monitoring-on-namespaced"], "PodMonitor", "-pools")
    assert pm["spec"]["namespaceSelector"] == {"matchNames": ["serving"]}
    assert pm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    relabel = {r["targetLabel"]: r["sourceLabels"]
               for r in pm["spec"]["podMetricsEndpoints"][0]["relabelings"]}
    assert relabel["pool"] == ["__meta_kubernetes_pod_label_poolpilot_dev_pool"]
    assert relabel["role"] == ["__meta_kubernetes_pod_label_poolpilot_dev_role"]
    sm = one(rendered["monitoring-on"], "ServiceMonitor", "-autoscaler")
    assert sm["spec"]["endpoints"][0]["honorLabels"] is True
    assert by_kind(rendered["defaults"], "PodMonitor") == []


def test_dashboards_ship_as_sidecar_configmaps(rendered: dict[str, list[dict[str, Any]]]) -> None:
    maps = [c for c in by_kind(rendered["defaults"], "ConfigMap")
            if c["metadata"]["labels"].get("grafana_dashboard") == "1"]
    assert sorted(m["metadata"]["name"] for m in maps) == [
        "pp-poolpilot-autoscaler-dashboard", "pp-poolpilot-fleet-dashboard",
        "pp-poolpilot-pool-dashboard"]
    for cm in maps:
        (key, text), = cm["data"].items()
        assert json.loads(text) == json.loads((CHART / "files" / "dashboards" / key).read_text())
    assert by_kind(rendered["monitoring-off"], "ConfigMap") == []


def test_helm_test_hook_checks_the_autoscaler(rendered: dict[str, list[dict[str, Any]]]) -> None:
    pod = one(rendered["defaults"], "Pod", "-test")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    script = pod["spec"]["containers"][0]["args"][0]
    assert "pp-poolpilot-autoscaler.poolpilot-system.svc:9090/metrics" in script
    compile(script, "helm-test", "exec")


@pytest.mark.parametrize(("watch", "warns"), [("{serving}", False), ("{research}", True)],
                         ids=["watches-serving", "watches-another"])
def test_notes_tell_the_next_command(tmp_path: Path, watch: str, warns: bool) -> None:
    # Render NOTES.txt through a probe template in a copy of the chart (the same template
    # engine and values); tests/adapter/test_quickstart.py reads it from a real `helm install`.
    chart = tmp_path / "poolpilot"
    shutil.copytree(CHART, chart)
    (chart / "templates" / "zz-notes.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\n"
        'data: {notes: {{ include "poolpilot/templates/NOTES.txt" . | quote }}}\n'
    )
    out = helm("template", "pp", str(chart), "--namespace", "ml", "--set",
               f"watchNamespaces={watch}", "--show-only", "templates/zz-notes.yaml").stdout
    notes = yaml.safe_load(out)["data"]["notes"]
    # The example pool is printed whole (the packaged chart has no examples/ to point at).
    assert "<<'EOF' | kubectl apply -f -\n# Llama-3.1-8B" in notes
    assert "kubectl -n serving port-forward svc/llama-8b-router 8000:8000 &" in notes
    assert "helm test pp -n ml" in notes
    assert ("This release does not manage namespace serving" in notes) is warns


def test_dockerfile_copies_every_mapped_package_but_the_dev_tools() -> None:
    """The image installs poolpilot from source: every folder pyproject maps must be copied,
    except the dev-only rooms (the emulator, the perf harnesses), which stay out of the image."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    folders = set(project["tool"]["setuptools"]["package-dir"].values())
    dev_only = set(project["tool"]["poolpilot"]["dev-only"])
    dockerfile = (ROOT / "Dockerfile").read_text()
    copied = {line.split()[1] for line in dockerfile.splitlines() if line.startswith("COPY ")}
    assert folders - dev_only <= copied, f"Dockerfile misses COPY for {sorted(folders - copied)}"
    assert not dev_only & copied, f"dev-only rooms in the control-plane image: {dev_only & copied}"
    ignored = set((ROOT / ".dockerignore").read_text().split())
    assert dev_only <= ignored, "the dev-only rooms belong in .dockerignore too"
    assert "USER 65532" in dockerfile


def test_peering_crds_match_the_operators() -> None:
    from poolpilot.operator import peering

    chart = [d for d in yaml.safe_load_all((CHART / "crds" / "kopf-peering.yaml").read_text())]
    assert chart == peering.peering_crds()


def test_no_leader_alert_names_the_shard_without_one(
        tmp_path: Path, rendered: dict[str, list[dict[str, Any]]]) -> None:
    """promtool's rule unit test: of two shards, the one whose replicas all report 0 fires."""
    rules_file = tmp_path / "rules.yaml"
    rules_file.write_text(yaml.safe_dump(_rule_spec(rendered["monitoring-on"])))
    test = {
        "rule_files": [str(rules_file)],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": [
                {"series": 'poolpilot_autoscaler_leader{shard="0", pod="a-0"}',
                 "values": "1x10"},
                {"series": 'poolpilot_autoscaler_leader{shard="0", pod="b-0"}',
                 "values": "0x10"},
                {"series": 'poolpilot_autoscaler_leader{shard="1", pod="a-1"}',
                 "values": "0x10"},
                {"series": 'poolpilot_autoscaler_leader{shard="1", pod="b-1"}',
                 "values": "0x10"},
                {"series": "poolpilot_autoscaler_cycle_seconds_count", "values": "1+1x10"},
            ],
            "alert_rule_test": [{
                "eval_time": "10m", "alertname": "PoolpilotAutoscalerNoLeader",
                "exp_alerts": [{
                    "exp_labels": {"shard": "1", "severity": "warning"},
                    "exp_annotations": {
                        "summary": "no poolpilot autoscaler replica of shard 1 holds its "
                                   "leader lease",
                        "description": "Every autoscaler replica of shard 1 runs but none "
                        "acts: none could take the shard's Lease (its RBAC, or the API "
                        "server), so the pools of that shard are not being resized. The "
                        "replicas' logs say why.",
                        "runbook_url": "https://github.com/poolpilot/poolpilot/blob/main/docs/"
                                       "alerts.md#poolpilotautoscalernoleader",
                    },
                }],
            }],
        }],
    }
    path = tmp_path / "test.yaml"
    path.write_text(yaml.safe_dump(test))
    proc = subprocess.run([tool("promtool"), "test", "rules", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr

"""The values users reach for (replicaCount, extraEnv, extraVolumes, topologySpreadConstraints,
podDisruptionBudget, per-component security contexts, image.digest, commonLabels,
namespaceOverride, the monitors' additionalLabels, global): each renders where it should and
changes nothing else, a values file with all of them lints and renders valid, restricted
manifests, and the schema or the templates refuse a wrong one by its name."""

from __future__ import annotations

import fnmatch
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from chartlib import (
    CHART,
    by_kind,
    helm,
    load_all,
    manifest_errors,
    one,
    pod_spec,
    render,
    restricted_violations,
)

DIGEST = "sha256:" + "0123456789abcdef" * 4
MONITORS_ON = {
    "monitoring": {
        "labels": {"release": "kps"},
        "serviceMonitor": {"enabled": True},
        "podMonitor": {"enabled": True},
    },
    "prometheusRule": {"enabled": True},
}
ABSENT = object()


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def dig(obj: Any, path: str) -> Any:
    """obj at a dotted path (list items by index); ABSENT where there is nothing."""
    for part in path.split(".") if path else []:
        if (
            isinstance(obj, list)
            and part.lstrip("-").isdigit()
            and -len(obj) <= int(part) < len(obj)
        ):
            obj = obj[int(part)]
        elif isinstance(obj, dict) and part in obj:
            obj = obj[part]
        else:
            return ABSENT
    return obj


def leaves(obj: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(obj, dict) and obj:
        out: dict[str, Any] = {}
        for k, v in obj.items():
            out.update(leaves(v, f"{prefix}.{k}" if prefix else k))
        return out
    if isinstance(obj, list) and obj:
        out = {}
        for i, v in enumerate(obj):
            out.update(leaves(v, f"{prefix}.{i}" if prefix else str(i)))
        return out
    return {prefix: obj}


def changed_paths(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> set[str]:
    """'Kind/name:path' of every leaf that differs (a whole object added or removed is
    'Kind/name:')."""

    def index(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
        return {f"{o['kind']}/{o['metadata']['name']}": o for o in objs}

    a, b = index(before), index(after)
    out = {f"{k}:" for k in a.keys() ^ b.keys()}
    for key in a.keys() & b.keys():
        if a[key] == b[key]:  # most objects (the CRDs above all) are the same: no leaf differs
            continue
        la, lb = leaves(a[key]), leaves(b[key])
        out |= {
            f"{key}:{p}" for p in la.keys() | lb.keys() if la.get(p, ABSENT) != lb.get(p, ABSENT)
        }
    return out


def touched_by(change: str, patterns: tuple[str, ...]) -> bool:
    obj, _, path = change.partition(":")
    for pattern in patterns:
        obj_pattern, _, prefix = pattern.partition(":")
        if fnmatch.fnmatchcase(obj, obj_pattern) and (
            path == prefix or path.startswith(prefix + ".") or not prefix or not path
        ):
            return True
    return False


@dataclass(frozen=True)
class Expect:
    target: str  # Kind/name glob; every match must hold, and there must be one
    path: str
    value: Any  # ABSENT: the path is not there


@dataclass(frozen=True)
class KeyCase:
    id: str
    values: dict[str, Any]
    expects: tuple[Expect, ...]
    touches: tuple[str, ...]  # 'Kind/name-glob:path-prefix' the key may change, and nothing else
    base: dict[str, Any] = field(default_factory=dict)


OPERATOR = "Deployment/*-operator"
AUTOSCALER = "Deployment/*-autoscaler"
OP_POD = "spec.template.spec"
NAMESPACED = (
    "Deployment",
    "Service",
    "ServiceAccount",
    "ConfigMap",
    "Role",
    "RoleBinding",
    "PodDisruptionBudget",
    "Pod",
)
SELECTOR = {"app.kubernetes.io/name": "poolpilot", "app.kubernetes.io/instance": "pp"}

KEY_CASES = [
    KeyCase(
        "image-digest",
        {"image": {"digest": DIGEST, "tag": "9.9"}},
        (
            Expect(
                OPERATOR, f"{OP_POD}.containers.0.image", f"ghcr.io/poolpilot/poolpilot@{DIGEST}"
            ),
            Expect(
                AUTOSCALER, f"{OP_POD}.containers.0.image", f"ghcr.io/poolpilot/poolpilot@{DIGEST}"
            ),
            Expect(
                "Pod/*-test", "spec.containers.0.image", f"ghcr.io/poolpilot/poolpilot@{DIGEST}"
            ),
        ),
        (f"Deployment/*:{OP_POD}.containers.0.image", "Pod/*-test:spec.containers.0.image"),
    ),
    KeyCase(
        "global-image-registry-replaces-the-registry",
        {"global": {"imageRegistry": "mirror.local:5000"}},
        (
            Expect(
                OPERATOR,
                f"{OP_POD}.containers.0.image",
                "mirror.local:5000/poolpilot/poolpilot:0.1.0",
            ),
        ),
        (f"Deployment/*:{OP_POD}.containers.0.image", "Pod/*-test:spec.containers.0.image"),
    ),
    KeyCase(
        "global-image-registry-prefixes-a-bare-repository",
        {"global": {"imageRegistry": "mirror.local/"}, "image": {"repository": "ml/poolpilot"}},
        (Expect(AUTOSCALER, f"{OP_POD}.containers.0.image", "mirror.local/ml/poolpilot:0.1.0"),),
        (f"Deployment/*:{OP_POD}.containers.0.image", "Pod/*-test:spec.containers.0.image"),
    ),
    KeyCase(
        "global-pull-secrets-names-or-objects",
        {
            "imagePullSecrets": [{"name": "regcred"}],
            "global": {"imagePullSecrets": ["mirror", {"name": "regcred"}]},
        },
        (
            Expect(
                OPERATOR, f"{OP_POD}.imagePullSecrets", [{"name": "regcred"}, {"name": "mirror"}]
            ),
            Expect(
                "Pod/*-test", "spec.imagePullSecrets", [{"name": "regcred"}, {"name": "mirror"}]
            ),
        ),
        (f"Deployment/*:{OP_POD}.imagePullSecrets", "Pod/*-test:spec.imagePullSecrets"),
    ),
    KeyCase(
        "global-keys-of-other-charts",
        {"global": {"storageClass": "fast", "rbac": {"x": 1}}, "enabled": True},
        (),
        (),
    ),
    KeyCase(
        "replicaCount",
        {"operator": {"replicaCount": 3}},
        (Expect(OPERATOR, "spec.replicas", 3),),
        (f"{OPERATOR}:spec.replicas",),
    ),
    KeyCase(
        "replicaCount-wins-over-replicas",
        {"autoscaler": {"replicas": 1, "replicaCount": 4}},
        (
            Expect(AUTOSCALER, "spec.replicas", 4),
            Expect("Role/*-autoscaler-leader", "kind", "Role"),
        ),
        (f"{AUTOSCALER}:spec.replicas",),
    ),
    KeyCase(
        "replicaCount-one-drops-leader-election-and-the-pdb",
        {"autoscaler": {"replicaCount": 1}},
        (Expect(AUTOSCALER, "spec.replicas", 1),),
        (
            f"{AUTOSCALER}:spec.replicas",
            f"{AUTOSCALER}:{OP_POD}.containers.0.args",
            "PodDisruptionBudget/*-autoscaler:",
            "Role/*-autoscaler-leader:",
            "RoleBinding/*-autoscaler-leader:",
        ),
    ),
    KeyCase(
        "extraEnv",
        {
            "operator": {"extraEnv": [{"name": "HTTPS_PROXY", "value": "http://p:3128"}]},
            "autoscaler": {
                "extraEnv": [
                    {"name": "T", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}
                ]
            },
        },
        (
            Expect(
                OPERATOR,
                f"{OP_POD}.containers.0.env.-1",
                {"name": "HTTPS_PROXY", "value": "http://p:3128"},
            ),
            Expect(AUTOSCALER, f"{OP_POD}.containers.0.env.-1.valueFrom.secretKeyRef.name", "s"),
        ),
        (f"Deployment/*:{OP_POD}.containers.0.env.2",),
    ),
    KeyCase(
        "extraVolumes-and-mounts",
        {
            "operator": {
                "extraVolumes": [{"name": "ca", "configMap": {"name": "corp-ca"}}],
                "extraVolumeMounts": [
                    {"name": "ca", "mountPath": "/etc/ssl/corp", "readOnly": True}
                ],
            }
        },
        (
            Expect(
                OPERATOR, f"{OP_POD}.volumes.-1", {"name": "ca", "configMap": {"name": "corp-ca"}}
            ),
            Expect(
                OPERATOR,
                f"{OP_POD}.containers.0.volumeMounts.-1",
                {"name": "ca", "mountPath": "/etc/ssl/corp", "readOnly": True},
            ),
        ),
        (f"{OPERATOR}:{OP_POD}.volumes.1", f"{OPERATOR}:{OP_POD}.containers.0.volumeMounts.1"),
    ),
    KeyCase(
        "topologySpreadConstraints-select-the-component",
        {
            "operator": {
                "topologySpreadConstraints": [
                    {
                        "maxSkew": 1,
                        "topologyKey": "topology.kubernetes.io/zone",
                        "whenUnsatisfiable": "ScheduleAnyway",
                    }
                ]
            }
        },
        (
            Expect(
                OPERATOR,
                f"{OP_POD}.topologySpreadConstraints.0.labelSelector.matchLabels",
                {**SELECTOR, "app.kubernetes.io/component": "operator"},
            ),
            Expect(
                OPERATOR,
                f"{OP_POD}.topologySpreadConstraints.0.topologyKey",
                "topology.kubernetes.io/zone",
            ),
        ),
        (f"{OPERATOR}:{OP_POD}.topologySpreadConstraints",),
    ),
    KeyCase(
        "topologySpreadConstraints-per-shard",
        {
            "autoscaler": {
                "topologySpreadConstraints": [
                    {
                        "maxSkew": 1,
                        "topologyKey": "kubernetes.io/hostname",
                        "whenUnsatisfiable": "DoNotSchedule",
                    }
                ]
            }
        },
        (
            Expect(
                "Deployment/*-autoscaler-1",
                f"{OP_POD}.topologySpreadConstraints.0.labelSelector.matchLabels",
                {
                    **SELECTOR,
                    "app.kubernetes.io/component": "autoscaler",
                    "poolpilot.dev/autoscaler-shard": "1",
                },
            ),
        ),
        (f"Deployment/*-autoscaler-?:{OP_POD}.topologySpreadConstraints",),
        base={"autoscaler": {"shards": 2}},
    ),
    KeyCase(
        "podDisruptionBudget-disabled",
        {
            "operator": {"podDisruptionBudget": {"enabled": False}},
            "autoscaler": {"podDisruptionBudget": {"enabled": False}},
        },
        (),
        ("PodDisruptionBudget/*:",),
    ),
    KeyCase(
        "podDisruptionBudget-maxUnavailable-replaces-minAvailable",
        {"operator": {"podDisruptionBudget": {"maxUnavailable": 1}}},
        (
            Expect("PodDisruptionBudget/*-operator", "spec.maxUnavailable", 1),
            Expect("PodDisruptionBudget/*-operator", "spec.minAvailable", ABSENT),
        ),
        ("PodDisruptionBudget/*-operator:spec",),
    ),
    KeyCase(
        "podDisruptionBudget-percentage",
        {"autoscaler": {"podDisruptionBudget": {"minAvailable": "50%"}}},
        (Expect("PodDisruptionBudget/*-autoscaler", "spec.minAvailable", "50%"),),
        ("PodDisruptionBudget/*-autoscaler:spec.minAvailable",),
    ),
    KeyCase(
        "podDisruptionBudget-one-replica-with-maxUnavailable",
        {"operator": {"replicaCount": 1, "podDisruptionBudget": {"maxUnavailable": 1}}},
        (Expect("PodDisruptionBudget/*-operator", "spec.maxUnavailable", 1),),
        (f"{OPERATOR}:spec.replicas", "PodDisruptionBudget/*-operator:spec"),
    ),
    KeyCase(
        "podSecurityContext-per-component",
        {"operator": {"podSecurityContext": {"runAsUser": 1000, "fsGroup": None}}},
        (
            Expect(OPERATOR, f"{OP_POD}.securityContext.runAsUser", 1000),
            Expect(OPERATOR, f"{OP_POD}.securityContext.fsGroup", ABSENT),
            Expect(OPERATOR, f"{OP_POD}.securityContext.runAsNonRoot", True),
            Expect(AUTOSCALER, f"{OP_POD}.securityContext.runAsUser", 65532),
        ),
        (f"{OPERATOR}:{OP_POD}.securityContext",),
    ),
    KeyCase(
        "securityContext-per-component",
        {
            "autoscaler": {
                "securityContext": {
                    "seccompProfile": {"type": "Localhost", "localhostProfile": "autoscaler.json"}
                }
            }
        },
        (
            Expect(
                AUTOSCALER,
                f"{OP_POD}.containers.0.securityContext.seccompProfile",
                {"type": "Localhost", "localhostProfile": "autoscaler.json"},
            ),
            Expect(AUTOSCALER, f"{OP_POD}.containers.0.securityContext.capabilities.drop", ["ALL"]),
        ),
        (f"{AUTOSCALER}:{OP_POD}.containers.0.securityContext.seccompProfile",),
    ),
    KeyCase(
        "podAnnotations-chart-wide-and-per-component",
        {"podAnnotations": {"a": "all", "b": "all"}, "operator": {"podAnnotations": {"b": "op"}}},
        (
            Expect(OPERATOR, "spec.template.metadata.annotations", {"a": "all", "b": "op"}),
            Expect(AUTOSCALER, "spec.template.metadata.annotations", {"a": "all", "b": "all"}),
        ),
        ("Deployment/*:spec.template.metadata.annotations",),
    ),
    KeyCase(
        "commonLabels-on-every-object",
        {"commonLabels": {"team": "ml", "app.kubernetes.io/name": "not-the-chart"}},
        (
            *(
                Expect(f"{kind}/*", "metadata.labels.team", "ml")
                for kind in (*NAMESPACED, "ClusterRole", "ClusterRoleBinding", "ClusterKopfPeering")
            ),
            Expect(
                "CustomResourceDefinition/inferencepools.poolpilot.dev",
                "metadata.labels.team",
                "ml",
            ),
            Expect("Deployment/*", "spec.template.metadata.labels.team", "ml"),
            # the chart's own labels win
            Expect("Deployment/*", "metadata.labels.app.kubernetes.io/name", "poolpilot"),
        ),
        ("*:metadata.labels.team", "Deployment/*:spec.template.metadata.labels.team"),
    ),
    KeyCase(
        "namespaceOverride",
        {"namespaceOverride": "platform"},
        (
            *(Expect(f"{kind}/*", "metadata.namespace", "platform") for kind in NAMESPACED),
            Expect("RoleBinding/*", "subjects.0.namespace", "platform"),
            Expect("ClusterRoleBinding/*", "subjects.0.namespace", "platform"),
        ),
        ("*:metadata.namespace", "*:subjects.0.namespace", "Pod/*-test:spec.containers.0.args"),
    ),
    KeyCase(
        "serviceMonitor-additionalLabels",
        {"monitoring": {"serviceMonitor": {"additionalLabels": {"scrape": "own"}}}},
        (
            Expect("ServiceMonitor/*", "metadata.labels.scrape", "own"),
            Expect("ServiceMonitor/*", "metadata.labels.release", "kps"),
        ),
        ("ServiceMonitor/*:metadata.labels.scrape",),
        base=MONITORS_ON,
    ),
    KeyCase(
        "podMonitor-additionalLabels",
        {"monitoring": {"podMonitor": {"additionalLabels": {"scrape": "pools"}}}},
        (Expect("PodMonitor/*", "metadata.labels.scrape", "pools"),),
        ("PodMonitor/*:metadata.labels.scrape",),
        base=MONITORS_ON,
    ),
    KeyCase(
        "prometheusRule-additionalLabels-over-monitoring-labels",
        {"prometheusRule": {"additionalLabels": {"release": "kps-rules"}}},
        (Expect("PrometheusRule/*", "metadata.labels.release", "kps-rules"),),
        ("PrometheusRule/*:metadata.labels.release",),
        base=MONITORS_ON,
    ),
]


def _dig_label_path(obj: dict[str, Any], path: str) -> Any:
    # Label keys hold dots: 'metadata.labels.<key>' takes the rest of the path as the key.
    for head in ("spec.template.metadata.labels.", "metadata.labels."):
        if path.startswith(head):
            labels = dig(obj, head.rstrip("."))
            return ABSENT if labels is ABSENT else labels.get(path[len(head) :], ABSENT)
    return dig(obj, path)


@pytest.mark.parametrize("case", KEY_CASES, ids=[c.id for c in KEY_CASES])
def test_each_key_renders_where_it_should_and_nowhere_else(case: KeyCase, tmp_path: Path) -> None:
    before = render(case.base, tmp=tmp_path)
    after = render(deep_merge(case.base, case.values), tmp=tmp_path)
    for expect in case.expects:
        targets = [
            o
            for o in after
            if fnmatch.fnmatchcase(f"{o['kind']}/{o['metadata']['name']}", expect.target)
        ]
        assert targets, f"nothing matches {expect.target}"
        for obj in targets:
            got = _dig_label_path(obj, expect.path)
            assert got == expect.value, (obj["metadata"]["name"], expect.path, got)
    stray = sorted(c for c in changed_paths(before, after) if not touched_by(c, case.touches))
    assert stray == [], f"{case.id} changed more than it should: {stray[:10]}"
    assert manifest_errors(after) == []


def test_touched_by_matches_prefixes_and_whole_objects() -> None:
    assert touched_by("Deployment/pp-op:spec.replicas", ("Deployment/*:spec",))
    assert not touched_by("Deployment/pp-op:spec.replicas", ("Deployment/*:spec.rep",))
    assert touched_by("Role/pp-x-leader:", ("Role/*-leader:",))
    assert not touched_by("Service/pp-x:spec", ("Deployment/*:spec",))


# A values file that sets every key above at once (and keeps the pods restricted).
EVERY_KEY: dict[str, Any] = {
    "global": {
        "imageRegistry": "registry.internal:5000",
        "imagePullSecrets": ["mirror-cred", {"name": "regcred"}],
        "storageClass": "fast",
    },
    "enabled": True,
    "image": {"digest": DIGEST},
    "imagePullSecrets": [{"name": "regcred"}],
    "namespaceOverride": "platform",
    "commonLabels": {"team": "ml", "cost-center": "42"},
    "podAnnotations": {"sidecar.istio.io/inject": "false"},
    "operator": {
        "replicaCount": 3,
        "podAnnotations": {"a": "op"},
        "extraEnv": [{"name": "HTTPS_PROXY", "value": "http://proxy:3128"}],
        "extraVolumes": [{"name": "ca", "configMap": {"name": "corp-ca"}}],
        "extraVolumeMounts": [{"name": "ca", "mountPath": "/etc/ssl/corp", "readOnly": True}],
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": "topology.kubernetes.io/zone",
                "whenUnsatisfiable": "ScheduleAnyway",
            }
        ],
        "podSecurityContext": {"runAsUser": 1000, "fsGroup": None},
        "securityContext": {"seccompProfile": {"type": "Localhost", "localhostProfile": "op.json"}},
        "podDisruptionBudget": {"maxUnavailable": 1},
    },
    "autoscaler": {
        "replicaCount": 2,
        "shards": 2,
        "extraEnv": [{"name": "LOG_LEVEL", "value": "debug"}],
        "extraVolumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "64Mi"}}],
        "extraVolumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": "kubernetes.io/hostname",
                "whenUnsatisfiable": "DoNotSchedule",
            }
        ],
        "podSecurityContext": {"runAsUser": 2000},
        "securityContext": {"runAsUser": 2000},
        "podDisruptionBudget": {"minAvailable": "50%"},
    },
    "monitoring": {
        "labels": {"release": "kps"},
        "serviceMonitor": {"enabled": True, "additionalLabels": {"scrape": "own"}},
        "podMonitor": {"enabled": True, "additionalLabels": {"scrape": "pools"}},
    },
    "prometheusRule": {"enabled": True, "additionalLabels": {"release": "kps-rules"}},
}


def test_every_key_at_once_lints_and_renders_valid_restricted_pods(tmp_path: Path) -> None:
    values = tmp_path / "every.yaml"
    values.write_text(yaml.safe_dump(EVERY_KEY))
    proc = helm("lint", "--strict", str(CHART), "--values", str(values), check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    objs = render(EVERY_KEY, tmp=tmp_path)
    assert manifest_errors(objs) == []
    pods = [s for s in map(pod_spec, objs) if s is not None]
    assert len(pods) == 4  # operator, two autoscaler shards, helm test
    for spec in pods:
        assert restricted_violations(spec) == []
    op = one(objs, "Deployment", "-operator")
    assert op["spec"]["replicas"] == 3
    assert op["spec"]["template"]["spec"]["containers"][0]["image"] == (
        f"registry.internal:5000/poolpilot/poolpilot@{DIGEST}"
    )
    assert {o["metadata"].get("namespace") for o in objs} == {None, "platform"}


@dataclass(frozen=True)
class BadValues:
    id: str
    values: dict[str, Any]
    message: str


BAD_VALUES = [
    BadValues(
        "misspelt-replicaCount",
        {"operator": {"replicaCont": 3}},
        "operator: Additional property replicaCont is not allowed",
    ),
    BadValues(
        "misspelt-pdb-key",
        {"autoscaler": {"podDisruptionBudget": {"minAvailabel": 1}}},
        "autoscaler.podDisruptionBudget: Additional property minAvailabel is not allowed",
    ),
    BadValues(
        "misspelt-additionalLabels",
        {"monitoring": {"serviceMonitor": {"additionalLabel": {}}}},
        "monitoring.serviceMonitor: Additional property additionalLabel is not allowed",
    ),
    BadValues(
        "misspelt-commonLabels",
        {"commonLabel": {"team": "ml"}},
        "Additional property commonLabel is not allowed",
    ),
    BadValues("replicaCount-zero", {"autoscaler": {"replicaCount": 0}}, "autoscaler.replicaCount"),
    BadValues("digest-without-algorithm", {"image": {"digest": "0123abcd"}}, "image.digest"),
    BadValues("namespace-not-a-name", {"namespaceOverride": "Team_A"}, "namespaceOverride"),
    BadValues(
        "label-not-a-string", {"commonLabels": {"cost-center": 42}}, "commonLabels.cost-center"
    ),
    BadValues(
        "env-without-name", {"operator": {"extraEnv": [{"value": "x"}]}}, "operator.extraEnv.0"
    ),
    BadValues(
        "mount-without-path",
        {"autoscaler": {"extraVolumeMounts": [{"name": "x"}]}},
        "autoscaler.extraVolumeMounts.0",
    ),
    BadValues(
        "volume-without-source",
        {"operator": {"extraVolumes": [{"name": "x"}]}},
        "operator.extraVolumes.0",
    ),
    BadValues(
        "spread-bad-policy",
        {
            "operator": {
                "topologySpreadConstraints": [
                    {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "Sometimes"}
                ]
            }
        },
        "operator.topologySpreadConstraints.0.whenUnsatisfiable",
    ),
    BadValues(
        "pdb-not-a-percentage",
        {"operator": {"podDisruptionBudget": {"maxUnavailable": "half"}}},
        "operator.podDisruptionBudget.maxUnavailable",
    ),
    BadValues(
        "pdb-neither",
        {"operator": {"podDisruptionBudget": {"minAvailable": None}}},
        "operator.podDisruptionBudget: set minAvailable or maxUnavailable",
    ),
    BadValues(
        "global-pull-secret-shape",
        {"global": {"imagePullSecrets": [{"nam": "x"}]}},
        "global.imagePullSecrets.0",
    ),
    BadValues(
        "env-the-chart-sets",
        {"operator": {"extraEnv": [{"name": "POD_NAMESPACE", "value": "x"}]}},
        "operator.extraEnv: POD_NAMESPACE is set by the chart",
    ),
    BadValues(
        "volume-the-chart-names",
        {"autoscaler": {"extraVolumes": [{"name": "tmp", "emptyDir": {}}]}},
        "autoscaler.extraVolumes: the volume name tmp is the chart's",
    ),
    BadValues(
        "mount-over-the-charts",
        {"operator": {"extraVolumeMounts": [{"name": "x", "mountPath": "/tmp"}]}},
        "operator.extraVolumeMounts: /tmp is mounted by the chart already",
    ),
]


@pytest.mark.parametrize("bad", BAD_VALUES, ids=[b.id for b in BAD_VALUES])
def test_wrong_values_are_refused_by_name(bad: BadValues, tmp_path: Path) -> None:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(bad.values))
    proc = helm("template", "x", str(CHART), "--values", str(path), check=False)
    assert proc.returncode != 0
    assert bad.message in proc.stderr, proc.stderr


def test_set_flags_reach_the_new_keys(tmp_path: Path) -> None:
    """--set gives numbers as int64 and percentages as text: both are accepted."""
    proc = helm(
        "template",
        "x",
        str(CHART),
        "--set",
        "operator.replicaCount=3",
        "--set",
        "autoscaler.podDisruptionBudget.maxUnavailable=50%",
        "--set",
        f"image.digest={DIGEST}",
        "--set",
        "commonLabels.team=ml",
        "--set",
        "namespaceOverride=platform",
    )
    objs = load_all(proc.stdout)
    assert one(objs, "Deployment", "-operator")["spec"]["replicas"] == 3
    assert one(objs, "PodDisruptionBudget", "-autoscaler")["spec"]["maxUnavailable"] == "50%"
    assert all(o["metadata"]["labels"]["team"] == "ml" for o in by_kind(objs, "Deployment"))


# The keys this chart added to values.yaml after its first release.
ADDED_KEYS = (
    "global",
    "enabled",
    "image.digest",
    "namespaceOverride",
    "commonLabels",
    "podAnnotations",
    "monitoring.serviceMonitor.additionalLabels",
    "monitoring.podMonitor.additionalLabels",
    "prometheusRule.additionalLabels",
    "prepull",
    *(
        f"{component}.{key}"
        for component in ("operator", "autoscaler")
        for key in (
            "replicaCount",
            "topologySpreadConstraints",
            "podSecurityContext",
            "securityContext",
            "extraEnv",
            "extraVolumes",
            "extraVolumeMounts",
            "podDisruptionBudget",
        )
    ),
)


@pytest.mark.parametrize(
    "values",
    [{}, MONITORS_ON, {"operator": {"replicas": 1}, "autoscaler": {"replicas": 3}}],
    ids=["defaults", "monitors-on", "old-replicas-key"],
)
def test_a_release_from_before_these_keys_upgrades_with_reuse_values(
    values: dict[str, Any], tmp_path: Path
) -> None:
    """`helm upgrade --reuse-values` renders the new templates with the values.yaml of the
    chart the release was installed from, which has none of the added keys: the render must
    be what the new defaults give."""
    old_chart = tmp_path / "poolpilot"
    shutil.copytree(CHART, old_chart)
    old_values = yaml.safe_load((CHART / "values.yaml").read_text())
    for dotted in ADDED_KEYS:
        *parents, last = dotted.split(".")
        node = old_values
        for part in parents:
            node = node[part]
        del node[last]
    (old_chart / "values.yaml").write_text(yaml.safe_dump(old_values))
    assert render(values, tmp=tmp_path, chart=old_chart) == render(values, tmp=tmp_path)

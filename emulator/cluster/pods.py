"""Pure pieces of the cluster controller: Deployments -> Pods -> local command lines, and the
objects and status a real control plane would write (EndpointSlices, Deployment status).

No I/O here: the controller's jobs (controller.py runs deployments.py, kubelet.py, endpoints.py,
scrape.py, timeline.py) read the API, call these, and write the result.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from poolpilot import names
from poolpilot.apitypes import Obj
from poolpilot.roles import Role

FINALIZER = "sandbox.poolpilot.dev/process"
TEMPLATE_HASH = "pod-template-hash"
SLICE_MANAGER = "sandbox.poolpilot.dev"
DEFAULT_SIM_MODEL = "llama-3.1-8b"
POOLPILOT = [sys.executable, "-m", "poolpilot.cli"]


class PodSpecError(ValueError):
    """A pod the sandbox cannot run (e.g. an unknown command); the message says why."""


# ---------------------------------------------------------------------------------------------
# Deployments -> Pods


def template_hash(template: Mapping[str, Any]) -> str:
    text = json.dumps(template, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def owned_by(obj: Mapping[str, Any], owner: Mapping[str, Any]) -> bool:
    uid = owner["metadata"].get("uid")
    return any(
        ref.get("uid") == uid and ref.get("controller")
        for ref in obj["metadata"].get("ownerReferences") or []
    )


def build_pod(deployment: Mapping[str, Any], suffix: str | None = None) -> Obj:
    """A Pod for one replica of a Deployment, as the ReplicaSet controller would make it."""
    meta = deployment["metadata"]
    template = deployment["spec"]["template"]
    h = template_hash(template)
    suffix = suffix or secrets.token_hex(3)[:5]
    tmeta = template.get("metadata") or {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{meta['name']}-{h[:6]}-{suffix}",
            "namespace": meta["namespace"],
            "labels": {**(tmeta.get("labels") or {}), TEMPLATE_HASH: h},
            "annotations": dict(tmeta.get("annotations") or {}),
            "finalizers": [FINALIZER],
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "Deployment",
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {**template["spec"], "nodeName": "sandbox"},
        "status": {"phase": "Pending"},
    }


@dataclass(frozen=True)
class PodPlan:
    """What the ReplicaSet logic wants: pods to create (count) and pods to delete (names)."""

    create: int
    delete: list[str]


def plan_replicas(deployment: Mapping[str, Any], pods: Sequence[Mapping[str, Any]],
                  ready: Mapping[str, bool]) -> PodPlan:
    """Converge a Deployment's live pods to spec.replicas on the current template.

    Pods on an old template are replaced surge-first (as maxUnavailable 0): a new pod is made,
    and an old one goes only once enough current pods are ready. Scale-down removes not-ready
    pods first, then the lowest pod-deletion-cost, then the newest, as the ReplicaSet
    controller does.
    """
    want = int(deployment["spec"].get("replicas", 1))
    h = template_hash(deployment["spec"]["template"])
    live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    current = [p for p in live if p["metadata"]["labels"].get(TEMPLATE_HASH) == h]
    old = [p for p in live if p["metadata"]["labels"].get(TEMPLATE_HASH) != h]
    current_ready = sum(1 for p in current if ready.get(p["metadata"]["name"]))
    create = max(0, want - len(current))
    delete: list[str] = []
    if len(current) > want:
        victims = sorted(
            current,
            key=lambda p: (
                bool(ready.get(p["metadata"]["name"])),
                deletion_cost(p),
                _negated(p["metadata"].get("creationTimestamp", "")),
            ),
        )
        delete += [p["metadata"]["name"] for p in victims[: len(current) - want]]
    # Old pods go as current ones become ready (all at once when the Deployment is at 0).
    removable = len(old) if want == 0 else max(0, current_ready + len(old) - want)
    delete += [p["metadata"]["name"] for p in old[:removable]]
    return PodPlan(create=create, delete=delete)


DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"


def deletion_cost(pod: Mapping[str, Any]) -> int:
    """The pod's `controller.kubernetes.io/pod-deletion-cost` (0 when unset or not an int, as
    the ReplicaSet controller reads it): among ready pods, the lowest goes first."""
    value = ((pod.get("metadata") or {}).get("annotations") or {}).get(DELETION_COST)
    try:
        return int(value) if value is not None else 0
    except (TypeError, ValueError):
        return 0


def _negated(stamp: str) -> tuple[int, ...]:
    # Sort newest first: negate each character code of the RFC 3339 timestamp.
    return tuple(-ord(c) for c in stamp)


def deployment_status(deployment: Mapping[str, Any], pods: Sequence[Mapping[str, Any]],
                      ready: Mapping[str, bool]) -> Obj:
    h = template_hash(deployment["spec"]["template"])
    live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    n_ready = sum(1 for p in live if ready.get(p["metadata"]["name"]))
    updated = sum(1 for p in live if p["metadata"]["labels"].get(TEMPLATE_HASH) == h)
    want = int(deployment["spec"].get("replicas", 1))
    status: Obj = {
        "observedGeneration": deployment["metadata"].get("generation", 1),
        "replicas": len(live),
        "updatedReplicas": updated,
        "readyReplicas": n_ready,
        "availableReplicas": n_ready,
        "unavailableReplicas": max(0, want - n_ready),
        "conditions": [
            {
                "type": "Available",
                "status": "True" if n_ready >= want else "False",
                "reason": "MinimumReplicasAvailable" if n_ready >= want
                else "MinimumReplicasUnavailable",
            },
        ],
    }
    return status


# ---------------------------------------------------------------------------------------------
# Pod -> local process


@dataclass(frozen=True)
class EngineMapping:
    """How engine pods run locally: the simulator, or real vLLM on CPU with the tiny model."""

    engine: str = "sim"  # sim | vllm-cpu
    speed: float = 1.0
    sim_model: str | None = None  # None: the pod's model if the simulator knows its shape
    sim_gpu: str = "h200"
    tiny_model: str | None = None  # folder, for vllm-cpu
    vllm_python: str | None = None
    cpu_threads: dict[str, str] = field(default_factory=dict)  # role -> OMP bind, e.g. "0"


def _option(argv: Sequence[str], name: str, default: str | None = None) -> str | None:
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return default


def _options(argv: Sequence[str], name: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == name and i + 1 < len(argv)]


def _subcommand(argv: Sequence[str]) -> tuple[str, list[str]]:
    """['poolpilot', 'launch', ...] -> ('launch', [...]); also 'python -m poolpilot.cli X'."""
    if not argv:
        raise PodSpecError("the container has no command")
    head = Path(argv[0]).name
    if head == "poolpilot" and len(argv) > 1:
        return argv[1], list(argv[2:])
    if head.startswith("python") and argv[1:3] in (["-m", "poolpilot.cli"], ["-m", "poolpilot"]):
        return argv[3], list(argv[4:])
    raise PodSpecError(
        f"the sandbox runs only poolpilot commands in pods; got {' '.join(argv[:3])!r}"
    )


def engine_arg_map(argv: Sequence[str]) -> dict[str, str]:
    """--engine-arg KEY=VALUE pairs, keys normalised to kebab-case."""
    out = {}
    for pair in _options(argv, "--engine-arg"):
        key, _, value = pair.partition("=")
        key = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "-", key.strip()).replace("_", "-").lower()
        out[key] = value
    return out


# What real vLLM needs on CPU with the tiny model (2048 positions), whatever the pool says.
VLLM_CPU_ARGS = {"dtype": "float32", "enforce-eager": "true", "max-model-len": "512"}


def _without_engine_args(argv: Sequence[str], keys: set[str]) -> list[str]:
    out: list[str] = []
    skip = False
    for i, a in enumerate(argv):
        if skip:
            skip = False
            continue
        if a == "--engine-arg" and i + 1 < len(argv) and next(
                iter(engine_arg_map(["--engine-arg", argv[i + 1]])), "") in keys:
            skip = True
            continue
        out.append(a)
    return out


def _set_option(argv: Sequence[str], name: str, value: str) -> list[str]:
    out = list(argv)
    if name in out:
        out[out.index(name) + 1] = value
    else:
        out += [name, value]
    return out


def local_command(argv: Sequence[str], ip: str, mapping: EngineMapping,
                  itl_budget: float | None = None) -> list[str]:
    """The command line a pod runs on this machine, bound to its own address `ip`.

    `poolpilot launch` becomes `poolpilot engine-sim` (engine sim) or stays the launcher with
    the tiny model (vllm-cpu); other poolpilot commands (the router) run as they are, with the
    pod's address added. `itl_budget`: the pool's ITL target, which a simulated decode engine
    keeps its steps within while it prefills a request itself (the router's local prefill).
    """
    sub, rest = _subcommand(argv)
    if sub == "launch":
        return _engine_command(rest, ip, mapping, itl_budget)
    if sub == "router":
        # One clock: the router reports latencies in simulated seconds, like the engines.
        return [*POOLPILOT, sub, *rest, "--host", ip, "--speed", f"{mapping.speed:g}"]
    return [*POOLPILOT, sub, *rest, "--host", ip]


def sim_model(pod_model: str | None, override: str | None) -> str:
    """The simulator model for a pod: the override, else the pod's model when the simulator
    knows its shape (e.g. meta-llama/Llama-3.1-70B-Instruct), else Llama-3.1-8B."""
    if override:
        return override
    from poolpilot.engine_sim.hardware import UnknownHardware, get_model

    try:
        return get_model(pod_model or "").name
    except UnknownHardware:
        return DEFAULT_SIM_MODEL


def _engine_command(rest: list[str], ip: str, mapping: EngineMapping,
                    itl_budget: float | None = None) -> list[str]:
    role = _option(rest, "--role") or str(Role.ENGINE)
    port = _option(rest, "--port") or str(names.ENGINE_PORT)
    served = _option(rest, "--served-name") or _option(rest, "--model") or "model"
    if mapping.engine == "sim":
        cmd = [
            *POOLPILOT, "engine-sim",
            "--role", role,
            "--model", sim_model(_option(rest, "--model"), mapping.sim_model),
            "--gpu", mapping.sim_gpu,
            "--tensor-parallel", _option(rest, "--tensor-parallel", "1") or "1",
            "--host", ip, "--port", port,
            "--speed", f"{mapping.speed:g}",
            "--served-name", served,
        ]  # fmt: skip
        engine_args = engine_arg_map(rest)
        max_len = engine_args.get("max-model-len")
        if max_len:
            cmd += ["--max-model-len", max_len]
        # vLLM's flag as the pool sets it (on by default there and in the simulator).
        if engine_args.get("enable-prefix-caching", "").lower() == "false":
            cmd += ["--no-enable-prefix-caching"]
        if itl_budget is not None and role == Role.DECODE:
            cmd += ["--itl-budget", f"{itl_budget:g}"]
        metrics_port = _option(rest, "--metrics-port")
        if metrics_port:  # where the pod's scrape annotation points
            cmd += ["--metrics-port", metrics_port]
        return cmd
    if mapping.engine == "vllm-cpu":
        if not mapping.tiny_model:
            raise PodSpecError("--engine vllm-cpu needs the tiny model folder")
        # The pod's model is a Hub id that cannot be downloaded here: serve the tiny model under
        # the pool's served name, with the settings vLLM needs on CPU.
        out = _without_engine_args(rest, set(VLLM_CPU_ARGS))
        out[out.index("--model") + 1] = mapping.tiny_model
        connector = _option(out, "--kv-connector")
        if connector == "NixlConnector":
            # NIXL on CPU: the KV buffer lives in host memory.
            kv = json.loads(_option(out, "--kv-config") or "{}")
            kv.setdefault("kv_buffer_device", "cpu")
            out = _set_option(out, "--kv-config", json.dumps(kv, separators=(",", ":")))
        for key, value in VLLM_CPU_ARGS.items():
            out += ["--engine-arg", f"{key}={value}"]
        cmd = [*POOLPILOT, "launch", *out, "--host", ip]
        if mapping.vllm_python:
            cmd += ["--python", mapping.vllm_python]
        return cmd
    raise PodSpecError(f"--engine {mapping.engine}: must be sim or vllm-cpu")


def field_ref(pod: Mapping[str, Any], path: str, ip: str) -> str:
    values = {
        "metadata.name": pod["metadata"]["name"],
        "metadata.namespace": pod["metadata"]["namespace"],
        "status.podIP": ip,
        "status.hostIP": "127.0.0.1",
        "spec.nodeName": "sandbox",
        "spec.serviceAccountName": pod["spec"].get("serviceAccountName", "default"),
    }
    if path not in values:
        raise PodSpecError(f"env fieldRef {path!r} is not supported by the sandbox")
    return values[path]


def resolve_env(pod: Mapping[str, Any], container: Mapping[str, Any], ip: str,
                secrets_data: Mapping[tuple[str, str], str] | None = None) -> dict[str, str]:
    """The container's environment: plain values, downward-API fields and secret/config keys."""
    env: dict[str, str] = {}
    for var in container.get("env") or []:
        name = var["name"]
        if "valueFrom" not in var:
            env[name] = _expand(str(var.get("value", "")), env)
            continue
        src = var["valueFrom"]
        if "fieldRef" in src:
            env[name] = field_ref(pod, src["fieldRef"]["fieldPath"], ip)
        else:
            ref = src.get("secretKeyRef") or src.get("configMapKeyRef") or {}
            value = (secrets_data or {}).get((ref.get("name", ""), ref.get("key", "")))
            if value is not None:
                env[name] = value
            elif not ref.get("optional", False):
                # An absent secret (e.g. an HF token) only matters to real downloads.
                env[name] = ""
    return env


def _expand(value: str, env: Mapping[str, str]) -> str:
    return re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), value)


def remap_paths(values: Iterable[str], mounts: Mapping[str, str]) -> list[str]:
    """Replace container mount paths (e.g. /etc/poolpilot/router) by the pod's local folders."""
    ordered = sorted(mounts.items(), key=lambda kv: -len(kv[0]))
    out = []
    for v in values:
        for mount, local in ordered:
            if v == mount or v.startswith(mount.rstrip("/") + "/"):
                v = local + v[len(mount.rstrip("/")):]
                break
        out.append(v)
    return out


def pod_command(argv: Sequence[str], ip: str, mapping: EngineMapping,
                mounts: Mapping[str, str], itl_budget: float | None = None) -> list[str]:
    """The local command line of a pod whose volumes are at `mounts` (mountPath -> folder).

    Only the container's own arguments are remapped: the local command adds host paths (this
    Python, the tiny model) that may well lie under a mount path such as /tmp.
    """
    return local_command(remap_paths(argv, mounts), ip, mapping, itl_budget)


def container_port(container: Mapping[str, Any], port: int | str) -> int:
    if isinstance(port, int) or str(port).isdigit():
        return int(port)
    for p in container.get("ports") or []:
        if p.get("name") == port:
            return int(p["containerPort"])
    raise PodSpecError(f"container {container.get('name')!r} has no port named {port!r}")


def probe_url(container: Mapping[str, Any], ip: str, kind: str = "readinessProbe") -> str | None:
    probe = container.get(kind) or {}
    get = probe.get("httpGet")
    if not get:
        return None
    port = container_port(container, get.get("port", names.ENGINE_PORT))
    return f"http://{ip}:{port}{get.get('path', '/')}"


@dataclass(frozen=True)
class ProbeRule:
    """How a readinessProbe's results turn into readiness, as the kubelet does: ready after
    `success_threshold` successes in a row, not ready after `failure_threshold` failures in
    a row (one slow answer does not pull a pod out of its Service), each try given
    `timeout_s`; a container that is not running is not ready at once."""

    failure_threshold: int = 3
    success_threshold: int = 1
    timeout_s: float = 1.0

    @classmethod
    def of(cls, container: Mapping[str, Any], kind: str = "readinessProbe") -> ProbeRule:
        probe = container.get(kind) or {}
        return cls(max(1, int(probe.get("failureThreshold", 3))),
                   max(1, int(probe.get("successThreshold", 1))),
                   max(0.1, float(probe.get("timeoutSeconds", 1))))

    def next(self, ready: bool, streak: int, ok: bool, running: bool = True
             ) -> tuple[bool, int]:
        """(ready, streak) after one probe: `streak` counts the results in a row that
        disagree with `ready` (successes while not ready, failures while ready)."""
        if not running:
            return False, 0
        if ok == ready:
            return ready, 0
        streak += 1
        if streak >= (self.success_threshold if ok else self.failure_threshold):
            return ok, 0
        return ready, streak


def prestop_seconds(container: Mapping[str, Any]) -> float:
    """A preStop `sleep N` hook's N (the operator's way to let endpoint removal propagate)."""
    cmd = (((container.get("lifecycle") or {}).get("preStop") or {}).get("exec") or {}).get(
        "command"
    ) or []
    if len(cmd) == 2 and cmd[0] == "sleep":
        try:
            return float(cmd[1])
        except ValueError:
            return 0.0
    return 0.0


# ---------------------------------------------------------------------------------------------
# Services -> EndpointSlices; pods -> Prometheus targets


def selects(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


@dataclass(frozen=True)
class PodView:
    """What the controller knows about a pod for endpoints and scraping."""

    pod: Mapping[str, Any]
    ip: str | None
    ready: bool
    terminating: bool


def endpoint_slice(service: Mapping[str, Any], pods: Sequence[PodView]) -> Obj:
    meta = service["metadata"]
    selector = service["spec"].get("selector") or {}
    chosen = [
        v for v in pods if v.ip and selects(selector, v.pod["metadata"].get("labels") or {})
    ]
    first = chosen[0].pod["spec"]["containers"][0] if chosen else {}
    ports = []
    for sp in service["spec"].get("ports") or []:
        target = sp.get("targetPort", sp["port"])
        try:
            number = container_port(first, target) if first else (
                int(target) if str(target).isdigit() else sp["port"])
        except PodSpecError:
            number = sp["port"]
        ports.append({"name": sp.get("name", ""), "port": number,
                      "protocol": sp.get("protocol", "TCP")})
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": f"{meta['name']}-sandbox",
            "namespace": meta["namespace"],
            "labels": {
                "kubernetes.io/service-name": meta["name"],
                "endpointslice.kubernetes.io/managed-by": SLICE_MANAGER,
                **{k: v for k, v in (meta.get("labels") or {}).items()
                   if k in (names.POOL_LABEL, names.ROLE_LABEL, names.MANAGED_BY)},
            },
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Service", "name": meta["name"],
                 "uid": meta.get("uid", ""), "controller": True, "blockOwnerDeletion": True}
            ],
        },
        "addressType": "IPv4",
        "endpoints": [
            {
                "addresses": [v.ip],
                "conditions": {
                    "ready": v.ready and not v.terminating,
                    "serving": v.ready,
                    "terminating": v.terminating,
                },
                "nodeName": "sandbox",
                "targetRef": {"kind": "Pod", "name": v.pod["metadata"]["name"],
                              "namespace": meta["namespace"],
                              "uid": v.pod["metadata"].get("uid", "")},
            }
            for v in sorted(chosen, key=lambda v: v.pod["metadata"]["name"])
        ],
        "ports": ports,
    }


@dataclass(frozen=True)
class ScrapeTarget:
    address: str
    labels: dict[str, str]
    path: str = "/metrics"


def scrape_target(view: PodView) -> ScrapeTarget | None:
    """A Prometheus target for a running pod, relabelled as the chart's PodMonitor does."""
    meta = view.pod["metadata"]
    ann = meta.get("annotations") or {}
    labels = meta.get("labels") or {}
    if not view.ip or ann.get("prometheus.io/scrape") != "true":
        return None
    port = ann.get("prometheus.io/port") or str(names.ENGINE_PORT)
    return ScrapeTarget(
        address=f"{view.ip}:{port}",
        labels={
            "namespace": meta["namespace"],
            "pool": labels.get(names.POOL_LABEL, ""),
            "role": labels.get(names.ROLE_LABEL, ""),
            "pod": meta["name"],
        },
        path=ann.get("prometheus.io/path", "/metrics"),
    )

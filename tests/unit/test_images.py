"""The two images' supply chain, read from their Dockerfiles (no Docker engine here): the
runtime dependencies come from the hashed lock with --require-hashes, the images carry the OCI
labels, the base images are build ARGs, and every poolpilot container runs as one uid (the
images' USER, the operator's engine and router pods, the chart's operator and autoscaler)."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from poolpilot.operator import builders
from poolpilot.operator.building_blocks import RUN_AS_USER

from poolpilot.validate import parse_spec

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "requirements" / "runtime.lock"
DOCKERFILES = {"control-plane": ROOT / "Dockerfile",
               "runtime": ROOT / "runtime_image" / "Dockerfile"}
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
OCI = ("title", "description", "source", "licenses", "version", "revision")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _instructions(text: str) -> list[str]:
    """One string per instruction: continuation lines joined, comments dropped."""
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    return [i.strip() for i in re.sub(r"\\\n", " ", "\n".join(lines)).splitlines() if i.strip()]


def _final_stage(text: str) -> list[str]:
    steps = _instructions(text)
    last_from = max(i for i, s in enumerate(steps) if s.startswith("FROM "))
    return steps[last_from:]


def _locked() -> dict[str, tuple[str, list[str]]]:
    """name -> (version, hashes) of every requirement in the lock."""
    out = {}
    for req in re.split(r"\n(?=\S)", LOCK.read_text()):
        match = re.match(r"([A-Za-z0-9_.-]+)==(\S+)", req)
        if match:
            hashes = re.findall(r"--hash=sha256:(\w{64})", req)
            out[_norm(match.group(1))] = (match.group(2), hashes)
    return out


def test_lock_pins_every_runtime_dependency_at_pyprojects_version_with_hashes() -> None:
    locked = _locked()
    for dep in PROJECT["dependencies"]:
        pinned = re.fullmatch(r"([A-Za-z0-9_.-]+)==(\S+)", dep)
        assert pinned, f"{dep}: pin runtime dependencies exactly (the lock follows them)"
        name, version = pinned.groups()
        assert _norm(name) in locked, f"{name} is not in {LOCK.name}: rerun pip-compile"
        assert locked[_norm(name)][0] == version, (
            f"{name}: pyproject pins {version}, the lock {locked[_norm(name)][0]}: rerun "
            "pip-compile (the command is in the lock's header)")
    assert all(hashes for _, hashes in locked.values()), "a requirement without a hash"
    tools = {_norm(d.split("==")[0]) for group in PROJECT["optional-dependencies"].values()
             for d in group} - {_norm(d.split("==")[0]) for d in PROJECT["dependencies"]}
    assert not tools & set(locked), f"developer tools in the runtime lock: {tools & set(locked)}"


@pytest.mark.parametrize("image", sorted(DOCKERFILES))
def test_dependencies_install_from_the_lock_with_require_hashes(image: str) -> None:
    text = DOCKERFILES[image].read_text()
    steps = _final_stage(text)
    copied = [s for s in steps if s.startswith("COPY ") and "requirements/runtime.lock" in s]
    assert copied, "the lock is not copied into the image"
    installs = [cmd for s in steps if s.startswith("RUN ")
                for cmd in re.split(r"&&", s) if re.search(r"\bpip install\b", cmd)]
    assert installs
    locked = [c for c in installs if "-r " in c and "runtime.lock" in c]
    assert locked and all("--require-hashes" in c for c in locked), installs
    # Whatever else pip installs is poolpilot itself, without resolving anything unhashed.
    for cmd in installs:
        assert cmd in locked or "--no-deps" in cmd, f"installs outside the lock: {cmd}"


@pytest.mark.parametrize("image", sorted(DOCKERFILES))
def test_images_carry_the_oci_labels(image: str) -> None:
    steps = _final_stage(DOCKERFILES[image].read_text())
    labels = dict(re.findall(r'(org\.opencontainers\.image\.[a-z.]+)="([^"]*)"',
                             " ".join(s for s in steps if s.startswith("LABEL "))))
    assert {f"org.opencontainers.image.{k}" for k in OCI} <= set(labels)
    assert labels["org.opencontainers.image.licenses"] == PROJECT["license"]["text"]
    assert labels["org.opencontainers.image.version"] == "${VERSION}"
    assert labels["org.opencontainers.image.revision"] == "${REVISION}"
    args = dict(re.findall(r"^ARG (\w+)(?:=(\S*))?$", "\n".join(steps), re.M))
    assert args["VERSION"] == PROJECT["version"] and "REVISION" in args  # declared in the stage


@pytest.mark.parametrize("image", sorted(DOCKERFILES))
def test_base_images_are_build_args_with_a_tag(image: str) -> None:
    """No digest is invented: the base is an ARG (pin one with --build-arg ...@sha256:)."""
    steps = _instructions(DOCKERFILES[image].read_text())
    froms = [s.split()[1] for s in steps if s.startswith("FROM ")]
    args = dict(re.findall(r"^ARG (\w+)=(\S+)$", "\n".join(steps), re.M))
    for ref in froms:
        var = re.fullmatch(r"\$\{(\w+)\}", ref)
        assert var and var.group(1) in args, f"FROM {ref}: make the base image a build ARG"
        assert re.fullmatch(r"[\w./-]+:[\w.-]+(@sha256:[0-9a-f]{64})?", args[var.group(1)])


def _user(image: str) -> int:
    users = [s.split()[1] for s in _final_stage(DOCKERFILES[image].read_text())
             if s.startswith("USER ")]
    assert len(users) == 1 and re.fullmatch(r"\d+(:\d+)?", users[0]), users
    ids = {int(x) for x in users[0].split(":")}
    assert len(ids) == 1, f"user and group differ: {users[0]}"
    return ids.pop()


def _pod_contexts(objs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for obj in objs:
        template = obj.get("spec", {}).get("template", {})
        if obj.get("kind") in ("Deployment", "StatefulSet", "DaemonSet", "Job") and template:
            out.append((f"{obj['kind']}/{obj['metadata']['name']}",
                        template["spec"].get("securityContext", {})))
    return out


def test_one_uid_for_every_poolpilot_container() -> None:
    uid = _user("control-plane")
    assert _user("runtime") == uid == RUN_AS_USER
    pool = yaml.safe_load((ROOT / "examples" / "llama-8b-disaggregated.yaml").read_text())
    children = builders.build_children(builders.Pool(
        name="p", namespace="ns", spec=parse_spec(pool["spec"]), uid="u"))
    pods = _pod_contexts(children)
    assert {name.split("/")[1] for name, _ in pods} >= {"p-prefill", "p-decode", "p-router"}
    for name, sc in pods:
        assert (sc["runAsUser"], sc["runAsGroup"], sc["fsGroup"]) == (uid, uid, uid), name
    values = yaml.safe_load((ROOT / "charts" / "poolpilot" / "values.yaml").read_text())
    psc = values["podSecurityContext"]
    assert (psc["runAsUser"], psc["runAsGroup"], psc["fsGroup"]) == (uid, uid, uid)


def test_the_charts_pods_run_as_that_uid() -> None:
    helm = shutil.which("helm") or shutil.which("helm", path=str(ROOT / ".cache" / "bin"))
    if helm is None:
        pytest.skip("helm is not installed; run ./dev setup")
    out = subprocess.run([helm, "template", "pp", str(ROOT / "charts" / "poolpilot"),
                          "--set", "prepull.enabled=true"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    pods = _pod_contexts([d for d in yaml.safe_load_all(out) if d])
    assert {n.split("-")[-1] for n, _ in pods} >= {"operator", "autoscaler"}
    for name, sc in pods:
        assert sc.get("runAsUser") == RUN_AS_USER, (name, sc)

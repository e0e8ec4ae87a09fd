"""Real vLLM on CPU in the filesystem the operator gives an engine pod: the root read-only
(`readOnlyRootFilesystem`), writable only where the pod has volumes (emptyDirs as tmpfs), the
model from a read-only PVC, the environment and the command from the operator's own Deployment.
If vLLM, Triton or torch wrote anywhere else, the engine would fail to start or to answer.

A private mount namespace (`unshare -m`) builds that root: system and repository folders bound
read-only, a tmpfs per emptyDir, then `chroot`. It needs root (CAP_SYS_ADMIN) and is skipped
without it.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from poolpilot.operator import builders
from poolpilot.sandbox.tinymodel import ensure_tiny_model
from poolpilot.testkit.prometheus import free_port
from router_support import REPO, VLLM_PYTHON, VLLM_VENV, vllm_available

from poolpilot.validate import parse_spec

pytestmark = [
    pytest.mark.adapter,
    pytest.mark.vllm,
    pytest.mark.skipif(not vllm_available(), reason="no vLLM venv: run ./dev setup-vllm"),
]

# What a container image's root holds that the engine reads: system folders, and here the
# repository and Python installs (poolpilot's and vLLM's venvs and their interpreters), bound
# where they are, wherever this checkout lives (CI clones it outside /work).
SYSTEM = ["/usr", "/etc", "/root", "/opt", "/var/lib"]


def read_only_folders() -> list[str]:
    places = {str(p.resolve()) for p in (REPO, VLLM_VENV, VLLM_PYTHON.resolve().parent.parent,
                                          Path(sys.base_prefix), Path(sys.prefix))}
    places |= set(SYSTEM)
    kept = sorted(p for p in places if Path(p).is_dir())
    # a folder inside another bound folder comes with it
    return [p for p in kept if not any(p != q and p.startswith(q + "/") for q in kept)]


def can_unshare() -> bool:
    try:
        return subprocess.run(["unshare", "-m", "true"], capture_output=True,
                              timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def engine_container(port: int) -> dict[str, Any]:
    spec = parse_spec({
        "model": {"name": "tiny-llama", "source": {"pvc": {"claimName": "models"}}},
        "mode": "Aggregated",
        "engine": {"gpus": 0, "replicas": 1},
        "runtime": {"engineArgs": {"dtype": "float32", "enforceEager": True,
                                   "maxModelLen": 512}},
    })
    dep = builders.build_engine_deployment(builders.Pool("ro", "ns", spec), "engine")
    pod = dep["spec"]["template"]["spec"]
    container: dict[str, Any] = pod["containers"][0]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    command = list(container["command"])
    command[command.index("--port") + 1] = str(port)
    container["command"] = [*command, "--host", "127.0.0.1"]
    container["volumes"] = pod["volumes"]
    return container


def namespace_script(root: Path, model: Path, container: dict[str, Any], env: dict[str, str]
                     ) -> str:
    """Shell run in a private mount namespace: build the pod's root, then exec the engine."""
    volumes = {v["name"]: v for v in container["volumes"]}
    lines = ["set -e", f"R={shlex.quote(str(root))}", "mount -t tmpfs tmpfs $R",
             "for d in bin lib lib64 sbin; do ln -s usr/$d $R/$d; done"]
    lines += ["mkdir -p $R/proc $R/dev $R/sys", "mount -t proc proc $R/proc",
              "mount --rbind /dev $R/dev", "mount --rbind /sys $R/sys"]
    for m in container["volumeMounts"]:
        path = f"$R{m['mountPath']}"
        lines.append(f"mkdir -p {path}")
        if "persistentVolumeClaim" in volumes[m["name"]]:  # the model, read-only
            lines += [f"mount --bind {shlex.quote(str(model))} {path}",
                      f"mount -o remount,ro,bind {path}"]
        else:  # an emptyDir
            lines.append(f"mount -t tmpfs tmpfs {path}")
    # After the volumes: a checkout under /tmp (CI clones there) must not be hidden by the
    # pod's /tmp emptyDir.
    for d in map(shlex.quote, read_only_folders()):
        lines += [f"mkdir -p $R{d}", f"mount --rbind {d} $R{d}", f"mount -o remount,ro,bind $R{d}"]
    lines.append("mount -o remount,ro $R")  # the root filesystem itself
    env_args = " ".join(shlex.quote(f"{k}={v}") for k, v in env.items())
    command = " ".join(shlex.quote(c) for c in container["command"])
    lines.append(f"exec chroot $R env -i {env_args} {command}")
    return "\n".join(lines)


@dataclass
class PodEngine:
    """vLLM started in a pod's filesystem (a private mount namespace); `wait_healthy()`
    before use, `stop()` after."""

    proc: subprocess.Popen[bytes]
    port: int
    log: Path
    container: dict[str, Any]
    facts: dict[str, Any] = field(default_factory=dict)  # what its test checks afterwards

    @classmethod
    def start(cls, script: str, log: Path, port: int, container: dict[str, Any],
              **facts: Any) -> PodEngine:
        with log.open("w") as out:
            proc = subprocess.Popen(
                ["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        return cls(proc, port, log, container, facts)

    def wait_healthy(self, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"the engine exited:\n{self.log.read_text()[-4000:]}"
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/health",
                             timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        pytest.fail(f"the engine did not become healthy:\n{self.log.read_text()[-4000:]}")

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def start_engine(tmp_path: Path, cpu: int) -> PodEngine:
    """This module's engine: the operator's aggregated engine pod, model from a read-only PVC."""
    model = ensure_tiny_model(REPO / ".cache" / "tiny-llama")
    port = free_port()
    container = engine_container(port)
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    env |= {
        "PATH": f"{REPO / '.venv' / 'bin'}:/usr/local/bin:/usr/bin:/bin",
        "POOLPILOT_VLLM_PYTHON": str(VLLM_PYTHON),  # the image's vLLM interpreter here
        "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
        "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": str(cpu),
    }
    root = tmp_path / "root"
    root.mkdir()
    script = namespace_script(root, model, container, env)
    return PodEngine.start(script, tmp_path / "engine.log", port, container)


def test_vllm_serves_with_a_read_only_root_and_only_the_pods_volumes(
        pod_engines: Callable[[str], PodEngine]) -> None:
    if not can_unshare():
        pytest.skip("needs a private mount namespace (unshare -m, as root)")
    # Started beside the model-cache module's engine (tests/adapter/conftest.py).
    engine = pod_engines(__name__)
    try:
        engine.wait_healthy()
        container = engine.container
        served = container["command"][container["command"].index("--served-name") + 1]
        r = httpx.post(f"http://127.0.0.1:{engine.port}/v1/completions", timeout=60,
                       json={"model": served, "prompt": "hello there", "max_tokens": 4,
                             "ignore_eos": True})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 4
        text = engine.log.read_text()
        assert "Read-only file system" not in text, text[-4000:]
    finally:
        engine.stop()

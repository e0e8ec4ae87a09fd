"""Real vLLM on CPU as the operator renders a SharedVolume engine: the root filesystem
read-only, the prefetched model on the shared PVC mounted read-only at /model-cache (vLLM gets
the folder, HF_HUB_OFFLINE=1, the Hub's files in /tmp), the compile cache on the shared
compile PVC (writable), everything else an emptyDir. If vLLM wrote into the model cache or
looked for the Hub, the engine would fail to start or to answer.

The same private mount namespace as test_engine_readonly_root.py (`unshare -m`, as root; skipped
without it), with the pod's two PVCs as bind mounts.
"""

from __future__ import annotations

import shlex
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from poolpilot.operator import builders, model_cache
from poolpilot.sandbox.tinymodel import ensure_tiny_model
from poolpilot.testkit.prometheus import free_port
from router_support import REPO, VLLM_PYTHON, vllm_available
from test_engine_readonly_root import PodEngine, can_unshare, read_only_folders

from poolpilot.validate import parse_spec

pytestmark = [pytest.mark.adapter, pytest.mark.vllm,
              pytest.mark.skipif(not vllm_available(), reason="needs ./dev setup-vllm")]


def engine_pod(port: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    spec = parse_spec({
        "model": {"name": "tiny-llama", "cache": {"type": "SharedVolume"}},
        "mode": "Aggregated",
        "engine": {"gpus": 0, "replicas": 1},
        "runtime": {"engineArgs": {"dtype": "float32", "enforceEager": True,
                                   "maxModelLen": 512}},
    })
    dep = builders.build_engine_deployment(builders.Pool("shared", "ns", spec), "engine")
    pod = dep["spec"]["template"]["spec"]
    container: dict[str, Any] = pod["containers"][0]
    command = list(container["command"])
    assert command[command.index("--model") + 1] == model_cache.model_dir(spec)
    command[command.index("--port") + 1] = str(port)
    container["command"] = [*command, "--host", "127.0.0.1"]
    return container, pod["volumes"]


def namespace_script(root: Path, claims: dict[str, Path], container: dict[str, Any],
                     volumes: list[dict[str, Any]], env: dict[str, str]) -> str:
    """The pod's root in a private mount namespace: each PVC a bind mount of its folder
    (read-only where the pod mounts it so), each emptyDir a tmpfs; then exec the engine."""
    by_name = {v["name"]: v for v in volumes}
    lines = ["set -e", f"R={shlex.quote(str(root))}", "mount -t tmpfs tmpfs $R",
             "for d in bin lib lib64 sbin; do ln -s usr/$d $R/$d; done",
             "mkdir -p $R/proc $R/dev $R/sys", "mount -t proc proc $R/proc",
             "mount --rbind /dev $R/dev", "mount --rbind /sys $R/sys"]
    for m in container["volumeMounts"]:
        path = f"$R{m['mountPath']}"
        lines.append(f"mkdir -p {path}")
        pvc = by_name[m["name"]].get("persistentVolumeClaim")
        if pvc is not None:
            lines.append(f"mount --bind {shlex.quote(str(claims[pvc['claimName']]))} {path}")
            if m.get("readOnly"):
                lines.append(f"mount -o remount,ro,bind {path}")
        else:
            lines.append(f"mount -t tmpfs tmpfs {path}")
    for d in map(shlex.quote, read_only_folders()):
        lines += [f"mkdir -p $R{d}", f"mount --rbind {d} $R{d}", f"mount -o remount,ro,bind $R{d}"]
    lines.append("mount -o remount,ro $R")
    env_args = " ".join(shlex.quote(f"{k}={v}") for k, v in env.items())
    command = " ".join(shlex.quote(c) for c in container["command"])
    lines.append(f"exec chroot $R env -i {env_args} {command}")
    return "\n".join(lines)


def start_engine(tmp_path: Path, cpu: int) -> PodEngine:
    """This module's engine: the operator's SharedVolume engine pod on its two PVCs."""
    # The shared PVC as the prefetch Job leaves it: the model's folder, marked complete.
    claims = {"shared-model-cache": tmp_path / "model-pvc",
              "shared-compile-cache": tmp_path / "compile-pvc"}
    shutil.copytree(ensure_tiny_model(REPO / ".cache" / "tiny-llama"),
                    claims["shared-model-cache"] / "tiny-llama")
    claims["shared-compile-cache"].mkdir()
    before = sorted(p.name for p in (claims["shared-model-cache"] / "tiny-llama").iterdir())
    port = free_port()
    container, volumes = engine_pod(port)
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    pod_env = dict(env)
    env |= {"PATH": f"{REPO / '.venv' / 'bin'}:/usr/local/bin:/usr/bin:/bin",
            "POOLPILOT_VLLM_PYTHON": str(VLLM_PYTHON),
            "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
            "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": str(cpu)}
    root = tmp_path / "root"
    root.mkdir()
    script = namespace_script(root, claims, container, volumes, env)
    return PodEngine.start(script, tmp_path / "engine.log", port, container, claims=claims,
                           before=before, pod_env=pod_env)


def test_vllm_serves_from_the_read_only_shared_model_cache(
        pod_engines: Callable[[str], PodEngine]) -> None:
    if not can_unshare():
        pytest.skip("needs a private mount namespace (unshare -m, as root)")
    # Started beside the read-only-root module's engine (tests/adapter/conftest.py).
    engine = pod_engines(__name__)
    try:
        env, claims = engine.facts["pod_env"], engine.facts["claims"]
        assert env["HF_HUB_OFFLINE"] == "1" and env["HF_HOME"].startswith("/tmp/")
        engine.wait_healthy()
        container = engine.container
        served = container["command"][container["command"].index("--served-name") + 1]
        assert served == "tiny-llama"  # clients keep the model's name, not the folder
        r = httpx.post(f"http://127.0.0.1:{engine.port}/v1/completions", timeout=60,
                       json={"model": served, "prompt": "hello there", "max_tokens": 4,
                             "ignore_eos": True})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 4
        assert "Read-only file system" not in engine.log.read_text()
        # Nothing was written into the shared model cache.
        assert sorted(p.name for p in (claims["shared-model-cache"] / "tiny-llama").iterdir()) \
            == engine.facts["before"]
    finally:
        engine.stop()

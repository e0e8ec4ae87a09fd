"""`poolpilot launch --metrics-port`: vLLM loads runtime_image/engine_metrics_port.py as a
middleware (from a folder the launcher puts on PYTHONPATH, since vLLM's Python may lack
poolpilot), which serves the metrics registry on a port of its own."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from poolpilot.runtime import engine_metrics_port
from poolpilot.runtime.launcher import LaunchError, LaunchSpec, build_command, launch_env
from poolpilot.testkit.prometheus import free_port
from prometheus_client import Counter


def test_the_launcher_loads_the_middleware_from_its_own_folder() -> None:
    spec = LaunchSpec(role="decode", model="m", metrics_port=8090, host="10.0.0.7")
    cmd = build_command(spec)
    assert cmd[cmd.index("--middleware") + 1] == "engine_metrics_port.MetricsPort"
    env = launch_env(spec, {"PYTHONPATH": "/opt/extra"})
    folder = env["PYTHONPATH"].split(os.pathsep)[0]
    assert (Path(folder) / "engine_metrics_port.py").is_file()
    assert env["PYTHONPATH"].split(os.pathsep)[1:] == ["/opt/extra"]
    assert env[engine_metrics_port.PORT_ENV] == "8090"
    assert env[engine_metrics_port.HOST_ENV] == "10.0.0.7"
    # A Python without poolpilot imports it from there alone (it imports nothing of ours).
    out = subprocess.run([sys.executable, "-I", "-c", "import sys; sys.path.insert(0, sys.argv[1]);"
                          " import engine_metrics_port; print(engine_metrics_port.PORT_ENV)",
                          folder], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == engine_metrics_port.PORT_ENV


def test_without_the_flag_nothing_changes() -> None:
    spec = LaunchSpec(role="decode", model="m")
    assert "--middleware" not in build_command(spec)
    assert engine_metrics_port.PORT_ENV not in launch_env(spec, {})


@pytest.mark.parametrize("port", [0, 8000, 70000], ids=["zero", "the-serving-port", "too-big"])
def test_a_bad_metrics_port_names_the_flag(port: int) -> None:
    with pytest.raises(LaunchError, match=f"--metrics-port {port}: must be 1..65535 and not "
                       "--port"):
        build_command(LaunchSpec(role="decode", model="m", metrics_port=port))


def test_the_middleware_serves_the_registry_and_passes_requests_through(
        monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port()
    monkeypatch.setenv(engine_metrics_port.PORT_ENV, str(port))
    monkeypatch.setenv(engine_metrics_port.HOST_ENV, "127.0.0.1")
    monkeypatch.setattr(engine_metrics_port, "_server", None)
    Counter("poolpilot_test_metrics_port_hits", "a series vLLM would register").inc(3)
    seen: list[str] = []

    async def app(scope: dict, receive: object, send: object) -> None:
        seen.append(scope["path"])

    middleware = engine_metrics_port.MetricsPort(app)
    try:
        page = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        assert "poolpilot_test_metrics_port_hits_total 3.0" in page
        asyncio.run(middleware({"type": "http", "path": "/v1/completions"}, None, None))
        assert seen == ["/v1/completions"]
        assert engine_metrics_port.start(port, "127.0.0.1") is True  # once per process
        # Another API server process of the same engine finds the port taken: no error.
        first = engine_metrics_port._server
        monkeypatch.setattr(engine_metrics_port, "_server", None)
        assert engine_metrics_port.start(port, "127.0.0.1") is False
        monkeypatch.setattr(engine_metrics_port, "_server", first)
    finally:
        server = engine_metrics_port._server
        if server is not None:
            server.shutdown()
            server.server_close()

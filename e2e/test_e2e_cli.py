"""`poolpilot sandbox` as a user runs it: clear errors, Ctrl-C stops everything it started,
and a second run right after (from another folder, with relative paths) works and writes its
report. Budget: about a minute."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

from poolpilot.sandbox.data import DEFAULT_POOL

from poolpilot.polling import wait_for

SANDBOX = [sys.executable, "-m", "poolpilot.cli", "sandbox", "--no-progress"]


def sandbox(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
            timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SANDBOX, *args], capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=cwd)


def processes_using(folder: Path) -> list[str]:
    """Live processes whose command line or working folder mentions `folder`."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            cwd = os.readlink(f"/proc/{pid}/cwd")
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, PermissionError, ProcessLookupError):
            continue
        if state != "Z" and (str(folder) in cmd or cwd.startswith(str(folder))):
            found.append(f"{pid}: {cmd[:150]}")
    return found


def test_missing_prometheus_says_how_to_install_it(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": str(tmp_path)}  # nothing on PATH: no prometheus
    r = sandbox("--report", str(tmp_path / "r"), env=env, timeout=60)
    assert r.returncode == 1
    assert "Prometheus is not installed" in r.stderr and "./dev setup" in r.stderr


def test_taken_port_is_named_with_the_fix(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = sandbox("--api-port", str(port), "--report", str(tmp_path / "r"), timeout=60)
    assert r.returncode == 1
    assert f"port {port} on 127.0.0.1 is taken" in r.stderr and "--api-port 0" in r.stderr


def test_bad_trace_line_is_named(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,input_tokens,output_tokens\n0,100,10\n1,lots,10\n")
    r = sandbox("--trace", str(trace), "--report", str(tmp_path / "r"), timeout=60)
    assert r.returncode == 2
    assert f"{trace}:3: input_tokens must be an integer" in r.stderr


def test_ctrl_c_stops_everything_then_a_second_run_works(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,input_tokens,output_tokens\n"
                     + "".join(f"{i * 2},{500 + 10 * i},{8 + i}\n" for i in range(6)))
    first = tmp_path / "first"
    log = (tmp_path / "first.log").open("w")
    proc = subprocess.Popen([*SANDBOX, "--trace", str(trace), "--speed", "8", "--report",
                             str(first)], stdout=log, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: "replaying the trace" in (tmp_path / "first.log").read_text()
                 or proc.poll() is not None, timeout=180, what="the pool to become ready")
        assert proc.poll() is None, (tmp_path / "first.log").read_text()
        assert processes_using(first), "the sandbox's processes should be running"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
    assert wait_for(lambda: not processes_using(first), timeout=15,
                    what="every process of the interrupted run to be gone", interval=0.5) is True
    # A second run right after, to the end: it gets its own ports and writes the report.
    # It runs from another folder with relative --pool, --trace and --report: pods run in
    # folders of their own, so every path handed to them must be absolute.
    second = tmp_path / "second"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.copy(DEFAULT_POOL, tmp_path / "pool.yaml")
    r = sandbox("--pool", "../pool.yaml", "--trace", "../t.csv", "--speed", "8",
                "--duration", "30", "--report", "../second", cwd=elsewhere)
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads((second / "report.json").read_text())
    assert report["requests"] == {**report["requests"], "sent": 6, "ok": 6, "failed": 0}
    assert report["ttft_seconds"]["p50"] > 0
    assert {p.name for p in second.glob("*.png")} == {"ttft.png", "queue.png", "replicas.png",
                                                       "request_rate.png"}
    assert "scale events" in r.stdout + r.stderr
    assert not processes_using(second)

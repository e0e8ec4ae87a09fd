"""Real vLLM on CPU behind the router: P/D disaggregation gives the aggregated engine's greedy
output token for token, and the decode engine's own metrics prove the KV came from outside.

Budget (2 cores): at most two engines at a time, each started once through `poolpilot launch`
(aggregated, then NixlConnector prefill+decode, then ExampleConnector prefill+decode):
1. `reference` (module scope): one aggregated engine, behind the router in aggregated mode,
   answers every case; then it is stopped.
2. TestNixl (class scope): the heavy path. Every case, streaming and not, completions and
   chat, plus the official openai client (sync, async, streaming).
3. TestExample (class scope): one shared-folder test (a streaming and a plain completion).
The tiny random model is built by the `model` fixture (cached in .cache/tiny-llama).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest
from poolpilot.sandbox.tinymodel import ensure_tiny_model
from poolpilot.testkit.prometheus import free_port
from router_support import (
    REPO,
    Proc,
    metric_value,
    running,
    sse_events,
    start_fake_engine,
    start_router,
    start_vllm,
    vllm_available,
    wait_until,
    wait_vllm_ready,
)

pytestmark = [
    pytest.mark.adapter,
    pytest.mark.vllm,
    pytest.mark.skipif(not vllm_available(), reason="no vLLM venv: run ./dev setup-vllm"),
]

SERVED = "tiny-llama"
MAX_TOKENS = 12


@dataclass(frozen=True)
class Case:
    id: str
    chat: bool
    stream: bool
    prompt: str  # more than 128 tokens (the CPU block size), unique per case


def _prompt(seed: str) -> str:
    words = ["prefill", "decode", "cache", "token", "engine", "router", "pool", "request",
             "stream", "batch", "queue"]
    return f"{seed}: " + " ".join(words[(i * 7 + len(seed)) % len(words)] for i in range(220))


CASES = [
    Case("completion", chat=False, stream=False, prompt=_prompt("alpha")),
    Case("completion-stream", chat=False, stream=True, prompt=_prompt("bravo")),
    Case("chat", chat=True, stream=False, prompt=_prompt("charlie")),
    Case("chat-stream", chat=True, stream=True, prompt=_prompt("delta")),
]
EXAMPLE_CASES = [c for c in CASES if not c.chat]
# Prompts no engine has seen before the local-prefill tests (a prefix-cache hit on the decode
# engine would hide whether it computed the prompt itself).
LOCAL_CASES = [
    Case("local-completion-stream", chat=False, stream=True, prompt=_prompt("echo")),
    Case("local-chat", chat=True, stream=False, prompt=_prompt("foxtrot")),
]
HANDOFF_CASE = Case("handoff-failed-completion", chat=False, stream=False,
                    prompt=_prompt("golf"))


def ask(router: str, case: Case) -> str:
    """The generated text for a case, through the router, greedy and ignoring EOS."""
    body: dict[str, object] = {"model": SERVED, "max_tokens": MAX_TOKENS, "temperature": 0,
                               "ignore_eos": True, "stream": case.stream}
    if case.chat:
        body["messages"] = [{"role": "user", "content": case.prompt}]
    else:
        body["prompt"] = case.prompt
    path = "/v1/chat/completions" if case.chat else "/v1/completions"
    resp = httpx.post(router + path, json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    if not case.stream:
        choice = resp.json()["choices"][0]
        return str(choice["message"]["content"] if case.chat else choice["text"])
    events = sse_events(resp.text)
    assert events[-1] == "[DONE]"
    assert not any("error" in e for e in events if isinstance(e, dict)), events
    pieces = []
    for e in events:
        if isinstance(e, dict) and e.get("choices"):
            c = e["choices"][0]
            pieces.append((c.get("delta") or {}).get("content") or "" if case.chat
                          else c.get("text") or "")
    return "".join(pieces)


@pytest.fixture(scope="module")
def model() -> Path:
    return ensure_tiny_model(REPO / ".cache" / "tiny-llama")


@pytest.fixture(scope="module")
def reference(model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Every case's output from one aggregated engine (through the router in aggregated
    mode); the engine is stopped before the P/D engines start."""
    engine = start_vllm("aggregated", model, tmp_path_factory.mktemp("agg"), 0, SERVED)
    with running(engine):
        wait_vllm_ready(engine)
        with running(start_router("--engine", engine.url)) as (router,):
            return {case.id: ask(router.url, case)
                    for case in [*CASES, *LOCAL_CASES, HANDOFF_CASE]}


@dataclass
class Pair:
    prefill: Proc
    decode: Proc
    router: Proc


def pd_pair(model: Path, scratch: Path, connector: str, kv_config: dict) -> Iterator[Pair]:
    prefill = start_vllm("prefill", model, scratch / "prefill", 0, SERVED, connector, kv_config)
    decode = start_vllm("decode", model, scratch / "decode", 1, SERVED, connector, kv_config)
    with running(prefill, decode):
        wait_vllm_ready(prefill)
        wait_vllm_ready(decode)
        with running(start_router("--prefill", prefill.url, "--decode", decode.url,
                                  "--pool", "tiny")) as (router,):
            # Warm-up: the first NIXL transfer sets up the side channel and can take seconds.
            ask(router.url, Case("warmup", chat=False, stream=False, prompt=_prompt("warmup")))
            yield Pair(prefill, decode, router)


def decode_metrics(pair: Pair) -> str:
    return httpx.get(pair.decode.url + "/metrics", timeout=10).text


def computed_prompt_tokens(page: str) -> float:
    """Prompt tokens an engine computed itself (not from its prefix cache or a KV transfer)."""
    return metric_value(page, "vllm:prompt_tokens_by_source_total", {"source": "local_compute"})


# Class scope: each pair lives only while its class runs (two engines at a time).
@pytest.fixture(scope="class")
def nixl_pair(model: Path, reference: dict[str, str],
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    yield from pd_pair(model, tmp_path_factory.mktemp("nixl"), "NixlConnector",
                       {"kv_buffer_device": "cpu"})


@pytest.fixture(scope="class")
def example_pair(model: Path, reference: dict[str, str],
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    scratch = tmp_path_factory.mktemp("example")
    shared = scratch / "kv"
    shared.mkdir()
    yield from pd_pair(model, scratch, "ExampleConnector", {"shared_storage_path": str(shared)})


class TestNixl:
    @pytest.fixture
    def pair(self, nixl_pair: Pair) -> Pair:
        return nixl_pair

    @pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
    def test_same_greedy_output_as_aggregated_with_kv_from_prefill(
        self, pair: Pair, reference: dict[str, str], case: Case
    ) -> None:
        before = decode_metrics(pair)
        try:
            out = ask(pair.router.url, case)
        finally:
            print((pair.router.output.text() if pair.router.output else "")[-4000:])
        after = decode_metrics(pair)
        assert out == reference[case.id]
        assert len(out) > 0
        # The decode engine pulled the prompt's KV over NIXL instead of computing it: it
        # took the prompt's blocks from the connector, or from its own prefix cache where an
        # earlier try of this case left them (a handoff that timed out falls back to a local
        # prefill, which caches the prompt on the decode engine, so a retry finds it there).
        xfers = "vllm:nixl_xfer_time_seconds_count"
        assert metric_value(after, xfers) > metric_value(before, xfers)
        taken = sum(metric_value(after, m) - metric_value(before, m)
                    for m in ("vllm:external_prefix_cache_hits_total",
                              "vllm:prefix_cache_hits_total"))
        assert taken >= 128

    def test_openai_client_sync_async_and_streaming(
        self, pair: Pair, reference: dict[str, str]
    ) -> None:
        base = pair.router.url + "/v1"
        extra = {"ignore_eos": True}
        failures = "poolpilot_router_kv_transfer_failures_total"
        # The router is shared by the class's tests: count this test's requests only.
        failed_before = metric_value(httpx.get(pair.router.url + "/metrics").text, failures)
        comp, chat_stream = CASES[0], CASES[3]
        client = openai.OpenAI(base_url=base, api_key="none", max_retries=0)
        assert [m.id for m in client.models.list().data] == [SERVED]
        out = client.completions.create(model=SERVED, prompt=comp.prompt,
                                        max_tokens=MAX_TOKENS, temperature=0, extra_body=extra)
        assert out.choices[0].text == reference[comp.id]

        async def stream_chat() -> str:
            aclient = openai.AsyncOpenAI(base_url=base, api_key="none", max_retries=0)
            stream = await aclient.chat.completions.create(
                model=SERVED, messages=[{"role": "user", "content": chat_stream.prompt}],
                max_tokens=MAX_TOKENS, temperature=0, stream=True, extra_body=extra)
            return "".join([c.choices[0].delta.content or "" async for c in stream
                            if c.choices])

        assert asyncio.run(stream_chat()) == reference[chat_stream.id]
        page = httpx.get(pair.router.url + "/metrics").text
        assert metric_value(page, "poolpilot_router_requests_total",
                            {"pool": "tiny", "code": "200"}) >= 3
        log = pair.router.output.text() if pair.router.output else ""
        assert metric_value(page, failures) == failed_before, log[-4000:]

    def test_local_prefill_when_prefill_is_behind_same_output_computed_on_decode(
        self, pair: Pair, reference: dict[str, str]
    ) -> None:
        """A second router on the same engines believes prefill runs at 10 tokens/s, so a
        220-token prompt would wait 22 s against a 1 s TTFT target: it sends every request to
        the decode engine alone, which computes the prompt itself."""
        with running(start_router(
            "--prefill", pair.prefill.url, "--decode", pair.decode.url, "--pool", "tiny",
            "--local-prefill-profile", "llama-3.1-8b/h200", "--ttft-target", "1",
            "--prefill-tokens-per-s", "10",
        )) as (router,):
            for case in LOCAL_CASES:
                before_d = decode_metrics(pair)
                before_p = httpx.get(pair.prefill.url + "/metrics", timeout=10).text
                assert ask(router.url, case) == reference[case.id]
                after_d = decode_metrics(pair)
                after_p = httpx.get(pair.prefill.url + "/metrics", timeout=10).text
                # The decode engine computed the whole prompt (more than one 128-token block)
                # and pulled nothing over NIXL; the prefill engine saw nothing.
                assert computed_prompt_tokens(after_d) - computed_prompt_tokens(before_d) > 128
                xfers = "vllm:nixl_xfer_time_seconds_count"
                assert metric_value(after_d, xfers) == metric_value(before_d, xfers)
                prompts = "vllm:prompt_tokens_total"
                assert metric_value(after_p, prompts) == metric_value(before_p, prompts)
            page = httpx.get(router.url + "/metrics").text
            assert metric_value(page, "poolpilot_router_local_prefill_total",
                                {"reason": "prefill_behind"}) == len(LOCAL_CASES)
            assert metric_value(page, "poolpilot_router_requests_total", {"code": "200"}) \
                == len(LOCAL_CASES)

    def test_failed_kv_handoff_is_retried_as_a_local_prefill(
        self, pair: Pair, reference: dict[str, str], tmp_path: Path
    ) -> None:
        """The decode engine is told to pull KV from a prefill engine that is not there (a fake
        prefill answering with real NIXL parameters whose side channel is a closed port): vLLM
        fails the request, and the router serves it with a local prefill instead."""
        real = httpx.post(pair.prefill.url + "/v1/completions", timeout=60, json={
            "model": SERVED, "prompt": _prompt("hotel"), "max_tokens": 1,
            "kv_transfer_params": {"do_remote_decode": True}}).json()["kv_transfer_params"]
        dead = real | {"remote_engine_id": "gone-" + str(real["remote_engine_id"]),
                       "remote_port": free_port()}
        with (
            running(start_fake_engine("P", 0.0, 0, "--kv-params", json.dumps(dead))) as (fake,),
            running(start_router("--prefill", fake.url, "--decode", pair.decode.url,
                                 "--pool", "tiny")) as (router,),
        ):
            try:
                out = ask(router.url, HANDOFF_CASE)
            finally:
                print((router.output.text() if router.output else "")[-4000:])  # on failure
            assert out == reference[HANDOFF_CASE.id]
            page = httpx.get(router.url + "/metrics").text
            assert metric_value(page, "poolpilot_router_kv_transfer_failures_total") == 1
            assert metric_value(page, "poolpilot_router_local_prefill_total",
                                {"reason": "kv_transfer_failed"}) == 1
            assert metric_value(decode_metrics(pair), "vllm:nixl_num_failed_transfers_total") > 0


    def test_a_failed_handoff_frees_the_prefills_kv_through_another_decode_engine(
        self, pair: Pair
    ) -> None:
        """The first decode engine fails the handoff (a fake that fails every KV load); the
        router has the real decode engine read the prompt's KV with a one-token decode, so the
        real prefill engine frees it now rather than when its lease runs out."""
        xfers = "vllm:nixl_xfer_time_seconds_count"
        late = "vllm:nixl_num_notifications_after_expiry_total"
        before_d = metric_value(decode_metrics(pair), xfers)
        before_p = metric_value(_stepped_metrics(pair.prefill.url), late)
        with (
            running(start_fake_engine("F", 0.0, 0, "--fail-kv-loads")) as (fake,),
            running(start_router("--prefill", pair.prefill.url, "--decode",
                                 f"{fake.url},{pair.decode.url}", "--pool", "tiny")) as (router,),
        ):
            resp = httpx.post(router.url + "/v1/completions", timeout=60, json={
                "model": SERVED, "prompt": _prompt("india"), "max_tokens": 4, "temperature": 0})
            assert resp.status_code == 200, resp.text

            def releases(outcome: str) -> float:
                return metric_value(httpx.get(router.url + "/metrics").text,
                                    "poolpilot_router_kv_releases_total", {"outcome": outcome})

            # The release is a one-token decode in the background: on a loaded machine vLLM
            # on CPU may take a while; the router gives it up to 60 s.
            try:
                wait_until(lambda: releases("released") + releases("failed") >= 1, 90,
                           "the release")
            finally:
                log = router.output.text() if router.output else ""
                print(log[-4000:])  # shown by pytest when the test fails
            assert releases("released") == 1, log[-4000:]
            assert metric_value(decode_metrics(pair), xfers) == before_d + 1
            # The KV was read while still held (not after its lease): the prefill engine
            # counts no late notification, so it freed the blocks. By the request's id in the
            # engine's log too (the counter is the engine's, shared with earlier tests).
            [released] = re.findall(r"prefill KV of (\S+): released", log)
            prefill_log = Path(pair.prefill.name.split(":", 1)[1]).read_text()
            assert metric_value(_stepped_metrics(pair.prefill.url), late) == before_p, \
                prefill_log[-4000:]
            assert f"unrecognized request {released} " not in prefill_log
            assert metric_value(httpx.get(router.url + "/metrics").text,
                                "poolpilot_router_kv_transfer_failures_total") == 1


def _stepped_metrics(url: str) -> str:
    """An engine's /metrics after one step of its own: vLLM publishes its KV connector's
    counters with a step's stats, so an idle engine's page can lag a notification it already
    handled (an earlier test's late one then shows up in a later test's reading)."""
    resp = httpx.post(url + "/v1/completions", timeout=60, json={
        "model": SERVED, "prompt": "step", "max_tokens": 1, "temperature": 0})
    assert resp.status_code == 200, resp.text
    return httpx.get(url + "/metrics", timeout=10).text


class TestExample:
    @pytest.fixture
    def pair(self, example_pair: Pair) -> Pair:
        return example_pair

    @pytest.mark.parametrize("case", EXAMPLE_CASES, ids=[c.id for c in EXAMPLE_CASES])
    def test_same_greedy_output_as_aggregated_with_kv_from_shared_folder(
        self, pair: Pair, reference: dict[str, str], case: Case
    ) -> None:
        before = decode_metrics(pair)
        out = ask(pair.router.url, case)
        after = decode_metrics(pair)
        assert out == reference[case.id]
        hits = "vllm:external_prefix_cache_hits_total"
        assert metric_value(after, hits) - metric_value(before, hits) >= 128

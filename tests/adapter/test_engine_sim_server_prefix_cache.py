"""The engine simulator's prefix cache over real HTTP: prompts that share text share blocks,
the hit counters on /metrics rise under vLLM's names and labels, and a hit lowers TTFT
(simulated seconds, from the simulator's own request log: orderings, not times)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from poolpilot.engine_sim.workloads import prompt_text
from poolpilot.testkit.engine_sim import EngineSimProcess
from prometheus_client.parser import text_string_to_metric_families

from poolpilot import metrics as m

pytestmark = pytest.mark.adapter
NAME = "sim-llama"
QUERIES = m.VLLM_PREFIX_CACHE_QUERIES
HITS = m.VLLM_PREFIX_CACHE_HITS


@pytest.fixture(scope="module")
def engine() -> Iterator[EngineSimProcess]:
    with EngineSimProcess(role="aggregated", speed=float("inf"), served_name=NAME) as sim:
        yield sim


def counters(sim: EngineSimProcess) -> dict[str, float]:
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(httpx.get(sim.url + "/metrics").text):
        for s in fam.samples:
            if s.name in (QUERIES, HITS):
                assert set(s.labels) == set(m.VLLM_LABELS)  # vLLM's labels: model_name, engine
                assert s.labels["model_name"] == NAME
                out[s.name] = s.value
    return out


def send(sim: EngineSimProcess, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(sim.url + path, json={"model": NAME, "max_tokens": 2, "ignore_eos": True,
                                         **body}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def last_ttft(sim: EngineSimProcess) -> float:
    rec = httpx.get(sim.url + "/sim/requests").json()["requests"][-1]
    return float(rec["first_token_at"] - rec["arrival"])


@dataclass(frozen=True)
class Pair:
    name: str
    path: str
    first: dict[str, Any]
    second: dict[str, Any]
    min_hit: int  # tokens the second request must hit at least
    max_hit: int  # ... and at most


SYSTEM = prompt_text((101, 102, 103, 104), 2048)
PAIRS = [
    Pair("completion-sharing-a-long-prefix", "/v1/completions",
         {"prompt": prompt_text((1, 2, 3, 4, 5, 6), 3000)},
         {"prompt": prompt_text((1, 2, 3, 4, 5, 7), 3000)}, 2544, 2560),
    Pair("chat-sharing-the-system-message", "/v1/chat/completions",
         {"messages": [{"role": "system", "content": SYSTEM},
                       {"role": "user", "content": "hello there"}]},
         {"messages": [{"role": "system", "content": SYSTEM},
                       {"role": "user", "content": "something else"}]}, 2032, 2048),
    Pair("chat-messages-in-another-order-share-nothing", "/v1/chat/completions",
         {"messages": [{"role": "user", "content": prompt_text((201,), 600)},
                       {"role": "user", "content": prompt_text((202,), 600)}]},
         {"messages": [{"role": "user", "content": prompt_text((202,), 600)},
                       {"role": "user", "content": prompt_text((201,), 600)}]}, 0, 0),
]


@pytest.mark.parametrize("case", PAIRS, ids=[c.name for c in PAIRS])
def test_a_shared_prefix_hits_and_lowers_ttft(engine: EngineSimProcess, case: Pair) -> None:
    before = counters(engine)
    first = send(engine, case.path, case.first)
    cold = last_ttft(engine)
    mid = counters(engine)
    second = send(engine, case.path, case.second)
    warm = last_ttft(engine)
    after = counters(engine)
    n1, n2 = first["usage"]["prompt_tokens"], second["usage"]["prompt_tokens"]
    assert mid[QUERIES] - before.get(QUERIES, 0) == n1  # every prompt token is queried
    assert after[QUERIES] - mid[QUERIES] == n2
    hit = after[HITS] - mid[HITS]
    assert case.min_hit <= hit <= case.max_hit
    assert hit % 16 == 0  # whole blocks only
    if hit:
        assert warm < cold
    else:
        assert warm == pytest.approx(cold, rel=0.05)


def test_pd_prefill_engine_serves_hits_and_decode_caches_what_it_reads() -> None:
    with EngineSimProcess(role="prefill", speed=float("inf"), served_name=NAME) as pre, \
            EngineSimProcess(role="decode", speed=float("inf"), served_name=NAME,
                             host="127.0.0.2") as dec:
        prompts = [prompt_text((1, 2, 3, 4), 2000), prompt_text((1, 2, 3, 5), 2000)]
        xfer: list[float] = []
        for prompt in prompts:
            kv = send(pre, "/v1/completions", {
                "prompt": prompt, "max_tokens": 1,
                "kv_transfer_params": {"do_remote_decode": True}})["kv_transfer_params"]
            before = _xfer_sum(dec)
            send(dec, "/v1/completions", {"prompt": prompt, "kv_transfer_params": kv})
            xfer.append(_xfer_sum(dec) - before)
        pc, dc = counters(pre), counters(dec)
        assert pc[HITS] == 1536 and dc[HITS] == 1536  # 3 shared blocks of 512 words
        assert xfer[1] < xfer[0]  # the decode engine held those: only the rest moved
        # a local prefill on the decode engine uses its cache (of KV it received)
        send(dec, "/v1/completions", {"prompt": prompt_text((1, 2, 3, 6), 2000)})
        assert counters(dec)[HITS] == 2 * 1536


def _xfer_sum(sim: EngineSimProcess) -> float:
    for fam in text_string_to_metric_families(httpx.get(sim.url + "/metrics").text):
        for s in fam.samples:
            if s.name == m.VLLM_NIXL_XFER_TIME + "_sum":
                return float(s.value)
    return 0.0


def test_caching_off_hits_nothing() -> None:
    with EngineSimProcess(role="aggregated", speed=float("inf"), served_name=NAME,
                          extra_args=["--no-enable-prefix-caching"]) as sim:
        for _ in range(2):
            send(sim, "/v1/completions", {"prompt": prompt_text((1, 2), 1000)})
        assert counters(sim).get(HITS, 0.0) == 0.0


def test_a_cpu_offload_tier_serves_a_prefix_the_gpu_evicted() -> None:
    """`--kv-offloading-size` (vLLM's flag): a GPU that holds ~4,800 tokens evicts most of a
    3,000-token prompt's blocks when a 4,500-token one comes; the same prompt again loads them
    back from host memory (vLLM's external prefix-cache counters on /metrics) and its first
    token comes sooner than the first time; without the tier it is computed again."""
    a, b = prompt_text((1, 2, 3, 4, 5, 6), 3000), prompt_text((7, 8, 9, 10, 11, 12), 4500)
    ext = m.VLLM_EXTERNAL_PREFIX_CACHE_HITS
    seen = {}
    for gib in ("0", "1"):
        with EngineSimProcess(role="engine", speed=float("inf"), served_name=NAME,
                              extra_args=["--gpu-memory-utilization", "0.125",
                                          "--kv-offloading-size", gib]) as sim:
            first = send(sim, "/v1/completions", {"prompt": a})["usage"]["prompt_tokens"]
            cold = last_ttft(sim)
            send(sim, "/v1/completions", {"prompt": b})
            before = _counter(sim, ext), counters(sim)[HITS]
            send(sim, "/v1/completions", {"prompt": a})
            after = _counter(sim, ext)
            loaded = None if after is None else after - (before[0] or 0.0)
            seen[gib] = (last_ttft(sim) / cold, loaded, counters(sim)[HITS] - before[1], first)
    (cold_ratio, cold_ext, cold_hit, n), (warm_ratio, warm_ext, warm_hit, _) = seen["0"], seen["1"]
    assert cold_ext is None  # no connector, no external series (as vLLM)
    assert cold_hit < n // 2 and cold_ratio > 0.5  # mostly recomputed
    assert warm_ext is not None and warm_ext > n // 2  # most of it came back from host
    assert warm_ext + warm_hit >= n - 16 - 512  # all but a partial block (and the last token)
    assert warm_ratio < cold_ratio / 2


def _counter(sim: EngineSimProcess, name: str) -> float | None:
    for fam in text_string_to_metric_families(httpx.get(sim.url + "/metrics").text):
        for s in fam.samples:
            if s.name == name:
                return float(s.value)
    return None

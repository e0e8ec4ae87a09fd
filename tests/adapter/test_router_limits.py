"""The router's limits over real HTTP against fake engine processes: requests that cannot fit
the engines' context refused before any engine work, hung decodes, the HTTP server's own
timeouts and connection cap."""

from __future__ import annotations

import httpx
import pytest
from router_support import FAST, Proc, running, start_fake_engine, start_router, wait_until

pytestmark = pytest.mark.adapter


def received(engine: Proc) -> int:
    return len(httpx.get(engine.url + "/debug/requests", timeout=5).json())


@pytest.mark.parametrize("mode", ["disaggregated", "aggregated"])
def test_prompt_plus_max_tokens_over_max_model_len_is_a_400_before_any_engine_work(
        mode: str) -> None:
    engines = [start_fake_engine(n, 0.0, 0, "--max-model-len", "1000") for n in ("P", "D")]
    with running(*engines) as (p, d):
        flags = (["--prefill", p.url, "--decode", d.url] if mode == "disaggregated"
                 else ["--engine", d.url])
        with running(start_router(*flags, *FAST)) as (r,):
            too_long = {"model": "fake", "prompt": [1] * 600, "max_tokens": 500}

            def refused() -> bool:
                return httpx.post(r.url + "/v1/completions", json=too_long,
                                  timeout=10).status_code == 400

            # The limit is learned from the engines' /v1/models on a health check.
            wait_until(refused, 30, "the router to learn max_model_len")
            before = received(p) + received(d)
            resp = httpx.post(r.url + "/v1/completions", json=too_long, timeout=10)
            assert resp.status_code == 400
            error = resp.json()["error"]
            assert "1000" in error["message"] and "1100" in error["message"]
            assert error["param"] == "max_tokens"
            assert received(p) + received(d) == before  # no prefill, no decode
            fits = httpx.post(r.url + "/v1/completions", timeout=10,
                              json=too_long | {"max_tokens": 400})
            assert fits.status_code == 200, fits.text

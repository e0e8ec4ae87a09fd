"""How the Router (router/app.py) chooses: the engine of a role for a request (by the prompt's
cached prefix when prefix routing is on, else by load), whether a decode engine prefills a
prompt itself, and how long a prefill engine may take before it counts as hung.
"""

from __future__ import annotations

import logging
from typing import Any

import aiohttp
from poolpilot.router import local_prefill as lp
from poolpilot.router.balancer import Balancer, Endpoint
from poolpilot.router.config import RouterConfig, floored
from poolpilot.router.metrics import RouterMetrics
from poolpilot.router.prefix_source import PrefixSource, PromptKeys
from poolpilot.router.relay import Attempt

from poolpilot.clock import Clock
from poolpilot.roles import Role

log = logging.getLogger("poolpilot.router")

# The prefill rate a deadline assumes before one is known (no seed, no prefill measured yet): a
# slow engine's (vLLM on CPU computes about this many prompt tokens a second), so a long prompt
# is not declared hung by a fresh router. The first measured prefills replace it.
UNMEASURED_PREFILL_TOKENS_PER_S = 1_000.0


class EngineChoice:
    """The Router's choices of engine, which it provides what is declared here."""

    clock: Clock
    config: RouterConfig
    balancer: Balancer
    metrics: RouterMetrics
    prefix: PrefixSource | None
    prefill_rate: lp.RateEstimate
    mean_prompt_tokens: float
    local_active: bool
    # Per prefill engine: when it last answered this router, or went from idle to busy; and
    # since when one of its prefills ran past the deadline, if it has not answered since
    # (clock.now(), simulated seconds).
    prefill_heard: dict[str, float]
    prefill_timed_out: dict[str, float]

    def _local_prefill_engine(self, prompt_tokens: int,
                              prompt: PromptKeys | None = None) -> Endpoint | None:
        """The decode engine to prefill this request itself, or None for the P/D path."""
        if self.config.local_prefill is None:
            return None
        rate = self.prefill_rate.tokens_per_s
        policy = self.config.local_prefill
        if self.prefill_rate.measured:  # not a seed: the engines' own speed
            policy = lp.calibrated(policy, rate)
        prefills = [e for e in self.balancer.role_endpoints(Role.PREFILL) if not e.ejected()]
        decodes = [e for e in self.balancer.role_endpoints(Role.DECODE) if not e.ejected()]
        # Queued prompt tokens (whole, the unit the rate is learned in): what this router has
        # in flight there (x its workers, which share connections evenly), or the engine's own
        # queue (which also holds other routers' work) in tokens, whichever says more. With
        # prefix-aware routing, what each engine is expected to hold of this prompt is not to
        # compute.
        held_p = self._matched(prompt, prompt_tokens, [e.url for e in prefills])
        held_d = self._matched(prompt, prompt_tokens, [e.url for e in decodes])
        d = lp.decide(
            prompt_tokens,
            [lp.PrefillLoad(max(e.queued_prompt_tokens * self.config.workers,
                                e.waiting * self.mean_prompt_tokens), rate, held)
             for e, held in zip(prefills, held_p, strict=True)],
            [lp.DecodeLoad(e.inflight, e.local_tokens, held)
             for e, held in zip(decodes, held_d, strict=True)],
            policy,
            self.local_active,
        )
        if d.active != self.local_active:
            log.info(
                "local prefill %s: expected prefill wait %.3f s (TTFT target %.3f s), "
                "prefill engines %d at %.0f tokens/s, decode engines %d",
                "on" if d.active else "off", d.prefill_wait_s, policy.ttft_s, len(prefills),
                rate, len(decodes),
            )
        self.local_active = d.active
        return decodes[d.engine] if d.local and d.engine is not None else None

    def _prefill_saturated(self) -> bool:
        """Every admitted prefill engine has more than the hold's worth of work this router
        queued there (x its workers) at the learned prefill rate; False with none admitted
        (the path for no prefill engine applies) or no rate known."""
        hold_s = self.config.prefill_hold_s
        rate = self.prefill_rate.tokens_per_s
        if hold_s is None or not rate > 0:
            return False
        limit = hold_s * rate / self.config.workers
        engines = [e for e in self.balancer.role_endpoints(Role.PREFILL)
                   if not e.ejected() and not self._prefill_silent(e)]
        return bool(engines) and all(e.queued_prompt_tokens > limit for e in engines)

    def _prefill_silent(self, e: Endpoint) -> bool:
        """A prefill engine that is hung, not saturated: with this router's work in flight it
        has not answered for a whole prefill deadline (its own part, N TTFT targets), or one
        of its prefills ran past the deadline within the last such deadline and it has not
        answered or passed a health check since. It is left out of the hold's saturation test
        and of the prefill pick, so held prompts neither wait on it nor go to it (an ejection
        lapses after seconds, while the requests in flight there time out one deadline after
        each was sent); a prompt with no other prefill engine takes the local prefill."""
        own_s = floored(self.config.prefill_deadline_s, self.clock)
        if own_s is None:
            return False
        now = self.clock.now()
        timed_out = self.prefill_timed_out.get(e.url)
        if timed_out is not None and now - timed_out <= own_s:
            return True
        heard = self.prefill_heard.get(e.url)
        return e.inflight > 0 and heard is not None and now - heard > own_s

    def _prefill_deadline(self, queued_tokens: int,
                          left_s: float | None = None) -> aiohttp.ClientTimeout | None:
        """How long a prefill engine may take to answer before it counts as hung: N TTFT
        targets plus this router's tokens queued there (this prompt's included) at the learned
        prefill rate, or at a slow engine's before one is learned (a saturated engine, or one
        computing a long prompt, is not a hung one), at most `left_s` (what the request's deadline
        budget has left once a deadline was missed; simulated seconds). The answer is the
        transport's timeout, in real seconds."""
        c = self.config
        own_s = floored(c.prefill_deadline_s, self.clock)
        if own_s is None and left_s is None:
            return None
        read_s = c.idle_timeout_s
        if own_s is not None:
            rate = self.prefill_rate.tokens_per_s  # per simulated second
            if not rate > 0:
                rate = UNMEASURED_PREFILL_TOKENS_PER_S
            queue_s = queued_tokens / rate
            read_s = min(read_s, self.clock.real(own_s + queue_s))
        if left_s is not None:
            read_s = max(1e-3, min(read_s, self.clock.real(left_s)))
        return aiohttp.ClientTimeout(total=c.request_timeout_s, sock_connect=c.connect_timeout_s,
                                     sock_read=read_s)

    async def _prompt_keys(self, path: str, body: dict[str, Any]) -> PromptKeys | None:
        if self.prefix is None:
            return None
        try:
            return await self.prefix.prompt_keys(path, body)
        except Exception:  # a source's failure must not fail the request: route on load
            log.warning("prefix source failed to key a prompt; routing on load", exc_info=True)
            return None

    def _matched(self, prompt: PromptKeys | None, prompt_tokens: int,
                 urls: list[str]) -> list[int]:
        """Per url, the prompt tokens it is expected to hold."""
        if prompt is None or self.prefix is None or not prompt.keys:
            return [0] * len(urls)
        blocks = self.prefix.matched_blocks(prompt, urls, self.clock.monotonic())
        return [min(prompt_tokens, prompt.tokens(b)) for b in blocks]

    def _pick(self, role: Role, exclude: list[str], prompt: PromptKeys | None,
              prompt_tokens: int) -> tuple[Endpoint | None, int]:
        """An endpoint of `role` (by prefix when there is a prompt to key) and the prompt
        tokens it is expected to hold."""
        now = self.clock.monotonic()  # the balancer's and the prefix index's: real seconds
        if role == Role.PREFILL:
            silent = [e.url for e in self.balancer.role_endpoints(role)
                      if self._prefill_silent(e)]
            exclude = [*exclude, *silent] if silent else exclude
        if prompt is None or self.prefix is None or not prompt.keys:
            return self.balancer.pick(role, now, exclude=exclude), 0
        got = self.balancer.pick_by_prefix(
            role, now, lambda urls: self._matched(prompt, prompt_tokens, urls), prompt_tokens,
            self.config.prefix_balance, exclude=exclude)
        if got is None:
            return None, 0
        endpoint, choice = got
        self.metrics.observe_choice(role, choice.reason)
        return endpoint, choice.matched_tokens

    def _settle_local(self, att: Attempt) -> None:
        """The engine has prefilled (or dropped) the prompt it was computing itself."""
        if att.local_tokens:
            self.balancer.add_local_tokens(att.endpoint.url, -att.local_tokens)
            att.local_tokens = 0

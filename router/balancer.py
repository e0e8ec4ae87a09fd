"""Endpoint selection: pure state and decisions, no I/O and no clock (callers pass `now`).

Load of an endpoint = requests this router has in flight there + the engine's own queue
(`vllm:num_requests_waiting`, scraped; it also counts other routers' work) + tokens in flight
divided by `tokens_per_request` (so one 8k-token prompt weighs like several short ones).
The pick is the endpoint with the lowest (load + 1) divided by its ramp weight; ties rotate.

Health: an endpoint is ejected after `eject_after` consecutive failures (passive: a failed
request; active: a failed health check) for a back-off that doubles per ejection up to
`max_eject_s`. It is re-admitted when a health check passes after the back-off (or when the
back-off ends, for callers without health checks), and ramps in again.

A decode engine that answers that a handoff's KV could not be loaded (the prefill's side:
the prefill engine is gone or released it) is not at fault: the router `forgive`s it the
failures counted while it pulled. One that is still pulling at the first-token deadline is
charged with `spare_last`: that failure never ejects the role's last admitted endpoint.

Ramp-in: an endpoint that joins (scale-up, re-admission) has weight growing linearly from
`min_weight` to 1 over `ramp_s`, so a cold engine is not flooded the moment it appears.
Endpoints known at start-up start at full weight.

If every endpoint of a role is ejected, the least-loaded one is used anyway (Envoy's panic
threshold), except for the roles in `strict_roles`: the P/D router has somewhere better to
go (local prefill, or a 503 with Retry-After) than an engine that just stopped answering.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from poolpilot.router.prefix_index import TOKENS_PER_LOAD, Choice, choose


@dataclass
class BalancerConfig:
    tokens_per_request: float = TOKENS_PER_LOAD
    eject_after: int = 2
    base_eject_s: float = 2.0
    max_eject_s: float = 30.0
    ramp_s: float = 10.0
    min_weight: float = 0.1


@dataclass
class Endpoint:
    url: str
    role: str
    joined_at: float = float("-inf")  # -inf: full weight from the start
    inflight: int = 0
    inflight_tokens: int = 0  # the prompt tokens charged: those not expected cached here
    # The whole prompt tokens of the prompts sent here to prefill (P/D), not yet answered: a
    # prefill engine's queue, in the unit its rate is learned in (EngineChoice).
    queued_prompt_tokens: int = 0
    waiting: float = 0.0  # scraped vllm:num_requests_waiting
    local_tokens: float = 0.0  # prompt tokens sent here to prefill locally, first token not seen
    failures: int = 0  # consecutive
    ejections: int = 0  # consecutive ejections, for back-off
    ejected_until: float | None = None  # None: admitted

    def requests(self) -> float:
        """Requests at the engine: this router's in flight and the engine's queue."""
        return self.inflight + self.waiting

    def load(self, cfg: BalancerConfig) -> float:
        return self.requests() + self.inflight_tokens / cfg.tokens_per_request

    def weight(self, cfg: BalancerConfig, now: float) -> float:
        if cfg.ramp_s <= 0:
            return 1.0
        return max(cfg.min_weight, min(1.0, (now - self.joined_at) / cfg.ramp_s))

    def ejected(self) -> bool:
        return self.ejected_until is not None


@dataclass
class Balancer:
    config: BalancerConfig = field(default_factory=BalancerConfig)
    # By (role, url): one server may serve two roles (tests, benchmarks). Calls that name a
    # url (load, health, queue depth) apply to every role it serves: it is one server.
    endpoints: dict[tuple[str, str], Endpoint] = field(default_factory=dict)
    _turns: dict[str, int] = field(default_factory=dict)  # per role, for rotating ties
    strict_roles: frozenset[str] = frozenset()  # all ejected: no candidate (no panic)
    # Indexes rebuilt when membership changes: every request looks endpoints up several times.
    _by_role: dict[str, list[Endpoint]] = field(default_factory=dict)
    _by_url: dict[str, list[Endpoint]] = field(default_factory=dict)

    # -- membership ------------------------------------------------------------------------

    def set_endpoints(self, role: str, urls: Iterable[str], now: float, initial: bool = False)\
            -> tuple[list[str], list[str]]:
        """Replace the role's endpoints; returns (added, removed). Existing ones keep their
        state; new ones ramp in unless `initial`."""
        wanted = list(dict.fromkeys(urls))
        current = [e.url for e in self.role_endpoints(role)]
        added = [u for u in wanted if (role, u) not in self.endpoints]
        removed = [u for u in current if u not in wanted]
        for url in removed:
            del self.endpoints[(role, url)]
        for url in added:
            joined = float("-inf") if initial else now
            self.endpoints[(role, url)] = Endpoint(url=url, role=role, joined_at=joined)
        self._index()
        return added, removed

    def _index(self) -> None:
        self._by_role, self._by_url = {}, {}
        for e in self.endpoints.values():
            self._by_role.setdefault(e.role, []).append(e)
            self._by_url.setdefault(e.url, []).append(e)

    def get(self, url: str, role: str | None = None) -> Endpoint:
        """The endpoint for a url (and role, when the url serves several)."""
        [e] = [e for e in self.by_url(url) if role is None or e.role == role]
        return e

    def by_url(self, url: str) -> list[Endpoint]:
        return self._by_url.get(url, [])

    def urls(self) -> list[str]:
        return list(dict.fromkeys(e.url for e in self.endpoints.values()))

    def role_endpoints(self, role: str) -> list[Endpoint]:
        return self._by_role.get(role, [])

    # -- selection ---------------------------------------------------------------------------

    def candidates(self, role: str, now: float, exclude: Iterable[str] = ()) -> list[Endpoint]:
        """The endpoints a request of `role` may go to: the admitted ones not excluded (all
        of them, ejected too, when none is admitted: panic, try anyway; none for a role in
        `strict_roles`)."""
        excluded = set(exclude)
        candidates = [e for e in self.role_endpoints(role) if e.url not in excluded]
        for e in candidates:
            self._maybe_readmit(e, now)
        admitted = [e for e in candidates if not e.ejected()]
        if admitted or role in self.strict_roles:
            return admitted
        return candidates

    def pick(self, role: str, now: float, exclude: Iterable[str] = ()) -> Endpoint | None:
        pool = self.candidates(role, now, exclude)
        if not pool:
            return None
        cfg = self.config
        # +1: an idle endpoint still costs something, so a ramping one (weight < 1) is not
        # preferred merely for being empty.
        scores = [(e.load(cfg) + 1) / e.weight(cfg, now) for e in pool]
        best = min(scores)
        ties = [e for e, s in zip(pool, scores, strict=True) if s <= best + 1e-9]
        return ties[self._turn(role) % len(ties)]

    def _turn(self, role: str) -> int:
        turn = self._turns[role] = self._turns.get(role, -1) + 1
        return turn

    def pick_by_prefix(
        self, role: str, now: float, matched: Callable[[list[str]], list[int]],
        prompt_tokens: int, balance: float, exclude: Iterable[str] = (),
    ) -> tuple[Endpoint, Choice] | None:
        """Prefix-aware pick (router/prefix_index.choose): `matched(urls)` gives the prompt
        tokens each candidate is expected to hold. With no holder it is `pick` exactly."""
        pool = self.candidates(role, now, exclude)
        if not pool:
            return None
        cfg = self.config
        choice = choose([e.load(cfg) for e in pool], matched([e.url for e in pool]),
                        prompt_tokens, weights=[e.weight(cfg, now) for e in pool],
                        tokens_per_load=cfg.tokens_per_request, balance=balance,
                        turn=self._turn(role), requests=[e.requests() for e in pool])
        return pool[choice.index], choice

    def acquire(self, url: str, tokens: int, prompt_tokens: int = 0) -> None:
        """A request sent: `tokens` charged, `prompt_tokens` to prefill there (P/D)."""
        for e in self.by_url(url):
            e.inflight += 1
            e.inflight_tokens += tokens
            e.queued_prompt_tokens += prompt_tokens

    def release(self, url: str, tokens: int, prompt_tokens: int = 0) -> None:
        for e in self.by_url(url):
            e.inflight = max(0, e.inflight - 1)
            e.inflight_tokens = max(0, e.inflight_tokens - tokens)
            e.queued_prompt_tokens = max(0, e.queued_prompt_tokens - prompt_tokens)

    def add_local_tokens(self, url: str, tokens: float) -> None:
        """Prompt tokens a decode engine was given to prefill itself (negative: prefilled)."""
        for e in self.by_url(url):
            e.local_tokens = max(0.0, e.local_tokens + tokens)

    # -- health ------------------------------------------------------------------------------

    def report_success(self, url: str) -> None:
        for e in self.by_url(url):
            if not e.ejected():
                e.failures = 0
                e.ejections = 0

    def forgive(self, url: str) -> list[Endpoint]:
        """The engine's recent failures were another's: it was pulling KV for a handoff that
        then failed on the prefill's side (vLLM on CPU answered its health checks up to 12 s
        late while it failed such a pull). Its consecutive failures are dropped and its
        ejection, if any, undone (the back-off as before it); returns the endpoints
        re-admitted (for logging)."""
        readmitted = []
        for e in self.by_url(url):
            e.failures = 0
            if e.ejected():
                e.ejected_until = None
                e.ejections = max(0, e.ejections - 1)
                readmitted.append(e)
        return readmitted

    def report_failure(self, url: str, now: float, spare_last: bool = False) -> list[Endpoint]:
        """Count a failure; returns the endpoints this ejected (for logging). `spare_last`: the
        failure may be another's (a KV pull from a prefill engine that is gone), so it counts
        but does not eject the last admitted endpoint of a role."""
        ejected = []
        for e in self.by_url(url):
            e.failures += 1
            if spare_last and not any(o is not e and not o.ejected()
                                      for o in self.role_endpoints(e.role)):
                continue
            if e.failures >= self.config.eject_after and not e.ejected():
                backoff = min(self.config.max_eject_s,
                              self.config.base_eject_s * 2**e.ejections)
                e.ejections += 1
                e.ejected_until = now + backoff
                ejected.append(e)
        return ejected

    def report_health(
        self, url: str, ok: bool, now: float
    ) -> tuple[list[Endpoint], list[Endpoint]]:
        """An active health check result: failure counts like a failed request; success
        re-admits an ejected endpoint once its back-off is over. Returns (ejected,
        re-admitted) endpoints, for logging."""
        if not ok:
            return self.report_failure(url, now), []
        readmitted = []
        for e in self.by_url(url):
            if e.ejected_until is None:
                e.failures = 0
            elif now >= e.ejected_until:
                self._readmit(e, now)
                readmitted.append(e)
        return [], readmitted

    def update_waiting(self, url: str, waiting: float) -> None:
        for e in self.by_url(url):
            e.waiting = max(0.0, waiting)

    def _maybe_readmit(self, e: Endpoint, now: float) -> None:
        # Without health checks, the back-off expiring re-admits on probation: one more
        # failure ejects again (failures stays at eject_after - 1).
        if e.ejected_until is not None and now >= e.ejected_until:
            self._readmit(e, now)
            e.failures = self.config.eject_after - 1

    def _readmit(self, e: Endpoint, now: float) -> None:
        e.ejected_until = None
        e.failures = 0
        e.joined_at = now

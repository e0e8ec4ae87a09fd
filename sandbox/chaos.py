"""Chaos in the sandbox, the pure part: the fault plan a seed gives, and the verdicts.

While a trace replays, `chaos_run.ChaosRun` kills one component at a time and lets it come
back: the operator, the autoscaler and Prometheus are killed (SIGKILL) and started again after
a downtime, as a Deployment would restart their pods; one pod of each engine role and the
router pod are killed and the sandbox's kubelet restarts them (a container crash). This module
decides *what* and *when* from a seed, and judges what was recorded against three properties:

1. no request lost silently: every request of the trace has an outcome at its client, a full
   answer or an error it saw; none hangs, none ends as a success with less than it asked for;
2. no scale-down caused by missing metrics: while Prometheus is down the autoscaler holds
   (MetricsAvailable=False, no scale event), and no scale-down follows within the scale-down
   window after it returns; every replica change of the run was announced by the autoscaler;
3. back to the desired size: after each fault, within a bound (below), the component serves
   again, each role's Deployment asks for the replicas the autoscaler wants, and every pod
   that existed when the fault struck is ready again (or was removed by a scale-down); pods
   the autoscaler ordered after it may still be loading (new orders, not the fault's damage).

Two faults leave the engine process alive (asked for by `--chaos-faults hung-ROLE,slow-ROLE`,
not in the default list): "hung" stops one pod of the role (SIGSTOP: it holds its sockets and
answers nothing) and continues it (SIGCONT) after a hold; "slow" makes its every step take
SLOWDOWN times as long (the engine simulator's POST /sim/fault) for a hold. Besides the three
properties, a hung engine is judged on a fourth:

4. a hung engine costs a deadline, not a timeout: no request waits, from its send or from the
   stop (whichever is later), longer than the pool's TTFT target plus one router deadline for
   its next token or its answer (an error counts: it was seen): the prefill deadline
   (PREFILL_DEADLINE_TTFTS x the TTFT target) for a prefill engine, the decode stall deadline
   (DECODE_STALL_ITLS x the ITL target) for a decode or aggregated one.

Times are simulated seconds from the start of the replay (the report's clock). No I/O here.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from poolpilot.roles import Role

INFRA = ("operator", "autoscaler", "prometheus")  # processes the sandbox restarts itself
PODS = tuple(Role)  # pods the kubelet restarts: every role's
ALIVE = ("hung", "slow")  # faults on an engine pod whose process stays alive: "hung-decode"
SLOWDOWN = 10.0  # a slow engine's step-time multiplier
# The router's default deadlines (router/main.py's --prefill-deadline-ttfts and
# --decode-stall-itls), in multiples of the pool's TTFT and ITL targets.
PREFILL_DEADLINE_TTFTS = 5.0
DECODE_STALL_ITLS = 200.0
# Downtime of a killed infra process before it is started again (simulated seconds). The
# Prometheus outage is long enough for the autoscaler to decide at least twice without data.
DOWNTIME_S: Mapping[str, tuple[float, float]] = {
    "operator": (10.0, 30.0),
    "autoscaler": (10.0, 30.0),
    "prometheus": (30.0, 60.0),
    # how long an engine stays stopped or slow: several router deadlines
    "hung": (20.0, 40.0),
    "slow": (30.0, 60.0),
}
# Real seconds a restarted Python process or Prometheus may take to serve on a loaded machine
# (imports, the TSDB's WAL replay, a pod's first probe); counted at the run's speed.
STARTUP_ALLOWANCE_REAL_S = 15.0
# Real seconds of timing slack in a hung engine's wait bound (the router's timers, the
# clients' event loop, and the fallback's first token from a busy engine on a loaded
# machine); counted at the run's speed. A fresh-clone CI run on two cores needed 0.33 s.
WAIT_ALLOWANCE_REAL_S = 0.5
MIN_GAP_S = 5.0  # simulated seconds between one fault's recovery and the next fault


def default_kinds(engine_roles: Sequence[str]) -> list[str]:
    return [*INFRA, *engine_roles, Role.ROUTER]


def alive_kinds(engine_roles: Sequence[str]) -> list[str]:
    """The hung and slow engine faults the pool's roles allow: hung-prefill, slow-decode..."""
    return [f"{a}-{role}" for a in ALIVE for role in engine_roles]


def alive_fault(kind: str) -> tuple[str, str] | None:
    """"hung-decode" -> ("hung", "decode"); None for a kill."""
    head, _, role = kind.partition("-")
    return (head, role) if head in ALIVE and role else None


def pod_role(kind: str) -> str:
    """The role whose pod a pod fault acts on: "decode" for "decode" and "hung-decode"."""
    alive = alive_fault(kind)
    return alive[1] if alive else kind


def parse_kinds(text: str, engine_roles: Sequence[str]) -> list[str]:
    """`--chaos-faults operator,decode,...` -> the kinds, checked against the pool's roles."""
    allowed = default_kinds(engine_roles) + alive_kinds(engine_roles)
    kinds = [k.strip() for k in text.split(",") if k.strip()]
    bad = [k for k in kinds if k not in allowed]
    if bad or not kinds:
        raise ValueError(f"--chaos-faults {text!r}: unknown fault {', '.join(bad) or '(none)'}; "
                         f"choose from {','.join(allowed)}")
    return list(dict.fromkeys(kinds))


@dataclass(frozen=True)
class Fault:
    """One planned fault: kill `kind` at `at_s` (or as soon after as the previous fault has
    recovered); infra stays down `down_s`; `pick` chooses the pod among the role's pods."""

    index: int
    kind: str
    at_s: float
    down_s: float = 0.0
    pick: float = 0.0  # in [0, 1): which of the role's running pods (sorted by name)

    def choose(self, pods: Sequence[str]) -> str | None:
        names = sorted(pods)
        return names[int(self.pick * len(names))] if names else None


def plan(seed: int, kinds: Sequence[str], start_s: float, end_s: float) -> list[Fault]:
    """Each kind once, in an order and at times drawn from `seed`: the span [start_s, end_s)
    is cut into one slot per fault and each fault falls in the first two thirds of its slot."""
    if end_s <= start_s:
        raise ValueError(f"no time for faults: [{start_s}, {end_s})")
    rng = random.Random(seed)
    order = list(kinds)
    rng.shuffle(order)
    slot = (end_s - start_s) / len(order)
    faults = []
    for i, kind in enumerate(order):
        at = start_s + i * slot + rng.uniform(0, slot * 2 / 3)
        alive = alive_fault(kind)
        lo, hi = DOWNTIME_S.get(alive[0] if alive else kind, (0.0, 0.0))
        faults.append(Fault(i, kind, round(at, 1), round(rng.uniform(lo, hi), 1),
                            round(rng.random(), 4)))
    return faults


@dataclass(frozen=True)
class BoundInputs:
    """What a fault's recovery may take, in simulated seconds."""

    speed: float
    cold_start_s: float  # simulator engines' weight loading
    interval_s: float  # the pool's autoscaling interval
    scrape_s: float  # Prometheus scrape interval


def kubelet_backoff_s(restarts_before: int) -> float:
    """The sandbox kubelet's restart back-off after a pod's (restarts_before + 1)-th exit."""
    return min(2.0 ** (restarts_before + 1), 30.0)


def recovery_bound_s(fault: Fault, b: BoundInputs, restarts_before: int = 0) -> float:
    """The promise: the pool is back at its desired size, and the component serving, within
    this many simulated seconds of the kill: the downtime (infra) or the kubelet's back-off
    (pods), one cold start (the restarted engine's, or of pods that were starting at the
    kill), two autoscaler intervals and two scrapes (it must see the new state and write it;
    after Prometheus returns, two more scrapes for rates to exist again), and a start-up
    allowance in real seconds counted at the run's speed. A hung or slow engine: its hold,
    and a back-off (its liveness probe may have the kubelet restart it meanwhile)."""
    if fault.kind in INFRA:
        restart = fault.down_s
    elif alive_fault(fault.kind):
        restart = fault.down_s + kubelet_backoff_s(restarts_before)
    else:
        restart = kubelet_backoff_s(restarts_before)
    rates = 2 * b.scrape_s if fault.kind == "prometheus" else 0.0
    return round(restart + b.cold_start_s + rates + 2 * b.interval_s + 2 * b.scrape_s
                 + STARTUP_ALLOWANCE_REAL_S * b.speed, 1)


# ---------------------------------------------------------------------------------------------
# What the run recorded


@dataclass
class FaultRecord:
    """A fault as it happened (simulated seconds from the replay's start; None: never)."""

    fault: Fault
    target: str = ""  # the pod or process killed (stopped, slowed)
    injected_s: float | None = None
    restored_s: float | None = None  # infra started again / the pod's process restarted /
    # the hung engine continued (SIGCONT), the slow one back at its speed
    recovered_s: float | None = None  # back at desired size and serving
    bound_s: float = 0.0  # recovery_bound_s, from injected_s
    sole: bool = False  # a pod fault that took down its role's only replica
    serving_s: float | None = None  # back in service: the killed pod ready again (for a sole
    # pod, any pod of its role); Prometheus's metrics usable again (MetricsAvailable=True);
    # the operator or autoscaler answering
    metrics_unavailable_seen: bool | None = None  # Prometheus faults: MetricsAvailable=False seen
    problem: str | None = None  # why it could not be injected

    @property
    def recovery_s(self) -> float | None:
        if self.injected_s is None or self.recovered_s is None:
            return None
        return round(self.recovered_s - self.injected_s, 1)

    @property
    def end_s(self) -> float | None:
        """When the fault's effects end: recovery, else its bound."""
        if self.injected_s is None:
            return None
        return self.recovered_s if self.recovered_s is not None else \
            self.injected_s + self.bound_s


@dataclass(frozen=True)
class ChaosRequest:
    """One request as its client saw it (from loadgen.RequestResult)."""

    sent_s: float
    finished_s: float | None  # None: no outcome at all by the end of the run
    ok: bool
    output_tokens: int
    max_tokens: int
    error: str | None
    token_s: tuple[float, ...] = ()  # when each token reached the client
    @property
    def kind(self) -> str:
        """answered | error | truncated (a success with fewer tokens than forced) | hung."""
        if self.finished_s is None:
            return "hung"
        if not self.ok:
            return "error"
        return "answered" if self.output_tokens >= self.max_tokens else "truncated"


def error_kind(message: str | None) -> str:
    """A short class for an error message: the exception and its HTTP status when it has one
    ("InternalServerError 502"), else the start of the message ("APIConnectionError:
    Connection error.")."""
    if not message:
        return "unknown"
    head, _, rest = message.partition(":")
    for code in ("400", "429", "499", "500", "502", "503", "504"):
        if f"Error code: {code}" in rest:
            return f"{head} {code}"
    return message[:60]


@dataclass
class Verdict:
    name: str
    ok: bool
    detail: str
    data: dict[str, Any] = field(default_factory=dict)


def judge_requests(trace_len: int, outcomes: Sequence[ChaosRequest]) -> Verdict:
    counts = {k: 0 for k in ("answered", "error", "truncated", "hung")}
    for o in outcomes:
        counts[o.kind] += 1
    missing = trace_len - len(outcomes)
    ok = missing == 0 and counts["truncated"] == 0 and counts["hung"] == 0
    detail = (f"{trace_len} in the trace, {len(outcomes)} sent: {counts['answered']} answered, "
              f"{counts['error']} errors seen by their client, {counts['truncated']} truncated "
              f"successes, {counts['hung']} without an outcome")
    return Verdict("no_request_lost_silently", ok, detail,
                   {"trace": trace_len, "sent": len(outcomes), **counts, "never_sent": missing})


def _in(t: float, lo: float | None, hi: float | None) -> bool:
    return lo is not None and hi is not None and lo <= t <= hi


@dataclass(frozen=True)
class Targets:
    """The pool's latency targets (simulated seconds), which the router's deadlines scale."""

    ttft_s: float
    itl_s: float
    allowance_s: float = 0.0  # the clients' and the router's timing on a loaded machine
    # The router's floor on every deadline (router.main.MIN_DEADLINE_S real seconds, at the
    # run's speed): under time compression it, not the target, may be the deadline.
    min_deadline_s: float = 0.0

    def wait_bound_s(self, role: str) -> float:
        """The longest a request may wait on a hung engine of `role`: the TTFT target plus
        the deadline after which the router gives up on that engine (plus the allowance)."""
        deadline = PREFILL_DEADLINE_TTFTS * self.ttft_s if role == Role.PREFILL else \
            DECODE_STALL_ITLS * self.itl_s
        deadline = max(deadline, self.min_deadline_s)
        return round(self.ttft_s + deadline + self.allowance_s, 3)


def wait_on(o: ChaosRequest, stopped_s: float, resumed_s: float) -> float | None:
    """How long `o` waited for its next token (or its answer, or its error) from its send or
    the stop, whichever is later; None when it was not waiting during [stopped, resumed] (it
    had ended before the stop, or was sent after the engine resumed); inf when it never
    heard anything again."""
    if o.sent_s > resumed_s or (o.finished_s is not None and o.finished_s < stopped_s):
        return None
    start = max(o.sent_s, stopped_s)
    nxt = next((t for t in o.token_s if t >= start), o.finished_s)
    return float("inf") if nxt is None else round(max(0.0, nxt - start), 3)


def judge_hung(records: Sequence[FaultRecord], outcomes: Sequence[ChaosRequest],
               targets: Targets) -> Verdict:
    """Property 4 (the module's docstring) for each hung-engine fault."""
    problems: list[str] = []
    checked: list[dict[str, Any]] = []
    for r in records:
        alive = alive_fault(r.fault.kind)
        if not alive or alive[0] != "hung" or r.injected_s is None:
            continue
        resumed = r.restored_s if r.restored_s is not None else r.end_s
        assert resumed is not None
        bound = targets.wait_bound_s(alive[1])
        waits = [w for o in outcomes if (w := wait_on(o, r.injected_s, resumed)) is not None]
        over = [w for w in waits if w > bound]
        worst = max(waits, default=0.0)
        checked.append({"fault": r.fault.index, "kind": r.fault.kind, "target": r.target,
                        "stopped": [r.injected_s, resumed], "requests_waiting": len(waits),
                        "longest_wait_s": None if worst == float("inf") else worst,
                        "bound_s": bound, "over_bound": len(over)})
        if over:
            problems.append(f"{r.fault.kind} ({r.target}): {len(over)} of {len(waits)} "
                            f"requests waited longer than {bound:g}s (longest "
                            f"{'forever' if worst == float('inf') else f'{worst:g}s'})")
    detail = "; ".join(problems) or (
        "no hung-engine fault in this run" if not checked else
        "every request waiting while an engine was hung heard from the pool within its "
        "TTFT target + one router deadline ("
        + ", ".join(f"{c['kind']}: longest {c['longest_wait_s']:g}s of {c['bound_s']:g}s"
                    for c in checked) + ")")
    return Verdict("hung_engine_costs_a_deadline", not problems, detail, {"checked": checked})


def hides_demand(r: FaultRecord) -> bool:
    """A fault during which the autoscaler cannot see the demand: Prometheus down (no data),
    or the only pod of the router or of an engine role down (requests fail before they reach
    the other roles, whose idle engines measure the outage)."""
    return r.fault.kind == "prometheus" or r.sole


def holds_for(r: FaultRecord, event: Mapping[str, Any]) -> bool:
    """Whether a fault that hides the demand forbids this scale event while it lasts. With
    Prometheus or the only router down no role's demand is seen: every role holds. With an
    engine role's only pod down (or hung), that role's demand is hidden and every role's is
    understated (nothing passes through it): no scale-down anywhere, and the role itself
    holds. Another role may scale up for work it really gets (the decode engines prefill
    locally while the prefill role is out)."""
    role = pod_role(r.fault.kind)
    if r.fault.kind == "prometheus" or role == Role.ROUTER:
        return True
    return event.get("role") == role or event["to"] < event["from"]


def judge_metrics_holds(records: Sequence[FaultRecord], events: Sequence[Mapping[str, Any]],
                        down_window_s: float, interval_s: float, lag_s: float,
                        seen_hung_s: float = 0.0) -> Verdict:
    """For each fault that hides the demand (`hides_demand`): no scale event it forbids
    (`holds_for`) from the kill (plus `lag_s`: a decision made before it may land a moment
    after; plus `seen_hung_s` for a hung engine, which nothing can see before its scrapes fail
    and the recording rules drop its series: until then its last samples read as an idle
    engine's) until the component is back (Prometheus restarted, the pod ready),
    MetricsAvailable=False seen during a Prometheus outage, and no scale-down until a
    scale-down window has passed since the autoscaler saw the pool whole again (`serving_s`,
    less one interval: the watcher sees that moment up to a decision late). Every replica
    change of the run must have been announced by the autoscaler (a change without its Event
    was made by something else)."""
    problems: list[str] = []
    checked: list[dict[str, Any]] = []
    for r in records:
        if not hides_demand(r) or r.injected_s is None:
            continue
        what = "Prometheus was down" if r.fault.kind == "prometheus" else \
            f"the only {r.fault.kind} pod was down"
        back = r.restored_s if r.fault.kind == "prometheus" else r.serving_s
        back = back if back is not None else r.end_s
        alive = alive_fault(r.fault.kind)
        seen = lag_s + (seen_hung_s if alive and alive[0] == "hung" else 0.0)
        during = [e for e in events if _in(e["t"], r.injected_s + seen, back)
                  and holds_for(r, e)]
        whole = r.serving_s if r.serving_s is not None else r.end_s
        after_end = (whole or r.injected_s) + down_window_s - interval_s
        downs = [e for e in events if e["to"] < e["from"] and _in(e["t"], back, after_end)]
        checked.append({"fault": r.fault.index, "kind": r.fault.kind,
                        "outage": [r.injected_s, back], "scale_events_during": len(during),
                        "whole_again": whole, "scale_downs_within_window_after": len(downs),
                        **({"metrics_unavailable_seen": r.metrics_unavailable_seen}
                           if r.fault.kind == "prometheus" else {})})
        if during:
            problems.append(f"{len(during)} scale event(s) while {what}: {during}")
        if downs:
            problems.append(f"scale-down(s) within the {down_window_s:g}s window after "
                            f"{r.fault.kind} was back at {whole}: {downs}")
        if r.fault.kind == "prometheus" and not r.metrics_unavailable_seen:
            problems.append(f"MetricsAvailable=False never seen during the outage "
                            f"{r.injected_s}-{back}")
    unannounced = [e for e in events if e.get("reason") in (None, "Unknown")]
    if unannounced:
        problems.append(f"replica changes no autoscaler Event announced: {unannounced}")
    kinds = ", ".join(c["kind"] for c in checked) or "none"
    detail = "; ".join(problems) or (
        f"faults hiding the demand ({kinds}): held, no scale-down within the "
        f"{down_window_s:g}s window after; every replica change announced by the autoscaler")
    return Verdict("no_scale_down_from_missing_metrics", not problems, detail,
                   {"checked": checked, "unannounced_changes": unannounced})


def judge_recovery(records: Sequence[FaultRecord]) -> Verdict:
    late = [r for r in records if r.injected_s is not None
            and (r.recovery_s is None or r.recovery_s > r.bound_s)]
    skipped = [r for r in records if r.injected_s is None]
    problems = [f"{r.fault.kind} ({r.target}): "
                + (f"back after {r.recovery_s}s, bound {r.bound_s}s" if r.recovery_s is not None
                   else f"not back within its bound of {r.bound_s}s")
                for r in late]
    problems += [f"{r.fault.kind}: not injected ({r.problem})" for r in skipped]
    worst = max((r.recovery_s / r.bound_s for r in records
                 if r.recovery_s is not None and r.bound_s), default=0.0)
    detail = "; ".join(problems) or (
        f"all {len(records)} faults recovered within their bounds (at worst "
        f"{worst:.0%} of the bound)")
    return Verdict("back_to_desired_size", not problems, detail)


def errors_by_fault(records: Sequence[FaultRecord], outcomes: Sequence[ChaosRequest]) \
        -> tuple[dict[int, dict[str, int]], list[ChaosRequest]]:
    """Errors (and any other non-answer) attributed to the first fault whose span [injected,
    end] overlaps the request's life [sent, finished]: one in flight across the whole fault
    counts too. Those outside every fault come second."""
    per: dict[int, dict[str, int]] = {r.fault.index: {} for r in records}
    outside: list[ChaosRequest] = []
    for o in outcomes:
        if o.kind == "answered":
            continue
        key = o.kind if o.kind != "error" else error_kind(o.error)
        hit = next((r for r in records if _overlaps(o, r)), None)
        if hit is None:
            outside.append(o)
            continue
        per[hit.fault.index][key] = per[hit.fault.index].get(key, 0) + 1
    return per, outside


# Enough of the errors outside every fault to tell when and why they happened.
OUTSIDE_SHOWN = 20


def _overlaps(o: ChaosRequest, r: FaultRecord) -> bool:
    if r.injected_s is None or r.end_s is None:
        return False
    finished = o.finished_s if o.finished_s is not None else float("inf")
    return o.sent_s <= r.end_s and finished >= r.injected_s


def events_during(r: FaultRecord, events: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [e for e in events if _in(e["t"], r.injected_s, r.end_s)]


def section(seed: int, records: Sequence[FaultRecord], outcomes: Sequence[ChaosRequest],
            trace_len: int, events: Sequence[Mapping[str, Any]],
            down_window_s: float, interval_s: float, lag_s: float,
            targets: Targets | None = None, seen_hung_s: float = 0.0) -> dict[str, Any]:
    """report.json's "chaos" section: the faults as they happened, per fault the errors and
    scale events in its span, and the verdicts (the fourth, on hung engines, with the pool's
    `targets`)."""
    per, outside = errors_by_fault(records, outcomes)
    verdicts = [judge_requests(trace_len, outcomes),
                judge_metrics_holds(records, events, down_window_s, interval_s, lag_s,
                                    seen_hung_s),
                judge_recovery(records)]
    hung = judge_hung(records, outcomes, targets) if targets is not None else None
    if hung is not None:
        verdicts.append(hung)
    faults: list[dict[str, Any]] = []
    for r in records:
        faults.append({
            "index": r.fault.index, "kind": r.fault.kind, "target": r.target,
            "planned_s": r.fault.at_s, "down_s": r.fault.down_s if r.fault.kind in INFRA else None,
            "injected_s": r.injected_s, "restored_s": r.restored_s,
            "serving_s": r.serving_s, "recovered_s": r.recovered_s,
            "recovery_s": r.recovery_s, "bound_s": r.bound_s, "hides_demand": hides_demand(r),
            "errors": per.get(r.fault.index, {}),
            "scale_events": [dict(e) for e in events_during(r, events)],
            **({"metrics_unavailable_seen": r.metrics_unavailable_seen}
               if r.fault.kind == "prometheus" else {}),
            **({"hold_s": r.fault.down_s} if alive_fault(r.fault.kind) else {}),
            **({"problem": r.problem} if r.problem else {}),
        })
    req = verdicts[0].data
    return {
        "seed": seed,
        "faults_injected": sum(r.injected_s is not None for r in records),
        "requests": {**req, "errors_outside_faults": len(outside)},
        "outside_faults": [{"sent_s": round(o.sent_s, 2), "finished_s": None if o.finished_s
                            is None else round(o.finished_s, 2), "kind": o.kind,
                            "error": o.error} for o in outside[:OUTSIDE_SHOWN]],
        "scale_events_during_faults": sum(len(f["scale_events"]) for f in faults),
        "faults": faults,
        **({"hung_waits": hung.data["checked"]} if hung is not None else {}),
        "verdicts": {v.name: {"ok": v.ok, "detail": v.detail} for v in verdicts},
        "ok": all(v.ok for v in verdicts),
    }

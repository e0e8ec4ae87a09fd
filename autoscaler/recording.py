"""Recording rules for the autoscaler's queries, and the plan that reads them when loaded.

Without rules, every cycle makes Prometheus aggregate the raw engine series of every pool
(`queries.QuerySet`): the latency quantiles alone are `histogram_quantile` over `rate()` of
tens of thousands of bucket series at 1,000 pools. With the rules below loaded (the chart's
PrometheusRule, group `poolpilot.autoscaler`; the sandbox's Prometheus), Prometheus computes
the same expressions once per rule interval, and a cycle reads the results with ONE query.

Rules (W = the autoscaler's --rate-window as `QuerySet.window()` prints it, e.g. `60s`):

| record                                   | what                                              |
|------------------------------------------|---------------------------------------------------|
| `poolpilot_autoscaler:<key>:W`           | each plain signal (queue, running, KV usage, token |
|                                          | and request rates, newest sample time, ...)       |
| `poolpilot_autoscaler_buckets:<hist>:W`  | bucket rates by (namespace, pool, role, le) of the |
|                                          | engines' TTFT and ITL and the router's TTFT        |
| `poolpilot_autoscaler:<hist>_quantile:W` | their quantile 0.9, the API's default (label      |
|                                          | `quantile`); others come from the bucket records   |

Each rule's expression is exactly the raw query's (same name fallbacks, same window), so a
recorded value means what the raw one means, only up to one rule interval older; the newest
sample time is recorded as a value, so its age still counts from the last scrape and grows if
the rules stop being evaluated.

Each rule carries a label `poolpilot_rule` with a digest of its expression (window left
out). The autoscaler reads Prometheus's /api/v1/rules and uses a record only if a healthy rule
of that name with the digest it expects is loaded: rules from another version of poolpilot,
for another window, unhealthy, or absent (a Prometheus without our rules) make it query that
signal raw, as before. Either way a signal with no series is "no data", which holds a pool's
size and never scales it down.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from poolpilot.autoscaler import queries as q

from poolpilot import metrics as m

PREFIX = "poolpilot_autoscaler"
DIGEST_LABEL = "poolpilot_rule"
QUANTILE_LABEL = "quantile"
GROUP = "poolpilot.autoscaler"
# Quantiles recorded: the API's default SLO quantile. Each one recorded costs Prometheus a
# histogram_quantile over every pool's buckets at every rule evaluation, used or not; another
# quantile is computed from the recorded bucket rates when a pool asks for it.
RECORDED_QUANTILES = (0.9,)

# Histograms whose quantiles the autoscaler reads: name in the records -> the query key of
# quantile q.
HISTOGRAMS: dict[str, Any] = {
    "ttft": q.ttft_key,
    "itl": q.itl_key,
    "router_ttft": q.router_ttft_key,
}

RuleId = tuple[str, str]  # (record name, quantile label or "")


def plain_name(key: str, window: str) -> str:
    return f"{PREFIX}:{key}:{window}"


def buckets_name(hist: str, window: str) -> str:
    return f"{PREFIX}_buckets:{hist}:{window}"


def quantile_name(hist: str, window: str) -> str:
    return f"{PREFIX}:{hist}_quantile:{window}"


def quantile_label(value: float) -> str:
    return f"{value:g}"


@dataclass(frozen=True)
class Rule:
    record: str
    expr: str
    digest: str
    quantile: str = ""  # the `quantile` label of a quantile record

    @property
    def id(self) -> RuleId:
        return self.record, self.quantile

    def to_dict(self) -> dict[str, Any]:
        labels = {DIGEST_LABEL: self.digest}
        if self.quantile:
            labels[QUANTILE_LABEL] = self.quantile
        return {"record": self.record, "expr": self.expr, "labels": labels}


@dataclass(frozen=True)
class _Windowed(q.QuerySet):
    """A QuerySet over every pool whose window is given as text (a placeholder in the chart)."""

    text: str = ""

    def window(self) -> str:
        return self.text


def _exprs(window: str) -> list[tuple[str, str, str]]:
    """(record, expression, quantile label) of every rule, for a window given as text."""
    qs = _Windowed(text=window)
    out = [(plain_name(key, window), expr, "") for key, expr in qs.build((), ()).items()]
    buckets = {"ttft": qs.bucket_rates(m.VLLM_TTFT), "itl": qs.bucket_rates(m.VLLM_ITL),
               "router_ttft": qs.router_bucket_rates()}
    out += [(buckets_name(h, window), expr, "") for h, expr in buckets.items()]
    for hist in HISTOGRAMS:
        # Reads the bucket record evaluated just before it in the same group.
        out += [(quantile_name(hist, window),
                 f"histogram_quantile({quantile_label(v)}, {buckets_name(hist, window)})",
                 quantile_label(v)) for v in RECORDED_QUANTILES]
    return out


def _digest(expr: str) -> str:
    return hashlib.sha256(expr.encode()).hexdigest()[:12]


def recording_rules(window: str) -> list[Rule]:
    """The rules for `--rate-window` printed as `window` (digests leave the window out)."""
    token = "WINDOW"
    return [Rule(record, expr, _digest(neutral), quantile)
            for (record, expr, quantile), (_, neutral, _) in zip(
                _exprs(window), _exprs(token), strict=True)]


def rule_group(window: str, interval: str) -> dict[str, Any]:
    """The Prometheus rule group (chart, sandbox, tests); `interval`: its evaluation period,
    which adds at most that much age to every recorded value."""
    return {"name": GROUP, "interval": interval,
            "rules": [r.to_dict() for r in recording_rules(window)]}


# ---------------------------------------------------------------------------------------------
# Which loaded rules can be used


@dataclass(frozen=True)
class Loaded:
    """The outcome of reading /api/v1/rules: the rules usable as they are, and why others
    are not (for one log line when it changes)."""

    usable: frozenset[RuleId] = frozenset()
    missing: int = 0
    problems: tuple[str, ...] = ()

    def summary(self, expected: int) -> str:
        head = f"{len(self.usable)} of {expected} recording rules usable"
        return head + (": " + "; ".join(self.problems) if self.problems else "")


def loaded(rules_api: Mapping[str, Any], expected: Iterable[Rule]) -> Loaded:
    """Which of the `expected` rules Prometheus evaluates as they are: a recording rule of the
    same name (and quantile) with the expected digest, healthy (evaluated without error at
    least once). `rules_api` is the JSON of GET /api/v1/rules."""
    want = {r.id: r for r in expected}
    usable: set[RuleId] = set()
    other_digest: set[str] = set()
    unhealthy: list[str] = []
    windows: set[str] = set()
    for group in (rules_api.get("data") or {}).get("groups") or []:
        for rule in group.get("rules") or []:
            name = str(rule.get("name") or "")
            if rule.get("type") not in (None, "recording") or not name.startswith(PREFIX):
                continue
            labels = rule.get("labels") or {}
            rid = (name, str(labels.get(QUANTILE_LABEL) or ""))
            exp = want.get(rid)
            if exp is None:
                windows.add(name.rsplit(":", 1)[-1])
                continue
            if labels.get(DIGEST_LABEL) != exp.digest:
                other_digest.add(name)
            elif rule.get("health") != "ok":
                unhealthy.append(f"{name} is {rule.get('health')}: {rule.get('lastError', '')}")
            else:
                usable.add(rid)
    problems = []
    if not usable and windows:
        mine = next(iter(want))[0].rsplit(":", 1)[-1] if want else "?"
        problems.append(f"rules are loaded for window {', '.join(sorted(windows))}, not for "
                        f"--rate-window {mine}")
    if other_digest:
        problems.append(f"{len(other_digest)} rules differ from this autoscaler's queries "
                        f"(another poolpilot version), e.g. {sorted(other_digest)[0]}")
    if unhealthy:
        problems.append(f"{len(unhealthy)} unhealthy, e.g. {unhealthy[0]}"[:300])
    missing = len(want) - len(usable)
    if missing and not problems:
        problems.append(f"{missing} not loaded (group {GROUP})")
    return Loaded(frozenset(usable), missing, tuple(problems))


# ---------------------------------------------------------------------------------------------
# The queries of one cycle


@dataclass
class Plan:
    """One cycle's queries: `combined` reads every usable record at once (None when none is);
    `names` maps its series' names to query keys; `raw` is everything else by key."""

    combined: str | None = None
    names: dict[str, str] = field(default_factory=dict)  # record -> key ("" for quantiles)
    quantiles: dict[str, Any] = field(default_factory=dict)  # quantile record -> key maker
    raw: dict[str, str] = field(default_factory=dict)
    recorded: int = 0  # query keys the combined query answers

    @property
    def count(self) -> int:
        return len(self.raw) + (self.combined is not None)

    def key_of(self, labels: Mapping[str, str]) -> str | None:
        """The query key of one series of the combined query."""
        name = labels.get("__name__", "")
        make = self.quantiles.get(name)
        if make is not None:
            try:
                return str(make(float(labels.get(QUANTILE_LABEL, "nan"))))
            except ValueError:
                return None
        return self.names.get(name)


def plan(qs: q.QuerySet, ttft_quantiles: Iterable[float], itl_quantiles: Iterable[float],
         usable: frozenset[RuleId]) -> Plan:
    """The queries for these quantiles: recorded where the rule is usable, raw otherwise."""
    ttft_qs, itl_qs = sorted(set(ttft_quantiles)), sorted(set(itl_quantiles))
    raw = qs.build(ttft_qs, itl_qs)
    if not usable:
        return Plan(raw=raw)
    w = qs.window()
    by_id = {r.id: r for r in recording_rules(w)}
    out = Plan()
    digests: set[str] = set()
    quantiles: set[str] = set()
    for key in qs.build((), ()):
        rid = (plain_name(key, w), "")
        if rid in usable:
            out.names[rid[0]] = key
            digests.add(by_id[rid].digest)
            del raw[key]
            out.recorded += 1
    inner = qs.selector()[1:-1]
    wanted = {"ttft": ttft_qs, "itl": itl_qs, "router_ttft": ttft_qs}
    for hist, make in HISTOGRAMS.items():
        for value in wanted[hist]:
            key, label = make(value), quantile_label(value)
            rid = (quantile_name(hist, w), label)
            bucket_id = (buckets_name(hist, w), "")
            if rid in usable:
                out.quantiles[rid[0]] = make
                digests.add(by_id[rid].digest)
                quantiles.add(label)
                del raw[key]
                out.recorded += 1
            elif bucket_id in usable:  # a quantile not recorded: computed from the buckets
                sel = f'{{{inner}, {DIGEST_LABEL}="{by_id[bucket_id].digest}"}}'
                raw[key] = f"histogram_quantile({label}, {bucket_id[0]}{sel})"
    if out.names or out.quantiles:
        names = "|".join(sorted([*out.names, *out.quantiles]))
        matchers = [f'__name__=~"{names}"', inner,
                    f'{DIGEST_LABEL}=~"{"|".join(sorted(digests))}"']
        if quantiles:  # plain records have no quantile label: "" matches them
            values = "|".join(re.escape(v).replace("\\", "\\\\") for v in sorted(quantiles))
            matchers.append(f'{QUANTILE_LABEL}=~"|{values}"')
        else:
            matchers.append(f'{QUANTILE_LABEL}=""')
        out.combined = "{" + ", ".join(matchers) + "}"
    out.raw = raw
    return out

"""The autoscaler's recording rules: which loaded rules it trusts, and the queries it plans."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from poolpilot.autoscaler import queries as q
from poolpilot.autoscaler import recording as rec

W = "60s"
QS = q.QuerySet(window_seconds=60)
RULES = rec.recording_rules(W)
ALL = frozenset(r.id for r in RULES)


def api(rules: list[dict[str, Any]]) -> dict[str, Any]:
    """A GET /api/v1/rules answer with one group."""
    return {"status": "success", "data": {"groups": [{"name": rec.GROUP, "rules": rules}]}}


def loaded_rule(r: rec.Rule, **changes: Any) -> dict[str, Any]:
    d = r.to_dict()
    out = {"name": d["record"], "query": d["expr"], "labels": d["labels"], "health": "ok",
           "type": "recording"}
    out.update(changes)
    return out


def test_rules_are_the_raw_queries_over_every_pool() -> None:
    raw = q.QuerySet(window_seconds=60).build((), ())
    plain = {r.record: r.expr for r in RULES if r.record.count(":") == 2 and "_quantile" not in
             r.record and not r.record.startswith(rec.PREFIX + "_buckets")}
    assert plain == {rec.plain_name(k, W): v for k, v in raw.items()}
    # Digests ignore the window, so a chart placeholder and the value agree.
    assert [r.digest for r in rec.recording_rules("@@w@@")] == [r.digest for r in RULES]
    assert len({r.id for r in RULES}) == len(RULES)


@dataclass(frozen=True)
class LoadCase:
    id: str
    rules: Callable[[], list[dict[str, Any]]]
    usable: int
    problem: str  # a fragment of the explanation ("" = none)


LOAD_CASES = [
    LoadCase("all-loaded-and-healthy", lambda: [loaded_rule(r) for r in RULES], len(RULES), ""),
    LoadCase("prometheus-without-our-rules", lambda: [], 0, "not loaded"),
    LoadCase("rules-for-another-window", lambda: [
        loaded_rule(r, name=r.record.replace(":60s", ":30s")) for r in RULES], 0,
        "window 30s, not for --rate-window 60s"),
    LoadCase("another-poolpilot-version", lambda: [
        loaded_rule(r, labels={**r.to_dict()["labels"], rec.DIGEST_LABEL: "0123456789ab"})
        for r in RULES], 0, "another poolpilot version"),
    LoadCase("not-evaluated-yet-or-failing", lambda: [
        loaded_rule(r, health="err", lastError="many-to-many matching") if i == 0
        else loaded_rule(r) for i, r in enumerate(RULES)], len(RULES) - 1,
        "1 unhealthy, e.g. poolpilot_autoscaler:waiting:60s is err: many-to-many"),
    LoadCase("some-missing", lambda: [loaded_rule(r) for r in RULES[2:]], len(RULES) - 2,
             "2 not loaded"),
    LoadCase("alerting-rules-ignored", lambda: [{"name": "PoolpilotX", "type": "alerting"}], 0,
             "not loaded"),
]


@pytest.mark.parametrize("case", LOAD_CASES, ids=[c.id for c in LOAD_CASES])
def test_which_loaded_rules_are_used(case: LoadCase) -> None:
    got = rec.loaded(api(case.rules()), RULES)
    assert len(got.usable) == case.usable
    assert got.missing == len(RULES) - case.usable
    said = got.summary(len(RULES))
    assert case.problem in said if case.problem else said == f"{len(RULES)} of {len(RULES)} " \
        "recording rules usable"


def test_no_rules_means_the_raw_queries() -> None:
    p = rec.plan(QS, (0.9,), (0.9,), frozenset())
    assert (p.combined, p.raw, p.count, p.recorded) == (None, QS.build(), len(QS.build()), 0)


def test_all_rules_means_one_query() -> None:
    p = rec.plan(QS, (0.9,), (0.9,), ALL)
    assert (p.count, p.raw, p.recorded) == (1, {}, len(QS.build()))
    assert p.combined is not None and 'quantile=~"|0\\\\.9"' in p.combined
    assert p.key_of({"__name__": rec.plain_name(q.WAITING, W)}) == q.WAITING
    assert p.key_of({"__name__": rec.quantile_name("router_ttft", W), "quantile": "0.9"}) == \
        q.router_ttft_key(0.9)
    assert p.key_of({"__name__": "something_else"}) is None


def test_a_missing_rule_is_queried_raw() -> None:
    p = rec.plan(QS, (0.9,), (0.9,), ALL - {(rec.plain_name(q.KV_USAGE, W), "")})
    assert p.count == 2 and p.raw == {q.KV_USAGE: QS.build()[q.KV_USAGE]}


def test_unrecorded_quantile_reads_the_recorded_buckets() -> None:
    p = rec.plan(QS, (0.85,), (0.9,), ALL)
    assert p.count == 3  # combined + TTFT at engines and router from their bucket records
    assert p.raw[q.ttft_key(0.85)].startswith(
        f"histogram_quantile(0.85, {rec.buckets_name('ttft', W)}{{")
    assert q.itl_key(0.9) not in p.raw


def test_namespace_scope_applies_to_the_recorded_query() -> None:
    scoped = q.QuerySet(window_seconds=60, namespaces=("team-b", "team-a"))
    p = rec.plan(scoped, (0.9,), (0.9,), ALL)
    assert p.combined is not None and 'namespace=~"team-a|team-b"' in p.combined


def test_a_shards_pools_scope_every_query_it_sends() -> None:
    shard = q.QuerySet(window_seconds=60, pools=("p2", "p1", "web.v2"))
    p = rec.plan(shard, (0.85,), (0.9,), ALL)  # combined, plus a quantile from buckets
    assert p.combined is not None and r'pool=~"p1|p2|web\\.v2"' in p.combined
    assert all(r'pool=~"p1|p2|web\\.v2"' in promql for promql in p.raw.values())
    raw = rec.plan(shard, (0.9,), (0.9,), frozenset())  # no rules loaded: every query raw
    assert all(r'pool=~"p1|p2|web\\.v2"' in promql for promql in raw.raw.values())
    assert q.QuerySet(pools=()).selector() == '{pool!="", pool=""}'  # no pool: no series

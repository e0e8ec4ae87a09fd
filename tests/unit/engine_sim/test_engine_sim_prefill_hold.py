"""The simulated router's late binding (PoolSim(prefill_hold_s=...)), as the real router's
(router/prefill_hold.py): while every ready prefill engine has more than the hold's worth of
queued work, prompts wait at the router and go to the first engine that can start on them."""

from __future__ import annotations

from collections import Counter

from poolpilot.engine_sim.des import PoolSim, SimRequest
from poolpilot.router.prefill_hold import DEFAULT_PREFILL_HOLD_S

from poolpilot.roles import Role


def burst_then_join(hold_s: float | None) -> tuple[PoolSim, Counter[int | None]]:
    """60 prompts of 8,000 tokens at once onto one prefill engine (~30 s of its work); a
    second engine joins 5 s later."""
    sim = PoolSim("llama-3.1-70b", tensor_parallel=2, prefill_replicas=1, decode_replicas=2,
                  prefill_hold_s=hold_s)
    first = next(iter(sim.replicas))
    sim.submit_many([SimRequest(i, 0.0, 8000, 20) for i in range(60)])
    sim.run_until(1.0)
    held_before_join = sim.pending(Role.PREFILL)
    second = sim.add_replica(Role.PREFILL, ready_at=5.0)
    sim.run()
    recs = sim.records()
    assert len(recs) == 60 and all(r.ok for r in recs)
    sent = Counter(r.prefill_replica for r in recs)
    assert set(sent) <= {first, second}
    return sim, Counter({"held": held_before_join, "first": sent[first],
                         "second": sent[second]})


def test_a_burst_held_at_the_router_goes_to_an_engine_that_joins() -> None:
    _, held = burst_then_join(DEFAULT_PREFILL_HOLD_S)
    assert held["held"] >= 50  # a second of work went to the engine, the rest waited
    # the joined engine took its half of what was left
    assert held["second"] >= 25, held
    _, queued = burst_then_join(None)
    assert (queued["held"], queued["first"], queued["second"]) == (0, 60, 0)


def test_a_pool_never_saturated_routes_exactly_as_without_the_hold() -> None:
    reqs = [SimRequest(i, i * 0.5, 2000, 50) for i in range(120)]
    runs = []
    for hold_s in (DEFAULT_PREFILL_HOLD_S, None):
        sim = PoolSim(prefill_replicas=2, decode_replicas=2, prefill_hold_s=hold_s)
        sim.submit_many(reqs)
        sim.run()
        runs.append([(r.id, r.prefill_replica, r.first_token_at) for r in sim.records()])
    assert runs[0] == runs[1]


def shared_prefix_burst(n: int) -> tuple[PoolSim, int]:
    """With prefix-aware routing: one 16k-token prompt, then, once it is cached, a burst of
    `n` prompts that share all but its last block, onto one prefill engine. Returns the sim
    and the most prompts held at the router during the burst."""
    sim = PoolSim("llama-3.1-70b", tensor_parallel=2, prefill_replicas=1, decode_replicas=2,
                  routing="prefix-aware")
    prefix = tuple(range(31))  # 31 blocks of 512 shared, then one of each prompt's own
    sim.submit_many([SimRequest("first", 0.0, 16384, 5, hash_ids=(*prefix, 1000))])
    sim.run_until(10.0)
    assert sim.records() and sim.records()[0].ok
    sim.submit_many([SimRequest(i, 10.0, 16384, 5, hash_ids=(*prefix, 2000 + i))
                     for i in range(n)])
    most = 0
    for t in (10.0, 10.05, 10.1, 10.2, 10.5):
        sim.run_until(t)
        most = max(most, sim.pending(Role.PREFILL))
    sim.run()
    assert len(sim.records()) == n + 1 and all(r.ok for r in sim.records())
    return sim, most


def test_the_queue_the_hold_reads_counts_whole_prompts_as_the_router_does() -> None:
    """The router's queues in seconds count whole prompt tokens at a rate learned in them,
    cached or not (router/app.py, docs/router.md), and so do the simulator's: a burst of
    prompts the router expects the engine to hold all but 512 tokens of is still a burst of
    16k-token prompts to its hold (counted in the tokens expected computed, no queue at all:
    the router's rule until it was measured here, docs/engine-simulator.md)."""
    sim, most = shared_prefix_burst(12)
    assert most >= 10, most  # one or two went to the engine; the rest waited at the router
    assert max(r.prefix_hit_tokens for r in sim.records()) == 31 * 512

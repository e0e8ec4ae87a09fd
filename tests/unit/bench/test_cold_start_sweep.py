"""The cold start as phases and profiles, warm placeholder nodes, and the cold-start sweep:
poolpilot's attainment must never fall as the cold start shrinks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from poolpilot.bench.cold_start import PROFILES, parse_phases, profile
from poolpilot.bench.cold_start_sweep import monotone_drops, parse_cold_starts
from poolpilot.bench.policies.base import PoolView, ScalingDecision
from poolpilot.bench.replay import BenchConfig, replay
from poolpilot.bench.synthetic import Shape, generate
from poolpilot.engine_sim.traces import TraceRequest, write_csv

from poolpilot.cli import main as cli_main

# --- phases and profiles ----------------------------------------------------------------------


def test_phases_add_up_to_the_cold_start() -> None:
    c = parse_phases("graphs=6, pull=1,load=17,compile=5")
    assert c.total == 29.0
    assert [n for n, _ in c.phases] == ["pull", "load", "compile", "graphs"]  # start-up order


@pytest.mark.parametrize(("text", "names"), [
    ("pull=1,warmup=3", "warmup"), ("pull", "PHASE=SECONDS"), ("load=-2", ">= 0"),
    ("load=fast", "not a number"), ("load=1,load=2", "twice"), ("", "no phase")])
def test_bad_phases_name_the_problem(text: str, names: str) -> None:
    with pytest.raises(ValueError, match=names):
        parse_phases(text)


def test_a_warm_node_starts_faster_than_a_node_cache_than_the_hub() -> None:
    for model, tp in (("llama-3.1-8b", 1), ("llama-3.1-70b", 2)):
        totals = [profile(p, model, tp).total for p in ("warm-node", "node-cache", "hub")]
        assert totals == sorted(totals) and len(set(totals)) == 3, (model, totals)
    # the measured floor of an 8B engine with its weights in the page cache (calibration)
    assert 15 < profile("warm-node", "llama-3.1-8b").total < 25
    assert set(PROFILES) == {"warm-node", "node-cache", "hub"}


# --- warm placeholder nodes -------------------------------------------------------------------


class OneUpAt:
    """Scale prefill up by `n` at t = 10 s (to see where the new pods land)."""

    name, interval = "up", 10.0

    def __init__(self, n: int) -> None:
        self.n = n
        self.ready_at: list[float] = []

    def initial(self) -> dict[str, int]:
        return {"prefill": 1, "decode": 1}

    def decide(self, view: PoolView) -> ScalingDecision:
        cur = {r: s.target for r, s in view.roles.items()}
        if view.now == 10.0:
            cur["prefill"] += self.n
        return ScalingDecision(cur)


def test_a_scale_up_lands_warm_on_a_free_placeholder_node_only() -> None:
    trace = [TraceRequest(i * 1.0, 100, 5) for i in range(120)]
    cfg = BenchConfig(cold_start=60.0, warm_placeholders=1, warm_cold_start=15.0)
    rep = replay(trace, OneUpAt(2), cfg)
    assert rep.info["warm_landings"] == 1
    spans = sorted(s.ready_at - s.requested_at for s in rep.ledger.spans if s.requested_at > 0)
    assert spans == [15.0, 60.0]  # one on the warm node, the other a full cold start
    cold = replay(trace, OneUpAt(2), BenchConfig(cold_start=60.0))
    assert "warm_landings" not in cold.info


# --- the sweep --------------------------------------------------------------------------------


def test_cold_starts_parse() -> None:
    assert parse_cold_starts("120, 60,60,20") == [120.0, 60.0, 20.0]
    for bad in ("", "fast", "-1"):
        with pytest.raises(ValueError, match="--cold-start-sweep"):
            parse_cold_starts(bad)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    reqs = [TraceRequest(i * 2.0, 500, 20) for i in range(30)]
    reqs += [TraceRequest(60 + i * 0.05, 3000, 50) for i in range(400)]
    reqs += [TraceRequest(80 + i * 2.0, 500, 20) for i in range(30)]
    path = tmp_path_factory.mktemp("sweep") / "t.csv"
    write_csv(reqs, path)
    return path


def test_the_sweep_document_shares_what_does_not_depend_on_the_cold_start(
        tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, md = tmp_path / "s.json", tmp_path / "s.md"
    code = cli_main(["bench", "--trace", str(tiny), "--cold-start-sweep", "30,10",
                     "--policies", "poolpilot,oracle,static-min,static-peak",
                     "--max-replicas", "8", "--json", str(out), "--markdown", str(md)])
    assert code == 0
    doc = json.loads(out.read_text())
    assert doc["cold_starts"] == [30.0, 10.0] and set(doc["runs"]) == {"30", "10"}
    fixed = [doc["runs"][k]["policies"]["static-min"]["gpu_hours"] for k in ("30", "10")]
    assert fixed[0] == fixed[1]
    oracle = [doc["runs"][k]["policies"]["oracle"] for k in ("30", "10")]
    assert oracle[0]["info"]["windows"] == oracle[1]["info"]["windows"]  # one plan
    for k in ("30", "10"):
        assert doc["runs"][k]["config"]["cold_start"] == float(k)
        assert doc["summary"]["oracle"][k]["gpu_hours_vs_oracle"] == 1.0
    table = md.read_text()
    assert table.startswith("| policy | 30 s | 10 s |") and "| static-min |" in table
    assert table in capsys.readouterr().out


def test_the_cli_refuses_two_cold_starts(tiny: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli_main(["bench", "--trace", str(tiny), "--cold-start", "30",
                     "--cold-start-profile", "hub"])
    assert code == 2
    assert "give the cold start one way only" in capsys.readouterr().err


BURSTY = Shape("bursts", rate=3.0, minutes=14, prompt_mean=3000, output_mean=60,
               burst_x=10.0, burst_s=8.0, period_s=90.0)
# Three quiet minutes first: every pool starts level whatever the cold start (the bench sizes
# a pool's start for its first cold start in hindsight, which would hand the longest cold
# start the first clump's size before any autoscaler could have seen one).
QUIET = Shape("steady", rate=1.0, minutes=3, prompt_mean=3000, output_mean=60)


def bursty_trace(seed: int) -> list[TraceRequest]:
    lead = generate(QUIET, seed=seed)
    shift = QUIET.minutes * 60
    return lead + [TraceRequest(r.arrival_s + shift, r.input_tokens, r.output_tokens)
                   for r in generate(BURSTY, seed=seed)]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """poolpilot and its ablation without burst room, on clumps of 8 s every ~90 s."""
    d = tmp_path_factory.mktemp("bursty")
    path, out = d / "bursts.csv", d / "sweep.json"
    write_csv(bursty_trace(3), path)
    code = cli_main(["bench", "--trace", str(path), "--model", "llama-3.1-8b",
                     "--cold-start-sweep", "120,60,30,20", "--max-replicas", "16",
                     "--policies", "poolpilot,poolpilot(room=0)", "--json", str(out)])
    assert code == 0
    return dict(json.loads(out.read_text()))


def test_poolpilot_never_loses_attainment_as_the_cold_start_shrinks(
        sweep: dict[str, object]) -> None:
    drops = monotone_drops(sweep, "poolpilot")
    assert all(lost <= 0.5 for _, _, lost in drops), drops


def test_the_burst_room_serves_clumps_the_rates_hide(sweep: dict[str, object]) -> None:
    summary = sweep["summary"]
    assert isinstance(summary, dict)
    for cs, with_room in summary["poolpilot"].items():
        without = summary["poolpilot(room=0)"][cs]
        assert with_room["slo_attainment"] > without["slo_attainment"], cs

"""`poolpilot bench` end to end on a small trace: the JSON document, the plot, bad options."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from poolpilot.engine_sim.traces import TraceRequest, write_csv

from poolpilot.cli import main as cli_main

KEYS = {"slo_attainment", "gpu_hours", "ttft_p90", "itl_p90", "goodput_per_gpu",
        "met_per_gpu_hour", "scale_events", "direction_changes", "gpu_hours_vs_oracle",
        "gpu_hours_vs_static_min"}
ALL = {"poolpilot", "oracle", "static-min", "static-peak", "hpa", "keda-queue", "dynamo-sla"}


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # a quiet minute, a burst, a quiet minute: enough for every policy to act
    reqs = [TraceRequest(i * 2.0, 500, 20) for i in range(30)]
    reqs += [TraceRequest(60 + i * 0.05, 3000, 50) for i in range(400)]
    reqs += [TraceRequest(80 + i * 2.0, 500, 20) for i in range(30)]
    path = tmp_path_factory.mktemp("bench") / "t.csv"
    write_csv(reqs, path)
    return path


def test_all_policies_json_and_plot(trace: Path, tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    out, png, md = tmp_path / "r.json", tmp_path / "r.png", tmp_path / "r.md"
    code = cli_main(["bench", "--trace", str(trace), "--cold-start", "30", "--json", str(out),
                     "--plot", str(png), "--markdown", str(md), "--max-replicas", "8"])
    assert code == 0
    doc = json.loads(out.read_text())
    assert set(doc["policies"]) == ALL
    pols = doc["policies"]
    for name, res in pols.items():
        assert set(res) >= KEYS, name
        assert res["requests"] == 460
        assert 0.0 <= res["slo_attainment"] <= 1.0
        assert res["gpu_hours"] > 0
        assert res["gpu_hours_vs_oracle"] == pytest.approx(
            res["gpu_hours"] / pols["oracle"]["gpu_hours"], rel=1e-4)
        assert res["gpu_hours_vs_static_min"] == pytest.approx(
            res["gpu_hours"] / pols["static-min"]["gpu_hours"], rel=1e-4)
    assert pols["oracle"]["slo_attainment"] >= 0.95
    assert pols["static-min"]["slo_attainment"] >= 0.95
    assert pols["static-min"]["info"]["found"] is True
    assert doc["trace"]["requests"] == 460
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = md.read_text()
    assert table.count("\n") == 9  # header, rule, seven policies
    assert "| vs oracle | vs static-min |" in table
    assert "static-peak" in capsys.readouterr().out
    # the saved JSON draws the same table and a plot again, without replaying
    md2, png2 = tmp_path / "again.md", tmp_path / "again.png"
    assert cli_main(["bench", "--replot", str(out), "--markdown", str(md2),
                     "--plot", str(png2)]) == 0
    assert md2.read_text() == table
    assert png2.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    series = pols["oracle"]["series"]
    assert len(series["t"]) == len(series["prefill"]) == len(series["decode"]) > 1


@pytest.mark.parametrize(
    "bounds,jobs",
    [((3, 3), 1), ((2, 8), 2)],
    ids=["fixed 3+3 pool", "min 2, parallel"],
)
def test_non_default_bounds_hold_for_every_policy(trace: Path, tmp_path: Path,
                                                  bounds: tuple[int, int], jobs: int) -> None:
    out = tmp_path / "r.json"
    lo, hi = bounds
    code = cli_main(["bench", "--trace", str(trace), "--cold-start", "30", "--json", str(out),
                     "--min-replicas", str(lo), "--max-replicas", str(hi),
                     "--jobs", str(jobs)])
    assert code == 0
    doc = json.loads(out.read_text())
    assert set(doc["policies"]) == ALL
    assert doc["config"]["min_replicas"] == lo and doc["config"]["max_replicas"] == hi
    for name, res in doc["policies"].items():
        # every policy's bill lies between `lo` and `hi` pods per role over the whole span
        gpus = res["avg_gpus"]
        assert 2 * lo - 1e-6 <= gpus <= 2 * hi + 1e-6, name
    if lo == hi:  # one possible pool: every policy bills exactly it
        fixed = doc["policies"]["static-peak"]["gpu_hours"]
        assert [r["gpu_hours"] for r in doc["policies"].values()] == pytest.approx(
            [fixed] * len(ALL))


def test_no_static_pool_within_the_bounds_says_so(trace: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.json"
    code = cli_main(["bench", "--trace", str(trace), "--cold-start", "30", "--json", str(out),
                     "--max-replicas", "1", "--policies", "static-min,static-peak"])
    assert code == 0
    doc = json.loads(out.read_text())
    smin = doc["policies"]["static-min"]
    assert smin["info"]["found"] is False and smin["slo_attainment"] < 0.95
    assert doc["policies"]["static-peak"]["gpu_hours_vs_static_min"] is None
    captured = capsys.readouterr()
    assert "no fixed pool up to --max-replicas reaches 95%" in captured.err
    assert "static-min: none (1+1 misses)" in captured.out


@pytest.mark.parametrize(
    "args,says",
    [
        (["--policies", "poolpilot,magic"], "--policies: unknown magic"),
        (["--poolpilot-autoscaling", '{"scaleDown": {"maxStep": 0}}'], "scaleDown.maxStep"),
        (["--poolpilot-autoscaling", "{nope"], "not valid JSON"),
        (["--rate-scale", "0"], "--rate-scale must be > 0"),
        (["--model", "gpt-17"], "gpt-17"),
        (["--min-replicas", "5", "--max-replicas", "2"], "--min-replicas 5 / --max-replicas 2"),
        (["--oracle-target", "1.5"], "--oracle-target must be a share in (0, 1]"),
        (["--goal", "0"], "--goal must be a share in (0, 1]"),
        (["--oracle-window", "0"], "--oracle-window must be > 0"),
        (["--jobs", "0"], "--jobs must be >= 1"),
        (["--replot", "/nonexistent/r.json"], "--replot /nonexistent/r.json: no such file"),
    ],
    ids=["unknown policy", "invalid autoscaling field", "bad JSON", "zero rate", "unknown model",
         "min above max", "target above 1", "zero goal", "zero window", "zero jobs",
         "replot missing file"],
)
def test_bad_options_exit_2_in_one_line(trace: Path, args: list[str], says: str,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["bench", "--trace", str(trace), *args]) == 2
    err = capsys.readouterr().err
    assert says in err
    assert err.count("\n") == 1 and err.startswith("poolpilot bench: ")


def test_local_prefill_fallback_is_a_flag_recorded_with_its_count(tmp_path: Path) -> None:
    # the burst comes after the opening the starting pool is sized for (bench.oracle.OPENING_S)
    reqs = [TraceRequest(i * 2.0, 500, 20) for i in range(75)]
    reqs += [TraceRequest(150 + i * 0.05, 3000, 50) for i in range(400)]
    reqs += [TraceRequest(170 + i * 2.0, 500, 20) for i in range(30)]
    trace = tmp_path / "late-burst.csv"
    write_csv(reqs, trace)
    docs, tables = {}, {}
    for mode in ("off", "on"):
        out, md = tmp_path / f"{mode}.json", tmp_path / f"{mode}.md"
        assert cli_main(["bench", "--trace", str(trace), "--cold-start", "30", "--json",
                         str(out), "--markdown", str(md), "--policies", "poolpilot,static-peak",
                         "--local-prefill", mode]) == 0
        docs[mode], tables[mode] = json.loads(out.read_text()), md.read_text()
    assert docs["off"]["config"]["local_prefill"] is False
    assert docs["on"]["config"]["local_prefill"] is True
    off, on = docs["off"]["policies"]["poolpilot"], docs["on"]["policies"]["poolpilot"]
    assert off["local_prefill_requests"] is None
    assert on["local_prefill_requests"] > 0  # the burst outran the prefill replica
    assert on["slo_attainment"] > off["slo_attainment"]
    assert "| local prefill |" in tables["on"].splitlines()[0]
    assert tables["off"].splitlines()[2].rstrip().endswith("| - |")


def test_poolpilot_is_given_the_slo_the_bench_scores(trace: Path, tmp_path: Path) -> None:
    # The bench scores the share of requests within the targets against --goal; a user who
    # wants that writes it as the InferencePool's SLO quantile. The router's local-prefill
    # fallback is on unless asked off, as in the router.
    for extra, quantile in (([], 0.95), (["--goal", "0.9"], 0.9)):
        out = tmp_path / f"q{quantile}.json"
        assert cli_main(["bench", "--trace", str(trace), "--cold-start", "30", "--json",
                         str(out), "--policies", "poolpilot", *extra]) == 0
        doc = json.loads(out.read_text())
        assert doc["config"]["quantile"] == quantile
        assert doc["config"]["local_prefill"] is True


def test_poolpilot_forecast_ablation_is_a_variant(trace: Path, tmp_path: Path) -> None:
    out, md = tmp_path / "f.json", tmp_path / "f.md"
    assert cli_main(["bench", "--trace", str(trace), "--cold-start", "30", "--json", str(out),
                     "--markdown", str(md), "--policies", "poolpilot,poolpilot(forecast=0)"]) == 0
    assert set(json.loads(out.read_text())["policies"]) == {"poolpilot", "poolpilot(forecast=0)"}
    assert "| poolpilot(forecast=0) |" in md.read_text()  # an ablation is in the main table
    assert cli_main(["bench", "--trace", str(trace), "--policies", "poolpilot(forecast=2)"]) == 2


def test_decisions_file_has_every_decision_and_its_message(tmp_path: Path) -> None:
    """`--decisions`: each poolpilot policy's every decision, per role, with the autoscaler's
    own message; its changes are the replay's scale events."""
    # two quiet minutes, then three busy ones: the pools start small and must grow
    reqs = [TraceRequest(i * 1.0, 500, 20) for i in range(120)]
    reqs += [TraceRequest(120 + i * 0.05, 3000, 50) for i in range(3600)]
    trace = tmp_path / "t.csv"
    write_csv(reqs, trace)
    out, log = tmp_path / "r.json", tmp_path / "d.jsonl"
    assert cli_main(["bench", "--trace", str(trace), "--cold-start", "30", "--max-replicas", "8",
                     "--policies", "poolpilot,poolpilot(forecast=0),static-peak",
                     "--json", str(out), "--decisions", str(log)]) == 0
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    doc = json.loads(out.read_text())
    for name in ("poolpilot", "poolpilot(forecast=0)"):
        mine = [r for r in rows if r["policy"] == name]
        for role in ("prefill", "decode"):
            times = [r["t"] for r in mine if r["role"] == role]
            assert times == sorted(times) and len(times) >= 18  # every 15 s for 5 min
        assert all(r["message"] and r["reason"] and not r["reason"].startswith("Reason.")
                   for r in mine)
        changes = sum(1 for r in mine if r["from"] != r["to"])
        assert changes == doc["policies"][name]["scale_events"] > 0
    assert {r["policy"] for r in rows} == {"poolpilot", "poolpilot(forecast=0)"}


def test_decisions_needs_a_poolpilot_policy_and_one_replay(trace: Path, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str],
                                                           ) -> None:
    log = str(tmp_path / "d.jsonl")
    assert cli_main(["bench", "--trace", str(trace), "--policies", "hpa",
                     "--decisions", log]) == 2
    assert "add poolpilot to --policies" in capsys.readouterr().err
    assert cli_main(["bench", "--trace", str(trace), "--cold-start-sweep", "60,30",
                     "--decisions", log]) == 2
    assert "--cold-start-sweep" in capsys.readouterr().err
    assert not Path(log).exists()

"""`poolpilot bench` end to end on a small trace: the JSON document, the plot, bad options."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from poolpilot.cli import main as cli_main
from poolpilot.traces import TraceRequest, write_csv

KEYS = {"slo_attainment", "gpu_hours", "ttft_p90", "itl_p90", "goodput_per_gpu",
        "scale_events", "direction_changes"}


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
    assert set(doc["policies"]) == {"poolpilot", "static-peak", "hpa", "keda-queue",
                                    "dynamo-sla"}
    for name, res in doc["policies"].items():
        assert set(res) >= KEYS, name
        assert res["requests"] == 460
        assert 0.0 <= res["slo_attainment"] <= 1.0
        assert res["gpu_hours"] > 0
    assert doc["trace"]["requests"] == 460
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert md.read_text().count("\n") == 7  # header, rule, five policies
    assert "static-peak" in capsys.readouterr().out


@pytest.mark.parametrize(
    "args,says",
    [
        (["--policies", "poolpilot,magic"], "--policies: unknown magic"),
        (["--poolpilot-autoscaling", '{"scaleDown": {"maxStep": 0}}'], "scaleDown.maxStep"),
        (["--poolpilot-autoscaling", "{nope"], "not valid JSON"),
        (["--rate-scale", "0"], "--rate-scale must be > 0"),
        (["--model", "gpt-17"], "gpt-17"),
    ],
    ids=["unknown policy", "invalid autoscaling field", "bad JSON", "zero rate", "unknown model"],
)
def test_bad_options_exit_2_naming_the_fix(trace: Path, args: list[str], says: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["bench", "--trace", str(trace), *args]) == 2
    assert says in capsys.readouterr().err.replace("\n", "")


def test_local_prefill_fallback_is_a_flag_recorded_with_its_count(trace: Path,
                                                                  tmp_path: Path) -> None:
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

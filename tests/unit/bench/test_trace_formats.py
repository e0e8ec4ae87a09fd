"""The trace formats the benchmark reads (engine_sim.traces), through `poolpilot bench`.

The same requests written as Azure CSV (2023's and 2024's timestamps), Mooncake JSONL,
Qwen-Bailian JSONL, BurstGPT CSV and plain CSV must replay as the same workload; a malformed
line must stop the benchmark with exit code 2 and FILE:LINE.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from poolpilot.engine_sim.traces import TraceError, TraceRequest, load_trace

from poolpilot.cli import main as cli_main

REQS = [TraceRequest(0.0, 812, 40), TraceRequest(0.25, 3000, 7), TraceRequest(1.5, 64, 300)]


def write_azure(path: Path, reqs: list[TraceRequest]) -> None:
    t0 = datetime(2023, 11, 16, 18, 17, 3, tzinfo=UTC)
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for r in reqs:
        ts = (t0 + timedelta(seconds=r.arrival_s)).strftime("%Y-%m-%d %H:%M:%S.%f") + "0"
        lines.append(f"{ts},{r.input_tokens},{r.output_tokens}")
    path.write_text("\n".join(lines) + "\n")


def write_azure_2024(path: Path, reqs: list[TraceRequest]) -> None:
    t0 = datetime(2024, 5, 10, 0, 0, 0, tzinfo=UTC)
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for r in reqs:
        lines.append(f"{t0 + timedelta(seconds=r.arrival_s)},{r.input_tokens},{r.output_tokens}")
    path.write_text("\n".join(lines) + "\n")  # 2024-05-10 00:00:00.250000+00:00


def write_burstgpt(path: Path, reqs: list[TraceRequest]) -> None:
    lines = ["Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"]
    for r in reqs:
        lines.append(f"{1000 + r.arrival_s},ChatGPT,{r.input_tokens},{r.output_tokens},"
                     f"{r.input_tokens + r.output_tokens},Conversation log")
    path.write_text("\n".join(lines) + "\n")


def write_mooncake(path: Path, reqs: list[TraceRequest]) -> None:
    # no hash ids: the same workload as the Azure and CSV copies (no prompt shares a prefix)
    path.write_text("".join(
        json.dumps({"timestamp": int(r.arrival_s * 1000), "input_length": r.input_tokens,
                    "output_length": r.output_tokens, "hash_ids": []}) + "\n"
        for r in reqs))


def write_bailian(path: Path, reqs: list[TraceRequest]) -> None:
    # seconds, where Mooncake's are milliseconds: read as Mooncake's, this would replay 1000x
    # faster
    path.write_text("".join(
        json.dumps({"chat_id": i, "parent_chat_id": -1, "timestamp": r.arrival_s,
                    "input_length": r.input_tokens, "output_length": r.output_tokens,
                    "type": "text", "turn": 1, "hash_ids": []}) + "\n"
        for i, r in enumerate(reqs)))


def write_csv(path: Path, reqs: list[TraceRequest]) -> None:
    path.write_text("arrival_s,input_tokens,output_tokens\n" + "".join(
        f"{r.arrival_s},{r.input_tokens},{r.output_tokens}\n" for r in reqs))


WRITERS = {"azure": (write_azure, ".csv"), "azure-2024": (write_azure_2024, ".csv"),
           "mooncake": (write_mooncake, ".jsonl"), "bailian": (write_bailian, ".jsonl"),
           "burstgpt": (write_burstgpt, ".csv"),
           "csv": (write_csv, ".csv")}


def fmt_name(key: str) -> str:
    return key.split("-")[0]  # azure-2024 is the azure format


@pytest.mark.parametrize("fmt", list(WRITERS), ids=list(WRITERS))
def test_each_format_reads_back_the_same_requests(tmp_path: Path, fmt: str) -> None:
    writer, ext = WRITERS[fmt]
    path = tmp_path / f"trace{ext}"
    writer(path, REQS)
    # (a Bailian trace's hash ids, had it any, would name 16-token blocks)
    expected = [replace(r, block_tokens=16) for r in REQS] if fmt == "bailian" else REQS
    assert load_trace(path, fmt_name(fmt)) == expected
    assert load_trace(path) == expected  # detected from the content


@dataclass(frozen=True)
class Malformed:
    name: str
    fmt: str
    text: str
    line: int
    says: str


MALFORMED = [
    Malformed("azure bad timestamp", "azure",
              "TIMESTAMP,ContextTokens,GeneratedTokens\n"
              "2023-11-16 18:17:03.1,10,2\nyesterday,5,1\n",
              3, "TIMESTAMP"),
    Malformed("azure negative tokens", "azure",
              "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.1,-4,2\n", 2,
              "ContextTokens"),
    Malformed("azure missing column", "azure",
              "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.1,10\n", 2, "columns"),
    Malformed("mooncake not json", "mooncake",
              '{"timestamp": 0, "input_length": 5, "output_length": 1}\n{"timestamp": 1,\n',
              2, "JSON"),
    Malformed("mooncake missing field", "mooncake",
              '{"timestamp": 0, "input_length": 5}\n', 1, "output_length"),
    Malformed("bailian hash ids not integers", "bailian",
              '{"chat_id": 0, "timestamp": 0.5, "input_length": 5, "output_length": 1, '
              '"hash_ids": [1, 2]}\n{"chat_id": 1, "timestamp": 1.5, "input_length": 5, '
              '"output_length": 1, "hash_ids": ["a"]}\n', 2, "hash_ids"),
    Malformed("bailian negative timestamp", "bailian",
              '{"chat_id": 0, "timestamp": -2, "input_length": 5, "output_length": 1}\n',
              1, "timestamp"),
    Malformed("csv text in number", "csv", "arrival_s,input_tokens,output_tokens\n0,5,1\n1,x,1\n",
              3, "input_tokens"),
    Malformed("csv negative arrival", "csv", "0,5,1\n-1,5,1\n", 2, "arrival_s"),
]


@pytest.mark.parametrize("case", MALFORMED, ids=[c.name for c in MALFORMED])
def test_malformed_line_is_named(tmp_path: Path, case: Malformed) -> None:
    path = tmp_path / ("t.jsonl" if case.fmt in ("mooncake", "bailian") else "t.csv")
    path.write_text(case.text)
    with pytest.raises(TraceError) as err:
        load_trace(path, case.fmt)
    assert str(err.value).startswith(f"{path}:{case.line}:")
    assert case.says in str(err.value)


def test_bench_cli_stops_on_a_malformed_trace(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.csv"
    path.write_text("arrival_s,input_tokens,output_tokens\n0,5,1\n1,5\n")
    code = cli_main(["bench", "--trace", str(path), "--format", "csv"])
    assert code == 2
    err = capsys.readouterr().err
    assert f"{path}:3:" in err.replace("\n", "")


def test_formats_replay_identically(tmp_path: Path) -> None:
    """The bench's JSON for the Azure and Mooncake copies of one workload is the same."""
    docs = []
    for fmt in WRITERS:
        writer, ext = WRITERS[fmt]
        path = tmp_path / f"w-{fmt}{ext}"
        reqs = [TraceRequest(i * 0.5, 200 + 37 * i, 5 + i) for i in range(30)]
        writer(path, reqs)
        out = tmp_path / f"{fmt}.json"
        code = cli_main(["bench", "--trace", str(path), "--format", fmt_name(fmt), "--json",
                         str(out),
                         "--policies", "oracle,static-min,static-peak,keda-queue"])
        assert code == 0
        doc = json.loads(out.read_text())
        docs.append({k: v for k, v in doc["policies"].items()})
    assert all(doc == docs[0] for doc in docs[1:])

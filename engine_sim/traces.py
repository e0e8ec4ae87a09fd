"""Request traces: parse public trace formats into one list of requests.

Formats (see ../shared/traces/README.md):
- ``azure``: the Azure LLM inference traces' CSV, ``TIMESTAMP,ContextTokens,GeneratedTokens``,
  with wall-clock timestamps: 2023's ``2023-11-16 18:17:03.9799600`` (naive, read as UTC),
  2024's ``2024-05-10 00:00:00.009930+00:00`` (a UTC offset; some rows without a fraction).
- ``burstgpt``: BurstGPT's CSV (``Timestamp,Model,Request tokens,Response tokens,Total
  tokens,Log Type``), ``Timestamp`` in seconds from the trace's start.
- ``mooncake``: Mooncake (FAST 2025) JSONL, one ``{"timestamp": <ms since start>,
  "input_length": N, "output_length": M, "hash_ids": [...]}`` object a line. ``hash_ids``
  (optional) names the prompt's blocks of MOONCAKE_BLOCK_TOKENS tokens: equal leading ids
  mean a shared prefix (see TraceRequest).
- ``bailian``: Alibaba's Qwen-Bailian traces (ATC 2025, alibaba-edu/qwen-bailian-usagetraces-
  anon) JSONL, one ``{"chat_id", "parent_chat_id", "timestamp": <s since start>,
  "input_length", "output_length", "type", "turn", "hash_ids": [...]}`` object a line, the
  ids naming blocks of BAILIAN_BLOCK_TOKENS tokens. Told from Mooncake's by its session
  fields (``chat_id``, ``parent_chat_id``, ``turn``) or its file name (``..._blksz_N.jsonl``,
  N the block size: 16 in every published one): the same keys otherwise, but seconds
  instead of milliseconds and 16-token blocks instead of 512, so read as Mooncake a two-hour
  trace would replay in seven seconds.
- ``csv``: a plain CSV ``arrival_s,input_tokens,output_tokens`` (header optional).

Every loader returns requests sorted by arrival, arrivals relative to the first request, and
raises `TraceError("FILE:LINE: problem")` on malformed input so the user can fix the line.
A request that generated nothing (0 output tokens: BurstGPT's failed requests) is replayed as
one that generated one token, since an engine always returns the first token its prefill
computes, and a 0-token prompt as a 1-token one; how many there were is logged as a warning
that names the file.
"""

from __future__ import annotations

import csv
import hashlib
import json
import logging
import math
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

FORMATS = ("azure", "mooncake", "bailian", "burstgpt", "csv")
log = logging.getLogger(__name__)

# Prompt tokens one Mooncake hash id stands for. Mooncake's FAST'25 traces hash each prompt in
# blocks of 512 tokens (their README: "the block size is 512"; a 6,955-token prompt carries 14
# ids, the last for a partial block of 299 tokens), so this is not a choice but the format's.
MOONCAKE_BLOCK_TOKENS = 512
# The Qwen-Bailian traces hash blocks of 16 tokens (their README: "Salted SipHash blocks (16
# tokens per block)"; vLLM's own KV block size), each block on its own content: the loader
# chains each id on the ids before it, so that an id stands for its whole prefix as a
# Mooncake id does (a block equal to another's at a different prefix is not a prefix hit).
BAILIAN_BLOCK_TOKENS = 16
# Keys of a Bailian trace that Mooncake's lack (any one tells the format), and its files'
# names, which state the block size (qwen_traceA_blksz_16.jsonl).
_BAILIAN_KEYS = ("chat_id", "parent_chat_id", "turn")
_BAILIAN_NAME = re.compile(r"blksz_(\d+)")
# Requests a second above which a trace read in milliseconds was more likely in seconds.
MOST_PLAUSIBLE_RATE = 1000.0


def _bailian_block_tokens(path: Path) -> int:
    """A Bailian trace's block size: the one its file name states, else 16."""
    m = _BAILIAN_NAME.search(path.name)
    return int(m[1]) if m and int(m[1]) > 0 else BAILIAN_BLOCK_TOKENS


class TraceError(ValueError):
    """A trace file that cannot be read; the message starts with FILE:LINE."""


@dataclass(frozen=True, order=True)
class TraceRequest:
    """One request. `hash_ids`: its prompt's blocks of `block_tokens` tokens (the last
    possibly partial), each id standing for its block and the whole prefix before it, so two
    requests share their first k blocks exactly when their first k ids are equal. Empty when
    the format carries no prefix information (Azure, plain CSV): no reuse. `block_tokens` is
    the format's (Mooncake's 512, Bailian's 16)."""

    arrival_s: float
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...] = ()
    block_tokens: int = MOONCAKE_BLOCK_TOKENS


def load_trace(path: str | Path, format: str | None = None) -> list[TraceRequest]:
    """Read a trace file; `format` is one of FORMATS or None to detect it from the content."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TraceError(f"{path}: no such trace file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"{path}: cannot read: {exc}") from None
    fmt = format or detect_format(path, text)
    if fmt not in FORMATS:
        raise TraceError(f"{path}: unknown trace format {fmt!r}; use one of {', '.join(FORMATS)}")
    rows = _PARSERS[fmt](str(path), text)
    trace = normalize(rows, where=str(path),
                      block_tokens=_bailian_block_tokens(path) if fmt == "bailian" else
                      MOONCAKE_BLOCK_TOKENS)
    span = trace[-1].arrival_s
    if fmt == "mooncake" and len(trace) > 1000 and len(trace) > MOST_PLAUSIBLE_RATE * span:
        log.warning("%s: %d requests in %.3g s read as Mooncake's milliseconds; if its "
                    "timestamps are seconds (a Qwen-Bailian trace), pass format bailian "
                    "(--format bailian)", path, len(trace), span)
    empty = sum(1 for r in trace if r.input_tokens == 0)
    silent = sum(1 for r in trace if r.output_tokens == 0)
    if empty or silent:
        log.warning("%s: of %d requests, %d had a 0-token prompt and %d generated 0 tokens; "
                    "replayed with 1 (a prompt has at least one token, and an engine always "
                    "returns the first token its prefill computes)", path, len(trace), empty,
                    silent)
        trace = [replace(r, input_tokens=max(1, r.input_tokens),
                         output_tokens=max(1, r.output_tokens)) for r in trace]
    return trace


def detect_format(path: Path, text: str) -> str:
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    if first.startswith("{") or path.suffix in (".jsonl", ".json"):
        try:
            obj = json.loads(first)
        except json.JSONDecodeError:
            obj = None  # (the parser names the line)
        bailian = isinstance(obj, dict) and any(k in obj for k in _BAILIAN_KEYS)
        return "bailian" if bailian or _BAILIAN_NAME.search(path.name) else "mooncake"
    header = [c.strip().lower() for c in first.split(",")]
    if "timestamp" in header and "contexttokens" in header:
        return "azure"
    if "request tokens" in header and "response tokens" in header:
        return "burstgpt"
    if path.suffix == ".csv" or len(header) == 3:
        return "csv"
    raise TraceError(
        f"{path}:1: cannot tell the trace format from {first[:60]!r}; pass format= "
        f"({', '.join(FORMATS)})"
    )


Row = tuple[int, float, int, int] | tuple[int, float, int, int, tuple[int, ...]]


def normalize(rows: Iterable[Row], where: str,
              block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> list[TraceRequest]:
    """(line, arrival, input, output[, hash_ids]) rows -> sorted requests with arrivals from
    zero, their ids naming blocks of `block_tokens`."""
    items = list(rows)
    if not items:
        raise TraceError(f"{where}: the trace has no requests")
    items.sort(key=lambda r: (r[1], r[0]))
    t0 = items[0][1]
    return [TraceRequest(round(r[1] - t0, 6), r[2], r[3], r[4] if len(r) > 4 else (),
                         block_tokens)
            for r in items]


def _tokens(where: str, lineno: int, name: str, raw: str, minimum: int) -> int:
    try:
        value = int(raw.strip())
    except (ValueError, AttributeError):
        raise TraceError(f"{where}:{lineno}: {name} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise TraceError(f"{where}:{lineno}: {name} must be >= {minimum}, got {value}")
    return value


def _seconds(where: str, lineno: int, name: str, raw: object) -> float:
    try:
        value = float(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise TraceError(f"{where}:{lineno}: {name} must be a number, got {raw!r}") from None
    if not math.isfinite(value) or value < 0:
        raise TraceError(f"{where}:{lineno}: {name} must be a finite number >= 0, got {raw!r}")
    return value


# Date, time, any number of fractional digits (2023's traces have 7; datetime takes at most 6),
# and an optional UTC offset (2024's traces end in +00:00).
_TIMESTAMP = re.compile(r"^(\d{4}-\d{2}-\d{2})[ T](\d{2}:\d{2}:\d{2})(?:\.(\d+))?"
                        r"\s*(Z|[+-]\d{2}:?\d{2})?$")


def _parse_timestamp(where: str, lineno: int, raw: str) -> float:
    m = _TIMESTAMP.match(raw.strip())
    try:
        if not m:
            raise ValueError
        date, clock, frac, offset = m.groups()
        zone = UTC
        if offset and offset != "Z":
            sign = -1 if offset[0] == "-" else 1
            hours, minutes = int(offset[1:3]), int(offset[-2:])
            zone = timezone(sign * timedelta(hours=hours, minutes=minutes))
        stamp = datetime.fromisoformat(f"{date} {clock}").replace(tzinfo=zone)
    except ValueError:
        raise TraceError(
            f"{where}:{lineno}: TIMESTAMP must look like 2023-11-16 18:17:03.9799600 or "
            f"2024-05-10 00:00:00.009930+00:00, got {raw!r}"
        ) from None
    return stamp.timestamp() + (float("0." + frac) if frac else 0.0)


def _csv_rows(text: str) -> Iterator[tuple[int, list[str]]]:
    reader = csv.reader(text.splitlines())
    for row in reader:
        if row and any(c.strip() for c in row):
            yield reader.line_num, row


def _named_columns(where: str, text: str, kind: str, need: tuple[str, str, str],
                   arrival: Callable[[str, int, str], float]) -> list[Row]:
    """A CSV whose header names its columns (Azure's, BurstGPT's): the arrival, prompt tokens
    and output tokens from the columns named in `need`, the others not read."""
    rows = _csv_rows(text)
    _, header = next(rows, (1, []))
    names = [h.strip() for h in header]
    missing = [n for n in need if n not in names]
    if missing:
        raise TraceError(f"{where}:1: {kind} trace header lacks {', '.join(missing)}; "
                         f"got {names}")
    at, prompt, output = (names.index(n) for n in need)
    out: list[Row] = []
    for lineno, row in rows:
        if len(row) != len(names):
            raise TraceError(f"{where}:{lineno}: expected {len(names)} columns, got {len(row)}")
        out.append((
            lineno,
            arrival(where, lineno, row[at]),
            _tokens(where, lineno, need[1], row[prompt], 0),
            _tokens(where, lineno, need[2], row[output], 0),
        ))
    return out


def _parse_azure(where: str, text: str) -> list[Row]:
    return _named_columns(where, text, "Azure", ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
                          _parse_timestamp)


def _parse_burstgpt(where: str, text: str) -> list[Row]:
    return _named_columns(
        where, text, "BurstGPT", ("Timestamp", "Request tokens", "Response tokens"),
        lambda w, n, raw: _seconds(w, n, "Timestamp", raw.strip()))


def _parse_plain_csv(where: str, text: str) -> list[Row]:
    out: list[Row] = []
    for lineno, row in _csv_rows(text):
        if lineno == 1 and row[0].strip().lower() == "arrival_s":
            continue
        if len(row) != 3:
            raise TraceError(
                f"{where}:{lineno}: expected 3 columns arrival_s,input_tokens,output_tokens, "
                f"got {len(row)}"
            )
        out.append((
            lineno,
            _seconds(where, lineno, "arrival_s", row[0].strip()),
            _tokens(where, lineno, "input_tokens", row[1], 0),
            _tokens(where, lineno, "output_tokens", row[2], 0),
        ))
    return out


def _hash_ids(where: str, lineno: int, raw: object) -> tuple[int, ...]:
    if not isinstance(raw, list) or not all(
            isinstance(h, int) and not isinstance(h, bool) for h in raw):
        shown = repr(raw)
        raise TraceError(f"{where}:{lineno}: hash_ids must be a list of integers, got "
                         f"{shown[:60]}{'...' if len(shown) > 60 else ''}")
    return tuple(raw)


def _parse_mooncake(where: str, text: str) -> list[Row]:
    return list(_json_lines(where, text, ms=True))


def _parse_bailian(where: str, text: str) -> list[Row]:
    rows = _json_lines(where, text, ms=False)
    chained = chain_ids([row[4] for row in rows])
    return [(row[0], row[1], row[2], row[3], ids)
            for row, ids in zip(rows, chained, strict=True)]


def chain_ids(prompts: Sequence[Sequence[int]]) -> list[tuple[int, ...]]:
    """Per-block ids made prefix ids: a block's new id names it and the new id before it
    (numbered from 0 in order of appearance), so two prompts share their first k new ids
    exactly when they share their first k old ones, and a block equal to another at a
    different prefix gets its own."""
    labels: dict[tuple[int, int], int] = {}
    out = []
    for ids in prompts:
        parent = -1
        chain = []
        for h in ids:
            parent = labels.setdefault((parent, h), len(labels))
            chain.append(parent)
        out.append(tuple(chain))
    return out


def _json_lines(where: str, text: str, ms: bool) -> list[tuple[int, float, int, int,
                                                                 tuple[int, ...]]]:
    """The JSONL formats' rows: `timestamp` in ms (Mooncake) or seconds (Bailian)."""
    out: list[tuple[int, float, int, int, tuple[int, ...]]] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TraceError(f"{where}:{lineno}: not valid JSON: {exc.msg}") from None
        if not isinstance(obj, dict):
            raise TraceError(f"{where}:{lineno}: expected a JSON object, got {type(obj).__name__}")
        for key in ("timestamp", "input_length", "output_length"):
            if key not in obj:
                raise TraceError(f"{where}:{lineno}: missing {key!r}")
        out.append((
            lineno,
            _seconds(where, lineno, "timestamp", obj["timestamp"]) / (1000.0 if ms else 1.0),
            _tokens(where, lineno, "input_length", str(obj["input_length"]), 0),
            _tokens(where, lineno, "output_length", str(obj["output_length"]), 0),
            _hash_ids(where, lineno, obj.get("hash_ids", [])),
        ))
    return out


_PARSERS = {"azure": _parse_azure, "mooncake": _parse_mooncake, "bailian": _parse_bailian,
            "burstgpt": _parse_burstgpt, "csv": _parse_plain_csv}


# ---------------------------------------------------------------------------------------------
# Shaping a trace for a run


def window(trace: Sequence[TraceRequest], start_s: float, duration_s: float) -> list[TraceRequest]:
    """The requests arriving in [start_s, start_s + duration_s), re-based to start at 0."""
    return [
        replace(r, arrival_s=round(r.arrival_s - start_s, 6))
        for r in trace
        if start_s <= r.arrival_s < start_s + duration_s
    ]


def busy_periods(trace: Sequence[TraceRequest], idle_s: float = 60.0) -> list[tuple[int, int]]:
    """The trace's busy periods, as indices [first, last] into the (sorted) trace: runs of
    requests split wherever `idle_s` or more pass without one."""
    periods: list[tuple[int, int]] = []
    first = 0
    for i in range(1, len(trace) + 1):
        if i == len(trace) or trace[i].arrival_s - trace[i - 1].arrival_s >= idle_s:
            periods.append((first, i - 1))
            first = i
    return periods


def longest_busy_period(trace: Sequence[TraceRequest], idle_s: float = 60.0) -> tuple[int, int]:
    """The busy period with the most requests (the earliest of equals), as indices [first,
    last]: a stretch of load that starts from idle and falls back to it, with the rises,
    bursts and lulls the trace has in between (a demo of an autoscaler needs all of them)."""
    if not trace:
        raise ValueError("longest_busy_period of an empty trace")
    return max(busy_periods(trace, idle_s), key=lambda p: (p[1] - p[0], -p[0]))


def scale_rate(trace: Sequence[TraceRequest], factor: float) -> list[TraceRequest]:
    """The same requests arriving `factor` times as fast (factor 2 = twice the request rate)."""
    if factor <= 0:
        raise ValueError(f"rate scale must be > 0, got {factor}")
    return [replace(r, arrival_s=round(r.arrival_s / factor, 6)) for r in trace]


def clamp_tokens(
    trace: Sequence[TraceRequest], max_input: int, max_output: int
) -> list[TraceRequest]:
    """Cap token counts so every request fits the engine's context (max-model-len); a cut
    prompt keeps the ids of its blocks (truncate_hash_ids)."""
    out = []
    for r in trace:
        n = max(1, min(r.input_tokens, max_input))
        out.append(replace(r, input_tokens=n, output_tokens=max(1, min(r.output_tokens,
                                                                        max_output)),
                           hash_ids=truncate_hash_ids(r.hash_ids, r.input_tokens, n,
                                                      r.block_tokens)))
    return out


def truncate_hash_ids(hash_ids: tuple[int, ...], input_tokens: int, keep: int,
                      block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> tuple[int, ...]:
    """The ids of a prompt cut from `input_tokens` to its first `keep` tokens: the blocks
    wholly kept keep their ids; a block cut short is other content, so it gets an id derived
    from its old id and its new length (two prompts cut alike in a shared block still share
    it, and nothing else can match it)."""
    if keep >= input_tokens or not hash_ids:
        return hash_ids
    full, part = divmod(keep, block_tokens)
    kept = hash_ids[:full]
    if part and len(hash_ids) > full:
        digest = hashlib.blake2b(f"{hash_ids[full]}:{part}".encode(), digest_size=8).digest()
        kept += (int.from_bytes(digest, "big") >> 1,)  # 63 bits: far above a trace's own ids
    return kept


def block_tokens_of(input_tokens: int, block: int,
                    block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> int:
    """Prompt tokens in block `block` of a prompt of `input_tokens` (the last may be partial)."""
    return max(0, min(block_tokens, input_tokens - block * block_tokens))


def prefix_hit_tokens(trace: Iterable[TraceRequest]) -> list[int]:
    """Per request, the prompt tokens an infinite prefix cache reachable from anywhere would
    serve: its leading blocks whose ids some earlier request already had (an id stands for its
    whole prefix, so a cache holds a leading run), at most input_tokens - 1 (vLLM always
    computes a prompt's last token, to sample from it). Requests in arrival order."""
    seen: set[int] = set()
    out = []
    for r in trace:
        hit = 0
        ids = r.hash_ids
        for b, h in enumerate(ids):
            if h not in seen:
                break
            hit += block_tokens_of(r.input_tokens, b, r.block_tokens)
        seen.update(ids)
        out.append(min(hit, r.input_tokens - 1))
    return out


def ideal_prefix_hit_tokens(trace: Iterable[TraceRequest]) -> int:
    """All prompt tokens an infinite cache reachable from anywhere would serve (the sum of
    prefix_hit_tokens)."""
    return sum(prefix_hit_tokens(trace))


def ideal_prefix_hit_rate(trace: Sequence[TraceRequest]) -> float:
    """ideal_prefix_hit_tokens over all prompt tokens (0.0 for a trace without hash ids)."""
    total = sum(r.input_tokens for r in trace)
    return ideal_prefix_hit_tokens(trace) / total if total else 0.0


def rate_per_bin(trace: Sequence[TraceRequest], bin_s: float) -> list[int]:
    """Request counts per `bin_s`-second bin, from 0 to the last arrival."""
    if not trace:
        return []
    bins = [0] * (int(trace[-1].arrival_s // bin_s) + 1)
    for r in trace:
        bins[int(r.arrival_s // bin_s)] += 1
    return bins


def write_csv(trace: Iterable[TraceRequest], path: str | Path) -> None:
    """Write the plain CSV format (readable back with load_trace)."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["arrival_s", "input_tokens", "output_tokens"])
        for r in trace:
            w.writerow([f"{r.arrival_s:.6f}", r.input_tokens, r.output_tokens])


def write_mooncake(trace: Iterable[TraceRequest], path: str | Path) -> None:
    """Write Mooncake JSONL (timestamp in ms, input_length, output_length, hash_ids), readable
    back with load_trace; the ms timestamps keep microseconds (3 decimals). Its ids must name
    Mooncake's 512-token blocks (write_bailian writes 16-token ones)."""
    trace = list(trace)
    _same_blocks(trace, MOONCAKE_BLOCK_TOKENS, "write_bailian")
    with open(path, "w", encoding="utf-8") as f:
        for r in trace:
            f.write(json.dumps({"timestamp": round(r.arrival_s * 1000.0, 3),
                                "input_length": r.input_tokens,
                                "output_length": r.output_tokens,
                                "hash_ids": list(r.hash_ids)}, separators=(",", ":")) + "\n")


def write_bailian(trace: Iterable[TraceRequest], path: str | Path) -> None:
    """Write the Qwen-Bailian JSONL (timestamp in seconds, 16-token blocks), readable back with
    load_trace. The trace keeps no sessions, so every request is written as its own
    (`chat_id` its index, `parent_chat_id` -1, `turn` 1): the ids still carry what is shared."""
    trace = list(trace)
    _same_blocks(trace, BAILIAN_BLOCK_TOKENS, "write_mooncake")
    with open(path, "w", encoding="utf-8") as f:
        for i, r in enumerate(trace):
            f.write(json.dumps({"chat_id": i, "parent_chat_id": -1,
                                "timestamp": round(r.arrival_s, 6),
                                "input_length": r.input_tokens,
                                "output_length": r.output_tokens, "type": "text", "turn": 1,
                                "hash_ids": list(r.hash_ids)}, separators=(",", ":")) + "\n")


def _same_blocks(trace: Sequence[TraceRequest], block_tokens: int, other: str) -> None:
    wrong = next((r for r in trace if r.hash_ids and r.block_tokens != block_tokens), None)
    if wrong is not None:
        raise ValueError(f"this format's hash ids name {block_tokens}-token blocks, the trace's "
                         f"{wrong.block_tokens}-token ones; write it with {other}")

"""Session workloads: multi-turn chat and agent loops whose prompts share prefixes, written as
Mooncake JSONL (with `hash_ids`), for tests, docs and the benchmark (a tool: not shipped).

    poolpilot workload sessions --kind chat|agent|mixed [--sessions N] [--rate R]
        [--duration S] [--seed K] --out FILE.jsonl

What a session is (every length in tokens, drawn from the seeded generator):
- it starts with one of a few system prompts shared across sessions, picked with Zipf-like
  popularity (prompt k with weight 1 / (k + 1) ** zipf_s);
- chat: each turn's prompt is the previous turn's prompt, the answer to it (the previous
  request's output) and a new user message; the user thinks between turns (exponential);
- agent: a task, then steps: each step's prompt is the previous prompt, the model's tool call
  (the previous output) and the tool's output; tools answer quickly (exponential);
- mixed: each session is a chat with probability `chat_share`, else an agent loop;
- sessions arrive as a Poisson process at `rate` per second, at most `sessions` of them, and
  only requests arriving before `duration` are kept; a session ends at its drawn number of
  turns or before its context would exceed `max_context`;
- `rate_profile` (empty by default): the session rate follows it instead of staying constant,
  one relative value per `profile_bin_s` seconds from the trace's start (scaled so that their
  mean is `rate`; the profile repeats past its end, and the warm-up takes its first value).
  `--arrivals-from TRACE` takes it from a real trace's request counts per bin, so a session
  workload rises and falls as real traffic did (sessions start as an inhomogeneous Poisson
  process, drawn by thinning);
- `warmup` seconds (0 by default): sessions start arriving that long before the trace begins
  and the requests before it are dropped, so the trace opens on traffic already in its steady
  state, as a window cut from a production trace does (sessions in progress, their earlier
  turns in no cache), instead of ramping up from no sessions at all. With `sessions` large
  enough that arrivals last the whole `duration`, the trace holds its steady state to the end.

Hash ids are consistent as a real trace's are: the prompt is cut into blocks of 512 tokens
(MOONCAKE_BLOCK_TOKENS) and block i's id is a hash of block i-1's id and block i's content
(which segments, which token ranges), relabelled to small integers in order of appearance. So
the same prefix blocks get the same ids across turns and sessions, and a block that is only
partly the same (the last, partial block of a prompt the next turn extends) gets a new one.
Output tokens become prompt tokens of the next turn, so they are cached only once they are
part of a prompt: the answer's blocks hit from the turn after.

`prompt_text(hash_ids, input_length)` turns such a request into text whose shared blocks are
identical text (words seeded by each id), for replaying the workload over HTTP.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import random
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import numpy as np
from poolpilot.engine_sim.traces import (
    BAILIAN_BLOCK_TOKENS,
    MOONCAKE_BLOCK_TOKENS,
    TraceRequest,
    ideal_prefix_hit_rate,
    load_trace,
    rate_per_bin,
    write_bailian,
    write_mooncake,
)

from .protocol import WORDS

KINDS = ("chat", "agent", "mixed")


@dataclass(frozen=True)
class SessionParams:
    """A session workload; `defaults(kind)` gives the documented defaults of each kind."""

    kind: str = "chat"
    sessions: int = 600
    rate: float = 1.0  # sessions arriving per second (Poisson)
    duration: float = 600.0  # seconds; later requests are dropped
    seed: int = 0
    warmup: float = 0.0  # seconds of sessions before the trace begins (their requests dropped)
    max_context: int = 32768  # prompt + output of one request, at most
    # shared system prompts: how many, their median length, the Zipf exponent of popularity
    chat_system_prompts: int = 16
    chat_system_tokens: int = 800
    agent_system_prompts: int = 8
    agent_system_tokens: int = 2000
    zipf_s: float = 1.0
    # chat: turns per session (geometric mean, capped), user message and answer medians,
    # think time between turns (mean seconds, after the previous answer would have ended)
    chat_turns: float = 2.5
    chat_max_turns: int = 16
    user_tokens: int = 200
    answer_tokens: int = 300
    think_s: float = 20.0
    # agent: steps per session, the task message, the tool call (output) and tool output
    # medians, the tool's mean latency in seconds
    agent_steps: float = 4.0
    agent_max_steps: int = 40
    task_tokens: int = 300
    call_tokens: int = 80
    tool_tokens: int = 1200
    tool_s: float = 2.0
    chat_share: float = 0.5  # mixed: the share of sessions that are chats
    sigma: float = 0.6  # lognormal spread of every drawn length
    # the session rate over time: relative values per bin (empty: constant `rate`)
    rate_profile: tuple[float, ...] = ()
    profile_bin_s: float = 60.0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        for name in ("sessions", "max_context", "chat_system_prompts", "agent_system_prompts"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("rate", "duration"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if not self.warmup >= 0:
            raise ValueError(f"warmup must be >= 0, got {self.warmup}")
        if self.rate_profile:
            if not all(0 <= v < float("inf") for v in self.rate_profile) \
                    or not max(self.rate_profile) > 0:
                raise ValueError("rate_profile must hold finite values >= 0, one of them > 0")
            if not self.profile_bin_s > 0:
                raise ValueError(f"profile_bin_s must be > 0, got {self.profile_bin_s}")

    def rate_at(self, t: float) -> float:
        """Sessions arriving per second at `t` (seconds from the trace's start)."""
        if not self.rate_profile:
            return self.rate
        prof = self.rate_profile
        i = int(max(0.0, t) // self.profile_bin_s) % len(prof)
        return self.rate * prof[i] * len(prof) / sum(prof)


# A segment of a session's context: (its key, its length). Keys are unique per content, so
# two contexts share a token exactly when they share the segment and the offset in it.
Segment = tuple[tuple[object, ...], int]


class _Ids:
    """Chained block hashes over segments, relabelled to small ints in order of appearance."""

    def __init__(self, block_tokens: int) -> None:
        self.block = block_tokens
        self.ids: dict[bytes, int] = {}

    def chain(self, segments: Sequence[Segment], length: int) -> tuple[int, ...]:
        out: list[int] = []
        parent = b""
        seg_i, seg_start = 0, 0
        for start in range(0, length, self.block):
            end = min(start + self.block, length)
            pieces = []
            pos = start
            while pos < end:
                while seg_start + segments[seg_i][1] <= pos:
                    seg_start += segments[seg_i][1]
                    seg_i += 1
                key, n = segments[seg_i]
                upto = min(end, seg_start + n)
                pieces.append((key, pos - seg_start, upto - seg_start))
                pos = upto
            parent = hashlib.blake2b(parent + repr(pieces).encode(), digest_size=16).digest()
            out.append(self.ids.setdefault(parent, len(self.ids)))
        return tuple(out)


def _lengths(rng: np.random.Generator, median: float, sigma: float) -> int:
    return max(1, int(rng.lognormal(np.log(median), sigma)))


def _turns(rng: np.random.Generator, mean: float, most: int) -> int:
    return int(min(most, rng.geometric(1.0 / max(mean, 1.0))))


def generate_sessions(params: SessionParams,
                      block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> list[TraceRequest]:
    """The workload's requests, sorted by arrival (deterministic for a given params), their
    prompts hashed in blocks of `block_tokens` (the same requests whatever the block size)."""
    p = params
    rng = np.random.default_rng(p.seed)
    ids = _Ids(block_tokens)
    systems = {
        "chat": [_lengths(rng, p.chat_system_tokens, p.sigma)
                 for _ in range(p.chat_system_prompts)],
        "agent": [_lengths(rng, p.agent_system_tokens, p.sigma)
                  for _ in range(p.agent_system_prompts)],
    }

    def popularity(n: int) -> np.ndarray:
        w = 1.0 / np.arange(1, n + 1) ** p.zipf_s
        return w / w.sum()

    weights = {k: popularity(len(v)) for k, v in systems.items()}
    out: list[TraceRequest] = []
    t = -p.warmup
    peak = max(p.rate_at(b * p.profile_bin_s) for b in range(len(p.rate_profile) or 1))
    for s in range(p.sessions):
        if p.rate_profile:  # thinning: candidates at the peak rate, kept at the rate then
            t += rng.exponential(1.0 / peak)
            while rng.random() * peak > p.rate_at(t):
                t += rng.exponential(1.0 / peak)
        else:
            t += rng.exponential(1.0 / p.rate)
        if t >= p.duration:
            break
        kind = p.kind if p.kind != "mixed" else (
            "chat" if rng.random() < p.chat_share else "agent")
        k = int(rng.choice(len(systems[kind]), p=weights[kind]))
        context: list[Segment] = [((kind, "system", k), systems[kind][k])]
        if kind == "chat":
            turns = _turns(rng, p.chat_turns, p.chat_max_turns)
            add, out_median, gap = ("user", p.user_tokens), p.answer_tokens, p.think_s
        else:
            turns = _turns(rng, p.agent_steps, p.agent_max_steps)
            context.append(((s, "task"), _lengths(rng, p.task_tokens, p.sigma)))
            add, out_median, gap = ("tool", p.tool_tokens), p.call_tokens, p.tool_s
        arrival = t
        for turn in range(turns):
            if turn > 0 or kind == "chat":
                context.append(((s, add[0], turn), _lengths(rng, add[1], p.sigma)))
            prompt = sum(n for _, n in context)
            output = _lengths(rng, out_median, p.sigma)
            if prompt + output > p.max_context or arrival >= p.duration:
                break
            if arrival >= 0:  # (before the trace: the warm-up's, dropped)
                out.append(TraceRequest(round(arrival, 6), prompt, output,
                                        ids.chain(context, prompt), block_tokens))
            context.append(((s, "output", turn), output))
            # the next turn comes after this answer (at ~ 30 tokens/s a user reads) and a gap
            arrival += output / 30.0 + rng.exponential(gap) if kind == "chat" else \
                rng.exponential(gap) + 0.5
    out.sort()
    return out


def arrival_profile(trace: Sequence[TraceRequest], bin_s: float) -> tuple[float, ...]:
    """A trace's requests per `bin_s` seconds, as a rate profile (`SessionParams`); a last bin
    the trace only began is left out (its count would read as a fall)."""
    counts = rate_per_bin(trace, bin_s)
    if len(counts) > 1 and trace[-1].arrival_s % bin_s < bin_s / 2:
        counts = counts[:-1]
    if not any(counts):
        raise ValueError("the arrivals trace has no request")
    return tuple(float(c) for c in counts)


def defaults(kind: str) -> SessionParams:
    return SessionParams(kind=kind)


# ---- text for the prompts (replaying over HTTP) ------------------------------------------------


@functools.lru_cache(maxsize=8192)
def _block_words(seed: int | str, n: int) -> tuple[str, ...]:
    rng = random.Random(seed)
    return tuple(rng.choices(WORDS, k=n))


def prompt_text(hash_ids: Sequence[int], input_length: int, *, salt: int = 0,
                block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> str:
    """A completion prompt of `input_length` tokens under the engine simulator's tokenizer (a
    BOS plus one token a word: engine_sim/protocol.py) whose words are, block by block, a run
    seeded by each hash id: requests sharing leading ids share that text exactly, so the
    simulator's prefix cache hits on them. Blocks beyond the ids (a trace without them) are
    seeded by `salt` and their position: pass each request its own salt (its index) so they
    are its own."""
    words: list[str] = []
    need = max(0, input_length - 1)  # the BOS is the first token
    block = 0
    while len(words) < need:
        n = min(block_tokens, need - len(words))
        seed: int | str = hash_ids[block] if block < len(hash_ids) else (
            f"tail:{salt}:{hash_ids[-1] if hash_ids else ''}:{block}")
        words.extend(_block_words(seed, block_tokens)[:n])
        block += 1
    return " ".join(words)


# ---- the command ---------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="workload", metavar="WORKLOAD", required=True)
    s = sub.add_parser("sessions", help="multi-turn chat and agent sessions sharing prefixes "
                       "(Mooncake or Qwen-Bailian JSONL with hash_ids)")
    d = SessionParams()
    s.add_argument("--kind", choices=KINDS, default=d.kind,
                   help="chat turns, agent loops, or both (default chat)")
    s.add_argument("--sessions", type=int, default=d.sessions,
                   help=f"sessions at most (default {d.sessions})")
    s.add_argument("--rate", type=float, default=d.rate,
                   help=f"sessions arriving per second, Poisson (default {d.rate:g})")
    s.add_argument("--duration", type=float, default=d.duration,
                   help=f"seconds of trace; later requests are dropped (default {d.duration:g})")
    s.add_argument("--seed", type=int, default=d.seed, help=f"random seed (default {d.seed})")
    s.add_argument("--warmup", type=float, default=d.warmup,
                   help="seconds of sessions before the trace begins, their requests dropped: "
                        "the trace opens in its steady state, as a window of a production "
                        f"trace does (default {d.warmup:g}: it ramps up from no sessions)")
    s.add_argument("--arrivals-from", type=Path, metavar="TRACE",
                   help="sessions arrive at a rate that follows this trace's request rate "
                        "(any format the bench reads), per --arrivals-bin seconds, scaled so "
                        "that its mean is --rate (default: a constant --rate)")
    s.add_argument("--arrivals-bin", type=float, default=d.profile_bin_s, metavar="SECONDS",
                   help=f"the bin of --arrivals-from (default {d.profile_bin_s:g})")
    s.add_argument("--max-context", type=int, default=d.max_context,
                   help=f"prompt + output of a request at most (default {d.max_context})")
    s.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="any other parameter of SessionParams (engine_sim/workloads.py), e.g. "
                        "--set think_s=10 --set chat_system_prompts=4")
    s.add_argument("--out", required=True, type=Path, help="the JSONL file to write")
    s.add_argument("--format", choices=("mooncake", "bailian"), default="mooncake",
                   help="Mooncake's JSONL with 512-token hash blocks (default), or the "
                        "Qwen-Bailian traces' with 16-token blocks (vLLM's KV block size)")
    s.add_argument("--json", action="store_true", help="print the summary as JSON")


def _params(args: argparse.Namespace) -> SessionParams:
    p = SessionParams(kind=args.kind, sessions=args.sessions, rate=args.rate,
                      duration=args.duration, seed=args.seed, warmup=args.warmup,
                      max_context=args.max_context)
    if args.arrivals_from is not None:
        if not args.arrivals_bin > 0:
            raise ValueError(f"--arrivals-bin must be > 0, got {args.arrivals_bin:g}")
        p = replace(p, rate_profile=arrival_profile(load_trace(args.arrivals_from),
                                                    args.arrivals_bin),
                    profile_bin_s=args.arrivals_bin)
    types = {f.name: type(getattr(p, f.name)) for f in fields(p) if f.name != "rate_profile"}
    changes: dict[str, object] = {}
    for item in args.set:
        name, eq, value = item.partition("=")
        name = name.strip().replace("-", "_")
        if not eq or name not in types:
            raise ValueError(f"--set {item!r}: expected NAME=VALUE with NAME one of "
                             f"{', '.join(sorted(types))}")
        try:
            changes[name] = types[name](value)
        except ValueError:
            raise ValueError(f"--set {item!r}: {value!r} is not a {types[name].__name__}") \
                from None
    return replace(p, **changes)  # type: ignore[arg-type]


def summary(trace: Sequence[TraceRequest], params: SessionParams) -> dict[str, object]:
    prompts = [r.input_tokens for r in trace]
    return {
        "requests": len(trace),
        "span_s": round(trace[-1].arrival_s, 3) if trace else 0.0,
        "mean_input_tokens": round(float(np.mean(prompts)), 1) if prompts else 0.0,
        "mean_output_tokens": round(float(np.mean([r.output_tokens for r in trace])), 1)
        if trace else 0.0,
        "ideal_prefix_hit_rate": round(ideal_prefix_hit_rate(trace), 4),
        "params": asdict(params),
    }


def run(args: argparse.Namespace) -> int:
    try:
        params = _params(args)
    except ValueError as exc:
        print(f"poolpilot workload sessions: {exc}", file=sys.stderr)
        return 2
    bailian = args.format == "bailian"
    trace = generate_sessions(params, BAILIAN_BLOCK_TOKENS if bailian else MOONCAKE_BLOCK_TOKENS)
    if not trace:
        print("poolpilot workload sessions: no request arrives within --duration",
              file=sys.stderr)
        return 2
    (write_bailian if bailian else write_mooncake)(trace, args.out)
    info = summary(trace, params)
    if args.json:
        print(json.dumps(info))
    else:
        print(f"{args.out}: {info['requests']} requests over {info['span_s']} s, mean prompt "
              f"{info['mean_input_tokens']} tokens, mean output {info['mean_output_tokens']}, "
              f"ideal prefix hit rate {info['ideal_prefix_hit_rate']}")
    return 0

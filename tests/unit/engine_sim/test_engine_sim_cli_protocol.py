"""Bad input to `poolpilot engine-sim` and the wire-format helpers."""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, fields

import pytest
from poolpilot.engine_sim import protocol as p
from poolpilot.engine_sim.engine import canonical_role
from poolpilot.engine_sim.server import SimServerConfig

from poolpilot.cli import build_parser, main
from poolpilot.roles import Role


@dataclass(frozen=True)
class BadArgs:
    name: str
    argv: list[str]
    message: str


BAD_ARGS = [
    BadArgs("unknown-model", ["--model", "gpt-9"],
            "unknown model 'gpt-9'; known models: llama-3.1-70b, llama-3.1-8b"),
    BadArgs("unknown-role", ["--role", "both-ways"], "use one of prefill, decode, engine"),
    BadArgs("too-long-context", ["--max-model-len", "200000"], "lower --max-model-len"),
    BadArgs("70b-on-one-gpu", ["--model", "llama-3.1-70b", "--gpu", "h100"],
            "use --tensor-parallel 2 or more"),
    BadArgs("zero-speed", ["--speed", "0"], "--speed must be > 0"),
]


@pytest.mark.parametrize("case", BAD_ARGS, ids=lambda c: c.name)
def test_engine_sim_rejects_bad_arguments_naming_the_fix(
        case: BadArgs, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["engine-sim", "--port", "0", *case.argv]) == 2
    assert case.message in capsys.readouterr().err


def test_engine_sim_options_are_its_config() -> None:
    """Every `poolpilot engine-sim` option is a SimServerConfig field with the same default,
    so the server takes a typed config, built from the command line or by hand."""
    parser = _subparser(build_parser(["engine-sim"]), "engine-sim")
    options = {a.dest for a in parser._actions if a.option_strings} - {
        "help", "log_level", "log_format"}
    assert options == {f.name for f in fields(SimServerConfig)}
    assert SimServerConfig.from_args(parser.parse_args([])) == SimServerConfig()
    given = parser.parse_args(["--role", "decode", "--speed", "inf", "--gpu", "H100",
                               "--no-enable-prefix-caching", "--itl-budget", "0.05"])
    assert SimServerConfig.from_args(given) == SimServerConfig(
        role="decode", speed=math.inf, gpu="h100", enable_prefix_caching=False,
        itl_budget=0.05)


@pytest.mark.parametrize(("given", "role"), [
    ("prefill", Role.PREFILL), ("decode", Role.DECODE), ("engine", Role.ENGINE),
    ("aggregated", Role.ENGINE),  # the older name, still passed by older pod specs
], ids=lambda v: str(v))
def test_engine_sim_roles_are_the_pool_roles(given: str, role: Role) -> None:
    assert canonical_role(given) is role
    assert SimServerConfig().role == Role.ENGINE  # the default: the aggregated engine


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    found: argparse.ArgumentParser = sub.choices[name]
    return found


@dataclass(frozen=True)
class TokCase:
    name: str
    prompt: object
    tokens: int


TOKENS = [
    TokCase("words-and-punctuation", "Hello, world!", 1 + 4),
    TokCase("token-ids", [5, 6, 7], 3),
    TokCase("batch-of-one", ["a b c"], 1 + 3),
]


@pytest.mark.parametrize("case", TOKENS, ids=lambda c: c.name)
def test_prompt_token_counts(case: TokCase) -> None:
    assert p.prompt_tokens(case.prompt)[0] == case.tokens


def test_chat_template_adds_header_tokens() -> None:
    n, _ = p.chat_tokens([{"role": "system", "content": "be brief"},
                          {"role": "user", "content": "hi"}])
    assert n == 1 + 3 + (4 + 2) + (4 + 1)


@pytest.mark.parametrize("bad", [[], [["a"], ["b"]], 3, [1.5]], ids=str)
def test_unusable_prompts_are_400(bad: object) -> None:
    with pytest.raises(p.BadRequest) as e:
        p.prompt_tokens(bad)
    assert e.value.status == 400 and e.value.param == "prompt"


def test_output_plan_honours_max_tokens_ignore_eos_and_is_deterministic() -> None:
    body = {"max_tokens": 50, "ignore_eos": True}
    assert p.plan_output(body, 10, 4096, False, "k", 256, 0) == p.Sampling(50, 50, "length")
    natural = [p.plan_output({"max_tokens": 10_000}, 10, 20_000, False, f"k{i}", 100, 0)
               for i in range(200)]
    assert all(s.finish_reason == "stop" and s.output_tokens < 10_000 for s in natural)
    assert 60 < sum(s.output_tokens for s in natural) / 200 < 150  # mean ~100
    assert natural[3] == p.plan_output({"max_tokens": 10_000}, 10, 20_000, False, "k3", 100, 0)
    assert p.plan_output({}, 10, 4096, True, "k", 1e9, 0).max_tokens == 4096 - 10  # chat
    assert p.plan_output({}, 10, 4096, False, "k", 1e9, 0).max_tokens == 16  # completions
    with pytest.raises(p.BadRequest, match="n=1"):
        p.plan_output({"n": 2}, 10, 4096, False, "k", 1, 0)


def test_generated_text_recounts_to_its_token_count() -> None:
    text = p.token_text("key", 0, 37)
    assert p.count_text_tokens(text) == 37
    assert p.token_text("key", 0, 10) + p.token_text("key", 10, 27) == text

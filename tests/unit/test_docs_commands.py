"""The docs' commands work as written.

Everything is read out of README.md, docs/*.md and runtime_image/README.md, so the test follows
the docs:
- every `poolpilot ...` command that runs offline (validate, crd, render, sim, launch --dry-run,
  any --help; `docker run --rm IMAGE ARGS` is the image's `poolpilot ARGS`), in a code block or
  inline with its arguments, runs as written from the repository root, globs and all, and exits 0;
- every `poolpilot ...` or `./dev sandbox ...` command the docs name, in a code block or inline,
  names a real subcommand, and each of its flags is in that subcommand's --help;
- every module path (`poolpilot.x.y`) and repository path (`operator/builders.py`) the docs name
  exists, so a move cannot leave the docs pointing at nothing.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from poolpilot import cli

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "runtime_image/README.md"]

FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
# Subcommands that touch no cluster, server or network: their documented lines are run.
OFFLINE = {"validate", "crd", "render", "sim"}
# A word that stands for a value (FILE, URL, NAME_OR_PATH) or syntax ([...], a|b, ...): a summary
# of a command's shape, checked for its flags but not run.
PLACEHOLDER = re.compile(r"\b[A-Z][A-Z_]+\b|[\[\]|…()]|\.\.\.?")
FLAG = re.compile(r"(?<![\w./=-])(--?[A-Za-z][\w-]*)")
SUBCOMMAND_WORD = re.compile(r"^[a-z][a-z0-9-]*$")
# How the docs spell a poolpilot command: itself, through ./dev, through the image's entry point.
AS_POOLPILOT = (("poolpilot ", "poolpilot "), ("./dev sandbox", "poolpilot sandbox"),
                ("docker run --rm IMAGE ", "poolpilot "))
# Folders whose files the docs name by path (`operator/builders.py`); others are outputs.
REPO_FOLDERS = ("poolpilot", "operator", "autoscaler", "router", "engine_sim", "bench", "sandbox",
                "dashboards", "emulator", "perf", "runtime_image", "charts", "crds", "examples",
                "docs", "tests", "e2e")


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _code_block_lines(text: str) -> list[str]:
    """Shell lines of every fenced block, continuations joined, `$ ` prompts dropped."""
    lines: list[str] = []
    for block in FENCE.findall(text):
        pending = ""
        for raw in block.splitlines():
            line = pending + raw.strip()
            if line.endswith("\\"):
                pending = line[:-1] + " "
                continue
            pending = ""
            lines.append(line.removeprefix("$ "))
    return lines


def _inline_spans(text: str) -> list[str]:
    """Inline code spans outside the fenced blocks, whitespace normalised (a span may wrap)."""
    prose = FENCE.sub("", text)
    return [" ".join(span.split()) for span in re.findall(r"`([^`\n]+(?:\n[^`\n]+)?)`", prose)]


def _as_poolpilot(command: str) -> str | None:
    """The `poolpilot ...` command a doc line stands for, without its comment; else None."""
    command = re.sub(r"\s+#.*$", "", command).strip()
    command = re.split(r"\s\|\s+(?=[a-z])", command)[0]  # `poolpilot render ... | kubectl apply`
    for prefix, replacement in AS_POOLPILOT:
        if command.startswith(prefix):
            return replacement + command[len(prefix):]
    return None


def _documented() -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(code-block commands, every command) as (doc, `poolpilot ...`)."""
    blocks: list[tuple[str, str]] = []
    every: list[tuple[str, str]] = []
    for doc in DOCS:
        text = doc.read_text()
        for line in _code_block_lines(text):
            if (cmd := _as_poolpilot(line)) is not None:
                blocks.append((_rel(doc), cmd))
        for span in _inline_spans(text):
            if (cmd := _as_poolpilot(span)) is not None:
                every.append((_rel(doc), cmd))
    return blocks, sorted(set(blocks + every))


BLOCKS, EVERY = _documented()


def _runs_offline(cmd: str) -> bool:
    words = cmd.split()
    if PLACEHOLDER.search(cmd) or len(words) < 2:
        return False
    return words[1] in OFFLINE or "--help" in words or (words[1] == "launch"
                                                        and "--dry-run" in words)


# Code blocks are commands; an inline span is a command when it has arguments (`poolpilot sim
# batching --seed 3 --json`), else it names one (`poolpilot render`).
RUNNABLE = sorted({(doc, cmd) for doc, cmd in EVERY if _runs_offline(cmd)
                   and ((doc, cmd) in BLOCKS or re.search(r" -|/", cmd))})


def test_the_docs_have_offline_commands_to_run() -> None:
    """The parsing finds what README.md shows a new user first (guards the test itself)."""
    commands = {cmd for _, cmd in RUNNABLE}
    assert {"poolpilot validate examples/*.yaml", "poolpilot crd --check"} <= commands
    assert any(cmd.startswith("poolpilot render ") for cmd in commands)
    assert any(cmd.startswith("poolpilot launch ") for cmd in commands)


@pytest.mark.parametrize(("doc", "command"), RUNNABLE, ids=[c for _, c in RUNNABLE])
def test_offline_command_runs_as_written(doc: str, command: str) -> None:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    out = subprocess.run(["bash", "-c", command], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, f"{doc}: `{command}` exited {out.returncode}:\n{out.stderr[-2000:]}"
    assert out.stdout.strip(), f"{doc}: `{command}` printed nothing"


def _help(words: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_:
        cli.main([*words, "--help"])
    captured = capsys.readouterr()
    assert exit_.value.code == 0, f"`poolpilot {' '.join(words)} --help`: {captured.err[-500:]}"
    return captured.out


@pytest.mark.parametrize(("doc", "command"), EVERY, ids=[c for _, c in EVERY])
def test_documented_command_and_its_flags_exist(doc: str, command: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    words: list[str] = []
    for word in command.split()[1:]:
        if not SUBCOMMAND_WORD.match(word):
            break
        words.append(word)
    assert not words or words[0] in cli.COMMANDS, f"{doc}: `{command}`: no such subcommand"
    text = _help(words, capsys)
    missing = [f for f in FLAG.findall(command)
               if f != "--help" and not re.search(rf"(?<![\w-]){re.escape(f)}(?![\w-])", text)]
    assert not missing, f"{doc}: `{command}`: `poolpilot {' '.join(words)}` has no {missing}"


def _named_modules() -> list[tuple[str, str]]:
    """`poolpilot.x.y` names in the docs, but for the API group, the chart's rule groups and
    the chart's values as an umbrella chart names them (`condition: poolpilot.enabled`)."""
    rules = yaml.safe_load((ROOT / "charts/poolpilot/files/prometheus-rules.yaml").read_text())
    not_modules = {group["name"] for group in rules["groups"]}
    schema = json.loads((ROOT / "charts/poolpilot/values.schema.json").read_text())
    not_modules |= {f"poolpilot.{key}" for key in schema["properties"]}
    found = set()
    for doc in DOCS:
        text = doc.read_text()
        for name in re.findall(r"(?<![\w./-])(poolpilot(?:\.[A-Za-z_]\w*)+)", text):
            name = name.rstrip(".")
            if not name.startswith("poolpilot.dev") and name not in not_modules:
                found.add((_rel(doc), name))
    return sorted(found)


@pytest.mark.parametrize(("doc", "name"), _named_modules(), ids=[n for _, n in _named_modules()])
def test_named_module_exists(doc: str, name: str) -> None:
    """`poolpilot.emulator.server.KubeEmulator`: the longest importable module, then attributes."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            assert hasattr(obj, attr), f"{doc} names {name}: {attr!r} is not in {obj!r}"
            obj = getattr(obj, attr)
        return
    raise AssertionError(f"{doc} names {name}, which does not exist")


def _named_paths() -> list[tuple[str, str]]:
    found = set()
    folders = "|".join(REPO_FOLDERS)
    for doc in DOCS:
        for span in _inline_spans(doc.read_text()):
            if re.fullmatch(rf"(?:{folders})/[\w./*-]*", span):
                found.add((_rel(doc), span))
    return sorted(found)


@pytest.mark.parametrize(("doc", "path"), _named_paths(), ids=[p for _, p in _named_paths()])
def test_named_path_exists(doc: str, path: str) -> None:
    assert list(ROOT.glob(path)), f"{doc} names {path}, which is not in the repository"


"""The `poolpilot` command line as a whole: --version, help on every flag of every subcommand,
one --log-level everywhere, and "no such file" errors that name the file and the fix."""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from poolpilot.engine_sim.hardware import GPUS
from poolpilot.perf import main as perf_main

from poolpilot import cli

ROOT = Path(__file__).resolve().parents[2]


def test_version_is_the_package_and_chart_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--version"])
    assert exit_.value.code == 0
    version = importlib.metadata.version("poolpilot")
    assert capsys.readouterr().out == f"poolpilot {version}\n"
    chart = yaml.safe_load((ROOT / "charts/poolpilot/Chart.yaml").read_text())
    assert chart["appVersion"] == version


class _Captured(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser


def _parsers() -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """(command line, parser) for poolpilot itself, every subcommand and nested subcommand,
    and every `poolpilot perf NAME` harness (each builds its parser inside its main())."""
    yield "poolpilot", cli.build_parser([])
    for name in cli.COMMANDS:
        yield from _nested(f"poolpilot {name}", _subparser(cli.build_parser([name]), name))
    for name, (module, _) in perf_main.HARNESSES.items():
        mp = pytest.MonkeyPatch()

        def capture(self: argparse.ArgumentParser, *args: object, **kw: object) -> None:
            raise _Captured(self)

        mp.setattr(argparse.ArgumentParser, "parse_args", capture)
        try:
            importlib.import_module(module).main([], prog=f"poolpilot perf {name}")
        except _Captured as got:
            yield f"poolpilot perf {name}", got.parser
        else:
            raise AssertionError(f"poolpilot perf {name}: main() parsed no arguments")
        finally:
            mp.undo()


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    found: argparse.ArgumentParser = sub.choices[name]
    return found


def _nested(line: str, parser: argparse.ArgumentParser
            ) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield line, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _nested(f"{line} {name}", sub)


def _flags_without_help(parser: argparse.ArgumentParser) -> list[str]:
    # argparse.SUPPRESS is a deliberate choice (a harness's internal re-exec flag), not a gap.
    return ["/".join(a.option_strings) or a.dest for a in parser._actions
            if not isinstance(a, argparse._SubParsersAction) and not a.help]


def test_every_flag_of_every_subcommand_has_help() -> None:
    parsers = dict(_parsers())
    assert {"poolpilot sim batching", "poolpilot perf router", "poolpilot sandbox"} <= set(parsers)
    missing = {line: flags for line, p in parsers.items() if (flags := _flags_without_help(p))}
    assert missing == {}


@pytest.mark.parametrize("command", sorted(cli.COMMANDS))
def test_every_subcommand_takes_log_level_and_v(command: str) -> None:
    parser = _subparser(cli.build_parser([command]), command)
    flags = {opt: a for a in parser._actions for opt in a.option_strings}
    level, verbose = flags["--log-level"], flags["-v"]
    assert level.dest == verbose.dest == "log_level"
    assert level.default == ("INFO" if command in cli.SERVERS else "WARNING")
    assert verbose is flags["--verbose"] and verbose.const == "DEBUG"
    assert level.type is not None and level.type("debug") == "DEBUG"


def test_an_unknown_log_level_names_the_choices(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["crd", "--log-level", "loud"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--log-level: invalid choice: 'LOUD'" in err
    assert all(level in err for level in cli.LOG_LEVELS)


def test_log_level_reaches_the_root_logger(monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(logging.root, "handlers", [])
    monkeypatch.setattr(logging.root, "level", logging.WARNING)
    assert cli.main(["crd", "--log-level", "DEBUG"]) == 0
    assert logging.root.level == logging.DEBUG
    assert "kind: CustomResourceDefinition" in capsys.readouterr().out


NOT_FOUND = [
    pytest.param(["crd", "--check"], 2,
                 "poolpilot crd --check: crds/inferencepool.yaml: no such file; run it in the "
                 "repository's root folder, or pass --file PATH", id="crd-check-outside-repo"),
    pytest.param(["dashboards", "--check"], 2,
                 "poolpilot dashboards: charts/poolpilot: no chart here (no Chart.yaml); run it "
                 "in the repository's root folder, or pass --chart DIR",
                 id="dashboards-check-outside-repo"),
    pytest.param(["validate", "missing.yaml"], 1, "missing.yaml: no such file",
                 id="validate-missing-file"),
    pytest.param(["render", "missing.yaml"], 2, "poolpilot render: missing.yaml: no such file",
                 id="render-missing-file"),
    pytest.param(["router", "--config", "missing.json", "--engine", "http://127.0.0.1:1"], 2,
                 "poolpilot router: error: --config missing.json: no such file",
                 id="router-missing-config"),
    pytest.param(["validate", "."], 1, ".: is a folder, not a file", id="validate-a-folder"),
]


@pytest.mark.parametrize(("argv", "code", "message"), NOT_FOUND)
def test_missing_files_are_named_with_the_fix(argv: list[str], code: int, message: str,
                                             tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)  # an empty folder: outside the repository
    assert cli.main(argv) == code
    err = capsys.readouterr().err
    assert message in err.splitlines()
    assert "Errno" not in err and "out of date" not in err and "stale" not in err


def test_crd_check_in_the_repository_still_passes(monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(ROOT)
    assert cli.main(["crd", "--check"]) == 0
    assert "crds/inferencepool.yaml matches the models" in capsys.readouterr().out


def test_router_config_that_is_not_json_says_so(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "router.json"
    bad.write_text("{not json")
    assert cli.main(["router", "--config", str(bad), "--engine", "http://127.0.0.1:1"]) == 2
    assert f"--config {bad}: cannot read it as JSON" in capsys.readouterr().err


def test_the_tool_commands_are_the_tool_rooms() -> None:
    """cli.TOOLS (the commands that say "install the developer tools" when their room or a
    dependency is missing) are exactly the commands of pyproject's dev-only rooms."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    package_dir: dict[str, str] = project["tool"]["setuptools"]["package-dir"]
    dev_only = set(project["tool"]["poolpilot"]["dev-only"])

    def folder(module: str) -> str:
        package = max((p for p in package_dir if module == p or module.startswith(p + ".")),
                      key=len)
        return package_dir[package]

    assert {name for name, (module, _) in cli.COMMANDS.items()
            if folder(module) in dev_only} == cli.TOOLS


def _action(parser: argparse.ArgumentParser, flag: str) -> argparse.Action | None:
    return next((a for a in parser._actions if flag in a.option_strings), None)


def _meaning(help_text: str | None) -> str:
    """A help text without its default (commands differ in their defaults, not the meaning)."""
    return (help_text or "").rsplit("default", 1)[0]


@dataclass(frozen=True)
class SharedOption:
    flag: str
    add: Callable[[argparse.ArgumentParser], None]
    users: frozenset[str]  # commands whose option is the shared definition
    everywhere: bool  # no command defines the flag any other way
    never: frozenset[str] = frozenset()  # commands that must not take the flag


SHARED = [
    SharedOption("--gpu", lambda p: cli.add_gpu(p, GPUS),
                 frozenset({"poolpilot engine-sim", "poolpilot sim trace", "poolpilot bench",
                            "poolpilot sandbox", "poolpilot perf router"}), everywhere=True),
    SharedOption("--kubeconfig", cli.add_kubeconfig,
                 frozenset({"poolpilot operator", "poolpilot router", "poolpilot autoscaler"}),
                 everywhere=False, never=frozenset({"poolpilot emulator"})),
    SharedOption("--speed", cli.add_speed,
                 frozenset({"poolpilot engine-sim", "poolpilot sandbox", "poolpilot router",
                            "poolpilot autoscaler"}),
                 everywhere=False, never=frozenset({"poolpilot perf router"})),
]


@pytest.mark.parametrize("case", SHARED, ids=lambda c: c.flag)
def test_a_shared_option_is_defined_once(case: SharedOption) -> None:
    """Commands that share an option take cli's definition: the same type, choices and
    meaning. The emulator's kubeconfig is one it writes (--write-kubeconfig) and perf router's
    engine pacing is --engine-speed, so neither flag has a second meaning."""
    reference = argparse.ArgumentParser()
    case.add(reference)
    ref = _action(reference, case.flag)
    assert ref is not None
    found = {line: a for line, p in _parsers() if (a := _action(p, case.flag)) is not None}
    assert case.users <= set(found)
    assert not case.never & set(found)
    same = {line for line, a in found.items()
            if (a.type, a.choices, a.metavar, _meaning(a.help))
            == (ref.type, ref.choices, ref.metavar, _meaning(ref.help))}
    assert case.users <= same
    if case.everywhere:
        assert same == set(found)


def test_gpu_choices_are_the_simulators_gpus(capsys: pytest.CaptureFixture[str]) -> None:
    parser = _subparser(cli.build_parser(["engine-sim"]), "engine-sim")
    gpu = _action(parser, "--gpu")
    assert gpu is not None and list(gpu.choices or ()) == sorted(GPUS)
    assert parser.parse_args(["--gpu", "H100"]).gpu == "h100"
    with pytest.raises(SystemExit):
        parser.parse_args(["--gpu", "tpu-v5"])
    err = capsys.readouterr().err
    assert "--gpu: invalid choice: 'tpu-v5'" in err and all(g in err for g in GPUS)

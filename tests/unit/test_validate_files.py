"""Bad files never crash `poolpilot validate` or `poolpilot render`: each gives
`FILE: what is wrong` and exit 1. Files that are fine but unusual still work."""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from poolpilot import cli

HEAD = "apiVersion: poolpilot.dev/v1alpha1\nkind: InferencePool\nmetadata: {name: p}\n"
POOL = HEAD + "spec:\n  model: {name: m}\n"
# A List as `kubectl get -o yaml` writes it; kubectl applies its items one by one.
LIST = ("apiVersion: v1\nkind: List\nitems:\n- {apiVersion: poolpilot.dev/v1alpha1, "
        "kind: InferencePool, metadata: {name: p}, spec: {model: {name: m}}}\n")
# 9 x 9 x ... : 9^9 (387 million) strings once expanded, in about 500 bytes.
BOMB = 'a: &a ["x","x","x","x","x","x","x","x","x"]\n' + "".join(
    f"{c}: &{c} [*{p},*{p},*{p},*{p},*{p},*{p},*{p},*{p},*{p}]\n"
    for p, c in zip("abcdefgh", "bcdefghi", strict=True)
)


def run(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(list(args))
    return code, out.getvalue(), err.getvalue()


@dataclass(frozen=True)
class BadFile:
    id: str
    data: bytes
    says: str  # part of the one-line reason


BAD_FILES = [
    BadFile("not-utf8", (HEAD + "spec:\n  model: {name: caf\xe9}\n").encode("latin-1"),
            "not UTF-8 text: byte 0xe9 at line 5"),
    BadFile("deep-flow-nesting", (POOL + "x: " + "[" * 10_000 + "]" * 10_000 + "\n").encode(),
            "nested deeper than 64 levels"),
    BadFile("deep-block-nesting",
            (POOL + "x:\n" + "".join("  " * (i + 1) + "a:\n" for i in range(1000))).encode(),
            "nested deeper than 64 levels"),
    BadFile("alias-bomb", (BOMB + POOL.replace("{name: m}", "{name: m}\n  runtime: "
                                                "{engineArgs: {x: *i}}")).encode(),
            "expands to more than 50000 values"),
    BadFile("alias-nesting", (POOL + "d: &d " + "[" * 40 + "]" * 40 + "\ne: " + "[" * 40
                              + "*d" + "]" * 40 + "\n").encode(),
            "nested deeper than 64 levels once aliases are expanded"),
    BadFile("duplicate-key", (POOL + "  mode: Aggregated\n  mode: Disaggregated\n").encode(),
            "line 7, column 3: duplicate key 'mode' (first at line 6); keep one"),
    BadFile("duplicate-top-level-key", (POOL + "kind: InferencePool\n").encode(),
            "duplicate key 'kind' (first at line 2)"),
    BadFile("recursive-alias", (POOL + "loop: &l [*l]\n").encode(),
            "an alias refers to a node that contains it"),
    BadFile("integer-key", (POOL + "  1: x\n").encode(), "key 1 is not a string; quote it"),
    BadFile("binary-tag", (POOL + "  servedName: !!binary aGk=\n").encode(),
            "tag:yaml.org,2002:binary values have no JSON form"),
    BadFile("python-tag", (POOL + "x: !!python/object/apply:os.system [ls]\n").encode(),
            "could not determine a constructor"),
    BadFile("control-character", (POOL + "x: \x1b[0m\n").encode(), "unacceptable character"),
    BadFile("not-a-mapping", b"- a\n- b\n", "document 1: expected a mapping"),
    BadFile("bad-yaml", (POOL + "  mode: [\n").encode(),
            "line 7, column 1: expected the node content"),
    BadFile("infinite-seconds",
            (POOL + "  slo: {ttft: {quantile: 0.9, seconds: .inf}}\n").encode(),
            "spec.slo.ttft.seconds: must be a finite number, got inf"),
    # YAML 1.1 reads 1:30 as 90; kubectl sends the text, which the API server refuses
    BadFile("base-60-number", (POOL + "  autoscaling: {intervalSeconds: 1:30}\n").encode(),
            "spec.autoscaling.intervalSeconds: must be an integer, got a string ('1:30')"),
    BadFile("huge-integer", (POOL + "  prefill: {replicas: " + "9" * 5000 + "}\n").encode(),
            "an integer of 5000 digits; Kubernetes integers are at most 64-bit"),
    BadFile("bad-item-of-a-list",
            (LIST + "- {apiVersion: poolpilot.dev/v1alpha1, kind: InferencePool, metadata: "
             "{name: q}, spec: {model: {name: m}, mode: Sideways}}"
             "\n").encode(),
            "items[1]: spec.mode: "),
    BadFile("list-without-pools", b"apiVersion: v1\nkind: List\nitems: []\n",
            "no InferencePool document found"),
    BadFile("too-large", (POOL + "x: '" + "a" * (5 * 1024 * 1024) + "'\n").encode(),
            "bytes; poolpilot reads at most 4 MiB"),
]


@pytest.mark.parametrize("command", ["validate", "render"])
@pytest.mark.parametrize("case", BAD_FILES, ids=[c.id for c in BAD_FILES])
def test_bad_file_is_one_line_and_exit_1(tmp_path: Path, case: BadFile, command: str) -> None:
    path = tmp_path / "pool.yaml"
    path.write_bytes(case.data)
    code, out, err = run(command, str(path))
    assert code == 1
    assert out == ""
    assert err.splitlines() == [err.strip()], "one line"
    assert err.startswith(f"{path}: ") and case.says in err, err


@pytest.mark.parametrize(("command", "code", "prefix"),
                         [("validate", 1, ""), ("render", 2, "poolpilot render: ")])
def test_missing_file_and_folder(tmp_path: Path, command: str, code: int, prefix: str) -> None:
    for path, says in ((tmp_path / "missing.yaml", "no such file"), (tmp_path, "a folder")):
        got, _, err = run(command, str(path))
        assert got == code and err.startswith(f"{prefix}{path}: ") and says in err, err


@pytest.mark.parametrize(
    ("command", "case"),
    [("render", BAD_FILES[3]), ("validate", BAD_FILES[0])],
    ids=["render-alias-bomb", "validate-not-utf8"],
)
def test_the_installed_command_says_it_too(tmp_path: Path, command: str, case: BadFile) -> None:
    """The real entry point, not only cli.main: no traceback, exit 1."""
    path = tmp_path / "pool.yaml"
    path.write_bytes(case.data)
    proc = subprocess.run([sys.executable, "-m", "poolpilot.cli", command, str(path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr and case.says in proc.stderr


@dataclass(frozen=True)
class GoodFile:
    id: str
    text: str


GOOD_FILES = [
    GoodFile("timestamp-stays-text", POOL.replace("{name: m}", "{name: 2024-01-01}")),
    GoodFile("exponent-without-dot", POOL + "  slo: {ttft: {quantile: 0.9, seconds: 5e-1}}\n"),
    GoodFile("anchors-and-merge-keys",
             POOL + "  prefill: &role {replicas: 1, maxReplicas: 4}\n  decode:\n"
             "    <<: *role\n    maxReplicas: 8\n"),
    GoodFile("byte-order-mark", "\ufeff" + POOL),
    GoodFile("base-60-text-stays-text", POOL.replace("{name: m}", "{name: m, servedName: 1:30}")),
    GoodFile("two-pools-and-other-kinds",
             POOL + "---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n---\n"
             + POOL.replace("{name: p}", "{name: q}")),
    GoodFile("a-list-as-kubectl-applies-it",
             LIST),
]


@pytest.mark.parametrize("case", GOOD_FILES, ids=[c.id for c in GOOD_FILES])
def test_unusual_but_valid_files(tmp_path: Path, case: GoodFile) -> None:
    path = tmp_path / "pool.yaml"
    path.write_text(case.text, encoding="utf-8")
    assert run("validate", str(path))[0] == 0
    code, out, err = run("render", str(path))
    assert code == 0 and "kind: Deployment" in out, err
    assert "&id" not in out and "*id" not in out

"""`poolpilot validate` on files that are not what they seem: a device or a pipe with no end
(it reads a bounded amount and says the file is too large), and one pool written twice (it
names both documents)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import resource
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from poolpilot import cli

TOO_LARGE = "more than 4194304 bytes; poolpilot reads at most 4 MiB"


def run(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(list(args))
    return code, out.getvalue(), err.getvalue()


def _pool(name: str = "p", namespace: str | None = "ns") -> dict[str, Any]:
    meta = {"name": name, **({"namespace": namespace} if namespace else {})}
    return {"apiVersion": "poolpilot.dev/v1alpha1", "kind": "InferencePool", "metadata": meta,
            "spec": {"model": {"name": "x/y"}, "mode": "Aggregated"}}


def _write(path: Path, *docs: dict[str, Any]) -> Path:
    path.write_text("---\n".join(json.dumps(d) + "\n" for d in docs))
    return path


# --- files with no size -----------------------------------------------------------------------


def _limit_memory() -> None:
    # Unbounded, reading /dev/zero would fill the machine's memory before failing.
    resource.setrlimit(resource.RLIMIT_AS, (2**31, 2**31))


@pytest.mark.parametrize("command", ["validate", "render"])
def test_dev_zero_is_too_large_not_read_forever(command: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "poolpilot.cli", command, "/dev/zero"],
                          capture_output=True, text=True, timeout=60,
                          preexec_fn=_limit_memory)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert proc.stderr == f"/dev/zero: {TOO_LARGE} (the API server takes 3 MiB per object)\n"


def test_a_pipe_that_never_ends_is_too_large(tmp_path: Path) -> None:
    """A pipe (as `poolpilot validate <(yes)`): stat gives 0 bytes, the data keeps coming
    (here twice the limit, so that a reader without the limit ends too)."""
    fifo = tmp_path / "pool.yaml"
    os.mkfifo(fifo)

    def write() -> None:
        with contextlib.suppress(BrokenPipeError), fifo.open("wb") as out:
            for _ in range(150):  # 9 MB, unless validate closes its end first
                out.write(b"# yes\n" * 10_000)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    code, out, err = run("validate", str(fifo))
    writer.join(timeout=30)
    assert (code, out) == (1, "")
    assert err.startswith(f"{fifo}: {TOO_LARGE}"), err


# --- one pool twice ---------------------------------------------------------------------------


def test_validate_names_both_documents_of_one_pool(tmp_path: Path) -> None:
    path = _write(tmp_path / "pools.yaml", _pool(), _pool(name="q"), _pool())
    code, out, err = run("validate", str(path))
    assert (code, out) == (1, "")
    assert err.strip() == (
        f"{path}: document 3: metadata.name: InferencePool ns/p again (first in document 1); "
        "kubectl would apply one over the other: give each pool its own metadata.name or "
        "metadata.namespace, or keep one")


def test_validate_names_both_items_of_a_list(tmp_path: Path) -> None:
    items = {"apiVersion": "v1", "kind": "List", "items": [_pool(namespace=None)] * 2}
    # (an empty document before it still counts, as an editor shows them)
    path = tmp_path / "pools.yaml"
    path.write_text("---\n---\n" + json.dumps(items) + "\n")
    code, _, err = run("validate", str(path))
    assert code == 1
    assert ("document 2 items[1]: metadata.name: InferencePool p (no namespace) again (first in "
            "document 2 items[0])") in err, err


def test_one_pool_in_two_files_is_two_alternatives(tmp_path: Path) -> None:
    """`poolpilot validate examples/*.yaml`: files are checked one by one, and the examples
    are alternatives that share a pool's name."""
    a = _write(tmp_path / "a.yaml", _pool())
    b = _write(tmp_path / "b.yaml", _pool())
    assert run("validate", str(a), str(b)) == (0, f"{a}: valid\n{b}: valid\n", "")


def test_a_bad_document_and_a_repeated_one_are_both_reported(tmp_path: Path) -> None:
    bad = {**_pool(), "spec": {"model": {"name": "x/y"}, "mode": "Sideways"}}
    path = _write(tmp_path / "pools.yaml", _pool(), bad, _pool())
    code, _, err = run("validate", str(path))
    assert code == 1
    lines = err.splitlines()
    assert len(lines) == 2 and "spec.mode: " in lines[0], err
    assert lines[1].startswith(f"{path}: document 3: metadata.name: InferencePool ns/p again")

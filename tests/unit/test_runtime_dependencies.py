"""The control plane needs only its runtime dependencies: every module of the core, the
operator, the autoscaler, the router, kubeclient and the engine launcher imports in a Python
that sees nothing but those distributions (pyproject's [project] dependencies and what they
require) and poolpilot's control-plane rooms, as in the images. And each runtime dependency is
imported by some control-plane module: nothing rides along unused.

The environment is built offline: a folder of links to exactly those distributions' top-level
packages in this venv, and `python -S` so that site-packages itself is not on the path.
"""

from __future__ import annotations

import ast
import importlib.metadata as md
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PACKAGE_DIR: dict[str, str] = PYPROJECT["tool"]["setuptools"]["package-dir"]
CONTROL_PLANE = ["poolpilot", "poolpilot.operator", "poolpilot.autoscaler", "poolpilot.router",
                 "poolpilot.kubeclient", "poolpilot.runtime"]
# Distributions that hold only type stubs or compiled parts imported under another name.
IMPORT_NAMES = {"pyyaml": "yaml", "prometheus-api-client": "prometheus_api_client",
                "cel-python": "celpy", "kubernetes-asyncio": "kubernetes_asyncio",
                "pyzmq": "zmq"}


def runtime_requirements() -> list[Requirement]:
    return [Requirement(r) for r in PYPROJECT["project"]["dependencies"]]


def closure(requirements: list[Requirement]) -> set[str]:
    """The installed distributions these requirements pull in (markers evaluated, no extras
    unless asked for)."""
    seen: set[str] = set()
    todo = [(r, frozenset(r.extras)) for r in requirements]
    while todo:
        req, extras = todo.pop()
        name = canonicalize_name(req.name)
        if req.marker is not None and not any(
                req.marker.evaluate({"extra": e}) for e in (extras or {""})):
            continue
        if name in seen:
            continue
        seen.add(name)
        for sub in md.distribution(name).requires or []:
            child = Requirement(sub)
            todo.append((child, frozenset(child.extras) | extras))
    return seen


def top_level(dist_name: str) -> set[str]:
    dist = md.distribution(dist_name)
    text = dist.read_text("top_level.txt")
    if text:
        return {t for t in text.split() if t}
    names = set()
    for f in dist.files or []:
        first = f.parts[0]
        if first.endswith((".dist-info", ".data")) or first in ("..", "__pycache__", "bin"):
            continue
        names.add(first.removesuffix(".py") if first.endswith(".py") else first.split(".")[0])
    return names


@pytest.fixture(scope="module")
def runtime_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    site = Path(md.distribution("pydantic").locate_file(""))
    out = tmp_path_factory.mktemp("runtime-only")
    for dist in closure(runtime_requirements()):
        for name in top_level(dist):
            for candidate in [site / name, *site.glob(f"{name}.*")]:
                if candidate.exists() and not (out / candidate.name).exists():
                    (out / candidate.name).symlink_to(candidate)
    # poolpilot as the images install it (package-dir), the control-plane rooms only.
    pkg = out / "poolpilot"
    pkg.mkdir()
    for entry in (ROOT / PACKAGE_DIR["poolpilot"]).iterdir():
        (pkg / entry.name).symlink_to(entry)
    for name in CONTROL_PLANE[1:]:
        (pkg / name.rpartition(".")[2]).symlink_to(ROOT / PACKAGE_DIR[name])
    return out


def _run(path: Path, code: str) -> subprocess.CompletedProcess[str]:
    """`code` in a Python without site-packages (-S), the runtime folder first on its path."""
    prelude = f"import sys\nsys.path.insert(0, {str(path)!r})\n"
    return subprocess.run([sys.executable, "-S", "-c", prelude + code], capture_output=True,
                          text=True, timeout=300, cwd=path)


def test_every_control_plane_module_imports_with_the_runtime_dependencies_only(
        runtime_path: Path) -> None:
    code = (
        "import pkgutil, importlib, traceback\n"
        f"roots = {CONTROL_PLANE!r}\n"
        "failed, n = [], 0\n"
        "for root in roots:\n"
        "    pkg = importlib.import_module(root)\n"
        "    names = [root] + [m.name for m in pkgutil.walk_packages(pkg.__path__, root + '.')]\n"
        "    for name in names:\n"
        "        if root == 'poolpilot' and any(name.startswith(r + '.') or name == r\n"
        "                                       for r in roots[1:]):\n"
        "            continue  # each room is walked as its own root\n"
        "        n += 1\n"
        "        try:\n"
        "            importlib.import_module(name)\n"
        "        except Exception as exc:\n"
        "            failed.append(f'{name}: {exc!r}')\n"
        "print(n)\n"
        "print('\\n'.join(failed))\n"
    )
    out = _run(runtime_path, code)
    assert out.returncode == 0, out.stderr
    count, *failed = out.stdout.strip().splitlines()
    assert int(count) > 40, out.stdout
    assert [f for f in failed if f] == [], "\n".join(failed)


def test_the_environment_really_lacks_the_tools(runtime_path: Path) -> None:
    """The check above can fail: the developer tools are not importable there."""
    out = _run(runtime_path, "import matplotlib")
    assert out.returncode != 0 and "No module named 'matplotlib'" in out.stderr
    out = _run(runtime_path, "import poolpilot.sandbox")
    assert out.returncode != 0


def _cli(path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return _run(path, f"from poolpilot import cli\nraise SystemExit(cli.main({list(argv)!r}))")


@pytest.mark.parametrize("argv", [["sandbox", "--help"], ["bench"], ["engine-sim"],
                                  ["dashboards", "--check"], ["emulator"]],
                         ids=lambda a: a[0])
def test_a_tool_in_an_image_says_what_to_install(runtime_path: Path, argv: list[str]) -> None:
    """The images hold the control plane only: a tool command there is one line that says
    how to get the tools, not a traceback."""
    out = _cli(runtime_path, *argv)
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.startswith(f"poolpilot {argv[0]}: poolpilot.")
    assert "is not installed" in out.stderr and "pip install -e '.[tools]'" in out.stderr


def test_the_control_planes_commands_work_there(runtime_path: Path) -> None:
    """Where the tools say what to install, the control plane's own commands run."""
    out = _cli(runtime_path, "crd")
    assert out.returncode == 0, out.stderr


def test_a_tool_without_its_dependencies_names_the_missing_one(runtime_path: Path,
                                                              tmp_path: Path) -> None:
    """The tool rooms present, the `tools` extra not installed (a plain `pip install -e .`)."""
    path = tmp_path / "site"
    path.mkdir()
    for entry in runtime_path.iterdir():
        if entry.name != "poolpilot":
            (path / entry.name).symlink_to(entry.resolve())
    shutil.copytree(runtime_path / "poolpilot", path / "poolpilot", symlinks=True)
    for package, folder in PACKAGE_DIR.items():
        if package not in CONTROL_PLANE:
            (path / "poolpilot" / package.rpartition(".")[2]).symlink_to(ROOT / folder)
    out = _cli(path, "sandbox", "--help")
    assert out.returncode == 2, out.stderr
    assert re.fullmatch(r"poolpilot sandbox: needs '\w+', which is not installed; install the "
                        r"developer tools: pip install -e '\.\[tools\]' .*\n", out.stderr), \
        out.stderr


def _third_party_imports() -> set[str]:
    found = set()
    for pkg, folder in PACKAGE_DIR.items():
        if pkg not in CONTROL_PLANE:
            continue
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    found |= {a.name.split(".")[0] for a in node.names}
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    found.add(node.module.split(".")[0])
    return found - set(sys.stdlib_module_names) - {"poolpilot"}


def test_every_runtime_dependency_is_imported_by_the_control_plane() -> None:
    imported = _third_party_imports()
    for req in runtime_requirements():
        name = canonicalize_name(req.name)
        module = IMPORT_NAMES.get(name, name.replace("-", "_"))
        assert module in imported, f"{req.name} is a runtime dependency nothing imports"

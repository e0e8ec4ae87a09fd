"""Pools that validate but whose rendered objects the API server (or kubectl) would misread or
refuse: a startup budget past int32, strings YAML readers take for numbers, and two pools of
one name in a file. Each goes through `poolpilot render` as a user runs it."""

from __future__ import annotations

import contextlib
import io
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from poolpilot import cli
from poolpilot.apitypes import INT32_MAX
from poolpilot.validate import load_text

HEAD = {"apiVersion": "poolpilot.dev/v1alpha1", "kind": "InferencePool"}


def _pool(name: str = "p", namespace: str | None = "ns", **spec: Any) -> dict[str, Any]:
    meta = {"name": name, **({"namespace": namespace} if namespace else {})}
    return {**HEAD, "metadata": meta,
            "spec": {"model": {"name": "x/y"}, "mode": "Aggregated", **spec}}


def run(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(list(args))
    return code, out.getvalue(), err.getvalue()


def _write(path: Path, *docs: dict[str, Any]) -> Path:
    # As JSON (YAML too): PyYAML's own dumper would write "1e3" plain, which reads as 1000.0.
    path.write_text("---\n".join(json.dumps(d) + "\n" for d in docs))
    return path


def _render(tmp_path: Path, *docs: dict[str, Any], output: str = "yaml") -> str:
    path = _write(tmp_path / "pool.yaml", *docs)
    code, out, err = run("render", "-o", output, str(path))
    assert code == 0, err
    return out


def _engine(objs: list[dict[str, Any]]) -> dict[str, Any]:
    dep = next(o for o in objs if o["kind"] == "Deployment"
               and o["metadata"]["name"].endswith("-engine"))
    container: dict[str, Any] = dep["spec"]["template"]["spec"]["containers"][0]
    return container


# --- the startup probe of a huge model --------------------------------------------------------


@pytest.mark.parametrize(("model", "runtime"), [
    ({"name": "x/y", "size": "2Ei"}, {}),
    ({"name": "x/y", "size": "7Ei"}, {}),
    # no size, none in the name: the model cache's size is the bound
    ({"name": "x/y"}, {"storage": {"modelCache": "7Ei"}}),
], ids=["size-2Ei", "size-7Ei", "cache-7Ei"])
def test_a_huge_model_gets_a_startup_probe_the_api_server_takes(
        tmp_path: Path, model: dict[str, Any], runtime: dict[str, Any]) -> None:
    objs = json.loads(_render(tmp_path, _pool(model=model, runtime=runtime),
                              output="json"))["items"]
    probe = _engine(objs)["startupProbe"]
    # int32 fields (the API server refuses the Deployment above); still the longest wait
    assert probe["failureThreshold"] <= INT32_MAX
    assert probe["periodSeconds"] * probe["failureThreshold"] >= INT32_MAX
    assert all(v <= INT32_MAX for v in probe.values() if isinstance(v, int))


# --- strings that must stay strings -----------------------------------------------------------

# Strings that some reader of a manifest (YAML 1.1, YAML 1.2, kubectl's go-yaml, poolpilot's
# own loader) takes for a number, a boolean, null or a date when they are written plain.
TRICKY = ["1e3", "1.5e3", "3e4", "-1e3", ".5e3", "1E+3", "089", "0o17", "0O17", "0X1F",
          "0B11", "1_000", "y", "N", "2024-1-2", "+1", "1:30", "on", "null", "~", ".inf",
          "0x_1F", "1.", "=", "-", "2024-01-02T03:04:05Z"]


class _Core12Loader(yaml.SafeLoader):
    """YAML 1.2's core schema, as another reader of the manifest reads it (1e3 and 0o17 are
    numbers there; yes and on are strings)."""


def _core_float(text: str) -> float:
    sign = -1 if text.startswith("-") else 1
    text = text.lower().lstrip("+-")
    return sign * float({".inf": "inf", ".nan": "nan"}.get(text, text))


def _core_int(text: str) -> int:
    base = {"0o": 8, "0x": 16}.get(text[:2], 10)
    return int(text[2:] if base != 10 else text, base)


def _core_null(text: str) -> None:
    return None


def _core_bool(text: str) -> bool:
    return text.lower() == "true"


_CORE: list[tuple[str, str, Callable[[str], Any]]] = [
    ("null", "null|Null|NULL|~", _core_null),
    ("bool", "true|True|TRUE|false|False|FALSE", _core_bool),
    ("int", r"[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+", _core_int),
    ("float", r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?"
              r"|[-+]?\.(inf|Inf|INF)|\.nan|\.NaN|\.NAN", _core_float),
]


def _constructor(make: Callable[[str], Any]) -> Callable[[yaml.SafeLoader, yaml.ScalarNode], Any]:
    def construct(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> Any:
        return make(str(loader.construct_scalar(node)))
    return construct


_Core12Loader.yaml_implicit_resolvers = {}
for _tag, _pattern, _make in _CORE:
    _Core12Loader.add_implicit_resolver(f"!core-{_tag}", re.compile(f"^(?:{_pattern})$"),
                                        list("nN~tTfF-+0123456789."))
    _Core12Loader.add_constructor(f"!core-{_tag}", _constructor(_make))


def test_rendered_yaml_reads_back_as_the_same_strings(tmp_path: Path) -> None:
    """The probe's case (Y-quoted-1e3), and every other tricky string as an env value, an
    annotation, a label and a command item: `render | kubectl apply` sends what was written."""
    pool = _pool(
        model={"name": "1e3", "servedName": "2e5"},
        runtime={"env": [{"name": f"V{i}", "value": v} for i, v in enumerate(TRICKY)],
                 "engineArgs": {"chatTemplate": "1e3"}},
        podTemplate={"metadata": {"labels": {"b": "3e4"},
                                  "annotations": {"a": "1e3", **{f"t{i}": v for i, v in
                                                                 enumerate(TRICKY)}}}})
    wanted = json.loads(_render(tmp_path, pool, output="json"))["items"]
    text = _render(tmp_path, pool)
    for loaded in (load_text(text), list(yaml.safe_load_all(text)),
                   list(yaml.load_all(text, Loader=_Core12Loader))):
        assert loaded == wanted
    engine = _engine(wanted)
    assert {"V0": "1e3", "V1": "1.5e3"}.items() <= {e["name"]: e.get("value")
                                                    for e in engine["env"]}.items()
    assert "'3e4'" in text and "'1e3'" in text  # quoted, not only read back


def test_numbers_and_booleans_stay_plain(tmp_path: Path) -> None:
    """Only strings are quoted: a replica count or a flag is still the number or boolean."""
    text = _render(tmp_path, _pool())
    assert re.search(r"^  replicas: \d+$", text, re.M)
    assert re.search(r"^ +readOnlyRootFilesystem: true$", text, re.M)
    assert re.search(r"^ +failureThreshold: \d+$", text, re.M)


# --- two pools of one name --------------------------------------------------------------------


def _refused(tmp_path: Path, *docs: dict[str, Any]) -> str:
    code, out, err = run("render", str(_write(tmp_path / "pools.yaml", *docs)))
    assert (code, out) == (1, ""), err
    return err


def test_render_refuses_two_documents_of_one_pool(tmp_path: Path) -> None:
    err = _refused(tmp_path, _pool(), _pool(name="q"), _pool())
    assert err.strip() == (
        f"{tmp_path / 'pools.yaml'}: document 3: metadata.name: InferencePool ns/p again "
        "(first in document 1); kubectl would apply one over the other: give each pool its "
        "own metadata.name or metadata.namespace, or keep one")


def test_render_refuses_two_items_of_one_pool_in_a_list(tmp_path: Path) -> None:
    items = {"apiVersion": "v1", "kind": "List", "items": [_pool(), _pool()]}
    err = _refused(tmp_path, items)
    assert "document 1 items[1]: metadata.name: InferencePool ns/p again (first in document 1 " \
        "items[0])" in err


def test_render_counts_a_pool_without_namespace_in_the_default_one(tmp_path: Path) -> None:
    assert "InferencePool default/p again" in _refused(tmp_path, _pool(namespace=None),
                                                       _pool(namespace="default"))
    code, out, err = run("render", "-o", "json", "-n", "other", str(tmp_path / "pools.yaml"))
    assert code == 0, err
    assert sorted(o["metadata"]["namespace"] for o in json.loads(out)["items"]
                  if o["kind"] == "Deployment" and o["metadata"]["name"] == "p-engine") \
        == ["default", "other"]

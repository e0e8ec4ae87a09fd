"""Hostile InferencePool manifests for the model/CRD agreement tests and the fuzz command.

Generated from the CRD's own OpenAPI schema, so every field (also ones added later) is
covered: each value is either well-typed (with the interesting edges: bounds, patterns, enum
values) or hostile (a wrong JSON type, null, a huge or non-finite number, an empty container).
Files are YAML texts of such documents, or of damaged ones: duplicate keys, alias bombs, deep
nesting, bytes that are not UTF-8, tags without a JSON form, truncation.

`check_document` and `check_file` are the properties: whatever the input, nothing raises, and
the models (`poolpilot validate`), the CRD as the API server applies it (crd_validation) and
the CLI (`poolpilot validate` and `poolpilot render`) agree on accept or refuse.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from hypothesis import strategies as st
from poolpilot.emulator import crd_validation

from poolpilot import api, cli, crd
from poolpilot.validate import InvalidFile, InvalidPool, load_documents, parse_pool

CRD = crd.build_crd()
SCHEMA = crd_validation.version_schema(CRD)
# CI runs 2,000 documents and 200 files; the fuzz command in docs/api.md sets 10,000 of each.
EXAMPLES = int(os.environ.get("POOLPILOT_FUZZ_EXAMPLES", "2000"))
FILE_EXAMPLES = int(os.environ.get("POOLPILOT_FUZZ_FILES", "200"))

HOSTILE: list[Any] = [
    None, "3", "true", True, False, 15.0, 0.5, -1, 0, 2**31, 2**63, 2**64, 3_000_000_000,
    -(2**63) - 1, 1e300, float("inf"), float("-inf"), float("nan"), [], {}, "", "x", [None],
    {"a": None},
]
POOL_NAMES = [
    "p", "llama-8b", "a" * 40, "a" * 41, "a" * 60, "team.chat", "Llama", "1abc", "-x", "x-", "",
    "llama_8b", "a\n", "é", 5, None, True,
]
ENGINE_ARG_KEYS = [
    "maxModelLen", "enforceEager", "gpuMemoryUtilization", "speculativeConfig", "max-num-seqs",
    *(s for k in api.RESERVED_ENGINE_ARGS for s in api.spellings(k)),
    "TENSOR_PARALLEL_SIZE", "",
]
CONNECTOR_KEYS = [
    "kv_buffer_device", "shared_storage_path",
    *(s for k in api.RESERVED_CONNECTOR_KEYS for s in api.spellings(k)),
    *api.spellings(api.CONNECTOR_EXTRA_CONFIG_KEY),
]
MAP_KEYS = ["cpu", "memory", "nvidia.com/gpu", "example.com/x", "gpu-type", "a b", ""]
QUANTITIES = ["1", "500m", "1.5", "32Gi", "1e3", "+2", ".5", "lots", "-1", "1.5.5", "Gi", "", " 1"]
STRINGS = ["m", "NoSchedule", "Exists", "Equal", "NoExecute", "key", "example.com/key",
           "value", "MY_VAR", "1 BAD=NAME", "a b", "", " x", "x ", "vllm:1", "Ready"]

# A JSON value for free-form maps: scalars, hostile numbers, small nested objects.
_scalars = st.one_of(
    st.integers(-10, 10**6), st.sampled_from([2**63, 2**70, -(2**64)]), st.booleans(),
    st.none(), st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=6),
)
JSON_VALUES = st.recursive(
    _scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.text(max_size=4), inner, max_size=3)),
    max_leaves=6,
)
PLAUSIBLE_JSON = st.one_of(st.integers(1, 8192), st.booleans(), st.sampled_from(["auto", "cpu"]))

# Each strategy below is built once and drawn from many times: Hypothesis validates and
# analyses a strategy object on its first draw, and building them afresh per value took three
# quarters of the fuzz's time (a regex strategy costs milliseconds). The draws are the same.
_HOSTILE = st.sampled_from(HOSTILE)
_PCT = st.integers(0, 99)
_PLAUSIBLE_INTEGER = st.sampled_from([1, 1, 1, 2, 4])
_PLAUSIBLE_NUMBER = st.sampled_from([0.5, 0.9, 0.05, 1, 2])
_PLAUSIBLE_QUANTITY = st.one_of(st.sampled_from(QUANTITIES[:7]), st.integers(0, 64))
_QUANTITY = st.one_of(st.sampled_from(QUANTITIES), st.integers(-2, 10**6))
_PLAUSIBLE_NAME = st.sampled_from(POOL_NAMES[:4])
_NAME = st.sampled_from(POOL_NAMES)
_PLAUSIBLE_STRING = st.sampled_from(["m", "x", "vllm:1"])
_STRING_CHOICES = (st.sampled_from(STRINGS), st.text(max_size=8))
_ANY_STRING = st.one_of(*_STRING_CHOICES)
_ITEMS = st.integers(0, 2)
_STRAY_KEY = st.sampled_from(["replica", "modee", "x"])
_STRAY_VALUE = st.sampled_from([1, None])


def _typed(values: list[Any]) -> tuple[tuple[type, Any], ...]:
    """A cache key for values that tells 1, 1.0 and True apart (they hash alike)."""
    return tuple((type(v), v) for v in values)


@functools.cache
def _sampled(key: tuple[tuple[type, Any], ...]) -> st.SearchStrategy[Any]:
    return st.sampled_from([v for _, v in key])


@functools.cache
def _integers_or(edges: tuple[tuple[type, Any], ...]) -> st.SearchStrategy[Any]:
    return st.one_of(st.integers(0, 20), _sampled(edges))


@functools.cache
def _numbers_or(edges: tuple[tuple[type, Any], ...]) -> st.SearchStrategy[Any]:
    return st.one_of(st.floats(-1, 100, allow_nan=False), st.integers(0, 9), _sampled(edges))


@functools.cache
def _regex(pattern: str, max_length: int) -> st.SearchStrategy[str]:
    return st.from_regex(pattern, fullmatch=True).filter(lambda s: len(s) <= max_length + 1)


@functools.cache
def _string_or_regex(pattern: str, max_length: int) -> st.SearchStrategy[Any]:
    return st.one_of(*_STRING_CHOICES, _regex(pattern, max_length))


@functools.cache
def _map_entries(keys: tuple[str, ...]) -> st.SearchStrategy[list[str]]:
    return st.lists(st.sampled_from(keys), max_size=3, unique=True)


@dataclass(frozen=True)
class Mood:
    """How a document is generated: `hostility` percent of values hostile; `plausible`
    documents use valid-looking values only (a bound, a rule or a pattern can still fail)."""

    hostility: int
    plausible: bool


def _pct(draw: Any, pct: int) -> bool:
    return pct > 0 and draw(_PCT) < pct


def _integer(draw: Any, schema: dict[str, Any], mood: Mood) -> int:
    if mood.plausible:
        return int(draw(_PLAUSIBLE_INTEGER))
    edges = [0, 1, 2, -1]
    for key in ("minimum", "maximum"):
        if key in schema:
            edges += [schema[key] - 1, schema[key], schema[key] + 1]
    return int(draw(_integers_or(_typed(edges))))


def _number(draw: Any, schema: dict[str, Any], mood: Mood) -> float | int:
    if mood.plausible:
        value: float | int = draw(_PLAUSIBLE_NUMBER)
        return value
    edges: list[float | int] = [0, 1, 0.5, 0.05, 0.9, 2, 64]
    for key in ("minimum", "maximum"):
        if key in schema:
            edges += [schema[key], schema[key] + 0.25, schema[key] - 0.25]
    value = draw(_numbers_or(_typed(edges)))
    return value


def _string(draw: Any, schema: dict[str, Any], path: tuple[str, ...], mood: Mood) -> Any:
    if "enum" in schema:
        return draw(_sampled(_typed([*schema["enum"], *([] if mood.plausible else ["Other"])])))
    if path[-2:] == ("metadata", "name"):
        return draw(_PLAUSIBLE_NAME if mood.plausible else _NAME)
    if "pattern" in schema and schema.get("maxLength", 64) <= 320:
        pattern, max_length = schema["pattern"], schema.get("maxLength", 64)
        if mood.plausible:
            return draw(_regex(pattern, max_length))
        return draw(_string_or_regex(pattern, max_length))
    return draw(_PLAUSIBLE_STRING if mood.plausible else _ANY_STRING)


def _map_keys(path: tuple[str, ...], mood: Mood) -> list[str]:
    if path and path[-1] == "engineArgs":
        return ENGINE_ARG_KEYS[:5] if mood.plausible else ENGINE_ARG_KEYS
    if path and path[-1] == "extraConfig":
        return CONNECTOR_KEYS[:2] if mood.plausible else CONNECTOR_KEYS
    return MAP_KEYS[:2] if mood.plausible else MAP_KEYS


def value_for(draw: Any, schema: dict[str, Any] | None, mood: Mood,
              path: tuple[str, ...] = ()) -> Any:
    """A value for `schema`: hostile with `mood.hostility` percent chance, else well-typed."""
    if schema is None or _pct(draw, mood.hostility):
        return draw(_HOSTILE)
    if schema.get("x-kubernetes-int-or-string"):
        return draw(_PLAUSIBLE_QUANTITY if mood.plausible else _QUANTITY)
    kind = schema.get("type")
    props = schema.get("properties")
    if kind == "object" and props and not schema.get("x-kubernetes-preserve-unknown-fields"):
        out: dict[str, Any] = {}
        required = set(schema.get("required", []))
        for name, sub in props.items():
            if name in required or draw(_PCT) < (20 if mood.plausible else 35):
                out[name] = value_for(draw, sub, mood, (*path, name))
        if _pct(draw, mood.hostility // 3):
            out[draw(_STRAY_KEY)] = draw(_STRAY_VALUE)
        return out
    if kind == "object":  # a map: typed values, or any JSON (engine args, connector config)
        sub = schema.get("additionalProperties")
        entries = draw(_map_entries(tuple(_map_keys(path, mood))))
        json_values = PLAUSIBLE_JSON if mood.plausible else JSON_VALUES
        return {k: (value_for(draw, sub, mood, (*path, k)) if isinstance(sub, dict)
                    else draw(json_values)) for k in entries}
    if kind == "array":
        return [value_for(draw, schema.get("items"), mood, (*path, "[]"))
                for _ in range(draw(_ITEMS))]
    if kind == "integer":
        return _integer(draw, schema, mood)
    if kind == "number":
        return _number(draw, schema, mood)
    if kind == "boolean":
        return draw(st.booleans())
    if kind == "string":
        return _string(draw, schema, path, mood)
    return draw(JSON_VALUES)


_MOODS = st.sampled_from([Mood(0, True), Mood(0, True), Mood(0, False), Mood(3, False),
                          Mood(15, False)])


@st.composite
def documents(draw: Any) -> dict[str, Any]:
    """An InferencePool manifest: plausible, or with hostile fields at a drawn rate."""
    mood = draw(_MOODS)
    spec = value_for(draw, SCHEMA["properties"]["spec"], mood, ("spec",))
    if isinstance(spec, dict) and draw(_PCT) < 85:
        spec.setdefault("model", {"name": "m"})  # keep most documents worth validating
    name = value_for(draw, {"type": "string"}, mood, ("metadata", "name"))
    doc: dict[str, Any] = {"apiVersion": api.API_VERSION, "kind": api.KIND,
                           "metadata": {"name": name, "namespace": "ns"}, "spec": spec}
    if _pct(draw, 10):
        doc["status"] = value_for(draw, SCHEMA["properties"]["status"], mood, ("status",))
    return doc


# --- the document property -------------------------------------------------------------------


@dataclass
class Tally:
    """What the fuzz saw, for its summary line."""

    counts: Counter[str]

    def line(self, what: str) -> str:
        c = self.counts
        return (f"{what}: {c['examples']} examples, {c['accepted']} accepted by both, "
                f"{c['refused']} refused by both, {c['unreadable']} unreadable files refused, "
                f"{c['disagreements']} disagreements, {c['crashes']} crashes")




def _normalized(value: Any) -> Any:
    """Compare what the models and the API server store: empty and null mean unset."""
    if isinstance(value, dict):
        pruned = {k: _normalized(v) for k, v in value.items() if v is not None}
        return {k: v for k, v in pruned.items() if v not in ({}, [])}
    if isinstance(value, list):
        return [_normalized(v) for v in value]
    return value


def verdicts(doc: dict[str, Any]) -> tuple[list[str], list[str], Any, Any]:
    """(model errors, CRD errors, model's spec as stored, CRD's spec after defaulting)."""
    try:
        parsed = parse_pool(doc)
        model_errors: list[str] = []
        wire = parsed.spec.to_wire()
    except InvalidPool as exc:
        model_errors, wire = exc.errors, None
    defaulted, crd_errors = crd_validation.validate(CRD, doc)
    return model_errors, crd_errors, wire, defaulted.get("spec")


def check_document(doc: dict[str, Any], tally: Tally) -> None:
    """The models and the CRD accept exactly the same documents, and default them the same."""
    tally.counts["examples"] += 1
    try:
        model_errors, crd_errors, wire, defaulted = verdicts(doc)
    except Exception:
        tally.counts["crashes"] += 1
        raise
    if bool(model_errors) != bool(crd_errors):
        tally.counts["disagreements"] += 1
        raise AssertionError(f"models: {model_errors or 'accept'}\nCRD: {crd_errors or 'accept'}"
                             f"\ndocument: {doc!r}")
    if model_errors:
        tally.counts["refused"] += 1
        return
    tally.counts["accepted"] += 1
    assert _normalized(defaulted) == _normalized(wire), "defaults differ"


# --- files -----------------------------------------------------------------------------------

BOMB = ('a: &a ["x","x","x","x","x","x","x","x","x"]\n'
        + "".join(f"{c}: &{c} [*{p},*{p},*{p},*{p},*{p},*{p},*{p},*{p},*{p}]\n"
                  for p, c in zip("abcdefgh", "bcdefghi", strict=True)))


def _damage(draw: Any, text: str) -> bytes:
    """One way to break a manifest, or none."""
    kind = draw(st.sampled_from([
        "none", "none", "duplicate", "bomb", "deep-block", "deep-flow", "bytes", "truncate",
        "tag", "alias", "merge", "bom", "documents", "recursive", "tabs",
    ]))
    data = text.encode()
    if kind == "duplicate":
        return data + b"kind: InferencePool\n"
    if kind == "bomb":
        return (BOMB + "spec: {model: {name: m}, runtime: {engineArgs: {x: *i}}}\n").encode()
    if kind == "deep-block":
        depth = draw(st.sampled_from([60, 70, 300, 1200]))  # 1200: 1.4 MB; Hypothesis keeps some
        return data + b"extra:\n" + b"".join(b"  " * (i + 1) + b"a:\n" for i in range(depth))
    if kind == "deep-flow":
        depth = draw(st.sampled_from([60, 70, 300, 20000]))
        return data + b"extra: " + b"[" * depth + b"]" * depth + b"\n"
    if kind == "bytes":
        at = draw(st.integers(0, len(data)))
        junk = draw(st.sampled_from([b"\xff", b"\xc3", b"\x00", b"\x1b[0m", b"\xe9t\xe9"]))
        return data[:at] + junk + data[at:]
    if kind == "truncate":
        return data[: draw(st.integers(0, len(data)))]
    if kind == "tag":
        tag = draw(st.sampled_from(["!!binary aGk=", "!!set {a, b}", "!!python/object:os.system",
                                    "2024-01-01", "!!timestamp 2024-01-01", "!!omap [{a: 1}]",
                                    "!custom x", "1e3", ".inf", ".nan", "0x1F", "0o17", "1_000"]))
        return data + f"status: {{observedGeneration: {tag}}}\n".encode()
    if kind == "alias":
        first = text.replace("spec:", "spec: &s", 1)
        second = text.replace("spec:", "spec: &t", 1)
        return (first + "---\n" + second).encode() + b"status: {x: *t}\n"
    if kind == "merge":
        return data + b"base: &b {replicas: 1}\nother: {<<: *b, replicas: 2}\n"
    if kind == "bom":
        return b"\xef\xbb\xbf" + data
    if kind == "documents":
        extra = draw(st.sampled_from([b"--- [1, 2]\n", b"--- 3\n", b"---\n---\n", b"--- null\n"]))
        return data + extra
    if kind == "recursive":
        return data + b"loop: &l [*l]\n"
    if kind == "tabs":
        return data.replace(b"  ", b"\t", 1)
    return data


@st.composite
def files(draw: Any) -> bytes:
    """A manifest file: one or two generated documents as YAML, perhaps damaged."""
    docs = [draw(documents()) for _ in range(draw(st.integers(1, 2)))]
    try:
        text = yaml.safe_dump_all(docs, sort_keys=False, allow_unicode=True)
    except (yaml.YAMLError, ValueError):
        text = "kind: InferencePool\n"
    return _damage(draw, text)


def _cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(list(args))
    return code, out.getvalue(), err.getvalue()


def check_file(path: Path, data: bytes, tally: Tally) -> None:
    """`validate` and `render` never crash: exit 0 exactly when every InferencePool in the file
    is valid for the models and the CRD and names a pool of its own, else exit 1 with
    `FILE: what is wrong` lines."""
    path.write_bytes(data)
    tally.counts["examples"] += 1
    try:
        try:
            docs = load_documents(path)
        except InvalidFile:
            docs = None
        pools = [d for d in docs or [] if d.get("kind") == api.KIND]
        valid = bool(pools)
        for doc in pools:
            model_errors, crd_errors, _, _ = verdicts(doc)
            if bool(model_errors) != bool(crd_errors):
                tally.counts["disagreements"] += 1
                raise AssertionError(f"models: {model_errors}\nCRD: {crd_errors}\n{doc!r}")
            valid = valid and not model_errors
        if valid:  # and one pool a namespace and name (kubectl would apply one over the other)
            keys = [(d["metadata"].get("namespace"), d["metadata"]["name"]) for d in pools]
            valid = len(set(keys)) == len(keys)
        for command in ("validate", "render"):
            code, out, err = _cli(command, str(path))
            assert code == (0 if valid else 1), (command, code, err)
            if not valid:
                lines = err.splitlines()
                assert lines and all(line.startswith(f"{path}: ") for line in lines), err
            else:
                assert out and len(out) < 20_000_000, f"{command} printed {len(out)} bytes"
    except AssertionError:
        raise
    except Exception:
        tally.counts["crashes"] += 1
        raise
    if docs is None:
        tally.counts["unreadable"] += 1
    else:
        tally.counts["accepted" if valid else "refused"] += 1


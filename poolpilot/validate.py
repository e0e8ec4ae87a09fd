"""Parse InferencePool manifests and turn pydantic errors into 'field: problem; fix' lines.

Files are read by a YAML loader that refuses what would crash or mislead later: bytes that are
not UTF-8, duplicate keys (YAML would keep the last silently), nesting deeper than MAX_DEPTH,
anchors and aliases that expand past MAX_NODES (an alias bomb is a few hundred bytes), keys that
are not strings, and tags that have no JSON form. Timestamps stay strings, as kubectl sends them.
"""

from __future__ import annotations

import difflib
import math
import os
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from poolpilot import api, fileerrors

MAX_FILE_BYTES = 4 * 1024 * 1024  # the API server takes 3 MiB per request
MAX_DEPTH = 64  # a pool is about 8 levels deep; engine args add a few
MAX_NODES = 50_000  # values after expanding aliases; a pool has about a hundred


class InvalidPool(ValueError):
    """A manifest the models reject; `errors` holds one 'path: message' line per problem."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("; ".join(errors))
        self.errors = errors


class InvalidFile(ValueError):
    """A file that is not a readable YAML stream of mappings; the message says where and why."""


# ---------------------------------------------------------------------------------------------
# Reading files


class _Loader(yaml.SafeLoader):
    """SafeLoader with bounded nesting, checked mappings and JSON-only values."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _problem(self.peek_event().start_mark,
                               f"nested deeper than {MAX_DEPTH} levels")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def compose_document(self) -> Any:
        node = super().compose_document()
        if node is not None:
            _measure(node, 1, {}, set())
        return node

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        if isinstance(node, yaml.MappingNode):
            seen: dict[str, Any] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                if not isinstance(key, str):
                    raise _problem(key_node.start_mark,
                                   f"key {key!r} is not a string; quote it")
                if key in seen:
                    raise _problem(key_node.start_mark,
                                   f"duplicate key {key!r} (first at line "
                                   f"{seen[key].line + 1}); keep one")
                seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


def _refuse_tag(loader: _Loader, node: Any) -> Any:
    raise _problem(node.start_mark, f"{node.tag} values have no JSON form; use a plain value")


def _timestamp_as_text(loader: _Loader, node: Any) -> str:
    return str(loader.construct_scalar(node))


def _bounded_int(loader: _Loader, node: Any) -> int | str:
    if ":" in str(node.value):
        return _sexagesimal_as_text(loader, node)
    # Python refuses to read integers of more than 4,300 digits (a ValueError, not a YAML
    # error); no Kubernetes field holds more than 64 bits anyway.
    text = str(loader.construct_scalar(node)).replace("_", "").lstrip("+-")
    if len(text) > 30:
        raise _problem(node.start_mark, f"an integer of {len(text)} digits; Kubernetes "
                       "integers are at most 64-bit (19 digits)")
    value: int = loader.construct_yaml_int(node)
    return value


def _sexagesimal_as_text(loader: _Loader, node: Any) -> str:
    # YAML 1.1 reads 1:30 as 90 (base 60); kubectl's reader (sigs.k8s.io/yaml) has no such
    # numbers and sends the text, which a number field then refuses: read it as kubectl does.
    return str(loader.construct_scalar(node))


def _float_unless_sexagesimal(loader: _Loader, node: Any) -> float | str:
    if ":" in str(node.value):
        return _sexagesimal_as_text(loader, node)
    value: float = loader.construct_yaml_float(node)
    return value


_Loader.add_constructor("tag:yaml.org,2002:int", _bounded_int)
_Loader.add_constructor("tag:yaml.org,2002:float", _float_unless_sexagesimal)
_Loader.add_constructor("tag:yaml.org,2002:timestamp", _timestamp_as_text)
for _tag in ("binary", "set", "omap", "pairs"):
    _Loader.add_constructor(f"tag:yaml.org,2002:{_tag}", _refuse_tag)
# YAML 1.2 (and kubectl) read 1e3 as a number; PyYAML's YAML 1.1 rule wants a dot.
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def _problem(mark: Any, what: str) -> yaml.MarkedYAMLError:
    return yaml.MarkedYAMLError(problem=what, problem_mark=mark)


def _measure(node: Any, depth: int, memo: dict[int, tuple[int, int]], active: set[int]) -> int:
    """Size of `node` once aliases are expanded; raises past MAX_NODES or MAX_DEPTH levels.
    Memoized per node, so a bomb of nested aliases is measured in linear time."""
    key = id(node)
    if key in active:
        raise _problem(node.start_mark, "an alias refers to a node that contains it")
    if key in memo:
        size, height = memo[key]
    else:
        active.add(key)
        children: list[Any] = []
        if isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        size, height = 1, 0
        for child in children:
            size += _measure(child, depth + 1, memo, active)
            height = max(height, memo[id(child)][1] + 1)
            if size > MAX_NODES:
                break
        active.discard(key)
        memo[key] = (size, height)
    if size > MAX_NODES:
        raise _problem(node.start_mark,
                       f"expands to more than {MAX_NODES} values (anchors and aliases "
                       "repeat what they name); write it out or make it smaller")
    if depth + height > MAX_DEPTH:
        raise _problem(node.start_mark,
                       f"nested deeper than {MAX_DEPTH} levels once aliases are expanded")
    return size


def _one_line(exc: yaml.YAMLError) -> str:
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}"
        context = f" ({exc.context})" if exc.context else ""
        return f"{where}: {exc.problem}{context}"
    return str(exc).replace("\n", " ")


def read_text(path: Path) -> str:
    """The file as text, refusing files too large for the API server or not UTF-8 (OSError
    when it cannot be read at all)."""
    # One byte past the limit at most: a device or a pipe (/dev/zero, <(yes)) has no size to
    # check first, and would otherwise be read until memory runs out.
    with path.open("rb") as file:
        data = file.read(MAX_FILE_BYTES + 1)
        size = os.fstat(file.fileno()).st_size
    if len(data) > MAX_FILE_BYTES:
        what = f"{size} bytes" if size > MAX_FILE_BYTES else f"more than {MAX_FILE_BYTES} bytes"
        raise InvalidFile(f"{what}; poolpilot reads at most {MAX_FILE_BYTES // 2**20} MiB "
                          "(the API server takes 3 MiB per object)")
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise InvalidFile(
            f"not UTF-8 text: byte 0x{data[exc.start]:02x} at line {line} (offset "
            f"{exc.start}); save the file as UTF-8"
        ) from None


def load_text(text: str) -> list[dict[str, Any]]:
    """Every non-empty YAML document in `text`; raises InvalidFile naming where and why."""
    return [doc for _, doc in numbered_documents(text)]


def numbered_documents(text: str) -> list[tuple[int, dict[str, Any]]]:
    """load_text, each document with its number in the stream (from 1, empty ones counted)."""
    docs: list[Any] = []
    try:
        loader = _Loader(text)  # refuses control characters already
        try:
            while loader.check_data():
                docs.append(loader.get_data())
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        raise InvalidFile(_one_line(exc)) from None
    except RecursionError:  # defensive: MAX_DEPTH keeps the composer far from this
        raise InvalidFile(f"nested deeper than {MAX_DEPTH} levels") from None
    out: list[tuple[int, dict[str, Any]]] = []
    for i, doc in enumerate(docs, start=1):
        if doc is None:
            continue
        if not isinstance(doc, dict):
            raise InvalidFile(f"document {i}: expected a mapping (an object with apiVersion "
                              f"and kind), got {_kind(doc)}")
        out.append((i, doc))
    return out


def load_documents(path: Path) -> list[dict[str, Any]]:
    """Every non-empty YAML document in the file; raises InvalidFile naming what is wrong, or
    OSError when the file cannot be read."""
    return load_text(read_text(path))


# ---------------------------------------------------------------------------------------------
# Parsing pools


def _loc(parts: tuple[Any, ...]) -> str:
    text = ""
    for p in parts:
        text += f"[{p}]" if isinstance(p, int) else (f".{p}" if text else str(p))
    return text


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model class that owns the field at `loc` (for listing known fields)."""
    model: Any = api.InferencePool
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        fields = {f.alias or n: f for n, f in model.model_fields.items()}
        if part not in fields:
            return None
        annotation = fields[part].annotation
        candidates = [annotation, *getattr(annotation, "__args__", ())]
        model = next(
            (c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None
        )
        if model is None:
            return None
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"a boolean ({'true' if value else 'false'})"
    if isinstance(value, int):
        return f"an integer ({value})"
    if isinstance(value, float):
        return f"a number ({value})"
    if isinstance(value, str):
        return f"a string ({value!r})"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


def _type_hint(err: Any) -> str:
    """Why a value of the wrong JSON type is refused, and the fix (no silent coercion)."""
    value = err.get("input")
    hint = ""
    if isinstance(value, str):
        if err["type"] in ("int_type", "float_type") and re.fullmatch(r"\s*[-+]?[0-9.eE]+\s*",
                                                                      value):
            hint = "; write the number without quotes"
        elif err["type"] == "bool_type" and value.lower() in ("true", "false"):
            hint = "; write true or false without quotes"
    elif isinstance(value, float) and err["type"] == "int_type" and math.isfinite(value) and (
        value.is_integer()
    ):
        hint = f"; write {int(value)}, without a decimal point"
    return f"got {_kind(value)}{hint}"


_TYPE_ERRORS = {
    "int_type": "must be an integer",
    "float_type": "must be a number",
    "bool_type": "must be true or false",
    "string_type": "must be a string",
    "dict_type": "must be a mapping",
    "list_type": "must be a list",
    "model_type": "must be a mapping",
    "model_attributes_type": "must be a mapping",
}


def _describe(err: Any) -> list[str]:
    """One 'path: problem; fix' line per problem in a pydantic error."""
    loc = tuple(err["loc"])
    kind = err["type"]
    if kind == "rule":
        return [f"{_loc((*loc, *f.field.split('.')))}: {f.message}"
                for f in err["ctx"]["failures"]]
    if kind == "reserved":  # one line per key, at the key's own path (as the API server)
        return [f"{_loc((*loc, key))}: {why}" for key, why in err["ctx"]["keys"].items()]
    if kind == "extra_forbidden":
        model = _model_at(loc)
        known = sorted(f.alias or n for n, f in model.model_fields.items()) if model else []
        close = difflib.get_close_matches(str(loc[-1]), known, n=1)
        hint = f"did you mean {close[0]}?" if close else f"known fields: {', '.join(known)}"
        return [f"{_loc(loc)}: unknown field; {hint}"]
    if kind == "missing":
        return [f"{_loc(loc)}: required; add it"]
    if kind in _TYPE_ERRORS:
        return [f"{_loc(loc)}: {_TYPE_ERRORS[kind]}, {_type_hint(err)}"]
    if kind == "finite_number":
        return [f"{_loc(loc)}: must be a finite number, got {err['input']}"]
    if kind in ("less_than_equal", "greater_than_equal", "less_than", "greater_than"):
        bound = err["msg"].replace("Input should be", "must be")
        return [f"{_loc(loc)}: {bound}, got {err['input']}"]
    return [f"{_loc(loc)}: {err['msg']}"]


def _paths_by_id(doc: Any) -> dict[int, list[tuple[Any, ...]]]:
    """Where each mapping of the input sits (a YAML alias can put one mapping in two places)."""
    paths: dict[int, list[tuple[Any, ...]]] = {}
    stack: list[tuple[Any, tuple[Any, ...]]] = [(doc, ())]
    while stack:
        value, path = stack.pop()
        if isinstance(value, dict):
            paths.setdefault(id(value), []).append(path)
            stack += [(v, (*path, k)) for k, v in value.items()]
        elif isinstance(value, list):
            stack += [(v, (*path, i)) for i, v in enumerate(value)]
    return paths


def _parse(model: type[api.ApiModel], data: Any, prefix: tuple[str, ...]) -> Any:
    """Validate, then report every problem: field errors and every failed rule of every model
    that parsed, each at its full path."""
    with api.collecting_rule_failures() as failed:
        try:
            # by the wire's names only: the API server knows no snake_case spelling
            parsed = model.model_validate(data, by_alias=True, by_name=False)
            errors = []
        except ValidationError as exc:
            parsed = None
            errors = [line for e in exc.errors()
                      for line in _describe({**e, "loc": (*prefix, *e["loc"])})]
    if failed:
        where = _paths_by_id(data)
        for source, failures in failed:
            for base in where.get(source, [()]):
                errors += [f"{_loc((*prefix, *base, *f.field.split('.')))}: {f.message}"
                           for f in failures]
    if errors:
        raise InvalidPool(list(dict.fromkeys(errors)))
    return parsed


def parse_pool(doc: dict[str, Any]) -> api.InferencePool:
    """Parse one manifest or raise InvalidPool naming every bad field."""
    if not isinstance(doc, dict):
        raise InvalidPool([f"<document>: expected a mapping, got {_kind(doc)}"])
    pool: api.InferencePool = _parse(api.InferencePool, doc, ())
    return pool


def parse_spec(spec: dict[str, Any]) -> api.InferencePoolSpec:
    """Parse a spec as the operator receives it; errors are prefixed with `spec.`."""
    parsed: api.InferencePoolSpec = _parse(api.InferencePoolSpec, spec, ("spec",))
    return parsed


def pool_documents(docs: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    """The InferencePool documents among `docs`, each with where it is ("" for a document of
    its own, "items[i]: " for an item of a `kind: List`, which kubectl applies item by item)."""
    out: list[tuple[str, Any]] = []
    for doc in docs:
        if doc.get("kind") == api.KIND:
            out.append(("", doc))
        elif str(doc.get("kind", "")).endswith("List") and isinstance(doc.get("items"), list):
            out += [(f"items[{i}]: ", item) for i, item in enumerate(doc["items"])
                    if isinstance(item, dict) and item.get("kind") == api.KIND]
    return out


def located_pools(path: Path) -> list[tuple[str, str, Any]]:
    """pool_documents of the file, each also with a name that tells it from the others:
    'document 2', or 'document 1 items[0]' for an item of a List."""
    return [(f"document {number}" + (f" {where.removesuffix(': ')}" if where else ""),
             where, doc)
            for number, found in numbered_documents(read_text(path))
            for where, doc in pool_documents([found])]


def duplicate_pools(pools: list[tuple[str, str | None, str]]) -> list[str]:
    """A 'document: problem; fix' line for each (document, namespace, name) whose namespace
    and name an earlier one has: kubectl would apply it over that one, render print both."""
    first: dict[tuple[str | None, str], str] = {}
    errors: list[str] = []
    for where, namespace, name in pools:
        if (namespace, name) not in first:
            first[(namespace, name)] = where
            continue
        pool = f"{namespace}/{name}" if namespace else f"{name} (no namespace)"
        errors.append(f"{where}: metadata.name: {api.KIND} {pool} again (first in "
                      f"{first[(namespace, name)]}); kubectl would apply one over the other: "
                      "give each pool its own metadata.name or metadata.namespace, or keep one")
    return errors


def validate_file(path: Path) -> list[str]:
    """Every error in the file's InferencePool documents, as 'FILE: path: message' lines."""
    try:
        pools = located_pools(path)
    except OSError as exc:
        return [f"{path}: {fileerrors.describe(exc)}"]
    except InvalidFile as exc:
        return [f"{path}: {exc}"]
    if not pools:
        return [f"{path}: no {api.KIND} document found (nor a List holding one)"]
    errors: list[str] = []
    parsed: list[tuple[str, str | None, str]] = []
    for label, where, doc in pools:
        try:
            meta = parse_pool(doc).metadata
        except InvalidPool as exc:
            errors += [f"{path}: {where}{e}" for e in exc.errors]
        else:
            parsed.append((label, meta.namespace, meta.name))
    return errors + [f"{path}: {e}" for e in duplicate_pools(parsed)]

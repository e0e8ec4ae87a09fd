"""PATCH semantics: JSON merge patch (RFC 7386), JSON patch (RFC 6902) and strategic merge
patch (lists of known fields merged by key, `$patch`/`$retainKeys`/`$setElementOrder`/
`$deleteFromPrimitiveList` directives), plus the list types both SMP and SSA need."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from poolpilot.emulator.errors import ApiError

Path = tuple[str, ...]
# A list's type: ("map", keys) associative, ("set", ()) primitive set, ("atomic", ()) replaced.
ListType = tuple[str, tuple[str, ...]]
ListTypes = Callable[[Path, list[Any]], ListType]

ATOMIC: ListType = ("atomic", ())

# Built-in kinds: list fields keyed like their Go types' patchMergeKey / listMapKeys.
_BUILTIN_KEYS: dict[str, tuple[str, ...]] = {
    "containers": ("name",),
    "initContainers": ("name",),
    "ephemeralContainers": ("name",),
    "volumes": ("name",),
    "env": ("name",),
    "imagePullSecrets": ("name",),
    "volumeMounts": ("mountPath",),
    "volumeDevices": ("devicePath",),
    "conditions": ("type",),
    "ownerReferences": ("uid",),
    "hostAliases": ("ip",),
    "topologySpreadConstraints": ("topologyKey", "whenUnsatisfiable"),
}
_BUILTIN_SETS = {"finalizers"}


def builtin_list_type(path: Path, items: list[Any]) -> ListType:
    """List type of a built-in kind's field, from the field name (and, for `ports`, the items:
    containers key them by containerPort, Services by port)."""
    name = path[-1] if path else ""
    if name == "ports":
        sample = next((i for i in items if isinstance(i, dict)), {})
        return ("map", ("containerPort",) if "containerPort" in sample else ("port",))
    if name in _BUILTIN_KEYS:
        return ("map", _BUILTIN_KEYS[name])
    if name in _BUILTIN_SETS:
        return ("set", ())
    return ATOMIC


def schema_list_types(schema: dict[str, Any]) -> ListTypes:
    """List types from a CRD's OpenAPI schema (x-kubernetes-list-type / -list-map-keys);
    metadata lists keep their built-in types."""

    def lookup(path: Path, items: list[Any]) -> ListType:
        if path and path[0] == "metadata":
            return builtin_list_type(path, items)
        node: dict[str, Any] | None = schema
        for part in path:
            if node is None:
                return ATOMIC
            if node.get("type") == "array":
                node = node.get("items")
            if node is None:
                return ATOMIC
            props = node.get("properties")
            if props is not None:
                node = props.get(part)
            elif isinstance(node.get("additionalProperties"), dict):
                node = node["additionalProperties"]
            else:
                return ATOMIC
        if node is None:
            return ATOMIC
        kind = node.get("x-kubernetes-list-type", "atomic")
        if kind == "map":
            return ("map", tuple(node.get("x-kubernetes-list-map-keys", ())))
        return ("set", ()) if kind == "set" else ATOMIC

    return lookup


def item_key(item: Any, keys: tuple[str, ...]) -> tuple[Any, ...]:
    if not isinstance(item, dict):
        return (item,)
    return tuple(_hashable(item.get(k)) for k in keys)


def _hashable(value: Any) -> Any:
    return repr(value) if isinstance(value, dict | list) else value


def clone(value: Any) -> Any:
    """Deep copy of JSON data (dicts, lists, scalars): several times faster than deepcopy."""
    if isinstance(value, dict):
        return {k: clone(v) if isinstance(v, dict | list) else v for k, v in value.items()}
    if isinstance(value, list):
        return [clone(v) if isinstance(v, dict | list) else v for v in value]
    return value


# --- JSON merge patch -----------------------------------------------------------------------


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return clone(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


# --- strategic merge patch ------------------------------------------------------------------

_DELETE = object()


def strategic_merge(target: Any, patch: Any, list_types: ListTypes = builtin_list_type,
                    path: Path = ()) -> Any:
    """Strategic merge patch as the API server applies it to built-in kinds."""
    if not isinstance(patch, dict):
        return clone(patch)
    directive = patch.get("$patch")
    if directive == "replace":
        return {k: clone(v) for k, v in patch.items() if k != "$patch"}
    if directive == "delete":
        return _DELETE
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key in ("$patch", "$retainKeys") or key.startswith("$setElementOrder/"):
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            result[field] = [x for x in result.get(field) or [] if x not in (value or [])]
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            merged = strategic_merge(result.get(key), value, list_types, (*path, key))
            if merged is _DELETE:
                result.pop(key, None)
            else:
                result[key] = merged
        elif isinstance(value, list):
            result[key] = _merge_list(result.get(key), value, list_types, (*path, key))
        else:
            result[key] = value
    if "$retainKeys" in patch:
        keep = set(patch["$retainKeys"] or [])
        result = {k: v for k, v in result.items() if k in keep}
    return result


def _merge_list(target: Any, patch: list[Any], list_types: ListTypes, path: Path) -> list[Any]:
    current = list(target) if isinstance(target, list) else []
    kind, keys = list_types(path, patch or current)
    if kind == "set":
        out = list(current)
        for item in patch:
            if item not in out:
                out.append(clone(item))
        return out
    if kind != "map" or any(not isinstance(i, dict) for i in patch):
        if len(patch) == 1 and isinstance(patch[0], dict) and patch[0].get("$patch") == "replace":
            return []
        return clone(patch)
    out = list(current)
    for item in patch:
        if item.get("$patch") == "replace":
            out = []
            continue
        k = item_key(item, keys)
        index = next((i for i, cur in enumerate(out) if item_key(cur, keys) == k), None)
        if item.get("$patch") == "delete":
            if index is not None:
                del out[index]
            continue
        if index is None:
            out.append(strategic_merge({}, item, list_types, path))
        else:
            out[index] = strategic_merge(out[index], item, list_types, path)
    return out


# --- JSON patch -----------------------------------------------------------------------------


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ApiError(422, f"invalid JSON pointer {path!r}: must start with '/'")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _walk(doc: Any, parts: list[str], path: str) -> Any:
    for part in parts:
        if isinstance(doc, dict) and part in doc:
            doc = doc[part]
        elif isinstance(doc, list) and part.isdigit() and int(part) < len(doc):
            doc = doc[int(part)]
        else:
            raise ApiError(422, f"jsonpatch: path {path!r} does not exist")
    return doc


def json_patch(doc: Any, ops: Any) -> Any:
    """RFC 6902: add, remove, replace, move, copy, test."""
    if not isinstance(ops, list):
        raise ApiError(400, "a JSON patch must be a list of operations")
    doc = clone(doc)
    for op in ops:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise ApiError(400, f"invalid JSON patch operation {op!r}: needs 'op' and 'path'")
        name, path = op["op"], op["path"]
        parts = _pointer(path)
        if name == "test":
            if _walk(doc, parts, path) != op.get("value"):
                raise ApiError(422, f"jsonpatch: test failed at {path!r}")
            continue
        if name in ("move", "copy"):
            src = _pointer(op["from"])
            value = clone(_walk(doc, src, op["from"]))
            if name == "move":
                doc = _remove(doc, src, op["from"])
            doc = _add(doc, parts, value, path)
        elif name == "add":
            doc = _add(doc, parts, clone(op.get("value")), path)
        elif name == "remove":
            doc = _remove(doc, parts, path)
        elif name == "replace":
            _walk(doc, parts, path)
            doc = _remove(doc, parts, path)
            doc = _add(doc, parts, clone(op.get("value")), path)
        else:
            raise ApiError(400, f"unknown JSON patch operation {name!r}")
    return doc


def _add(doc: Any, parts: list[str], value: Any, path: str) -> Any:
    if not parts:
        return value
    parent = _walk(doc, parts[:-1], path)
    last = parts[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        if last == "-":
            parent.append(value)
        elif last.isdigit() and int(last) <= len(parent):
            parent.insert(int(last), value)
        else:
            raise ApiError(422, f"jsonpatch: index out of range at {path!r}")
    else:
        raise ApiError(422, f"jsonpatch: cannot add at {path!r}")
    return doc


def _remove(doc: Any, parts: list[str], path: str) -> Any:
    if not parts:
        return None
    parent = _walk(doc, parts[:-1], path)
    last = parts[-1]
    if isinstance(parent, dict) and last in parent:
        del parent[last]
    elif isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        del parent[int(last)]
    else:
        raise ApiError(422, f"jsonpatch: path {path!r} does not exist")
    return doc

"""Server-side apply: field sets, managedFields (FieldsV1) and conflicts.

A field set is a set of paths. A path is a tuple of elements: ("f", name) a map field,
("k", key-json) an item of an associative list, ("v", value-json) an item of a set list.
`flatten` maps every path of an object to its value (leaves) or NODE (maps, keyed items), so
ownership, conflicts and releases can be computed with set arithmetic, as the structured-merge-
diff library does for the real API server.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from poolpilot.emulator.patch import ListTypes, clone, item_key

Elem = tuple[str, str]
FPath = tuple[Elem, ...]
NODE = object()
# Fields the server owns; never tracked (as in the real managedFields).
_UNTRACKED_TOP = {"apiVersion", "kind"}
_UNTRACKED_META = {
    "name", "namespace", "uid", "resourceVersion", "generation", "creationTimestamp",
    "managedFields", "deletionTimestamp", "deletionGracePeriodSeconds", "selfLink",
}


def _names(path: FPath) -> tuple[str, ...]:
    return tuple(v for k, v in path if k == "f")


def flatten(obj: dict[str, Any], list_types: ListTypes) -> dict[FPath, Any]:
    out: dict[FPath, Any] = {}
    top = {k: v for k, v in obj.items() if k not in _UNTRACKED_TOP}
    if isinstance(top.get("metadata"), dict):
        meta = {k: v for k, v in top["metadata"].items() if k not in _UNTRACKED_META}
        if meta:
            top["metadata"] = meta
        else:
            del top["metadata"]
    _flatten_map(top, (), list_types, out)
    return out


def _flatten_map(obj: dict[str, Any], path: FPath, lt: ListTypes, out: dict[FPath, Any]) -> None:
    for key, value in obj.items():
        p = (*path, ("f", key))
        _flatten_value(value, p, lt, out)


def _flatten_value(value: Any, p: FPath, lt: ListTypes, out: dict[FPath, Any]) -> None:
    if isinstance(value, dict) and value:
        out[p] = NODE
        _flatten_map(value, p, lt, out)
    elif isinstance(value, list) and value:
        kind, keys = lt(_names(p), value)
        if kind == "map" and all(isinstance(i, dict) for i in value):
            out[p] = NODE
            for item in value:
                kp = (*p, ("k", _key_json(item, keys)))
                out[kp] = NODE
                _flatten_map(item, kp, lt, out)
        elif kind == "set":
            out[p] = NODE
            for item in value:
                out[(*p, ("v", json.dumps(item, separators=(",", ":"))))] = True
        else:
            out[p] = value
    else:
        out[p] = value


def _key_json(item: dict[str, Any], keys: tuple[str, ...]) -> str:
    return json.dumps({k: item.get(k) for k in keys if k in item}, separators=(",", ":"))


# --- FieldsV1 encoding ----------------------------------------------------------------------


def encode(paths: set[FPath]) -> dict[str, Any]:
    root: dict[str, Any] = {}
    for path in sorted(paths, key=len):
        node = root
        for elem in path:
            node = node.setdefault(f"{elem[0]}:{elem[1]}", {})
    # Keyed list items are marked owned themselves (".") as the real API server does.
    for path in paths:
        node = root
        for elem in path:
            node = node[f"{elem[0]}:{elem[1]}"]
        if node and path[-1][0] == "k":
            node["."] = {}
    return root


def decode(fields: dict[str, Any], prefix: FPath = ()) -> set[FPath]:
    out: set[FPath] = set()
    for name, child in (fields or {}).items():
        if name == ".":
            continue
        kind, _, rest = name.partition(":")
        p = (*prefix, (kind, rest))
        out.add(p)  # our sets hold every ancestor of an owned field, so each node counts
        out |= decode(child, p)
    return out


# --- managers -------------------------------------------------------------------------------


@dataclass
class Manager:
    manager: str
    operation: str  # "Apply" | "Update"
    api_version: str
    time: str
    subresource: str = ""
    fields: frozenset[FPath] = frozenset()

    @property
    def ident(self) -> tuple[str, str, str]:
        return (self.manager, self.operation, self.subresource)

    def entry(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "manager": self.manager,
            "operation": self.operation,
            "apiVersion": self.api_version,
            "time": self.time,
            "fieldsType": "FieldsV1",
            "fieldsV1": encode(set(self.fields)),
        }
        if self.subresource:
            out["subresource"] = self.subresource
        return out


def read_managers(obj: dict[str, Any] | None) -> list[Manager]:
    out = []
    for e in ((obj or {}).get("metadata") or {}).get("managedFields") or []:
        if not isinstance(e, dict) or "manager" not in e:
            continue
        out.append(
            Manager(
                e["manager"], e.get("operation", "Update"), e.get("apiVersion", ""),
                e.get("time", ""), e.get("subresource", ""),
                frozenset(decode(e.get("fieldsV1") or {})),
            )
        )
    return out


def write_managers(obj: dict[str, Any], managers: list[Manager]) -> None:
    entries = [m.entry() for m in managers if m.fields]
    meta = obj.setdefault("metadata", {})
    if entries:
        meta["managedFields"] = entries
    else:
        meta.pop("managedFields", None)


def _prune_nodes(fields: set[FPath], flat: dict[FPath, Any]) -> frozenset[FPath]:
    """Keep only what exists, and map/keyed-item nodes only while something under them is
    owned (a node alone means nothing)."""
    fields = fields & set(flat)
    parents = {p[:i] for p in fields for i in range(1, len(p))}
    return frozenset(p for p in fields if flat[p] is not NODE or p in parents)


def _ancestors(path: FPath) -> list[FPath]:
    return [path[:i] for i in range(1, len(path))]


def track_update(old: dict[str, Any] | None, new: dict[str, Any], list_types: ListTypes,
                 ident: tuple[str, str, str], api_version: str, now: str) -> None:
    """Record a non-apply write: the writer owns what it changed; others lose what changed."""
    managers = read_managers(old)
    old_flat = flatten(old, list_types) if old else {}
    new_flat = flatten(new, list_types)
    changed = {p for p, v in new_flat.items() if v is not NODE and old_flat.get(p, NODE) != v}
    changed |= {p for p, v in new_flat.items() if v is NODE and p not in old_flat}
    removed = set(old_flat) - set(new_flat)
    gained = set(changed)
    for p in changed:
        gained.update(a for a in _ancestors(p) if a in new_flat)
    out: list[Manager] = []
    found = False
    for m in managers:
        fields = set(m.fields) - removed
        if m.ident == ident:
            found = True
            fields |= gained
            m = Manager(m.manager, m.operation, api_version, now, m.subresource)
        else:
            fields -= {p for p in changed if new_flat.get(p) is not NODE}
        m.fields = _prune_nodes(fields, new_flat)
        out.append(m)
    if not found and gained:
        out.append(Manager(ident[0], ident[1], api_version, now, ident[2], frozenset(gained)))
    write_managers(new, out)


@dataclass
class Conflict:
    manager: str
    api_version: str
    path: FPath

    def field(self) -> str:
        text = ""
        for kind, value in self.path:
            text += f".{value}" if kind == "f" else f"[{value}]"
        return text


def apply(current: dict[str, Any] | None, config: dict[str, Any], list_types: ListTypes,
          ident: tuple[str, str, str], api_version: str, now: str,
          force: bool) -> tuple[dict[str, Any], list[Conflict]]:
    """Server-side apply of `config` by one manager: returns (new object, conflicts).

    With conflicts and no force, the caller answers 409; with force the fields move to this
    manager. Fields this manager applied before and omits now are removed unless another
    manager owns them."""
    managers = read_managers(current)
    cur_flat = flatten(current, list_types) if current else {}
    cfg_flat = flatten(config, list_types)
    applied = set(cfg_flat)
    conflicts: list[Conflict] = []
    for m in managers:
        if m.ident == ident:
            continue
        for p in applied & m.fields:
            want = cfg_flat[p]
            if want is not NODE and p in cur_flat and cur_flat[p] != want:
                conflicts.append(Conflict(m.manager, m.api_version, p))
    if conflicts and not force:
        return current or {}, conflicts
    taken = {c.path for c in conflicts}
    previous = next((m.fields for m in managers if m.ident == ident), frozenset())
    others = [m for m in managers if m.ident != ident]
    owned_by_others: set[FPath] = set()
    for m in others:
        owned_by_others |= set(m.fields) - taken
    released = set(previous) - applied
    obj = clone(current) if current else {}
    removable = {p for p in released
                 if not any(o[: len(p)] == p for o in owned_by_others)}
    # Remove whole subtrees at their top: a keyed item goes with its key fields at once.
    for p in sorted(removable, key=len):
        if not any(p[:i] in removable for i in range(1, len(p))):
            _remove_path(obj, p)
    obj = merge_applied(obj, config, list_types, ())
    new_flat = flatten(obj, list_types)
    out = []
    for m in others:
        m.fields = _prune_nodes(set(m.fields) - taken, new_flat)
        out.append(m)
    out.append(Manager(ident[0], ident[1], api_version, now, ident[2],
                       _prune_nodes(applied, new_flat)))
    write_managers(obj, out)
    return obj, conflicts


def merge_applied(obj: Any, config: Any, lt: ListTypes, names: tuple[str, ...]) -> Any:
    """Merge an applied configuration: maps recurse, associative lists merge by key, sets
    union, anything else is replaced."""
    if isinstance(config, dict) and isinstance(obj, dict) and config:
        out = dict(obj)
        for k, v in config.items():
            out[k] = merge_applied(obj.get(k), v, lt, (*names, k))
        return out
    if isinstance(config, list) and isinstance(obj, list) and config:
        kind, keys = lt(names, config)
        if kind == "map" and all(isinstance(i, dict) for i in config + obj):
            result = list(obj)
            for item in config:
                k = item_key(item, keys)
                idx = next((i for i, c in enumerate(result) if item_key(c, keys) == k), None)
                if idx is None:
                    result.append(clone(item))
                else:
                    result[idx] = merge_applied(result[idx], item, lt, names)
            return result
        if kind == "set":
            return list(obj) + [clone(i) for i in config if i not in obj]
    return clone(config)


def _remove_path(obj: Any, path: FPath) -> None:
    """Delete the field, keyed list item or set member at `path` (if it is there)."""
    node = obj
    for i, (kind, value) in enumerate(path):
        last = i == len(path) - 1
        if kind == "f":
            if not isinstance(node, dict) or value not in node:
                return
            if last:
                del node[value]
                return
            node = node[value]
        elif kind == "k":
            if not isinstance(node, list):
                return
            key = json.loads(value)
            want = item_key(key, tuple(key))
            idx = next((j for j, it in enumerate(node)
                        if isinstance(it, dict) and item_key(it, tuple(key)) == want), None)
            if idx is None:
                return
            if last:
                del node[idx]
                return
            node = node[idx]
        else:  # "v": a set member
            if not isinstance(node, list):
                return
            member = json.loads(value)
            if last and member in node:
                node.remove(member)
            return

"""Decode the protobuf request bodies client-go's typed clients send (kubectl `create
namespace|configmap|secret|serviceaccount`, Helm's release Secrets) for the few kinds that
need it. Bodies are `k8s\\0` + runtime.Unknown{typeMeta, raw}; `raw` is the object, decoded
with the field numbers of k8s.io/api's generated.proto. Other kinds answer 415."""

from __future__ import annotations

import base64
from datetime import UTC, datetime
from typing import Any

from poolpilot.emulator.errors import ApiError

MAGIC = b"k8s\x00"
Schema = dict[int, tuple[str, Any]]


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def fields(buf: bytes) -> list[tuple[int, Any]]:
    """(field number, value) in order; length-delimited values stay bytes."""
    out: list[tuple[int, Any]] = []
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        num, wire = key >> 3, key & 7
        value: Any
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 2:
            size, pos = _varint(buf, pos)
            value, pos = buf[pos:pos + size], pos + size
        elif wire == 1:
            value, pos = int.from_bytes(buf[pos:pos + 8], "little"), pos + 8
        elif wire == 5:
            value, pos = int.from_bytes(buf[pos:pos + 4], "little"), pos + 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
        out.append((num, value))
    return out


def _time(buf: bytes) -> str:
    seconds = dict(fields(buf)).get(1, 0)
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def decode(buf: bytes, schema: Schema) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for num, value in fields(buf):
        if num not in schema:
            continue
        name, kind = schema[num]
        if kind == "string":
            out[name] = value.decode()
        elif kind == "bytes":
            out[name] = base64.b64encode(value).decode()
        elif kind == "int":
            out[name] = value
        elif kind == "bool":
            out[name] = bool(value)
        elif kind == "time":
            out[name] = _time(value)
        elif kind in ("map", "map-bytes"):
            entry = dict(fields(value))
            key = entry.get(1, b"").decode()
            raw = entry.get(2, b"")
            out.setdefault(name, {})[key] = (
                base64.b64encode(raw).decode() if kind == "map-bytes" else raw.decode())
        elif kind == "strings":
            out.setdefault(name, []).append(value.decode())
        elif isinstance(kind, tuple) and kind[0] == "list":
            out.setdefault(name, []).append(decode(value, kind[1]))
        elif isinstance(kind, dict):
            out[name] = decode(value, kind)
    return out


OWNER_REF: Schema = {1: ("kind", "string"), 3: ("name", "string"), 4: ("uid", "string"),
                     5: ("apiVersion", "string"), 6: ("controller", "bool"),
                     7: ("blockOwnerDeletion", "bool")}
OBJECT_META: Schema = {
    1: ("name", "string"), 2: ("generateName", "string"), 3: ("namespace", "string"),
    5: ("uid", "string"), 6: ("resourceVersion", "string"), 7: ("generation", "int"),
    8: ("creationTimestamp", "time"), 11: ("labels", "map"), 12: ("annotations", "map"),
    13: ("ownerReferences", ("list", OWNER_REF)), 14: ("finalizers", "strings"),
}
LOCAL_REF: Schema = {1: ("name", "string")}
DELETE_OPTIONS: Schema = {
    1: ("gracePeriodSeconds", "int"),
    2: ("preconditions", {1: ("uid", "string"), 2: ("resourceVersion", "string")}),
    3: ("orphanDependents", "bool"), 4: ("propagationPolicy", "string"), 5: ("dryRun", "strings"),
}
KINDS: dict[tuple[str, str], Schema] = {
    ("v1", "Namespace"): {1: ("metadata", OBJECT_META),
                          2: ("spec", {1: ("finalizers", "strings")})},
    ("v1", "ConfigMap"): {1: ("metadata", OBJECT_META), 2: ("data", "map"),
                          3: ("binaryData", "map-bytes"), 4: ("immutable", "bool")},
    ("v1", "Secret"): {1: ("metadata", OBJECT_META), 2: ("data", "map-bytes"),
                       3: ("type", "string"), 4: ("stringData", "map"), 5: ("immutable", "bool")},
    ("v1", "ServiceAccount"): {1: ("metadata", OBJECT_META),
                               3: ("imagePullSecrets", ("list", LOCAL_REF)),
                               4: ("automountServiceAccountToken", "bool")},
}


def decode_body(body: bytes) -> dict[str, Any]:
    """A protobuf request body as the JSON object it encodes; 415 for kinds not covered."""
    if not body.startswith(MAGIC):
        raise ApiError(400, "protobuf body without the k8s magic prefix")
    try:
        unknown = dict(fields(body[len(MAGIC):]))
        type_meta = {n: v.decode() for n, v in fields(unknown.get(1, b""))}
        api_version, kind = type_meta.get(1, ""), type_meta.get(2, "")
        schema = DELETE_OPTIONS if kind == "DeleteOptions" else KINDS.get((api_version, kind))
        if schema is None:
            raise ApiError(
                415, f"the emulator decodes protobuf only for {sorted(k for _, k in KINDS)} and "
                "DeleteOptions; "
                f"send {kind or 'this kind'} as application/json (e.g. kubectl apply -f)",
                "UnsupportedMediaType")
        obj = decode(unknown.get(2, b""), schema)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"invalid protobuf body: {exc}") from exc
    return {"apiVersion": api_version, "kind": kind, **obj}

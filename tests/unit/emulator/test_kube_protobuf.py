"""Protobuf request bodies (client-go typed clients) decode to the JSON objects they encode.
The encoder here is written from the protobuf wire format, independently of the decoder."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from poolpilot.emulator.errors import ApiError
from poolpilot.emulator.protobuf import MAGIC, decode_body


def varint(n: int) -> bytes:
    out = b""
    while True:
        byte, n = n & 0x7F, n >> 7
        out += bytes([byte | (0x80 if n else 0)])
        if not n:
            return out


def field(num: int, value: bytes | str | int | bool) -> bytes:
    if isinstance(value, bool | int):
        return varint(num << 3) + varint(int(value))
    data = value.encode() if isinstance(value, str) else value
    return varint(num << 3 | 2) + varint(len(data)) + data


def entry(num: int, key: str, value: bytes | str) -> bytes:
    return field(num, field(1, key) + field(2, value))


def envelope(api_version: str, kind: str, raw: bytes) -> bytes:
    return MAGIC + field(1, field(1, api_version) + field(2, kind)) + field(2, raw)


META = field(1, "s") + field(3, "team") + entry(11, "app", "web") + field(14, "a/b") \
    + field(13, field(1, "Deployment") + field(3, "d") + field(4, "u1") + field(5, "apps/v1")
            + field(6, True))
META_JSON = {"name": "s", "namespace": "team", "labels": {"app": "web"}, "finalizers": ["a/b"],
             "ownerReferences": [{"kind": "Deployment", "name": "d", "uid": "u1",
                                  "apiVersion": "apps/v1", "controller": True}]}


@dataclass(frozen=True)
class Case:
    id: str
    body: bytes
    want: dict[str, Any]


CASES = [
    Case("secret", envelope("v1", "Secret", field(1, META) + entry(2, "k", b"v")
                            + field(3, "Opaque") + field(5, True)),
         {"apiVersion": "v1", "kind": "Secret", "metadata": META_JSON, "data": {"k": "dg=="},
          "type": "Opaque", "immutable": True}),
    Case("configmap", envelope("v1", "ConfigMap", field(1, field(1, "c")) + entry(2, "a", "b")
                               + entry(2, "c", "d")),
         {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"},
          "data": {"a": "b", "c": "d"}}),
    Case("namespace", envelope("v1", "Namespace", field(1, field(1, "ns"))),
         {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ns"}}),
    Case("delete-options", envelope("meta.k8s.io/v1", "DeleteOptions",
                                    field(4, "Foreground") + field(5, "All")),
         {"apiVersion": "meta.k8s.io/v1", "kind": "DeleteOptions",
          "propagationPolicy": "Foreground", "dryRun": ["All"]}),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_decode(case: Case) -> None:
    assert decode_body(case.body) == case.want


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (envelope("apps/v1", "Deployment", field(1, field(1, "d"))), 415),
        (b"not-k8s" + b"\x00", 400),
        (MAGIC + b"\x0a\xff", 400),
    ],
    ids=["undecoded-kind", "no-magic", "truncated"],
)
def test_undecodable_bodies(body: bytes, code: int) -> None:
    with pytest.raises(ApiError) as err:
        decode_body(body)
    assert err.value.code == code

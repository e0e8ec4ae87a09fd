"""Label and field selectors, parsed like the API server parses `labelSelector=` and
`fieldSelector=` query parameters."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from poolpilot.emulator.errors import ApiError

_KEY = r"[A-Za-z0-9][-A-Za-z0-9_./]*"
_SET_RE = re.compile(rf"^\s*({_KEY})\s+(in|notin)\s+\(([^)]*)\)\s*$")
_EXISTS_RE = re.compile(rf"^\s*(!?)\s*({_KEY})\s*$")
_CMP_RE = re.compile(rf"^\s*({_KEY})\s*(==|!=|=)\s*([-A-Za-z0-9_.]*)\s*$")


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!"
    values: tuple[str, ...] = ()

    def matches(self, labels: dict[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.op == "exists":
            return present
        if self.op == "!":
            return not present
        if self.op in ("=", "in"):
            return present and value in self.values
        # "!=" and "notin" also match objects without the label, as in Kubernetes.
        return not present or value not in self.values


def _split_top(text: str) -> list[str]:
    """Split on commas outside parentheses."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [p for p in parts if p.strip()]


def parse_label_selector(text: str | None) -> list[Requirement]:
    """Parse 'a=b,c!=d,e in (x,y),f notin (z),g,!h'; raises ApiError(400) naming the term."""
    reqs: list[Requirement] = []
    for term in _split_top(text or ""):
        if m := _SET_RE.match(term):
            values = tuple(v.strip() for v in m.group(3).split(",") if v.strip())
            reqs.append(Requirement(m.group(1), m.group(2), values))
        elif m := _CMP_RE.match(term):
            op = "=" if m.group(2) in ("=", "==") else "!="
            reqs.append(Requirement(m.group(1), op, (m.group(3),)))
        elif m := _EXISTS_RE.match(term):
            reqs.append(Requirement(m.group(2), "!" if m.group(1) else "exists"))
        else:
            raise ApiError(400, f"unable to parse requirement: invalid label selector {term!r}")
    return reqs


def labels_match(reqs: list[Requirement], labels: dict[str, str] | None) -> bool:
    labels = labels or {}
    return all(r.matches(labels) for r in reqs)


@dataclass(frozen=True)
class FieldRequirement:
    path: tuple[str, ...]
    equal: bool
    value: str

    def matches(self, obj: dict[str, Any]) -> bool:
        cur: Any = obj
        for part in self.path:
            cur = cur.get(part) if isinstance(cur, dict) else None
        actual = "" if cur is None else (str(cur).lower() if isinstance(cur, bool) else str(cur))
        return (actual == self.value) == self.equal


def parse_field_selector(text: str | None) -> list[FieldRequirement]:
    """Parse 'metadata.name=x,metadata.namespace!=y' (any dotted path, = / == / !=)."""
    reqs = []
    for term in _split_top(text or ""):
        m = re.match(r"^\s*([A-Za-z0-9_.]+)\s*(==|!=|=)\s*(.*?)\s*$", term)
        if not m:
            raise ApiError(400, f"invalid field selector: {term!r}")
        reqs.append(FieldRequirement(tuple(m.group(1).split(".")), m.group(2) != "!=", m.group(3)))
    return reqs


def fields_match(reqs: list[FieldRequirement], obj: dict[str, Any]) -> bool:
    return all(r.matches(obj) for r in reqs)


def selector_string(selector: dict[str, Any] | None) -> str:
    """A metav1.LabelSelector (matchLabels/matchExpressions) as the query-string form."""
    if not selector:
        return ""
    terms = [f"{k}={v}" for k, v in sorted((selector.get("matchLabels") or {}).items())]
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        if op == "In":
            terms.append(f"{key} in ({','.join(values)})")
        elif op == "NotIn":
            terms.append(f"{key} notin ({','.join(values)})")
        elif op == "Exists":
            terms.append(key)
        elif op == "DoesNotExist":
            terms.append(f"!{key}")
    return ",".join(terms)

"""Validate an object against a CRD the way the Kubernetes API server does.

Order as in the API server: refuse numbers JSON cannot carry, prune nulls and apply schema
defaults, check the structural OpenAPI schema (with strict field validation, as `kubectl apply`
asks for by default, `x-kubernetes-list-type` keys and RE2 patterns), then evaluate the CEL
rules (`x-kubernetes-validations`, with `messageExpression`) with cel-python. Used by the tests
(the CRD must reject what the models reject) and by the Kubernetes API emulator, so the sandbox
behaves like a real cluster. Any JSON value is accepted as input without raising: integers past
int64 (the API server decodes them as floats), deep nesting, nulls anywhere.
"""

from __future__ import annotations

import copy
import functools
import json
import math
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import celpy
import jsonschema
from celpy import celtypes

from poolpilot import re2
from poolpilot.apitypes import quantity_value

_ENV = celpy.Environment()
_INT64 = (-(2**63), 2**63 - 1)


def version_schema(crd: dict[str, Any], version: str | None = None) -> dict[str, Any]:
    for v in crd["spec"]["versions"]:
        if version is None or v["name"] == version:
            schema: dict[str, Any] = v["schema"]["openAPIV3Schema"]
            return schema
    raise KeyError(f"version {version} not in CRD {crd['metadata']['name']}")


def _subschema(schema: dict[str, Any] | None, key: str) -> dict[str, Any] | None:
    if schema is None:
        return None
    props = schema.get("properties") or {}
    if key in props:
        sub: dict[str, Any] = props[key]
        return sub
    extra = schema.get("additionalProperties")
    return extra if isinstance(extra, dict) else None


def apply_defaults(schema: dict[str, Any] | None, value: Any) -> Any:
    """Prune nulls and fill defaults, as the API server does before validating: a null field
    that is not nullable is dropped (or replaced by its default), absent fields with a default
    get it, recursing into objects that exist or were defaulted. Returns a new object along the
    schema's paths; values the schema does not describe are shared, not copied."""
    if schema is None:
        return value
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            sub = _subschema(schema, key)
            if item is None and sub is not None and not sub.get("nullable"):
                if "default" not in sub:
                    continue
                item = copy.deepcopy(sub["default"])
            out[key] = apply_defaults(sub, item)
        for key, sub in (schema.get("properties") or {}).items():
            if key not in out and "default" in sub:
                out[key] = apply_defaults(sub, copy.deepcopy(sub["default"]))
        return out
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [apply_defaults(schema["items"], v) for v in value]
    return value


def _strict(schema: Any) -> Any:
    """JSON Schema with unknown fields rejected where the structural schema would prune them,
    and x-kubernetes-int-or-string spelled out."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items() if k not in ("x-kubernetes-validations",)}
    if (
        "properties" in schema
        and "additionalProperties" not in schema
        and not schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    if schema.get("x-kubernetes-int-or-string") and "anyOf" not in schema:
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    return out


def _re2_pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[Any]:
    if validator.is_type(instance, "string") and not re2.search(pattern, instance):
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


_Validator = jsonschema.validators.extend(jsonschema.Draft4Validator, {"pattern": _re2_pattern})


# Validators by schema object: building one costs more than validating (CRD objects are
# replaced, not edited in place, by the emulator's store).
_VALIDATORS: dict[int, tuple[dict[str, Any], Any]] = {}


def _validator(schema: dict[str, Any]) -> Any:
    cached = _VALIDATORS.get(id(schema))
    if cached is None or cached[0] is not schema:
        if len(_VALIDATORS) > 64:
            _VALIDATORS.clear()
        cached = (schema, _Validator(_strict(copy.deepcopy(schema))))
        _VALIDATORS[id(schema)] = cached
    return cached[1]


def _path(parts: Any) -> str:
    text = ""
    for p in parts:
        text += f"[{p}]" if isinstance(p, int) else (f".{p}" if text else str(p))
    return text


# --- values JSON cannot carry --------------------------------------------------------------


def _non_finite(obj: Any) -> list[str]:
    """Infinity and NaN have no JSON form: a real API server never receives them (kubectl and
    client libraries fail to encode them), so the emulator refuses them instead."""
    errors = []
    stack: list[tuple[Any, tuple[Any, ...]]] = [(obj, ())]
    while stack:
        value, path = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            errors.append(f"{_path(path) or '<root>'}: Invalid value: {value}: must be a finite "
                          "number (JSON has no Infinity or NaN)")
        elif isinstance(value, dict):
            stack += [(v, (*path, k)) for k, v in value.items()]
        elif isinstance(value, list):
            stack += [(v, (*path, i)) for i, v in enumerate(value)]
    return sorted(errors)


# --- list types ------------------------------------------------------------------------------


def _list_errors(schema: dict[str, Any] | None, value: Any, path: tuple[Any, ...]) -> list[str]:
    """x-kubernetes-list-type map (unique keys) and set (unique items), as the API server
    checks them."""
    if schema is None:
        return []
    errors: list[str] = []
    if isinstance(value, list):
        kind = schema.get("x-kubernetes-list-type")
        seen: set[str] = set()
        for i, item in enumerate(value):
            if kind == "map" and isinstance(item, dict):
                keys = {k: item.get(k) for k in schema.get("x-kubernetes-list-map-keys", [])}
                ident = json.dumps(keys, sort_keys=True)
            elif kind == "set":
                ident = json.dumps(item, sort_keys=True)
            else:
                ident = ""
            if ident and ident in seen:
                errors.append(f"{_path((*path, i))}: Duplicate value: {ident}")
            seen.add(ident)
            errors += _list_errors(schema.get("items"), item, (*path, i))
    elif isinstance(value, dict):
        for key, item in value.items():
            errors += _list_errors(_subschema(schema, key), item, (*path, key))
    return errors


# --- CEL -------------------------------------------------------------------------------------


def _matches(text: Any, pattern: Any) -> celtypes.BoolType:
    return celtypes.BoolType(re2.search(str(pattern), str(text)))


class _Quantity(celtypes.StringType):
    """A value of Kubernetes' CEL quantity library (`quantity("500m")`)."""

    amount: Decimal


def _to_quantity(text: Any) -> _Quantity:
    amount = quantity_value(str(text))
    if amount is None:
        raise ValueError(f"quantity: {text!r} is not a quantity")  # celpy: an evaluation error
    q = _Quantity(str(text))
    q.amount = amount
    return q


def _is_greater_than(a: _Quantity, b: _Quantity) -> celtypes.BoolType:
    return celtypes.BoolType(a.amount > b.amount)


def _is_less_than(a: _Quantity, b: _Quantity) -> celtypes.BoolType:
    return celtypes.BoolType(a.amount < b.amount)


def _is_integer(q: _Quantity) -> celtypes.BoolType:
    """Whether asInteger can read it: a whole number within int64."""
    return celtypes.BoolType(q.amount == q.amount.to_integral_value()
                             and _INT64[0] <= q.amount <= _INT64[1])


def _as_integer(q: _Quantity) -> celtypes.IntType:
    if not _is_integer(q):
        raise ValueError(f"quantity: {q} is not an integer within int64")
    return celtypes.IntType(int(q.amount))


def _substring(text: Any, start: Any, end: Any = None) -> celtypes.StringType:
    """The strings extension's `substring(start[, end])` (Kubernetes enables it)."""
    s = str(text)
    stop = len(s) if end is None else int(end)
    if not 0 <= int(start) <= stop <= len(s):
        raise ValueError(f"substring: index out of range for {s!r}")
    return celtypes.StringType(s[int(start):stop])


_FUNCTIONS: dict[str, Any] = {"matches": _matches, "quantity": _to_quantity,
                              "isGreaterThan": _is_greater_than, "isLessThan": _is_less_than,
                              "isInteger": _is_integer, "asInteger": _as_integer,
                              "substring": _substring}


@functools.lru_cache(maxsize=1024)
def _program(expression: str) -> Any:
    return _ENV.program(_ENV.compile(expression), functions=_FUNCTIONS)


def _scalar(value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, bool):
        return celtypes.BoolType(value)
    if isinstance(value, int):  # past int64 the API server has decoded a float
        inside = _INT64[0] <= value <= _INT64[1]
        if inside:  # int.__new__: IntType() re-checks the range in a slow decorator
            return int.__new__(celtypes.IntType, value)
        return celtypes.DoubleType(float(value))
    if isinstance(value, float):
        return celtypes.DoubleType(value)
    return celtypes.StringType(str(value))


def to_cel(value: Any) -> Any:
    """JSON to CEL values, without recursion (a deep free-form value cannot overflow the stack)."""
    holder: list[Any] = [None]
    stack: list[tuple[Any, Any, Any]] = [(value, holder, 0)]
    while stack:
        item, parent, slot = stack.pop()
        if isinstance(item, dict):
            node: Any = celtypes.MapType()
            stack += [(v, node, celtypes.StringType(k)) for k, v in item.items()]
        elif isinstance(item, list):
            node = celtypes.ListType([None] * len(item))
            stack += [(v, node, i) for i, v in enumerate(item)]
        else:
            node = _scalar(item)
        parent[slot] = node
    return holder[0]


def _short(exc: Exception) -> str:
    text = str(exc.args[0]) if exc.args else str(exc)
    return text.split(" (in activation")[0].splitlines()[0][:200]


def _message(rule: dict[str, Any], activation: dict[str, Any]) -> str:
    """messageExpression when it evaluates to a string, else the static message (as the API
    server falls back)."""
    expression = rule.get("messageExpression")
    if expression:
        try:
            result = _program(expression).evaluate(activation)
        except celpy.CELEvalError:
            result = None
        if isinstance(result, str) and result.strip():
            return str(result)
    return str(rule.get("message") or f"failed rule: {rule['rule']}")


def _evaluate(rule: str, message: str | None, message_expression: str | None,
              cel_self: Any) -> str | None:
    """None when `rule` holds for `self`, else the message to report."""
    activation = {"self": cel_self}
    try:
        if bool(_program(rule).evaluate(activation)):
            return None
    except celpy.CELEvalError as exc:  # e.g. a field the rule reads is absent
        return f"{message or rule} ({_short(exc)})"
    return _message({"rule": rule, "message": message, "messageExpression": message_expression},
                    activation)


@functools.lru_cache(maxsize=4096)
def _evaluate_json(rule: str, message: str | None, message_expression: str | None,
                   value_json: str) -> str | None:
    """CEL is pure: outcomes are cached by the value's JSON, since most objects repeat the
    same defaulted parts (evaluation in cel-python costs about a millisecond)."""
    return _evaluate(rule, message, message_expression, to_cel(json.loads(value_json)))


_CACHED_VALUE_BYTES = 2048  # small parts repeat (roles, resources); whole objects do not


def _rule_outcome(rule: dict[str, Any], value: Any) -> str | None:
    args = (rule["rule"], rule.get("message"), rule.get("messageExpression"))
    try:
        value_json = json.dumps(value, sort_keys=True)
    except (RecursionError, ValueError, TypeError):  # too deep to encode
        value_json = None
    if value_json is None or len(value_json) > _CACHED_VALUE_BYTES:
        return _evaluate(*args, to_cel(value))  # the cache holds small values only
    return _evaluate_json(*args, value_json)


def _cel_errors(schema: dict[str, Any], value: Any, path: tuple[Any, ...]) -> list[str]:
    errors: list[str] = []
    for rule in schema.get("x-kubernetes-validations", []):
        message = _rule_outcome(rule, value)
        if message is None:
            continue
        field = rule.get("fieldPath", "").lstrip(".")
        if field and message.startswith(f"{field}: "):
            message = message[len(field) + 2:]
        where = _path([*path, *field.split(".")] if field else path)
        errors.append(f"{where}: {message}" if where else message)
    if isinstance(value, dict):
        for name, item in value.items():
            sub = _subschema(schema, name)
            if sub is not None:
                errors += _cel_errors(sub, item, (*path, name))
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            errors += _cel_errors(schema["items"], item, (*path, i))
    return errors


# --- schema errors ---------------------------------------------------------------------------


def _describe(error: jsonschema.ValidationError) -> str:
    """Phrase schema errors as the API server does: the field's full path first."""
    path = list(error.absolute_path)
    instance: Any = error.instance
    schema: Any = error.schema
    if error.validator == "required":
        required: Any = error.validator_value
        missing = [r for r in required if r not in instance]
        return "; ".join(f"{_path([*path, m])}: Required value" for m in missing)
    if error.validator == "additionalProperties":
        known = set(schema.get("properties", {}))
        extra = sorted(k for k in instance if k not in known)
        return "; ".join(f'{_path([*path, k])}: unknown field "{k}"' for k in extra)
    return f"{_path(path) or '<root>'}: {error.message}"


def validate(crd: dict[str, Any], obj: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Return (the object with nulls pruned and defaults applied, errors as 'path: message')."""
    non_finite = _non_finite(obj)
    if non_finite:
        return obj, non_finite
    schema = version_schema(crd)
    defaulted = apply_defaults(schema, obj)
    validator = _validator(schema)
    errors = [
        _describe(e)
        for e in sorted(validator.iter_errors(defaulted), key=lambda e: [str(p) for p in
                                                                          e.absolute_path])
    ]
    errors += _list_errors(schema, defaulted, ())
    if not errors:  # CEL only runs on objects that pass the schema, as in the API server
        errors = _cel_errors(schema, defaulted, ())
    return defaulted, errors

"""Validate an object against a CRD the way the Kubernetes API server does.

Order as in the API server: apply schema defaults, check the structural OpenAPI schema (with
strict field validation, as `kubectl apply` asks for by default), then evaluate the CEL rules
(`x-kubernetes-validations`) with cel-python. Used by the tests (the CRD must reject what the
models reject) and by the Kubernetes API emulator, so the sandbox behaves like a real cluster.
"""

from __future__ import annotations

import copy
from typing import Any

import celpy
import jsonschema

_ENV = celpy.Environment()


def version_schema(crd: dict[str, Any], version: str | None = None) -> dict[str, Any]:
    for v in crd["spec"]["versions"]:
        if version is None or v["name"] == version:
            schema: dict[str, Any] = v["schema"]["openAPIV3Schema"]
            return schema
    raise KeyError(f"version {version} not in CRD {crd['metadata']['name']}")


def apply_defaults(schema: dict[str, Any], value: Any) -> Any:
    """Fill defaults of absent fields, recursing into objects that exist (or were defaulted)."""
    if isinstance(value, dict) and "properties" in schema:
        for name, sub in schema["properties"].items():
            if name not in value and "default" in sub:
                value[name] = copy.deepcopy(sub["default"])
            if name in value:
                value[name] = apply_defaults(sub, value[name])
    elif isinstance(value, list) and "items" in schema:
        return [apply_defaults(schema["items"], v) for v in value]
    return value


def _strict(schema: Any) -> Any:
    """JSON Schema with unknown fields rejected where the structural schema would prune them."""
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
    return out


def _path(parts: Any) -> str:
    text = ""
    for p in parts:
        text += f"[{p}]" if isinstance(p, int) else (f".{p}" if text else str(p))
    return text


def _cel_errors(schema: dict[str, Any], value: Any, path: list[Any]) -> list[str]:
    errors: list[str] = []
    for rule in schema.get("x-kubernetes-validations", []):
        program = _ENV.program(_ENV.compile(rule["rule"]))
        try:
            ok = bool(program.evaluate({"self": celpy.json_to_cel(value)}))
        except celpy.CELEvalError as exc:  # e.g. a field the rule reads is absent
            ok, rule = False, {**rule, "message": f"{rule['message']} ({exc})"}
        if not ok:
            field = rule.get("fieldPath", "").lstrip(".")
            message = rule["message"]
            if field and message.startswith(f"{field}: "):
                message = message[len(field) + 2:]
            errors.append(f"{_path([*path, *field.split('.')] if field else path)}: {message}")
    if isinstance(value, dict):
        for name, sub in schema.get("properties", {}).items():
            if name in value:
                errors += _cel_errors(sub, value[name], [*path, name])
    elif isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            errors += _cel_errors(schema["items"], item, [*path, i])
    return errors


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
    """Return (the object with defaults applied, errors as 'path: message' strings)."""
    schema = version_schema(crd)
    defaulted = apply_defaults(schema, copy.deepcopy(obj))
    validator = jsonschema.Draft4Validator(_strict(schema))
    errors = [
        _describe(e)
        for e in sorted(validator.iter_errors(defaulted), key=lambda e: list(e.absolute_path))
    ]
    if not errors:  # CEL only runs on objects that pass the schema, as in the API server
        errors = _cel_errors(schema, defaulted, [])
    return defaulted, errors

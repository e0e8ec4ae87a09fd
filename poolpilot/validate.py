"""Parse InferencePool manifests and turn pydantic errors into 'field: problem; fix' lines."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from poolpilot import api, fileerrors


class InvalidPool(ValueError):
    """A manifest the models reject; `errors` holds one 'path: message' line per problem."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("; ".join(errors))
        self.errors = errors


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


def _describe(err: Any) -> str:
    loc = tuple(err["loc"])
    if err["type"] == "rule":
        field = err["ctx"]["field"]
        return f"{_loc((*loc, field))}: {err['ctx']['message']}"
    if err["type"] == "extra_forbidden":
        model = _model_at(loc)
        known = sorted(f.alias or n for n, f in model.model_fields.items()) if model else []
        close = difflib.get_close_matches(str(loc[-1]), known, n=1)
        hint = f"did you mean {close[0]}?" if close else f"known fields: {', '.join(known)}"
        return f"{_loc(loc)}: unknown field; {hint}"
    if err["type"] == "missing":
        return f"{_loc(loc)}: required; add it"
    return f"{_loc(loc)}: {err['msg']}"


def parse_pool(doc: dict[str, Any]) -> api.InferencePool:
    """Parse one manifest or raise InvalidPool naming every bad field."""
    try:
        return api.InferencePool.model_validate(_without_server_fields(doc))
    except ValidationError as exc:
        raise InvalidPool([_describe(e) for e in exc.errors()]) from None


def parse_spec(spec: dict[str, Any]) -> api.InferencePoolSpec:
    """Parse a spec as the operator receives it; errors are prefixed with `spec.`."""
    try:
        return api.InferencePoolSpec.model_validate(spec)
    except ValidationError as exc:
        raise InvalidPool([f"spec.{_describe(e)}" for e in exc.errors()]) from None


def _without_server_fields(doc: dict[str, Any]) -> dict[str, Any]:
    keep = ("apiVersion", "kind", "metadata", "spec", "status")
    return {k: v for k, v in doc.items() if k in keep}


def load_documents(path: Path) -> list[dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    for d in docs:
        if not isinstance(d, dict):
            raise InvalidPool([f"<document>: expected a mapping, got {type(d).__name__}"])
    return docs


def validate_file(path: Path) -> list[str]:
    """Every error in the file's InferencePool documents, as 'FILE: path: message' lines."""
    try:
        docs = load_documents(path)
    except OSError as exc:
        return [f"{path}: {fileerrors.describe(exc)}"]
    except (yaml.YAMLError, InvalidPool) as exc:
        return [f"{path}: {exc}"]
    pools = [d for d in docs if d.get("kind") == api.KIND]
    if not pools:
        return [f"{path}: no {api.KIND} document found"]
    errors: list[str] = []
    for doc in pools:
        try:
            parse_pool(doc)
        except InvalidPool as exc:
            errors += [f"{path}: {e}" for e in exc.errors]
    return errors

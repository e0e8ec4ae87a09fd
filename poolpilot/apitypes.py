"""Building blocks of the API models, each saying the same thing to pydantic and to the CRD.

- `ApiModel`: camelCase on the wire, unknown fields refused, strict JSON types (no coercion of
  "3", true or 15.0, as the API server), finite numbers, null meaning unset (the API server
  prunes nulls before defaulting), and cross-field `Rule`s that become CEL validations. Every
  failed rule is reported, not only the first.
- Value types (int32/int64, Kubernetes names, quantities, free-form JSON) whose check here and
  OpenAPI schema in the CRD refuse the same values, with messages that say the fix.
This module does no I/O (enforced by import-linter).
"""

from __future__ import annotations

import functools
import math
import re
import typing
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from decimal import Decimal
from typing import Annotated, Any, ClassVar

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    PlainValidator,
    WithJsonSchema,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError, core_schema

from poolpilot import re2

# A Kubernetes object as its JSON (what the API server sends and takes), the one name for it.
Obj = dict[str, Any]

# ---------------------------------------------------------------------------------------------
# Value types: each one's check here and its OpenAPI schema in the CRD say the same thing.

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1

# int32 like Deployment replicas and most Kubernetes counts; int64 like generations.
Int32 = Annotated[int, Field(le=INT32_MAX, json_schema_extra={"format": "int32"})]
Int64 = Annotated[
    int, Field(ge=-INT64_MAX - 1, le=INT64_MAX, json_schema_extra={"format": "int64"})
]

DNS1035_LABEL = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
DNS1123_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS1123_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
# Kubernetes' own rules: env var names (IsEnvVarName), label values, qualified names (keys).
ENV_VAR_NAME = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
QUALIFIED_NAME = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
# QUALIFIED_NAME bounds the name (63 characters) but not the prefix, a DNS subdomain of at most
# 253: the keys of labels, annotations and nodeSelectors match both.
QUALIFIED_NAME_LENGTHS = r"^([^/]{1,253}/)?[^/]{1,63}$"


def qualified_name(key: str) -> bool:
    """A label, annotation or nodeSelector key as Kubernetes checks it (IsQualifiedName)."""
    return bool(re2.search(QUALIFIED_NAME, key) and re2.search(QUALIFIED_NAME_LENGTHS, key))


def qualified_name_cel(var: str) -> str:
    """CEL twin of qualified_name."""
    return (f"{var}.matches({cel_string(QUALIFIED_NAME)}) && "
            f"{var}.matches({cel_string(QUALIFIED_NAME_LENGTHS)})")


def qualified_keys_rule(field: str) -> Rule:
    """The keys of the map `field` are qualified names (example.com/team or team)."""
    return Rule(
        field=field,
        cel=f"!has(self.{field}) || self.{field}.all(k, {qualified_name_cel('k')})",
        message="keys must be qualified names such as example.com/team or team (a DNS "
        "subdomain of at most 253 characters, '/', and a name of at most 63)",
        check=lambda s: all(qualified_name(k) for k in getattr(s, _snake(field))),
    )


# Kubernetes' quantity syntax (resource.Quantity), without a sign: requests cannot be negative.
QUANTITY = (
    r"^\+?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)


@dataclass(frozen=True)
class Matching:
    """Annotation for a string checked against `pattern` (RE2 semantics, as the API server
    checks the CRD's `pattern`) and `max_length`, with a message saying `what` is expected."""

    pattern: str
    what: str
    max_length: int | None = None

    def check(self, value: str) -> str:
        if self.max_length is not None and len(value) > self.max_length:
            raise PydanticCustomError(
                "too_long", "{what}; at most {max} characters, got {n}",
                {"what": self.what, "max": self.max_length, "n": len(value)},
            )
        if not re2.search(self.pattern, value):
            raise PydanticCustomError("pattern", "{what}; got {value}",
                                      {"what": self.what, "value": repr(value)})
        return value

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> Any:
        return core_schema.no_info_after_validator_function(self.check, handler(source))

    def __get_pydantic_json_schema__(self, schema: Any, handler: GetJsonSchemaHandler) -> Any:
        out = handler(schema)
        out["pattern"] = self.pattern
        if self.max_length is not None:
            out["maxLength"] = self.max_length
        return out


EnvVarName = Annotated[str, Matching(
    ENV_VAR_NAME,
    "must be letters, digits, '_', '-' or '.', not starting with a digit (e.g. MY_VAR)",
)]
LabelValue = Annotated[str, Matching(
    LABEL_VALUE,
    "must be a label value: letters, digits, '-', '_' or '.', starting and ending with a "
    "letter or digit",
    max_length=63,
)]
QualifiedName = Annotated[str, Matching(
    QUALIFIED_NAME,
    "must be a qualified name such as example.com/gpu-type or gpu-type",
    max_length=317,
)]
ObjectName = Annotated[str, Matching(
    DNS1123_SUBDOMAIN,
    "must be a Kubernetes object name: lowercase letters, digits, '-' and '.', starting and "
    "ending with a letter or digit",
    max_length=253,
)]
SecretKey = Annotated[str, Matching(
    r"^[-._a-zA-Z0-9]+$", "must be letters, digits, '-', '_' or '.'", max_length=253
)]
TrimmedString = Annotated[str, Matching(
    r"^\S(.*\S)?$", "must not be empty or start or end with whitespace"
)]


_QUANTITY_PARTS = re.compile(r"^\+?([0-9.]+(?:[eE][+-]?[0-9.]+)?)([KMGTPE]i|[numkMGTPE])?$")
_SUFFIX: dict[str | None, Decimal] = {
    None: Decimal(1), "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"),
    "k": Decimal(10**3), "M": Decimal(10**6), "G": Decimal(10**9), "T": Decimal(10**12),
    "P": Decimal(10**15), "E": Decimal(10**18), "Ki": Decimal(2**10), "Mi": Decimal(2**20),
    "Gi": Decimal(2**30), "Ti": Decimal(2**40), "Pi": Decimal(2**50), "Ei": Decimal(2**60),
}


def quantity_value(value: int | str) -> Decimal | None:
    """The amount a Kubernetes quantity stands for ("500m" -> 0.5, "1Gi" -> 1073741824), or
    None when it is not one."""
    if isinstance(value, int) and not isinstance(value, bool):
        return Decimal(value)
    m = _QUANTITY_PARTS.match(str(value))
    if not m:
        return None
    try:
        return Decimal(m.group(1)) * _SUFFIX[m.group(2)]
    except ArithmeticError:  # malformed, or an exponent past what a Decimal holds ("1e9999999")
        return None


def _quantity(value: Any) -> int | str:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= INT64_MAX:
        return value
    if isinstance(value, str) and re2.search(QUANTITY, value):
        amount = quantity_value(value)
        if amount is None or amount > INT64_MAX:
            # Kubernetes caps such a quantity at 2^63-1 (a request no node can meet).
            raise PydanticCustomError(
                "quantity", "{value} is out of range: a Kubernetes quantity is at most 2^63-1 "
                "(9223372036854775807, just under 8Ei): lower it", {"value": repr(value)})
        return value
    raise PydanticCustomError(
        "quantity",
        "must be a Kubernetes quantity such as 500m, 4, 1.5 or 32Gi (an integer or a string); "
        "got {value}",
        {"value": repr(value)},
    )


Quantity = Annotated[
    int | str,
    PlainValidator(_quantity),
    WithJsonSchema({
        "x-kubernetes-int-or-string": True,
        "anyOf": [{"type": "integer"}, {"type": "string"}],
        "pattern": QUANTITY,
        "minimum": 0,
        "maximum": INT64_MAX,
    }),
]


def _finite_json(value: Any) -> Any:
    """Free-form values (engine args, connector config) are JSON, and JSON has no Infinity or
    NaN: refuse them here as the API server's JSON decoder would."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            raise PydanticCustomError(
                "finite_number", "must be a finite number, got {value}", {"value": item}
            )
        if isinstance(item, dict):
            stack += item.values()
        elif isinstance(item, list):
            stack += item
    return value


# Free-form values (engine args, connector config) are kept as JSON scalars or objects.
JsonValue = Annotated[Any, AfterValidator(_finite_json)]


@dataclass(frozen=True)
class Rule:
    """A cross-field rule, checked by the model and emitted as a CEL validation in the CRD.

    `message` may name other fields in braces, e.g. "must be >= minReplicas ({minReplicas})";
    the model fills them from the object and the CRD gets a `messageExpression` that does the
    same with CEL, so `kubectl apply` shows the real values too.
    """

    field: str
    cel: str
    message: str
    check: Callable[[Any], bool]

    def placeholders(self) -> list[str]:
        return re.findall(r"\{(\w+)\}", self.message)

    def static_message(self) -> str:
        """The fallback `message` (used by API servers that cannot evaluate the expression)."""
        return f"{self.field}: " + re.sub(r"\s*\([^()]*\{\w+\}[^()]*\)", "", self.message)

    def message_expression(self) -> str:
        parts = re.split(r"\{(\w+)\}", f"{self.field}: {self.message}")
        cel = [
            f"string(self.{p})" if i % 2 else cel_string(p)
            for i, p in enumerate(parts)
            if i % 2 or p
        ]
        return " + ".join(cel)

    def render(self, model: Any) -> str:
        """The message with the object's values, exactly as the CRD's messageExpression says."""
        return self.message.format(
            **{name: _cel_str(getattr(model, _snake(name))) for name in self.placeholders()}
        )

    def to_crd(self) -> dict[str, str]:
        out = {"rule": self.cel, "message": self.static_message()}
        if self.placeholders():
            out["messageExpression"] = self.message_expression()
        out["fieldPath"] = f".{self.field}"
        return out


def cel_string(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _cel_str(value: Any) -> str:
    """CEL's string() of an int or bool (the only values messages name)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


@dataclass(frozen=True)
class RuleFailure:
    """A failed rule: the failing field's path below the model that owns the rule."""

    field: str
    message: str


# Set while validate.parse_pool/parse_spec collect every failed rule of the whole document:
# a model whose own rules fail is still built (so the rules of the models around it run too),
# and its failures are recorded here against the input mapping it was built from.
_RULE_FAILURES: ContextVar[list[tuple[int, list[RuleFailure]]] | None] = ContextVar(
    "rule_failures", default=None
)


@contextmanager
def collecting_rule_failures() -> Iterator[list[tuple[int, list[RuleFailure]]]]:
    """Collect (id of the input mapping, failures) for every model whose rules fail."""
    failures: list[tuple[int, list[RuleFailure]]] = []
    token = _RULE_FAILURES.set(failures)
    try:
        yield failures
    finally:
        _RULE_FAILURES.reset(token)


class ApiModel(BaseModel):
    """Base: camelCase on the wire, unknown fields rejected, strict JSON types (no coercion of
    "3", true or 15.0 into an integer, as the API server), finite numbers, null meaning unset
    (the API server prunes nulls before defaulting), every rule checked after parsing."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        use_enum_values=True,
        strict=True,
        allow_inf_nan=False,
    )
    rules: ClassVar[tuple[Rule, ...]] = ()

    @model_validator(mode="wrap")
    @classmethod
    def _validate(cls, data: Any, handler: Callable[[Any], ApiModel]) -> ApiModel:
        source = data
        if isinstance(data, dict):
            data = _without_nulls(cls, data)
        model = handler(data)
        failures = model.failed_rules()
        if failures:
            collected = _RULE_FAILURES.get()
            if collected is None:
                raise PydanticCustomError(
                    "rule",
                    "{summary}",
                    {
                        "summary": "; ".join(f"{f.field}: {f.message}" for f in failures),
                        "failures": failures,
                    },
                )
            collected.append((id(source), failures))
        return model

    def failed_rules(self) -> list[RuleFailure]:
        """Every rule of this model that fails (not only the first)."""
        return [RuleFailure(r.field, r.render(self)) for r in self.rules if not r.check(self)]

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema: Any, handler: Any) -> Any:
        schema = handler(core_schema)
        target = handler.resolve_ref_schema(schema)
        if cls.rules:
            target["x-kubernetes-validations"] = [r.to_crd() for r in cls.rules]
        return schema

    def to_wire(self) -> dict[str, Any]:
        """The object as it appears in YAML: camelCase, without unset optional fields."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


def _without_nulls(cls: type[BaseModel], data: dict[str, Any]) -> dict[str, Any]:
    """Drop null fields, and null values of map fields: for the API server null means unset.
    A null under a name that is not a field stays, to be refused as an unknown field (the API
    server prunes nulls only where its schema knows the field)."""
    fields, maps = _field_names(cls)
    out: dict[str, Any] = {}
    for key, value in data.items():
        if value is None and key in fields:
            continue
        if key in maps and isinstance(value, dict) and None in value.values():
            value = {k: v for k, v in value.items() if v is not None}
        out[key] = value
    return out


@functools.cache
def _field_names(cls: type[BaseModel]) -> tuple[frozenset[str], frozenset[str]]:
    """Wire names of all fields, and of the fields that are maps (a null under a Python name
    is an unknown field in a document, as at the API server)."""
    names: set[str] = set()
    maps: set[str] = set()
    for name, info in cls.model_fields.items():
        both = {info.alias or name}
        names |= both
        if typing.get_origin(info.annotation) is dict or (
            typing.get_origin(info.annotation) is Annotated
            and typing.get_origin(typing.get_args(info.annotation)[0]) is dict
        ):
            maps |= both
    return frozenset(names), frozenset(maps)


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()



# ---------------------------------------------------------------------------------------------
# Free-form maps with keys poolpilot owns


def spellings(camel: str) -> list[str]:
    """A key as camelCase, snake_case and kebab-case (the spellings the launcher reads)."""
    snake = _snake(camel)
    return list(dict.fromkeys([camel, snake, snake.replace("_", "-")]))


def _reserved_by_spelling(reserved: dict[str, str]) -> dict[str, str]:
    return {s: source for camel, source in reserved.items() for s in spellings(camel)}


def _reserved_schema(reserved: dict[str, str], extra: dict[str, Any] | None = None) -> Any:
    """A free-form map whose reserved keys are declared properties that always fail: the only
    way an API server can refuse keys of a map whose values have no schema (CEL cannot see
    such a map)."""
    properties: dict[str, Any] = {
        key: {
            "x-kubernetes-int-or-string": True,
            "description": f"Set by poolpilot {source}; not allowed here.",
            "x-kubernetes-validations": [
                {"rule": "false", "message": f"set by poolpilot {source}; remove it"}
            ],
        }
        for key, source in _reserved_by_spelling(reserved).items()
    }
    properties.update(extra or {})
    return {"type": "object", "x-kubernetes-preserve-unknown-fields": True,
            "properties": properties}


def _refuse_reserved(reserved: dict[str, str]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    by_spelling = _reserved_by_spelling(reserved)

    def check(value: dict[str, Any]) -> dict[str, Any]:
        found = {k: f"set by poolpilot {by_spelling[k]}; remove it"
                 for k in value if k in by_spelling}
        if found:
            raise PydanticCustomError(
                "reserved", "{problems}",
                {"problems": "; ".join(f"{k}: {why}" for k, why in found.items()),
                 "keys": found},
            )
        return value

    return check


@dataclass(frozen=True)
class ReservedKeys:
    """Annotation for a map of any JSON values whose `reserved` keys (camelCase -> where the
    value comes from instead) are refused in every spelling; `properties` declares more known
    keys in the CRD."""

    reserved: dict[str, str]
    properties: dict[str, Any] | None = None

    def __hash__(self) -> int:
        return hash(tuple(self.reserved))

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> Any:
        return core_schema.no_info_after_validator_function(
            _refuse_reserved(self.reserved), handler(source)
        )

    def __get_pydantic_json_schema__(self, schema: Any, handler: GetJsonSchemaHandler) -> Any:
        return _reserved_schema(self.reserved, self.properties)

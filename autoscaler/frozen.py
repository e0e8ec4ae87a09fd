"""`replace` for the decision core's frozen dataclasses, without `dataclasses.replace`'s cost.

`dataclasses.replace` builds a keyword dict of every field and runs `__init__` again: at
1,000 pools the core made ~11 such copies per pool and cycle, 15% of a cycle's CPU.
The core's records have no `__post_init__`, no `InitVar` and no `init=False` field, so a copy
of the instance's `__dict__` with the changes laid over it is the same object `replace`
would build. Unknown names are refused as `replace` refuses them.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

T = TypeVar("T")


_FIELDS: dict[type, frozenset[str]] = {}


def _fields(cls: type) -> frozenset[str]:
    known = _FIELDS.get(cls)
    if known is None:
        if not dataclasses.is_dataclass(cls) or hasattr(cls, "__post_init__") or hasattr(
                cls, "__slots__"):
            raise TypeError(f"{cls.__name__}: not a plain dataclass; use dataclasses.replace")
        known = _FIELDS[cls] = frozenset(f.name for f in dataclasses.fields(cls))
    return known


def replace(obj: T, /, **changes: Any) -> T:
    """`dataclasses.replace(obj, **changes)` for a plain (frozen) dataclass instance."""
    cls = type(obj)
    unknown = changes.keys() - _fields(cls)
    if unknown:
        raise TypeError(f"{cls.__name__} has no field {', '.join(sorted(unknown))}")
    new = object.__new__(cls)
    # A frozen dataclass refuses setattr, not an update of its __dict__.
    new.__dict__.update(obj.__dict__)
    new.__dict__.update(changes)
    return new

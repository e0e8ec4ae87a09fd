"""Regular expressions with the Kubernetes API server's semantics (Go's RE2), in Python.

OpenAPI `pattern` and CEL `matches()` are evaluated by Go, where `$` means the end of the
text. In Python `$` also matches before a trailing newline, so `^[a-z]+$` would accept "abc\n"
here and not in a cluster. Every pattern the API declares is checked through `search`, which
makes `$` mean the end of the text. The patterns themselves stay plain RE2 (no lookarounds, no
backreferences) so the generated CRD carries them unchanged.
"""

from __future__ import annotations

import functools
import re


@functools.lru_cache(maxsize=512)
def compile_re2(pattern: str) -> re.Pattern[str]:
    """Compile `pattern`, turning each unescaped `$` outside a character class into `\\Z`."""
    out: list[str] = []
    in_class = escaped = False
    for ch in pattern:
        if escaped:
            out.append(ch)
            escaped = False
        elif ch == "\\":
            out.append(ch)
            escaped = True
        elif in_class:
            out.append(ch)
            in_class = ch != "]"
        elif ch == "[":
            out.append(ch)
            in_class = True
        elif ch == "$":
            out.append(r"\Z")
        else:
            out.append(ch)
    return re.compile("".join(out))


def search(pattern: str, text: str) -> bool:
    """True when `pattern` matches somewhere in `text`, as Go's regexp.MatchString decides."""
    return compile_re2(pattern).search(text) is not None

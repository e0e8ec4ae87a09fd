"""`KEY=VALUE` label arguments (`--monitor-label release=kube-prometheus-stack`), checked with
Kubernetes' own rules so a typo fails at start-up, not as a 422 on every monitor."""

from __future__ import annotations

import re

# A qualified name: optional DNS-subdomain prefix and '/', then 1-63 of [A-Za-z0-9-_.],
# alphanumeric at both ends. Values: the same 63 characters, or empty.
_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_PREFIX = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_KEY = re.compile(rf"^({_PREFIX}/)?{_NAME}$")
_VALUE = re.compile(rf"^({_NAME})?$")


def parse(text: str) -> tuple[str, str]:
    """'release=kps' -> ('release', 'kps'); ValueError saying what is wrong."""
    key, sep, value = text.partition("=")
    if not sep:
        raise ValueError(f"{text!r}: expected KEY=VALUE")
    prefix = key.rpartition("/")[0]
    if not _KEY.match(key) or len(prefix) > 253:
        raise ValueError(f"{text!r}: {key!r} is not a valid label key (an optional DNS prefix "
                         "and '/', then up to 63 letters, digits, '-', '_' or '.')")
    if not _VALUE.match(value):
        raise ValueError(f"{text!r}: {value!r} is not a valid label value (up to 63 letters, "
                         "digits, '-', '_' or '.', alphanumeric at both ends)")
    return key, value


def parse_all(texts: list[str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(dict(parse(t) for t in texts).items()))

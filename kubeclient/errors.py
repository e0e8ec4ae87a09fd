"""One error for every failed API call, and one rule for whether retrying it can help.

Transient: the same request may succeed later without anyone acting — no answer at all
(timeouts, refused or dropped connections: status 0), 408, 409 (a conflict: read again and
retry), 425, 429 (throttled), 500, 502, 503, 504. Permanent: everything else — 400, 401, 403
(RBAC, or a ResourceQuota: "exceeded quota"), 404 on a write, 405, 415, 422 (the server
refused the object) — which a person has to fix, so callers report them instead of retrying
at full speed.
"""

from __future__ import annotations

import json
from typing import Any

TRANSIENT_STATUSES = frozenset({0, 408, 409, 425, 429, 500, 502, 503, 504})


class ApiError(Exception):
    """A failed request: HTTP status (0 when no answer came), the API's reason and message."""

    def __init__(self, status: int, message: str, reason: str = "", *, method: str = "",
                 path: str = "", retry_after: float | None = None) -> None:
        where = f"{method} {path}: " if method else ""
        super().__init__(f"{where}HTTP {status}{' ' + reason if reason else ''}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.method = method
        self.path = path
        self.retry_after = retry_after
        self.what = ""  # what the caller was doing ("apply Deployment/x"), set by callers

    def about(self) -> str:
        """The API's message, prefixed with what was being done when known."""
        return f"{self.what}: {self.message}" if self.what else self.message

    @property
    def transient(self) -> bool:
        return is_transient(self.status)

    @property
    def permanent(self) -> bool:
        return not self.transient


def is_transient(status: int) -> bool:
    return status in TRANSIENT_STATUSES


def from_body(status: int, body: bytes | str | None, *, method: str = "", path: str = "",
              retry_after: str | None = None) -> ApiError:
    """An ApiError from a response body (a metav1.Status when the API server wrote it)."""
    raw = body.decode(errors="replace") if isinstance(body, bytes) else (body or "")
    message, reason = raw[:500], ""
    try:
        data: Any = json.loads(raw) if raw else {}
    except ValueError:
        data = None
    if isinstance(data, dict):
        message = str(data.get("message") or message)
        reason = str(data.get("reason") or "")
    after: float | None = None
    if retry_after:
        try:
            after = float(retry_after)
        except ValueError:
            after = None
    return ApiError(status, message or f"HTTP {status}", reason, method=method, path=path,
                    retry_after=after)

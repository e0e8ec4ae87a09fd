"""API errors shaped as metav1.Status, as a real kube-apiserver returns them."""

from __future__ import annotations

from typing import Any

REASONS = {
    400: "BadRequest",
    404: "NotFound",
    405: "MethodNotAllowed",
    406: "NotAcceptable",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


class ApiError(Exception):
    """An error answered as a `Status` object with `code`, `reason` and `details`."""

    def __init__(
        self,
        code: int,
        message: str,
        reason: str | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason or REASONS.get(code, "Unknown")
        self.details = details

    def status(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details is not None:
            body["details"] = self.details
        return body


def not_found(resource: str, name: str, group: str = "", kind: str = "") -> ApiError:
    qualified = f"{resource}.{group}" if group else resource
    return ApiError(
        404,
        f'{qualified} "{name}" not found',
        "NotFound",
        {"name": name, "group": group, "kind": resource},
    )


def already_exists(resource: str, name: str, group: str = "") -> ApiError:
    qualified = f"{resource}.{group}" if group else resource
    return ApiError(
        409,
        f'{qualified} "{name}" already exists',
        "AlreadyExists",
        {"name": name, "group": group, "kind": resource},
    )


def conflict(resource: str, name: str, group: str = "", why: str = "") -> ApiError:
    qualified = f"{resource}.{group}" if group else resource
    why = why or (
        "the object has been modified; please apply your changes to the latest version and "
        "try again"
    )
    return ApiError(
        409,
        f'Operation cannot be fulfilled on {qualified} "{name}": {why}',
        "Conflict",
        {"name": name, "group": group, "kind": resource},
    )


def invalid(kind: str, group: str, name: str, causes: list[tuple[str, str]]) -> ApiError:
    """422 Invalid; causes are (field, message) pairs, e.g. ('spec.decode.maxReplicas', ...)."""
    qualified = f"{kind}.{group}" if group else kind
    text = "; ".join(f"{field}: {msg}" if field else msg for field, msg in causes)
    return ApiError(
        422,
        f'{qualified} "{name}" is invalid: {text}',
        "Invalid",
        {
            "name": name,
            "group": group,
            "kind": kind,
            "causes": [
                {"reason": "FieldValueInvalid", "message": msg, "field": field}
                for field, msg in causes
            ],
        },
    )


def too_large(limit: int) -> ApiError:
    """The API server's answer to a body above its limit (3 MiB)."""
    return ApiError(413, f"Request entity too large: limit is {limit}", "RequestEntityTooLarge")


def bad_request(message: str) -> ApiError:
    return ApiError(400, message, "BadRequest")


def gone(message: str) -> ApiError:
    return ApiError(410, message, "Expired")

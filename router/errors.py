"""What goes wrong on the way to an engine, and every error the router answers itself, in
OpenAI's shape (`{"error": {message, type, param, code}}`, as vLLM sends it)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp import web

log = logging.getLogger("poolpilot.router")


NO_ENDPOINT = "-"  # UpstreamError.url when no endpoint of the role could be tried


class UpstreamError(Exception):
    """An engine failed before its response started (safe to retry elsewhere)."""

    def __init__(self, url: str, status: int, message: str) -> None:
        super().__init__(f"{url}: {message}")
        self.url = url
        self.status = status
        self.message = message


# Why a handoff failed (HandoffFailed.cause), which decides what the decode engine is charged.
DECODE_FAILED = "decode_failed"  # on its own: no answer, a 502/503/504, a broken connection
# Its status line came but no first token by the deadline: it may still be pulling from a
# prefill engine that is gone (vLLM gives up after ~10 s), or be hung. Charged, but neither
# that nor what was counted while it pulled ejects the role's last admitted engine, which the
# local prefill may then use.
KV_PULL_SLOW = "kv_pull_slow"
# It answered that its KV load failed (vLLM: a 500, or an error as the stream's first event):
# the prefill's side failed, and it is alive. Not charged, and the failures counted while it
# pulled are forgiven (vLLM can stall its health checks for seconds during such a pull).
KV_LOAD_FAILED = "kv_load_failed"


class HandoffFailed(Exception):
    """The decode step failed after a successful prefill and nothing reached the client yet:
    the request can still be served by prefilling it on a decode engine. `cause`: one of
    DECODE_FAILED, KV_PULL_SLOW, KV_LOAD_FAILED."""

    def __init__(self, error: UpstreamError, cause: str = DECODE_FAILED) -> None:
        super().__init__(str(error))
        self.error = error
        self.cause = cause


class ClientError(Exception):
    """The request is wrong; the engine's 4xx answer is passed back as is."""

    def __init__(self, status: int, body: bytes, content_type: str) -> None:
        super().__init__(status)
        self.status = status
        self.body = body
        self.content_type = content_type


def error_body(status: int, message: str, kind: str, param: str | None = None) -> dict[str, Any]:
    # The shape OpenAI clients parse (and vLLM sends).
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


def json_error(status: int, message: str, kind: str = "router_error",
               param: str | None = None, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response(error_body(status, message, kind, param), status=status,
                             headers=headers)


ERROR_KINDS = {400: "invalid_request_error", 401: "invalid_request_error",
               404: "invalid_request_error", 405: "invalid_request_error",
               413: "invalid_request_error", 429: "rate_limit_error"}


@web.middleware
async def openai_errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """Every error the router itself answers in OpenAI's shape: unknown paths and methods,
    oversized bodies, and a bug's 500 (logged with its traceback)."""
    try:
        response: web.StreamResponse = await handler(request)
        return response
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        if exc.status == 404:
            message = f"Invalid URL ({request.method} {request.path})"
        elif exc.status == 405:
            message = f"Method {request.method} is not allowed for {request.path}"
        else:
            message = exc.reason
        headers = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
        return json_error(exc.status, message, ERROR_KINDS.get(exc.status, "router_error"),
                          headers=headers)
    except (asyncio.CancelledError, ConnectionError):
        raise
    except Exception:
        log.exception("unexpected error serving %s %s", request.method, request.path)
        return json_error(500, "internal router error", "internal_error")

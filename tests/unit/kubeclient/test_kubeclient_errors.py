"""One error mapping for every component: which API failures are worth retrying as is."""

from __future__ import annotations

import json

import pytest
from poolpilot.kubeclient import ApiError
from poolpilot.kubeclient.errors import from_body

CASES = [
    (0, True, "no-answer"),
    (408, True, "request-timeout"),
    (409, True, "conflict-read-again"),
    (429, True, "throttled"),
    (500, True, "internal"),
    (503, True, "unavailable"),
    (504, True, "gateway-timeout"),
    (400, False, "bad-request"),
    (401, False, "unauthorized"),
    (403, False, "forbidden-or-quota"),
    (404, False, "not-found"),
    (410, False, "gone-relist"),
    (422, False, "invalid"),
]


@pytest.mark.parametrize("status,transient", [c[:2] for c in CASES], ids=[c[2] for c in CASES])
def test_transient_or_permanent(status: int, transient: bool) -> None:
    err = ApiError(status, "m")
    assert err.transient is transient
    assert err.permanent is not transient


def test_status_body_gives_message_reason_and_retry_after() -> None:
    body = json.dumps({"kind": "Status", "code": 403, "reason": "Forbidden",
                       "message": 'deployments.apps "x" is forbidden: exceeded quota: gpus'})
    err = from_body(403, body.encode(), method="PATCH", path="/apis/apps/v1/x",
                    retry_after="7")
    assert (err.status, err.reason, err.retry_after) == (403, "Forbidden", 7.0)
    assert "exceeded quota: gpus" in err.message
    assert str(err).startswith("PATCH /apis/apps/v1/x: HTTP 403 Forbidden: ")


def test_non_json_body_is_kept_as_the_message() -> None:
    err = from_body(502, b"<html>bad gateway</html>")
    assert err.message == "<html>bad gateway</html>" and err.transient


def test_what_prefixes_the_message() -> None:
    err = ApiError(422, "spec.replicas: Invalid value")
    err.what = "apply Deployment/p-decode"
    assert err.about() == "apply Deployment/p-decode: spec.replicas: Invalid value"

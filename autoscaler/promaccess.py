"""How the autoscaler reaches a Prometheus that is not an open HTTP port on the cluster network:
TLS with a private CA (verification is on unless switched off), a client certificate, a bearer
token read from a file (re-read when the file changes: projected ServiceAccount tokens and
Secret mounts rotate), basic auth with the password in a file, and fixed headers (Mimir's and
Cortex's `X-Scope-OrgID`, a proxy's own header).

    access = PrometheusAccess(ca_file="/etc/prometheus-ca/ca.crt",
                              bearer_token_file="/var/run/secrets/prometheus/token")
    session, auth, headers = access.session(), access.auth(), access.headers
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import requests
from requests.auth import AuthBase, _basic_auth_str


class AccessError(ValueError):
    """A Prometheus access option that cannot work; the message names the option."""


@dataclass(frozen=True)
class PrometheusAccess:
    ca_file: str | None = None  # PEM bundle that signs Prometheus' certificate
    insecure_skip_verify: bool = False
    cert_file: str | None = None  # client certificate (mutual TLS)
    key_file: str | None = None
    bearer_token_file: str | None = None
    username: str | None = None  # basic auth; the password comes from password_file
    password_file: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def check(self) -> None:
        """Raise AccessError for options that contradict each other or name missing files."""
        if self.bearer_token_file and self.username:
            raise AccessError("--prometheus-bearer-token-file and --prometheus-username: "
                              "choose one way to authenticate")
        if bool(self.username) != bool(self.password_file):
            raise AccessError("--prometheus-username needs --prometheus-password-file (and "
                              "the reverse)")
        if bool(self.cert_file) != bool(self.key_file):
            raise AccessError("--prometheus-cert-file needs --prometheus-key-file (and the "
                              "reverse)")
        if self.ca_file and self.insecure_skip_verify:
            raise AccessError("--prometheus-ca-file and --prometheus-insecure-skip-verify: "
                              "choose one")
        if "authorization" in {k.lower() for k in self.headers} and (
                self.bearer_token_file or self.username):
            raise AccessError("an Authorization --prometheus-header and a token or password: "
                              "choose one")
        for flag, path in (("--prometheus-ca-file", self.ca_file),
                           ("--prometheus-cert-file", self.cert_file),
                           ("--prometheus-key-file", self.key_file),
                           ("--prometheus-bearer-token-file", self.bearer_token_file),
                           ("--prometheus-password-file", self.password_file)):
            if path and not Path(path).is_file():
                raise AccessError(f"{flag} {path}: no such file")

    def session(self) -> requests.Session:
        session = requests.Session()
        session.verify = False if self.insecure_skip_verify else (self.ca_file or True)
        if self.cert_file and self.key_file:
            session.cert = (self.cert_file, self.key_file)
        return session

    def auth(self) -> AuthBase | None:
        if self.bearer_token_file:
            return FileAuth(self.bearer_token_file, lambda s: f"Bearer {s}")
        if self.username and self.password_file:
            user = self.username
            return FileAuth(self.password_file, lambda s: _basic_auth_str(user, s))
        return None


class FileAuth(AuthBase):
    """Sets Authorization from a secret file, read again whenever the file changes (another
    inode, as kubelet's atomic swap of a projected token or Secret gives, or another
    modification time or size), so a rotated token is used from the next query on."""

    def __init__(self, path: str, header: Callable[[str], str]) -> None:
        self.path = path
        self._header = header
        self._lock = threading.Lock()
        self._seen: tuple[int, int, int] | None = None
        self._value = ""

    def value(self) -> str:
        st = os.stat(self.path)
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        with self._lock:
            if key != self._seen:
                secret = Path(self.path).read_text().strip()
                self._value = self._header(secret)
                self._seen = key
            return self._value

    def __call__(self, r: requests.PreparedRequest) -> requests.PreparedRequest:
        r.headers["Authorization"] = self.value()
        return r


def parse_header(text: str) -> tuple[str, str]:
    """'X-Scope-OrgID: team-a' -> ('X-Scope-OrgID', 'team-a')."""
    name, sep, value = text.partition(":")
    name, value = name.strip(), value.strip()
    if not sep or not name or any(c in name for c in " \t\r\n") or "\n" in value:
        raise AccessError(f"--prometheus-header {text!r}: expected 'Name: value'")
    return name, value

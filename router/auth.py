"""API keys for the router's OpenAI endpoints (`Authorization: Bearer KEY`), like vLLM's
`--api-key`: from `--api-key` / `$POOLPILOT_ROUTER_API_KEY`, and from a file of keys, one per
line (a mounted Kubernetes Secret: the operator mounts `spec.router.apiKeySecret` there).

The file is re-read when it changes (checked at most every `reload_s`), so a rotated Secret
takes effect without a restart; while the new file cannot be read the old keys stay.
Comparison is constant-time per key (hmac.compare_digest)."""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import time
from collections.abc import Callable, Iterable

log = logging.getLogger("poolpilot.router")


class KeyFileError(ValueError):
    pass


def read_keys(path: str) -> list[str]:
    """The keys in a file: one per line, blank lines and `#` comments ignored."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise KeyFileError(f"--api-key-file {path}: cannot read it ({exc})") from exc
    keys = [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
    if not keys:
        raise KeyFileError(f"--api-key-file {path}: holds no key (one per line)")
    return keys


class ApiKeys:
    def __init__(self, keys: Iterable[str] = (), path: str | None = None,
                 reload_s: float = 5.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.static = [k for k in keys if k]
        self.path = path
        self.reload_s = reload_s
        self.clock = clock
        self._file_keys: list[str] = read_keys(path) if path else []
        self._stamp = self._file_stamp()
        self._checked = clock()

    @property
    def enabled(self) -> bool:
        return bool(self.static or self.path)

    def _file_stamp(self) -> tuple[float, int] | None:
        if not self.path:
            return None
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_mtime, st.st_size

    def _maybe_reload(self) -> None:
        now = self.clock()
        if not self.path or now - self._checked < self.reload_s:
            return
        self._checked = now
        stamp = self._file_stamp()
        if stamp is None or stamp == self._stamp:
            return
        try:
            self._file_keys = read_keys(self.path)
            self._stamp = stamp
            log.info("API keys reloaded from %s (%d keys)", self.path, len(self._file_keys))
        except KeyFileError as exc:
            log.warning("%s; keeping the previous keys", exc)

    def client(self, authorization: str | None) -> str | None:
        """The client's identity (a digest of its key) if the header carries a valid key."""
        self._maybe_reload()
        scheme, _, token = (authorization or "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return None
        # aiohttp keeps a header's non-UTF-8 bytes as surrogates: such a key is simply wrong
        # (a 401), never an encoding error.
        try:
            given = token.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            return None
        ok = False
        for key in (*self.static, *self._file_keys):
            ok |= hmac.compare_digest(given, key.encode())
        if not ok:
            return None
        return "key:" + hashlib.sha256(given).hexdigest()[:12]

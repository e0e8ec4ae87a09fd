"""Headless Chromium (Debian's `chromium`, installed by ./dev setup) for the e2e suite, driven
over the DevTools protocol: one browser for several pages, each read once its scripts drew
what the test waits for (no fixed wait)."""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

# As root, on a machine without a display or outside network: no sandbox, no GPU, and none of
# Chromium's own background connections (refused here, many at a time).
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]

# The series in the legend of Prometheus's classic graph page, one text per series:
# {namespace="sandbox",pool="demo",role="prefill"}.
LEGEND_JS = ("JSON.stringify(Array.from(document.querySelectorAll('.rickshaw_legend .label'))"
             ".map(e => e.textContent))")
PAIR = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def chromium() -> str:
    found = shutil.which("chromium")
    if found is None:
        raise AssertionError("chromium is not installed; run ./dev setup (it installs Debian's "
                             "chromium package)")
    return found


class _DevTools:
    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.ids = itertools.count(1)

    async def call(self, method: str, session: str | None = None,
                   **params: Any) -> dict[str, Any]:
        msg_id = next(self.ids)
        msg: dict[str, Any] = {"id": msg_id, "method": method, "params": params}
        if session:
            msg["sessionId"] = session
        await self.ws.send_json(msg)
        while True:  # events and other replies are skipped: one call at a time
            reply = await self.ws.receive_json(timeout=60)
            if reply.get("id") == msg_id:
                if "error" in reply:
                    raise AssertionError(f"chromium: {method}: {reply['error']}")
                result: dict[str, Any] = reply["result"]
                return result


async def _legends(urls: list[str], timeout: float) -> list[list[dict[str, str]]]:
    # Chromium's helper processes can still write to the profile as the main one exits;
    # a profile left behind in /tmp is harmless, a failed test for it is not.
    with tempfile.TemporaryDirectory(prefix="pp-chromium-", ignore_cleanup_errors=True) as profile:
        proc = subprocess.Popen(
            [chromium(), *FLAGS, f"--user-data-dir={profile}", "--remote-debugging-port=0",
             "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            active = Path(profile) / "DevToolsActivePort"
            deadline = time.monotonic() + 60
            while not active.exists() or len(active.read_text().splitlines()) < 2:
                if proc.poll() is not None or time.monotonic() > deadline:
                    err = proc.stderr.read().decode() if proc.stderr else ""
                    raise AssertionError(f"chromium did not start: {err[-2000:]}")
                await asyncio.sleep(0.1)
            port, path = active.read_text().splitlines()[:2]
            async with aiohttp.ClientSession() as http, \
                    http.ws_connect(f"ws://127.0.0.1:{port}{path}", max_msg_size=0) as ws:
                cdp = _DevTools(ws)
                sessions = []
                for url in urls:
                    target = await cdp.call("Target.createTarget", url=url)
                    attached = await cdp.call("Target.attachToTarget",
                                              targetId=target["targetId"], flatten=True)
                    sessions.append(attached["sessionId"])
                return [await _read_legend(cdp, s, timeout) for s in sessions]
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def _read_legend(cdp: _DevTools, session: str, timeout: float) -> list[dict[str, str]]:
    """The legend once the graph drew it (or empty after `timeout`)."""
    deadline = time.monotonic() + timeout
    while True:
        got = await cdp.call("Runtime.evaluate", session, expression=LEGEND_JS,
                             returnByValue=True)
        texts = json.loads(got["result"].get("value") or "[]")
        if texts or time.monotonic() > deadline:
            return [dict(PAIR.findall(t)) for t in texts]
        await asyncio.sleep(0.2)


def graph_series(urls: list[str], timeout: float = 30) -> list[list[dict[str, str]]]:
    """Per URL of Prometheus's classic graph page: the label sets of the series its graph
    drew, read from the legend in one headless Chromium."""
    return asyncio.run(_legends(urls, timeout))

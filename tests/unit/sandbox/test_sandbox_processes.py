"""Process groups and pod addresses: everything the sandbox starts is stopped, descendants
included, and a pod never gets an address whose port another program holds."""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path

import pytest
from poolpilot.emulator.cluster.kubelet import AddressPool
from poolpilot.emulator.cluster.processes import ProcessTable
from poolpilot.sandbox.supervisor import SandboxError, check_port
from poolpilot.testkit.prometheus import free_port

# A parent that starts a grandchild and ignores SIGTERM: only the group kill ends both.
STUBBORN = """
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print(child.pid, flush=True)
time.sleep(60)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is gone for our purposes.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_stop_all_kills_the_whole_group(tmp_path: Path) -> None:
    table = ProcessTable(tmp_path)
    child = table.start("stubborn", [sys.executable, "-c", STUBBORN])
    deadline = time.monotonic() + 20
    while not child.log_path.read_text().strip() and time.monotonic() < deadline:
        time.sleep(0.05)
    grandchild = int(child.log_path.read_text().split()[0])
    assert _alive(child.pid) and _alive(grandchild)
    table.stop_all(grace=0.5)
    deadline = time.monotonic() + 10
    while (_alive(child.pid) or _alive(grandchild)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child.pid)
    assert not _alive(grandchild)
    assert table.children == {}


def test_address_pool_skips_taken_ports_and_never_reuses_early() -> None:
    pool = AddressPool(second_octet=0)
    with socket.socket() as s:
        s.bind(("127.0.0.2", 0))
        port = s.getsockname()[1]
        s.listen()
        first = pool.allocate([port])
    assert first == "127.0.0.3"  # 127.0.0.2 has the port taken
    pool.release(first)
    assert pool.allocate([port]) == "127.0.0.4"  # released addresses wait for the wrap


def test_two_sandboxes_draw_different_address_ranges() -> None:
    octets = {AddressPool().octet for _ in range(20)}
    assert len(octets) > 1 and all(1 <= o <= 254 for o in octets)
    ip = AddressPool(second_octet=42).allocate([free_port()])
    assert ip == "127.42.0.2"


def test_taken_port_is_a_clear_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(SandboxError, match=f"port {port} on 127.0.0.1 is taken.*--api-port 0"):
            check_port("127.0.0.1", port, "--api-port")
    check_port("127.0.0.1", 0, "--api-port")  # 0: a free port is picked, nothing to check


def test_free_ports_come_from_below_the_ephemeral_range_and_skip_taken_ones(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An outgoing connection takes its local port from the kernel's ephemeral range: a port
    handed out from there could be taken before the server binds it (a CI run lost the
    sandbox's operator to 'address already in use')."""
    from poolpilot.testkit import prometheus

    lo, _ = prometheus.ephemeral_ports()
    ports = {free_port() for _ in range(50)}
    assert all(prometheus.LOWEST_FREE_PORT <= p < lo for p in ports), ports
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", next(iter(ports))))
        taken.listen()
        # every pick lands on the taken port first: it is skipped, the next one is free
        picks = iter([taken.getsockname()[1], taken.getsockname()[1] + 1])
        monkeypatch.setattr(prometheus.random.SystemRandom, "randrange",
                            lambda self, a, b: next(picks))
        assert free_port() == taken.getsockname()[1] + 1

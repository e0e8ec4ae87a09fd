"""`poolpilot router --workers N`: N router processes sharing one port (SO_REUSEPORT).

One Python process relays every streamed chunk of every request on one core; with N workers
the kernel spreads new connections over N listening sockets bound to the same port, each in
its own process with its own event loop. The parent reserves the port (a bound, never
listening socket, so `--port 0` works and no connection can land on it), forks the workers,
prints the usual `listening on` line once all of them listen, forwards SIGTERM/SIGINT (each
worker drains its own streams) and exits when they have; a worker that dies takes the others
down with it (exit 1), so Kubernetes restarts the pod instead of serving at a fraction of its
capacity.

State, partitioned: each worker balances its own in-flight requests over the engines (the
engines' scraped queue depths, which every worker reads, are the shared part), and the
local-prefill rule scales its own in-flight prompt tokens by N (connections are spread
evenly) unless an engine's own queue says more. Metrics are shared: prometheus_client's
multiprocess mode (one mmap file per worker in a private folder) and every worker's /metrics
serves the sum. Health checks and discovery watches run in every worker.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import tempfile
from collections.abc import Callable
from contextlib import suppress

log = logging.getLogger("poolpilot.router")


def reserve_port(host: str, port: int) -> socket.socket:
    """A socket bound to (host, port) with SO_REUSEPORT and never listening: it holds the port
    for the workers' sockets without taking a share of the connections."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


def run_workers(n: int, host: str, port: int, worker: Callable[[int, int], int],
                on_ready: Callable[[int], None]) -> int:
    """Fork `n` processes running `worker(port, ready_fd)` (each writes one byte to ready_fd
    once it listens); return the exit code for the parent."""
    from prometheus_client import multiprocess, values

    folder = tempfile.mkdtemp(prefix="poolpilot-router-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = folder
    holder = reserve_port(host, port)
    port = holder.getsockname()[1]
    ready_r, ready_w = os.pipe()
    children: dict[int, int] = {}  # pid -> worker index
    for i in range(n):
        pid = os.fork()
        if pid == 0:  # the worker
            os.close(ready_r)
            holder.close()
            values.ValueClass = values.MultiProcessValue()  # metrics to this worker's file
            code = 1
            try:
                code = worker(port, ready_w)
            except BaseException:
                log.exception("router worker %d failed", i)
            finally:
                os._exit(code)
        children[pid] = i
    os.close(ready_w)
    stopping = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True
        for pid in children:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    ready = 0
    while ready < n:
        data = os.read(ready_r, n - ready)
        if not data:
            break  # a worker exited before it listened
        ready += len(data)
    os.close(ready_r)
    holder.close()
    if ready == n:
        on_ready(port)
    else:
        stop(signal.SIGTERM, None)
    code = 0 if ready == n else 1
    while children:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            break
        index = children.pop(pid, None)
        if index is None:
            continue
        multiprocess.mark_process_dead(pid)
        exit_code = os.waitstatus_to_exitcode(status)
        if not stopping:
            log.error("router worker %d (pid %d) exited with %d: stopping the others",
                      index, pid, exit_code)
            stop(signal.SIGTERM, None)
            code = 1
        code = max(code, exit_code if exit_code > 0 else 0)
    shutil.rmtree(folder, ignore_errors=True)
    return code

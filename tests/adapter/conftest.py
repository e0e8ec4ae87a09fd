"""The adapter tier's shared real-vLLM-CPU engines, and the order that lets modules share them.

`pod_engines` (session scope): the engines of the modules in POD_ENGINE_MODULES, each vLLM in
an operator pod's filesystem (a private mount namespace), start together, one per core, when
the first of them is asked for: two starts in the time of one (about 90 s each on two cores).
Each module's `start_engine(tmp_path, cpu)` builds its pod; its test stops its engine.

`shared_vllm` (session scope) is two aggregated engines, one per core, started on first use
(router_support.SharedEngines). The modules below use them back to back, in this order, so
each engine starts once: the metrics-port module starts the first, the KV-events module the
second, and the last two modules end them (SIGTERM is what they test). The engines are
stopped after the last test that uses them, whatever the selection. test_vllm_router.py keeps
its own aggregated engine, stopped before its P/D pairs start: an idle shared engine beside a
P/D pair (three engines on two cores) once coincided with first NIXL handoffs that outlasted
the prefill's 25 s KV lease.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from router_support import SharedEngines

SHARED_ORDER = [
    "test_vllm_metrics_port.py",
    "test_vllm_kv_events.py",
    "test_vllm_drain_under_load.py",  # takes the engine on core 1 (its victim)
    "test_vllm_drain.py",  # takes the engine on core 0
]
SHARED = pytest.StashKey[SharedEngines]()
LAST_USER = pytest.StashKey[str]()


@pytest.fixture(scope="session")
def shared_vllm(request: pytest.FixtureRequest,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedEngines]:
    engines = SharedEngines(tmp_path_factory.mktemp("shared-vllm"), "tiny-llama")
    request.config.stash[SHARED] = engines
    try:
        yield engines
    finally:
        engines.close()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The sharing modules' tests move, in SHARED_ORDER, to where the first of them was
    collected; every other test keeps its place."""
    def rank(item: pytest.Item) -> int:
        name = Path(str(item.fspath)).name
        here = Path(str(item.fspath)).resolve().parent == Path(__file__).resolve().parent
        return SHARED_ORDER.index(name) if here and name in SHARED_ORDER else -1

    sharing = [i for i in items if rank(i) >= 0]
    if sharing:
        first = items.index(sharing[0])
        rest = [i for i in items if rank(i) < 0]
        items[:] = [*rest[:first], *sorted(sharing, key=rank), *rest[first:]]
    users = [i for i in items if "shared_vllm" in getattr(i, "fixturenames", ())]
    if users:
        config.stash[LAST_USER] = users[-1].nodeid


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    """Stop the shared engines once the last test using them is done (each holds about
    3.3 GiB; the tests after it start engines of their own)."""
    if item.nodeid == item.config.stash.get(LAST_USER, None):
        engines = item.config.stash.get(SHARED, None)
        if engines is not None:
            engines.close()


# Their tests are collected back to back (test_engine_r..., test_engine_s...).
POD_ENGINE_MODULES = ["test_engine_readonly_root", "test_engine_shared_model_cache"]


@pytest.fixture(scope="session")
def pod_engines(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
                ) -> Iterator[Callable[[str], Any]]:
    started: dict[str, Any] = {}

    def engine(module: str) -> Any:
        if not started:
            # Every one of those modules this session runs (not the others: a lone module
            # starts its engine alone).
            selected = {Path(str(i.fspath)).stem for i in request.session.items}
            for cpu, name in enumerate(m for m in POD_ENGINE_MODULES
                                       if m in selected or m == module):
                start = importlib.import_module(name).start_engine
                started[name] = start(tmp_path_factory.mktemp(name), cpu % 2)
        return started.pop(module)

    try:
        yield engine
    finally:
        for left in started.values():  # a module whose test was skipped or deselected
            left.stop()

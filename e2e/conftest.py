"""End-to-end suite: the whole system in the local sandbox (`poolpilot sandbox`'s machinery).

Every test asserts on what a user sees: Deployment replicas, the pool's status and Events
(through real kubectl against the emulated API), and the responses the OpenAI client gets.
The simulator scenarios share one sandbox (module scope) and one replayed burst; time runs
SPEED times faster, so windows and intervals in the pools are simulated seconds.

Against a real cluster (`pytest --kubeconfig FILE`) these scenarios do not apply as they are:
they start their own control plane, Prometheus and engines on this machine. They are skipped
there; the operator and autoscaler suites cover a real cluster.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

E2E = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if Path(str(item.fspath)).resolve().parent == E2E:
            item.add_marker(pytest.mark.e2e)
            if os.environ.get("KUBECONFIG_E2E"):
                item.add_marker(pytest.mark.skip(
                    reason="sandbox scenarios run their own control plane; not on a real cluster"))

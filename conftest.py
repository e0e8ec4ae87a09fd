"""Suite-wide options.

`--kubeconfig FILE` runs the cluster suites (operator, autoscaler loop, e2e where it makes
sense) against a real cluster instead of the in-process Kubernetes API emulator; it sets
KUBECONFIG_E2E, which poolpilot.testkit.cluster.cluster_from_env() reads.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

# No per-example deadline: a property is about values, not time, and a loaded machine (two
# pytest workers on two cores) made examples miss hypothesis's default 200 ms.
settings.register_profile("poolpilot", deadline=None)
settings.load_profile("poolpilot")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--kubeconfig",
        default=None,
        help="run cluster suites against this real cluster instead of the emulator",
    )


def pytest_configure(config: pytest.Config) -> None:
    kubeconfig = config.getoption("--kubeconfig")
    if kubeconfig:
        os.environ["KUBECONFIG_E2E"] = os.path.abspath(kubeconfig)


# Real vLLM on two CPU cores: these tests start engines and time NIXL handoffs, leases and
# drains on a machine whose scheduling they share with the router, the proxies and each
# other, and one in a few runs loses a race that a GPU node would not (a first KV pull past a
# 6 s lease, a stream that ended before the scale-down it should outlive). One retry each,
# these only: a real failure fails twice, and the log shows the first failure too.
VLLM_RERUNS = 1


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("vllm") is not None:
            item.add_marker(pytest.mark.flaky(reruns=VLLM_RERUNS, reruns_delay=5))


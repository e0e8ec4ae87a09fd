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

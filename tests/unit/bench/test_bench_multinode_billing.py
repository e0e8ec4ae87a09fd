"""A multi-node replica (a LeaderWorkerSet group) is billed for every pod's GPUs."""

from __future__ import annotations

import pytest
from poolpilot.bench.accounting import Ledger


@pytest.mark.parametrize("nodes,gpus,hours", [(1, 8, 8.0), (2, 8, 16.0), (4, 2, 8.0)],
                         ids=["one-node", "two-nodes-of-8", "four-nodes-of-2"])
def test_gpu_hours_per_replica_are_nodes_times_gpus(nodes: int, gpus: int,
                                                    hours: float) -> None:
    ledger = Ledger()
    span = ledger.request("decode", 0.0, 60.0, gpus, nodes=nodes)
    ledger.close(span, 3600.0)
    assert ledger.gpu_hours(7200.0) == pytest.approx(hours)
    assert ledger.gpu_hours(7200.0, role="prefill") == 0.0


def test_single_node_replicas_are_billed_as_before() -> None:
    ledger = Ledger()
    ledger.request("prefill", 0.0, 0.0, 4)
    assert ledger.gpu_hours(1800.0) == pytest.approx(2.0)

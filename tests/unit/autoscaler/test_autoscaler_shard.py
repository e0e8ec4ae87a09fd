"""Sharding: every pool is decided by exactly one of N autoscalers, whichever asks, and the
split is even enough that N shards each do about 1/N of the work."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st
from poolpilot.autoscaler.shard import Shard

NAMES = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?", fullmatch=True)


@given(NAMES, NAMES, st.integers(1, 16))
def test_exactly_one_shard_owns_each_pool(ns: str, name: str, total: int) -> None:
    owners = [i for i in range(total) if Shard(i, total).owns(ns, name)]
    assert len(owners) == 1


def test_one_shard_owns_everything() -> None:
    assert Shard().owns("any", "pool") and not Shard().split
    assert Shard().lease_name("poolpilot-autoscaler") == "poolpilot-autoscaler"
    assert Shard(2, 4).lease_name("poolpilot-autoscaler") == "poolpilot-autoscaler-2-of-4"


def test_the_split_is_even_and_the_same_in_another_process() -> None:
    pools = [(f"team-{i % 37}", f"pool-{i}") for i in range(10_000)]
    counts = Counter(next(i for i in range(4) if Shard(i, 4).owns(*p)) for p in pools)
    assert all(2_300 <= c <= 2_700 for c in counts.values()), counts
    # A fresh interpreter (another salt for str hashes) assigns the same shards.
    code = ("from poolpilot.autoscaler.shard import Shard; print(sum(Shard(1, 4).owns("
            "f'team-{i % 37}', f'pool-{i}') for i in range(10_000)))")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True, env={"PYTHONHASHSEED": "12345"})
    assert int(other.stdout) == counts[1]


@pytest.mark.parametrize(("index", "total"), [(0, 0), (2, 2), (-1, 3)])
def test_an_impossible_shard_is_refused(index: int, total: int) -> None:
    with pytest.raises(ValueError, match=r"the shard must be 0 \.\. total - 1"):
        Shard(index, total)

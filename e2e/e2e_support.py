"""Helpers shared by the e2e scenarios."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

BURST_POOL = Path(__file__).resolve().parent / "burst-pool.yaml"


def pool_manifest(name: str, edit: Callable[[dict[str, Any]], None] | None = None,
                  namespace: str = "e2e") -> dict[str, Any]:
    """The scenarios' pool (burst-pool.yaml here) under another name, optionally edited."""
    manifest: dict[str, Any] = yaml.safe_load(BURST_POOL.read_text())
    manifest["metadata"] = {"name": name, "namespace": namespace}
    if edit is not None:
        edit(manifest["spec"])
    return manifest


def write_pool(tmp: Path, manifest: dict[str, Any]) -> Path:
    path = tmp / f"{manifest['metadata']['name']}.yaml"
    path.write_text(yaml.safe_dump(manifest, sort_keys=False))
    return path

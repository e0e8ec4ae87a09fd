"""Run a suite against the emulator, or against a real cluster when given a kubeconfig.

    from poolpilot.testkit.cluster import cluster_from_env

    with cluster_from_env(tmp_path) as (kubeconfig, emu):
        ...  # emu is None on a real cluster: skip what needs emulator-only features (faults)

A real cluster is used when `kubeconfig=` is passed or KUBECONFIG_E2E is set (the path of a
kubeconfig, e.g. one `kind get kubeconfig` wrote); otherwise a fresh KubeEmulator runs.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from poolpilot.emulator.server import KubeEmulator

ENV = "KUBECONFIG_E2E"


def real_kubeconfig(explicit: str | Path | None = None) -> Path | None:
    """The real cluster's kubeconfig to test against, or None to use the emulator."""
    value = explicit or os.environ.get(ENV)
    if not value:
        return None
    path = Path(value).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"{ENV}={value}: no such kubeconfig file; unset {ENV} to test "
                                "against the emulator")
    return path


@contextlib.contextmanager
def cluster_from_env(workdir: str | Path | None = None, *, kubeconfig: str | Path | None = None,
                     namespace: str = "default",
                     **emulator_options: object) -> Iterator[tuple[Path, KubeEmulator | None]]:
    """Yield (kubeconfig path, emulator or None for a real cluster)."""
    real = real_kubeconfig(kubeconfig)
    if real is not None:
        yield real, None
        return
    with contextlib.ExitStack() as stack:
        if workdir is None:
            workdir = stack.enter_context(tempfile.TemporaryDirectory(prefix="kube-emu-"))
        emu = KubeEmulator(**emulator_options)  # type: ignore[arg-type]
        stack.enter_context(emu.running())
        path = emu.write_kubeconfig(Path(workdir) / "kubeconfig", namespace=namespace)
        yield path, emu

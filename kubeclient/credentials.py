"""Where a component finds its cluster: one order for every component.

1. an explicit kubeconfig (a --kubeconfig flag): the user said so;
2. in-cluster, when running in a pod (KUBERNETES_SERVICE_HOST is set and the ServiceAccount
   token is mounted): a pod's own identity is what its RBAC was written for;
3. $KUBECONFIG (one file or several joined with ':', merged as kubectl merges them);
4. ~/.kube/config.

`resolve` is pure apart from reading the environment and checking files, so the order is
tested without a cluster; `load` turns its answer into a kubernetes_asyncio Configuration.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from kubernetes_asyncio import client, config

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class NoCredentials(RuntimeError):
    """No source of credentials exists; the message lists what was tried."""


@dataclass(frozen=True)
class Source:
    """The credentials chosen: in-cluster, or a kubeconfig (path may join several with ':')."""

    in_cluster: bool
    kubeconfig: str | None = None
    why: str = ""
    service_account_dir: Path = SERVICE_ACCOUNT_DIR

    def describe(self) -> str:
        return "in-cluster ServiceAccount" if self.in_cluster else f"kubeconfig {self.kubeconfig}"


def resolve(
    kubeconfig: str | os.PathLike[str] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    service_account_dir: Path = SERVICE_ACCOUNT_DIR,
    home: Path | None = None,
) -> Source:
    """The credential source, in the order of the module docstring; NoCredentials if none."""
    env = os.environ if environ is None else environ
    if kubeconfig:
        path = Path(kubeconfig).expanduser()
        if not path.is_file():
            raise NoCredentials(f"--kubeconfig {kubeconfig}: no such file")
        return Source(False, str(path), "--kubeconfig")
    token = service_account_dir / "token"
    if env.get("KUBERNETES_SERVICE_HOST") and env.get("KUBERNETES_SERVICE_PORT") \
            and token.is_file():
        return Source(True, None, "running in a pod", service_account_dir)
    if env.get("KUBECONFIG"):
        paths = [p for p in env["KUBECONFIG"].split(os.pathsep) if p]
        present = [p for p in paths if Path(p).expanduser().is_file()]
        if not present:
            raise NoCredentials(f"KUBECONFIG={env['KUBECONFIG']}: no such file")
        return Source(False, os.pathsep.join(present), "$KUBECONFIG")
    default = (home or Path.home()) / ".kube" / "config"
    if default.is_file():
        return Source(False, str(default), "~/.kube/config")
    raise NoCredentials(
        "no cluster credentials: not running in a pod (no KUBERNETES_SERVICE_HOST and "
        f"ServiceAccount token), KUBECONFIG is not set and {default} does not exist; pass "
        "--kubeconfig FILE or set KUBECONFIG"
    )


async def load(source: Source) -> client.Configuration:
    """A kubernetes_asyncio Configuration for the source (tokens refresh as the library does)."""
    cfg = client.Configuration()
    try:
        if source.in_cluster:
            sa = source.service_account_dir
            config.load_incluster_config(client_configuration=cfg,
                                         token_filename=str(sa / "token"),
                                         cert_filename=str(sa / "ca.crt"))
        else:
            await config.load_kube_config(config_file=source.kubeconfig,
                                          client_configuration=cfg)
    except (config.ConfigException, OSError, ValueError) as exc:
        raise NoCredentials(f"{source.describe()}: {exc}") from exc
    return cfg

"""The one credential order every component uses: --kubeconfig, in-cluster, $KUBECONFIG,
~/.kube/config; and what each source becomes as a kubernetes_asyncio Configuration."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from poolpilot.kubeclient import NoCredentials, credentials

KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "http://127.0.0.1:{port}"}}]
users: [{name: u, user: {token: "t-{port}"}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


@dataclass(frozen=True)
class Case:
    id: str
    flag: str | None = None  # --kubeconfig (a name under tmp)
    pod: bool = False  # KUBERNETES_SERVICE_HOST/PORT set and the token mounted
    env: list[str] = field(default_factory=list)  # names joined into $KUBECONFIG
    home: bool = False  # ~/.kube/config exists
    token: bool = True  # the ServiceAccount token is mounted
    want: str | None = None  # "in-cluster", or the kubeconfig names joined with ':'
    error: str | None = None


CASES = [
    Case("flag-beats-everything", flag="flag.yaml", pod=True, env=["a.yaml"], home=True,
         want="flag.yaml"),
    Case("in-cluster-beats-env", pod=True, env=["a.yaml"], home=True, want="in-cluster"),
    Case("env-beats-home", env=["a.yaml"], home=True, want="a.yaml"),
    Case("env-several-files-missing-skipped", env=["a.yaml", "gone.yaml", "b.yaml"],
         want="a.yaml:b.yaml"),
    Case("home-last", home=True, want="home"),
    Case("pod-without-token-is-not-in-cluster", pod=True, home=True, token=False, want="home"),
    Case("nothing", error="no cluster credentials"),
    Case("flag-missing-file", flag="nope.yaml", pod=True, error="--kubeconfig"),
    Case("env-all-missing", env=["gone.yaml"], home=True, error="KUBECONFIG="),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_credential_order(case: Case, tmp_path: Path) -> None:
    for name in ("flag.yaml", "a.yaml", "b.yaml"):
        (tmp_path / name).write_text(KUBECONFIG.replace("{port}", "1"))
    sa = tmp_path / "sa"
    sa.mkdir()
    if case.token:
        (sa / "token").write_text("pod-token")
    home = tmp_path / "home"
    if case.home:
        (home / ".kube").mkdir(parents=True)
        (home / ".kube" / "config").write_text(KUBECONFIG.replace("{port}", "2"))
    environ = {}
    if case.pod:
        environ |= {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    if case.env:
        environ["KUBECONFIG"] = os.pathsep.join(str(tmp_path / n) for n in case.env)
    flag = str(tmp_path / case.flag) if case.flag else None
    if case.error:
        with pytest.raises(NoCredentials, match=case.error):
            credentials.resolve(flag, environ=environ, service_account_dir=sa, home=home)
        return
    got = credentials.resolve(flag, environ=environ, service_account_dir=sa, home=home)
    if case.want == "in-cluster":
        assert got.in_cluster and got.kubeconfig is None
    elif case.want == "home":
        assert got.kubeconfig == str(home / ".kube" / "config")
    else:
        assert case.want is not None
        assert got.kubeconfig == os.pathsep.join(str(tmp_path / n)
                                                 for n in case.want.split(":"))


async def test_in_cluster_source_loads_the_mounted_token_and_ca(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch
                                                                ) -> None:
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("pod-token")
    (sa / "ca.crt").write_text("not checked until a request is made")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    source = credentials.resolve(service_account_dir=sa)
    cfg = await credentials.load(source)
    assert cfg.host == "https://10.96.0.1:443"
    assert cfg.api_key["BearerToken"] == "Bearer pod-token"
    assert cfg.ssl_ca_cert == str(sa / "ca.crt")


async def test_merged_kubeconfig_uses_its_current_context(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(KUBECONFIG.replace("{port}", "7"))
    source = credentials.resolve(environ={"KUBECONFIG": str(tmp_path / "a.yaml")},
                                 home=tmp_path)
    cfg = await credentials.load(source)
    assert cfg.host == "http://127.0.0.1:7"
    assert cfg.api_key["BearerToken"] == "Bearer t-7"


async def test_a_broken_kubeconfig_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("apiVersion: v1\nkind: Config\ncontexts: []\n")
    source = credentials.resolve(tmp_path / "bad.yaml")
    with pytest.raises(NoCredentials, match=r"bad\.yaml"):
        await credentials.load(source)

"""The API server's proxy comes from the environment, resolved once at connect (not looked up
again in a thread for every request)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest
from poolpilot.kubeclient import KubeClient

KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://api.example:6443"}}]
users: [{name: u, user: {token: "t"}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""
PROXY_VARS = ("HTTPS_PROXY", "HTTP_PROXY", "NO_PROXY", "https_proxy", "http_proxy", "no_proxy",
              "ALL_PROXY", "all_proxy")


@dataclass(frozen=True)
class Case:
    id: str
    env: dict[str, str] = field(default_factory=dict)
    proxy: str | None = None
    proxy_header: str | None = None


CASES = [
    Case("no-proxy-variables"),
    Case("https-proxy", {"HTTPS_PROXY": "http://proxy.example:3128"}, "http://proxy.example:3128"),
    Case("credentials-in-the-proxy-url", {"HTTPS_PROXY": "http://u:pw@proxy.example:3128"},
         "http://proxy.example:3128", "Basic dTpwdw=="),
    Case("no-proxy-names-the-api-server",
         {"HTTPS_PROXY": "http://proxy.example:3128", "NO_PROXY": ".example"}),
    Case("http-proxy-is-not-for-https", {"HTTP_PROXY": "http://proxy.example:3128"}),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
async def test_proxy_resolved_once(case: Case, tmp_path: Path,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    for var in PROXY_VARS:
        monkeypatch.delenv(var, raising=False)
    for var, value in case.env.items():
        monkeypatch.setenv(var, value)
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG)
    kube = await KubeClient.connect(path)
    try:
        rest = kube.api_client.rest_client
        assert rest.proxy == case.proxy
        assert (rest.proxy_headers or {}).get("Proxy-Authorization") == case.proxy_header
        assert rest.pool_manager.trust_env is False  # no netrc/proxy lookup per request
    finally:
        await kube.close()

"""`poolpilot router --discover kubernetes` against the Kubernetes API emulator: the router
follows the pool's EndpointSlices (created, made unready, deleted through the real API) and
survives a dropped watch. Engines are fake engine processes on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from poolpilot.emulator.server import KubeEmulator
from router_support import FAST, Proc, running, start_fake_engine, start_router, wait_until

pytestmark = [pytest.mark.adapter, pytest.mark.cluster]

NS = "serving"
SLICES = f"/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices"


def endpoint_slice(name: str, service: str, engine: Proc, ready: bool = True) -> dict:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": NS,
                     "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": engine.port, "protocol": "TCP"}],
        "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": ready}}],
    }


@pytest.fixture(scope="module")
def emulator() -> Iterator[KubeEmulator]:
    with KubeEmulator().running() as emu:
        yield emu


def answered_by(router: Proc, n: int = 6) -> set[str]:
    out = set()
    for _ in range(n):
        r = httpx.post(router.url + "/v1/completions", timeout=10,
                       json={"model": "fake", "prompt": "hi", "max_tokens": 1})
        assert r.status_code == 200, r.text
        out.add(r.json()["choices"][0]["text"].rstrip("0 "))
    return out


def test_router_follows_endpointslices(emulator: KubeEmulator, tmp_path: Path) -> None:
    kubeconfig = emulator.write_kubeconfig(tmp_path / "kubeconfig", namespace=NS)
    api = httpx.Client(base_url=emulator.url, timeout=10)
    engines = [start_fake_engine("P"), start_fake_engine("DA"), start_fake_engine("DB")]
    with running(*engines) as (p, da, db):
        router = start_router("--discover", "kubernetes", "--namespace", NS, "--pool", "pool",
                              "--kubeconfig", str(kubeconfig), "--health-interval", "0.2",
                              "--ramp-seconds", "0")
        with running(router):
            # Nothing discovered yet: not ready, and requests fail cleanly with 503.
            assert httpx.get(router.url + "/ready").status_code == 503
            resp = httpx.post(router.url + "/v1/completions", json={"prompt": "x"})
            assert resp.status_code == 503
            assert "no prefill engine" in resp.json()["error"]["message"]

            for body in (endpoint_slice("pool-prefill-1", "pool-prefill", p),
                         endpoint_slice("pool-decode-a", "pool-decode", da),
                         endpoint_slice("other-decode-x", "other-decode", db)):  # other pool
                assert api.post(SLICES, json=body).status_code == 201
            wait_until(lambda: httpx.get(router.url + "/ready").status_code == 200, 10,
                       "router ready after slices appear")
            assert answered_by(router) == {"DA"}

            # Scale-up: a second decode endpoint appears and takes work within seconds.
            assert api.post(SLICES, json=endpoint_slice("pool-decode-b", "pool-decode", db))\
                .status_code == 201
            wait_until(lambda: answered_by(router) == {"DA", "DB"}, 10, "DB to take work")

            # A pod turning unready leaves the rotation.
            patch = {"endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": False}}]}
            assert api.patch(f"{SLICES}/pool-decode-a", json=patch, headers={
                "Content-Type": "application/merge-patch+json"}).status_code == 200
            wait_until(lambda: answered_by(router) == {"DB"}, 10, "DA to leave")

            # A dropped watch is resumed (relist), and later changes are still seen.
            assert emulator.disconnect_watches() >= 1
            assert api.delete(f"{SLICES}/pool-decode-b").status_code == 200
            patch["endpoints"][0]["conditions"]["ready"] = True
            assert api.patch(f"{SLICES}/pool-decode-a", json=patch, headers={
                "Content-Type": "application/merge-patch+json"}).status_code == 200
            wait_until(lambda: answered_by(router) == {"DA"}, 15, "DA back, DB gone")


def test_router_is_not_healthy_before_discovery_has_listed_the_engines(
        emulator: KubeEmulator, tmp_path: Path) -> None:
    """Found by the sandbox's chaos run: a router restarted after a crash answered /health
    (its readiness probe) before its first list of EndpointSlices, went back behind its
    Service and refused the first requests with 503 "no prefill engine available"."""
    import yaml
    from poolpilot.testkit.prometheus import free_port

    unreachable = tmp_path / "unreachable"
    config = yaml.safe_load(emulator.write_kubeconfig(unreachable, namespace=NS).read_text())
    config["clusters"][0]["cluster"]["server"] = f"http://127.0.0.1:{free_port()}"
    unreachable.write_text(yaml.safe_dump(config))
    router = start_router("--discover", "kubernetes", "--namespace", NS, "--pool", "pool",
                          "--kubeconfig", str(unreachable), "--log-level", "INFO", *FAST)
    with running(router):
        output = router.output
        assert output is not None
        wait_until(lambda: "relisting" in output.text(), 20,
                   "the first list of EndpointSlices to fail")
        r = httpx.get(router.url + "/health")
        assert r.status_code == 503 and r.json()["error"]["message"] == "discovering engines"
    live = emulator.write_kubeconfig(tmp_path / "kubeconfig", namespace=NS)
    router = start_router("--discover", "kubernetes", "--namespace", NS, "--pool", "other",
                          "--kubeconfig", str(live), *FAST)
    with running(router):  # listed (no engines yet): alive and healthy, not ready
        wait_until(lambda: httpx.get(router.url + "/health").status_code == 200, 20,
                   "healthy once discovery has listed")
        assert httpx.get(router.url + "/ready").status_code == 503

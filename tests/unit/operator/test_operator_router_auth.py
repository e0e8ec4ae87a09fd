"""The router's default API key (--router-auth, on in the chart): a Secret the operator creates
once per pool with a random key and never reads or changes; the router mounts it."""

from __future__ import annotations

import asyncio
import base64
import copy
from typing import Any

from poolpilot.operator import builders, reconcile, router_auth
from poolpilot.operator.building_blocks import ROUTER_KEYS_DIR

from poolpilot import api
from poolpilot.validate import parse_spec

UID = "6a1c1d4e-0000-4000-8000-0000000a0174"
AUTH = builders.Capabilities(router_auth=True)
SECRET = ("v1", "Secret", "p-router-api-keys")


class SecretsCluster:
    """Objects by (apiVersion, kind, name); Secrets can only be created (as the operator's RBAC
    allows): a GET or an apply of one fails the test."""

    def __init__(self, pool: builders.Pool) -> None:
        self.objs: dict[tuple[str, str, str], dict[str, Any]] = {
            (api.API_VERSION, api.KIND, pool.name): {"metadata": {"name": pool.name,
                                                                  "uid": pool.uid}}}
        self.creates = 0

    async def get(self, api_version: str, kind: str, namespace: str, name: str) -> Any:
        assert kind != "Secret", "the operator may not read Secrets"
        return copy.deepcopy(self.objs.get((api_version, kind, name)))

    async def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        assert obj["kind"] != "Secret", "the operator may not patch Secrets"
        self.objs[(obj["apiVersion"], obj["kind"], obj["metadata"]["name"])] = copy.deepcopy(obj)
        return copy.deepcopy(obj)

    async def create_absent(self, obj: dict[str, Any]) -> bool:
        self.creates += 1
        key = (obj["apiVersion"], obj["kind"], obj["metadata"]["name"])
        if key in self.objs:
            return False  # 409 AlreadyExists
        self.objs[key] = copy.deepcopy(obj)
        return True

    async def delete(self, obj: dict[str, Any]) -> None:
        self.objs.pop((obj["apiVersion"], obj["kind"], obj["metadata"]["name"]))

    async def apply_size(self, namespace: str, name: str, replicas: int,
                         api_version: str = "apps/v1", kind: str = "Deployment") -> None:
        self.objs[(api_version, kind, name)]["spec"]["replicas"] = replicas


def _pool(**router: Any) -> builders.Pool:
    return builders.Pool("p", "ns", parse_spec({"model": {"name": "m"}, "router": router}),
                         uid=UID)


def _reconcile(cluster: SecretsCluster, pool: builders.Pool,
               caps: builders.Capabilities = AUTH) -> reconcile.ReconcileResult:
    return asyncio.run(reconcile.reconcile(cluster, pool, caps))


def _router(cluster: SecretsCluster) -> dict[str, Any]:
    return cluster.objs[("apps/v1", "Deployment", "p-router")]


def _key(secret: dict[str, Any]) -> str:
    return base64.b64decode(secret["data"]["api-keys"]).decode()


def test_the_router_mounts_a_random_key_made_once() -> None:
    pool = _pool()
    cluster = SecretsCluster(pool)
    out = _reconcile(cluster, pool)
    assert "Secret/p-router-api-keys" in out.created
    secret = cluster.objs[SECRET]
    key = _key(secret)
    assert key.startswith("pp-") and len(key.strip()) > 40 and key.endswith("\n")
    # Deleted with the pool (its owner reference), and labelled as the router's.
    assert secret["metadata"]["ownerReferences"][0]["uid"] == UID
    assert secret["metadata"]["labels"]["poolpilot.dev/role"] == "router"
    dep = _router(cluster)
    c = dep["spec"]["template"]["spec"]["containers"][0]
    assert c["command"][c["command"].index("--api-key-file") + 1] == \
        f"{ROUTER_KEYS_DIR}/api-keys"
    [vol] = [v for v in dep["spec"]["template"]["spec"]["volumes"] if v["name"] == "api-keys"]
    assert vol["secret"]["secretName"] == "p-router-api-keys"
    # A second reconcile writes nothing and does not touch the key.
    again = _reconcile(cluster, pool)
    assert again.writes == 0 and cluster.creates == 1
    assert _key(cluster.objs[SECRET]) == key
    # Two pools never share a key.
    other = SecretsCluster(pool)
    _reconcile(other, pool)
    assert _key(other.objs[SECRET]) != key


def test_a_rotated_or_users_secret_of_that_name_is_used_and_left_as_it_is() -> None:
    pool = _pool()
    cluster = SecretsCluster(pool)
    mine = {"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "p-router-api-keys", "namespace": "ns"},
            "data": {"api-keys": base64.b64encode(b"old\nnew\n").decode()}}
    cluster.objs[SECRET] = copy.deepcopy(mine)
    out = _reconcile(cluster, pool)
    assert cluster.objs[SECRET] == mine  # byte for byte
    assert "Secret/p-router-api-keys" not in out.created
    vol = next(v for v in _router(cluster)["spec"]["template"]["spec"]["volumes"]
               if v["name"] == "api-keys")
    assert vol["secret"]["secretName"] == "p-router-api-keys"


def test_the_pools_own_secret_wins_and_auth_off_mounts_none() -> None:
    pool = _pool(apiKeySecret={"name": "llm-keys", "key": "keys"})
    cluster = SecretsCluster(pool)
    _reconcile(cluster, pool)
    assert SECRET not in cluster.objs and cluster.creates == 0
    vol = next(v for v in _router(cluster)["spec"]["template"]["spec"]["volumes"]
               if v["name"] == "api-keys")
    assert vol["secret"]["secretName"] == "llm-keys"
    assert router_auth.key_ref(pool, AUTH) == ("llm-keys", "keys")
    # --no-router-auth (the command's default): no key, no Secret.
    open_pool = _pool()
    plain = SecretsCluster(open_pool)
    _reconcile(plain, open_pool, builders.Capabilities())
    assert SECRET not in plain.objs
    c = _router(plain)["spec"]["template"]["spec"]["containers"][0]
    assert "--api-key-file" not in c["command"]

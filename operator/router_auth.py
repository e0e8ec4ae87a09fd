"""The router's API key when the pool names none: a Secret the operator creates once per pool
with a random key, which the router mounts (--router-auth; the chart turns it on).

Create-only: the operator never reads, patches or replaces Secrets (its RBAC holds `create` on
them and no other verb), so a key it made, rotated by a user, or a Secret of that name that
was there first (a user's) is the one the router uses and is left exactly as it is. The Secret
carries the pool's owner reference: deleting the pool deletes it.

Users read the key with
  kubectl get secret POOL-router-api-keys -o jsonpath='{.data.api-keys}' | base64 -d
and rotate it by writing new lines into the Secret: the router re-reads the mounted file
(every line is a valid key, so the old and the new one work side by side while clients move).
"""

from __future__ import annotations

import base64
import secrets

from poolpilot.operator.building_blocks import ROUTER_KEYS_FILE, Capabilities, Pool, _meta

from poolpilot import names
from poolpilot.apitypes import Obj
from poolpilot.roles import Role

KEY_BYTES = 32  # 256 bits of randomness, URL-safe base64 (43 characters)


def default_secret_name(pool: Pool) -> str:
    return names.child_name(pool.name, "router-api-keys")


def key_ref(pool: Pool, caps: Capabilities) -> tuple[str, str] | None:
    """(Secret name, key) the router reads its keys from: spec.router.apiKeySecret, else the
    operator's default Secret when router auth is on, else None (no authentication)."""
    secret = pool.spec.router.api_key_secret
    if secret is not None:
        return secret.name, secret.key
    if caps.router_auth:
        return default_secret_name(pool), ROUTER_KEYS_FILE
    return None


def new_key() -> str:
    return "pp-" + secrets.token_urlsafe(KEY_BYTES)


def build_default_secret(pool: Pool, key: str) -> Obj:
    """The default key Secret (pure: the key is the caller's)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _meta(pool, default_secret_name(pool), Role.ROUTER),
        "type": "Opaque",
        "data": {ROUTER_KEYS_FILE: base64.b64encode(f"{key}\n".encode()).decode()},
    }


def wants_default_secret(pool: Pool, caps: Capabilities) -> bool:
    return caps.router_auth and pool.spec.router.api_key_secret is None

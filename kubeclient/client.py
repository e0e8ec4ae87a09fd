"""`KubeClient`: JSON objects in and out, a timeout on every request, `ApiError` on failure.

Objects are plain dicts as the API serves them (camelCase), never kubernetes_asyncio's typed
models: every component builds and reads manifests, and dicts round-trip through server-side
apply unchanged. Kinds become URLs through the API server's discovery, read lazily and cached
by kubernetes_asyncio's dynamic client (a kind it does not know yet, e.g. a CRD installed
after start, makes it read discovery again).

    kube = await KubeClient.connect(kubeconfig, timeout=10, user_agent="poolpilot-operator/x")
    dep = await kube.get("apps/v1", "Deployment", "serving", "llama-8b-decode")
    async for kind, obj in kube.watch("discovery.k8s.io/v1", "EndpointSlice", "serving",
                                      resource_version=rv, label_selector=sel): ...
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp.helpers import get_env_proxy_for_url
from kubernetes_asyncio.client import ApiClient, Configuration
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.dynamic import DynamicClient, ResourceList
from kubernetes_asyncio.dynamic.exceptions import ResourceNotFoundError
from poolpilot.kubeclient import credentials
from poolpilot.kubeclient.errors import ApiError, from_body
from yarl import URL

from poolpilot.apitypes import Obj

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
WATCH_MARGIN_S = 30.0  # a watch's client timeout beyond the server's timeoutSeconds


class _TimedApiClient(ApiClient):
    """Every request without a timeout of its own gets the default one: typed APIs (leader
    election's Lease), the dynamic client's discovery and ours alike. Unbounded requests are
    how a control loop wedges when the API server stops answering."""

    def __init__(self, configuration: Configuration, timeout: float) -> None:
        super().__init__(configuration)
        self.default_timeout = timeout

    def request(self, method: Any, url: Any, query_params: Any = None, headers: Any = None,
                post_params: Any = None, body: Any = None, _preload_content: bool = True,
                _request_timeout: Any = None) -> Any:
        if _request_timeout is None:
            _request_timeout = self.default_timeout
        return super().request(method, url, query_params, headers, post_params, body,
                               _preload_content, _request_timeout)


def _environment_once(api_client: ApiClient) -> None:
    """kubernetes_asyncio opens its aiohttp session with trust_env=True, so aiohttp looks up
    ~/.netrc and the proxy variables in a worker thread on every request: a fifth of the
    operator's CPU per reconcile (py-spy). The proxy for the API server is resolved
    here once, with the same variables (HTTPS_PROXY/HTTP_PROXY, NO_PROXY), and the lookups
    per request are turned off. Credentials come from the kubeconfig, never from .netrc."""
    rest = api_client.rest_client
    session = getattr(rest, "pool_manager", None)
    if session is None or not getattr(session, "_trust_env", False):
        return
    if not rest.proxy:
        try:
            proxy, proxy_auth = get_env_proxy_for_url(URL(str(api_client.configuration.host)))
        except LookupError:  # no proxy for this host
            pass
        else:
            rest.proxy = str(proxy)
            if proxy_auth is not None:
                rest.proxy_headers = {"Proxy-Authorization": proxy_auth.encode()}
    session._trust_env = False


class KubeClient:
    """One per process; share it. `requests` and `writes` count calls (logs, benchmarks)."""

    def __init__(self, api_client: ApiClient, *, timeout: float = 10.0,
                 source: credentials.Source | None = None) -> None:
        self._client = api_client
        self.timeout = timeout
        self.source = source
        self.requests = 0
        self.writes = 0
        self._dynamic: DynamicClient | None = None
        self._discovery_lock = asyncio.Lock()
        self._cache_dir: str | None = None
        self._resources: dict[tuple[str | None, str], Any] = {}

    @classmethod
    async def connect(cls, kubeconfig: str | Path | None = None, *, timeout: float = 10.0,
                      user_agent: str | None = None) -> KubeClient:
        """Credentials in the one order (see `credentials`); raises NoCredentials."""
        source = credentials.resolve(kubeconfig)
        cfg = await credentials.load(source)
        api_client = _TimedApiClient(cfg, timeout)
        _environment_once(api_client)
        if user_agent:
            api_client.user_agent = user_agent
        return cls(api_client, timeout=timeout, source=source)

    @property
    def api_client(self) -> ApiClient:
        """The underlying ApiClient (for kubernetes_asyncio's leader election)."""
        return self._client

    @property
    def user_agent(self) -> str:
        return str(self._client.user_agent)

    @user_agent.setter
    def user_agent(self, value: str) -> None:
        self._client.user_agent = value

    async def close(self) -> None:
        await self._client.close()
        if self._cache_dir:
            shutil.rmtree(self._cache_dir, ignore_errors=True)

    # -- raw requests --------------------------------------------------------------------------

    async def request(self, method: str, path: str, *, query: list[tuple[str, str]] | None = None,
                      body: Any = None, content_type: str = JSON,
                      timeout: float | None = None) -> Any:
        """One call; the decoded JSON answer (None when empty). Raises ApiError."""
        self.requests += 1
        if method != "GET":
            self.writes += 1
        with mapped_errors(method, path):
            resp = await self._client.call_api(
                path, method, query_params=query or [],
                header_params={"Accept": JSON, "Content-Type": content_type}, body=body,
                auth_settings=["BearerToken"], _preload_content=False,
                _request_timeout=timeout if timeout is not None else self.timeout,
            )
            data = await resp.read()
            status = resp.status
            resp.release()
        if not 200 <= status <= 299:
            raise from_body(status, data, method=method, path=path)
        # orjson: a LIST of thousands of objects, and a watch's stream, decode 2-3x faster
        return orjson.loads(data) if data else None

    # -- discovery -----------------------------------------------------------------------------

    async def _discovery(self) -> DynamicClient:
        async with self._discovery_lock:
            if self._dynamic is None:
                # A private cache file: the library's default is shared by every process
                # talking to the same host, and a read-only root keeps only /tmp writable.
                self._cache_dir = tempfile.mkdtemp(prefix="poolpilot-discovery-")
                with mapped_errors("GET", "/apis"):
                    self._dynamic = await DynamicClient(
                        self._client, cache_file=str(Path(self._cache_dir) / "cache.json"))
            return self._dynamic

    async def resource(self, api_version: str | None, kind: str) -> Any:
        """The discovered resource for a kind (URL building, scope); ApiError(404) if the
        cluster does not serve it. Without `api_version`, the kind's preferred version, the
        core group first (Event is served by both v1 and events.k8s.io)."""
        found = self._resources.get((api_version, kind))
        if found is not None:
            return found
        dynamic = await self._discovery()
        with mapped_errors("GET", f"discovery of {api_version or kind}"):
            if api_version:
                try:
                    found = await dynamic.resources.get(api_version=api_version, kind=kind)
                except ResourceNotFoundError:
                    found = None
            else:
                matches = [r for r in await dynamic.resources.search(kind=kind)
                           if r.kind == kind and not isinstance(r, ResourceList)]
                matches.sort(key=lambda r: (bool(r.group), not r.preferred))
                found = matches[0] if matches else None
        if found is None:
            raise ApiError(404, f"the server does not serve {kind} in {api_version or 'any group'}",
                           "NotFound")
        self._resources[(api_version, kind)] = found
        return found

    async def path(self, api_version: str | None, kind: str, namespace: str | None = None,
                   name: str | None = None, subresource: str | None = None) -> str:
        res = await self.resource(api_version, kind)
        path = str(res.path(name=name, namespace=namespace if res.namespaced else None))
        return f"{path}/{subresource}" if subresource else path

    async def serves(self, api_version: str, kind: str) -> bool:
        try:
            await self.resource(api_version, kind)
        except ApiError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def api_groups(self) -> frozenset[str]:
        """Names of the API groups the server serves (read fresh: CRDs come and go)."""
        data = await self.request("GET", "/apis")
        return frozenset(g["name"] for g in (data or {}).get("groups") or [])

    # -- objects -------------------------------------------------------------------------------

    async def get(self, api_version: str | None, kind: str, namespace: str | None, name: str,
                  subresource: str | None = None) -> Obj | None:
        """The object, or None when it does not exist."""
        try:
            obj: Obj = await self.request(
                "GET", await self.path(api_version, kind, namespace, name, subresource))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        return obj

    async def list_with_version(
        self, api_version: str | None, kind: str, namespace: str | None = None, *,
        label_selector: str | None = None, field_selector: str | None = None,
    ) -> tuple[list[Obj], str]:
        """Items (with apiVersion and kind filled in, as lists leave them out) and the list's
        resourceVersion, to watch from. `namespace` None: every namespace."""
        query = []
        if label_selector:
            query.append(("labelSelector", label_selector))
        if field_selector:
            query.append(("fieldSelector", field_selector))
        res = await self.resource(api_version, kind)
        path = res.path(namespace=namespace if res.namespaced else None)
        data = await self.request("GET", path, query=query)
        items: list[Obj] = (data or {}).get("items") or []
        for item in items:
            item.setdefault("apiVersion", res.group_version)
            item.setdefault("kind", kind)
        rv = str(((data or {}).get("metadata") or {}).get("resourceVersion") or "")
        return items, rv

    async def list(self, api_version: str | None, kind: str, namespace: str | None = None, *,
                   label_selector: str | None = None,
                   field_selector: str | None = None) -> list[Obj]:
        items, _ = await self.list_with_version(
            api_version, kind, namespace, label_selector=label_selector,
            field_selector=field_selector)
        return items

    async def create(self, obj: Obj, *, manager: str | None = None) -> Obj:
        meta = obj["metadata"]
        query = [("fieldManager", manager)] if manager else []
        path = await self.path(obj["apiVersion"], obj["kind"], meta.get("namespace"))
        result: Obj = await self.request("POST", path, query=query, body=obj)
        return result

    async def apply(self, obj: Obj, *, manager: str, force: bool = True,
                    subresource: str | None = None) -> Obj:
        """Server-side apply as `manager` (force: take over fields others set)."""
        meta = obj["metadata"]
        query = [("fieldManager", manager)] + ([("force", "true")] if force else [])
        path = await self.path(obj["apiVersion"], obj["kind"], meta.get("namespace"),
                               meta["name"], subresource)
        result: Obj = await self.request("PATCH", path, query=query, body=obj,
                                         content_type=APPLY_PATCH)
        return result

    async def merge_patch(self, api_version: str | None, kind: str, namespace: str | None,
                          name: str, patch: Obj, *, subresource: str | None = None,
                          manager: str | None = None) -> Obj:
        query = [("fieldManager", manager)] if manager else []
        path = await self.path(api_version, kind, namespace, name, subresource)
        result: Obj = await self.request("PATCH", path, query=query, body=patch,
                                         content_type=MERGE_PATCH)
        return result

    async def replace(self, obj: Obj, *, manager: str | None = None) -> Obj:
        meta = obj["metadata"]
        query = [("fieldManager", manager)] if manager else []
        path = await self.path(obj["apiVersion"], obj["kind"], meta.get("namespace"),
                               meta["name"])
        result: Obj = await self.request("PUT", path, query=query, body=obj)
        return result

    async def delete(self, api_version: str | None, kind: str, namespace: str | None, name: str, *,
                     uid: str | None = None, propagation: str | None = "Background",
                     grace_seconds: int | None = None) -> bool:
        """Delete; False when it was already gone. `uid`: only that incarnation of the name."""
        body: Obj = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if propagation:
            body["propagationPolicy"] = propagation
        if uid:
            body["preconditions"] = {"uid": uid}
        if grace_seconds is not None:
            body["gracePeriodSeconds"] = grace_seconds
        try:
            await self.request("DELETE", await self.path(api_version, kind, namespace, name),
                               body=body)
        except ApiError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def watch(self, api_version: str, kind: str, namespace: str | None = None, *,
                    resource_version: str, label_selector: str | None = None,
                    field_selector: str | None = None, timeout_seconds: int = 300,
                    bookmarks: bool = False) -> AsyncIterator[tuple[str, Obj]]:
        """(type, object) events after `resource_version` until the server ends the stream.

        BOOKMARK events (an object with only a newer resourceVersion) are passed on only with
        `bookmarks=True`, for callers that watch again from the last version seen; an ERROR
        event (410 Gone: the version is too old) raises ApiError, after which the caller lists
        again. With a field selector, an object that stops matching arrives as DELETED."""
        query = [("watch", "true"), ("resourceVersion", resource_version),
                 ("allowWatchBookmarks", "true"), ("timeoutSeconds", str(timeout_seconds))]
        if label_selector:
            query.append(("labelSelector", label_selector))
        if field_selector:
            query.append(("fieldSelector", field_selector))
        path = await self.path(api_version, kind, namespace)
        self.requests += 1
        timeout = aiohttp.ClientTimeout(connect=self.timeout, sock_connect=self.timeout,
                                        sock_read=timeout_seconds + WATCH_MARGIN_S)
        with mapped_errors("GET", path):
            resp = await self._client.call_api(
                path, "GET", query_params=query, header_params={"Accept": JSON},
                auth_settings=["BearerToken"], _preload_content=False,
                _request_timeout=timeout,
            )
        try:
            if not 200 <= resp.status <= 299:
                with mapped_errors("GET", path):
                    data = await resp.read()
                raise from_body(resp.status, data, method="GET", path=path)
            while True:
                with mapped_errors("GET", path):
                    line = await resp.content.readline()
                if not line:
                    return
                event = orjson.loads(line)
                etype, obj = event.get("type"), event.get("object") or {}
                if etype is None and event.get("kind") == "Status":  # an error, not an event
                    etype, obj = "ERROR", event
                if etype == "ERROR":
                    raise ApiError(int(obj.get("code") or 500), str(obj.get("message") or ""),
                                   str(obj.get("reason") or ""), method="GET", path=path)
                if etype == "BOOKMARK" and not bookmarks:
                    continue
                obj.setdefault("apiVersion", api_version)
                obj.setdefault("kind", kind)
                yield str(etype), obj
        finally:
            with contextlib.suppress(Exception):
                resp.release()


@contextlib.contextmanager
def mapped_errors(method: str, path: str) -> Iterator[None]:
    """kubernetes_asyncio's and aiohttp's failures as ApiError (no answer: status 0)."""
    try:
        yield
    except ApiException as exc:
        raise from_body(int(exc.status or 0), exc.body or exc.reason, method=method, path=path,
                        retry_after=_header(exc, "Retry-After")) from None
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        raise ApiError(0, f"{type(exc).__name__}: {exc}".rstrip(": "), "NoAnswer",
                       method=method, path=path) from None


def _header(exc: ApiException, name: str) -> str | None:
    headers = getattr(exc, "headers", None)
    if not headers:
        return None
    value = headers.get(name)
    return None if value is None else str(value)

"""The Kubernetes API emulator: an in-memory API server over real HTTP (aiohttp).

Serves the subset of the Kubernetes API that poolpilot, Kopf, kubernetes_asyncio and kubectl
use (see docs/kube-emulator.md); semantics live in `store.py`, this module is the HTTP face:
URL routing, discovery, watches, content types, Table output, fault injection and the request
log tests count writes with.

    emu = KubeEmulator()
    with emu.running():                       # serves from a background thread
        emu.write_kubeconfig(tmp / "kubeconfig")
        ...
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml
from aiohttp import web
from poolpilot.emulator import errors, openapi, protobuf, tables
from poolpilot.emulator.errors import REASONS, ApiError
from poolpilot.emulator.faults import Fault, Faults
from poolpilot.emulator.resources import ResourceType
from poolpilot.emulator.selectors import parse_field_selector, parse_label_selector
from poolpilot.emulator.store import PATCH_TYPES, Store, Watcher

log = logging.getLogger(__name__)
T = TypeVar("T")
_CLOSE = "close"
_ABORT = "abort"
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
MAX_BODY_BYTES = 3 * 1024 * 1024  # the API server's request body limit
# Deeper bodies are refused before the store's recursive copies could overflow Python's stack.
MAX_BODY_DEPTH = 100


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether `value` nests more than `limit` levels (iterative: no recursion to overflow)."""
    todo: list[tuple[Any, int]] = [(value, 1)]
    while todo:
        item, depth = todo.pop()
        if isinstance(item, dict | list):
            if depth > limit:
                return True
            todo.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict)
                                                  else item))
    return False
KUBE_VERSION = {
    "major": "1",
    "minor": "33",
    "gitVersion": "v1.33.0-poolpilot-emulator",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2025-04-23T00:00:00Z",
    "goVersion": "go1.24.2",
    "compiler": "gc",
    "platform": "linux/amd64",
}


@dataclass
class RequestRecord:
    """One request served (status 0 while a watch is still streaming)."""

    method: str
    path: str
    query: dict[str, str]
    status: int = 0
    content_type: str = ""
    user_agent: str = ""

    @property
    def is_write(self) -> bool:
        return self.method in WRITE_METHODS


@dataclass(eq=False)
class _Stream:
    watcher: Watcher
    request: web.Request


@dataclass
class _Route:
    rt: ResourceType
    namespace: str | None
    name: str | None
    sub: str
    watch: bool


class _YamlLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """YAML as the API server reads it: timestamps stay strings (JSON has no dates)."""


_YamlLoader.yaml_implicit_resolvers = {
    k: [(tag, rx) for tag, rx in v if tag != "tag:yaml.org,2002:timestamp"]
    for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _truthy(value: str | None) -> bool:
    return (value or "").lower() in ("1", "true", "yes")


class KubeEmulator:
    """An in-memory Kubernetes API server. See the module docstring and docs/kube-emulator.md."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *,
                 bookmark_interval: float = 5.0, history_limit: int = 20_000,
                 auto_namespaces: bool = True, request_log_limit: int | None = None) -> None:
        self.host = host
        self.request_log_limit = request_log_limit  # None: keep every RequestRecord
        self.port = port
        self.bookmark_interval = bookmark_interval
        self.store = Store(history_limit=history_limit, auto_namespaces=auto_namespaces)
        self.faults = Faults()
        self.requests: list[RequestRecord] = []
        self._streams: set[_Stream] = set()
        self._runner: web.AppRunner | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._closing: asyncio.Event | None = None

    # --- lifecycle --------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._closing = asyncio.Event()
        # Above the API's own limit, so that _body answers 413 as the API server does.
        app = web.Application(client_max_size=2 * MAX_BODY_BYTES)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        server = site._server
        assert server is not None
        sockets = getattr(server, "sockets", None) or []
        self.port = sockets[0].getsockname()[1]
        log.info("Kubernetes API emulator serving at %s", self.url)

    async def stop(self) -> None:
        if self._closing is not None:
            self._closing.set()
        self._close_streams(abrupt=False)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> KubeEmulator:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @contextlib.contextmanager
    def running(self) -> Iterator[KubeEmulator]:
        """Serve from a background thread with its own event loop (sync tests, KopfRunner)."""
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="kube-emulator", daemon=True)
        thread.start()
        self._thread = thread
        try:
            asyncio.run_coroutine_threadsafe(self.start(), loop).result(timeout=30)
            yield self
        finally:
            try:
                asyncio.run_coroutine_threadsafe(self.stop(), loop).result(timeout=30)
            finally:
                loop.call_soon_threadsafe(loop.stop)
                thread.join(timeout=30)
                loop.close()
                self._thread = None

    def write_kubeconfig(self, path: str | Path, namespace: str = "default",
                         context: str = "poolpilot-emulator") -> Path:
        """A kubeconfig for kubectl, Kopf and kubernetes_asyncio pointing at this emulator."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": context, "cluster": {"server": self.url}}],
            "users": [{"name": context, "user": {"token": "poolpilot-emulator"}}],
            "contexts": [{"name": context, "context": {"cluster": context, "user": context,
                                                       "namespace": namespace}}],
            "current-context": context,
            "preferences": {},
        }
        # Atomically: other processes poll for this file and must never read half of it.
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(yaml.safe_dump(config, sort_keys=False))
        tmp.replace(path)
        return path

    # --- test helpers (callable from any thread) --------------------------------------------

    def call(self, fn: Callable[[], T]) -> T:
        """Run `fn` on the emulator's loop thread (the store is not thread-safe)."""
        if (self._thread is None or self._loop is None
                or threading.current_thread() is self._thread):
            return fn()

        async def run() -> T:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout=30)

    def _copy(self, fn: Callable[[], Any]) -> Any:
        """`call`, returning a private copy (stored objects are shared snapshots)."""
        return json.loads(json.dumps(self.call(fn)))

    def count_writes(self, path_prefix: str | None = None) -> int:
        """POST/PUT/PATCH/DELETE requests served (optionally under a URL path prefix)."""
        return sum(
            1 for r in list(self.requests)
            if r.is_write and (path_prefix is None or r.path.startswith(path_prefix))
        )

    def disconnect_watches(self, abrupt: bool = False) -> int:
        """End every open watch stream (abrupt: drop the TCP connections); returns how many."""
        return self.call(lambda: self._close_streams(abrupt))

    def _close_streams(self, abrupt: bool) -> int:
        streams = list(self._streams)
        for s in streams:
            s.watcher.queue.put_nowait(_ABORT if abrupt else _CLOSE)
        return len(streams)

    def open_watches(self) -> int:
        return self.call(lambda: len(self._streams))

    def resource(self, name: str) -> ResourceType:
        """A served type by plural/kind/short name, 'plural.group' or 'group/version/plural'."""
        return self.call(lambda: self.store.registry.resolve(name))

    def get(self, resource: str, name: str, namespace: str = "default") -> dict[str, Any] | None:
        def fn() -> dict[str, Any] | None:
            rt = self.store.registry.resolve(resource)
            obj = self.store.find(rt, namespace, name)
            return None if obj is None else json.loads(json.dumps(obj))

        return self.call(fn)

    def objects(self, resource: str, namespace: str | None = None,
             label_selector: str | None = None) -> list[dict[str, Any]]:
        def fn() -> list[dict[str, Any]]:
            rt = self.store.registry.resolve(resource)
            items = self.store.select(rt, namespace, parse_label_selector(label_selector))
            return json.loads(json.dumps(items))

        return self.call(fn)

    def create(self, obj: dict[str, Any], manager: str = "test") -> dict[str, Any]:
        def fn() -> dict[str, Any]:
            rt = self._type_of(obj)
            ns = (obj.get("metadata") or {}).get("namespace", "default")
            return self.store.create(rt, ns, obj, manager=manager)

        return self._copy(fn)

    def apply(self, obj: dict[str, Any], manager: str = "test",
              force: bool = True) -> dict[str, Any]:
        """Server-side apply `obj` (create or update) as `manager`."""
        def fn() -> dict[str, Any]:
            rt = self._type_of(obj)
            meta = obj.get("metadata") or {}
            return self.store.patch(rt, meta.get("namespace", "default"), meta["name"], "apply",
                                    obj, manager=manager, force=force)

        return self._copy(fn)

    def patch(self, resource: str, name: str, body: Any, namespace: str = "default",
              subresource: str = "", patch_type: str = "merge",
              manager: str = "test") -> dict[str, Any]:
        def fn() -> dict[str, Any]:
            rt = self.store.registry.resolve(resource)
            return self.store.patch(rt, namespace, name, patch_type, body, sub=subresource,
                                    manager=manager)

        return self._copy(fn)

    def delete(self, resource: str, name: str, namespace: str = "default") -> dict[str, Any]:
        def fn() -> dict[str, Any]:
            rt = self.store.registry.resolve(resource)
            return self.store.delete(rt, namespace, name)

        return self._copy(fn)

    def set_crd_validation(self, enabled: bool) -> None:
        """Turn CRD schema/CEL validation off to let invalid objects in (bad-input tests)."""
        def fn() -> None:
            self.store.validate_crds = enabled

        self.call(fn)

    def compact(self) -> None:
        """Drop the event history: watches resuming from an older version get 410 Gone."""
        self.call(self.store.compact)

    def _type_of(self, obj: dict[str, Any]) -> ResourceType:
        api_version, kind = obj.get("apiVersion", ""), obj.get("kind", "")
        group, _, version = api_version.rpartition("/")
        for rt in self.store.registry.types.values():
            if rt.group == group and rt.version == version and rt.kind == kind:
                return rt
        raise KeyError(f"no served resource for apiVersion {api_version!r} kind {kind!r}")

    # --- HTTP -------------------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        is_watch = _truthy(request.query.get("watch")) or "/watch/" in request.path
        record = RequestRecord(
            request.method, request.path, dict(request.query), 0,
            request.headers.get("Content-Type", ""), request.headers.get("User-Agent", ""),
        )
        self.requests.append(record)
        limit = self.request_log_limit
        if limit is not None and len(self.requests) > 2 * limit:
            del self.requests[: len(self.requests) - limit]  # amortised trimming
        fault = self.faults.take(request.method, request.path, is_watch)
        if fault is not None and fault.status == "delay":
            await asyncio.to_thread(fault.released.wait, fault.delay_s)
            fault = None  # then served as usual
        if fault is not None and fault.when == "before":
            resp = await self._fault(request, fault)
            record.status = resp.status
            return resp
        self.store.warnings = []
        try:
            resp = await self._dispatch(request, record)
        except ApiError as exc:
            resp = web.json_response(exc.status(), status=exc.code)
        except (ConnectionResetError, asyncio.CancelledError):
            raise
        except Exception as exc:  # a bug in the emulator: answer like an apiserver would
            log.exception("emulator error on %s %s", request.method, request.path_qs)
            resp = web.json_response(ApiError(500, f"emulator error: {exc!r}").status(),
                                     status=500)
        if fault is not None and not resp.prepared:  # "after": served, then the error
            resp = await self._fault(request, fault)
        record.status = resp.status
        return resp

    async def _fault(self, request: web.Request, fault: Fault) -> web.StreamResponse:
        if fault.status == "timeout":
            assert self._closing is not None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), fault.delay_s)
            err = ApiError(504, fault.message or "injected fault: the request timed out",
                           "Timeout")
            return web.json_response(err.status(), status=504)
        if fault.status == "disconnect":
            if request.transport is not None:
                request.transport.close()
            raise ConnectionResetError("injected fault: connection dropped")
        code = int(fault.status)
        message = fault.message or f"injected fault: {REASONS.get(code, 'error')}"
        if code == 409 and not fault.message:
            message = ("Operation cannot be fulfilled: the object has been modified; please "
                       "apply your changes to the latest version and try again (injected)")
        err = ApiError(code, message)
        return web.json_response(err.status(), status=code,
                                 headers={"Retry-After": "1"} if code in (429, 503) else None)

    def _json(self, body: Any, status: int = 200) -> web.Response:
        headers = {}
        if self.store.warnings:
            headers["Warning"] = ", ".join(
                "299 - " + json.dumps(w) for w in self.store.warnings
            )
        return web.json_response(body, status=status, headers=headers,
                                 dumps=lambda o: json.dumps(o, separators=(",", ":")))

    async def _dispatch(self, request: web.Request, record: RequestRecord) -> web.StreamResponse:
        parts = [p for p in request.path.split("/") if p]
        if not parts:
            return self._json({"paths": self._paths()})
        if parts == ["version"]:
            return self._json(KUBE_VERSION)
        if parts[0] in ("healthz", "readyz", "livez"):
            return web.Response(text="ok")
        if parts[:2] == ["openapi", "v3"]:
            return self._openapi(parts[2:])
        if parts == ["openapi", "v2"]:
            # An empty protobuf message is a valid, empty OpenAPI v2 document: client-go's
            # validators (helm, kubectl) download it first, then ask v3 about fieldValidation.
            return web.Response(
                body=b"", content_type="application/com.github.proto-openapi.spec.v2.v1.0+protobuf")
        if parts[0] == "api":
            if len(parts) == 1:
                return self._json({
                    "kind": "APIVersions", "versions": ["v1"],
                    "serverAddressByClientCIDRs": [
                        {"clientCIDR": "0.0.0.0/0", "serverAddress": f"{self.host}:{self.port}"}
                    ],
                })
            group, version, rest = "", parts[1], parts[2:]
        elif parts[0] == "apis":
            if len(parts) == 1:
                return self._json(self._group_list())
            if len(parts) == 2:
                return self._json(self._group(parts[1]))
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise ApiError(404, "the server could not find the requested resource", "NotFound")
        if not rest:
            return self._json(self._resource_list(group, version))
        route = self._route(group, version, rest)
        return await self._serve(request, route, record)

    # --- discovery --------------------------------------------------------------------------

    def _openapi(self, rest: list[str]) -> web.Response:
        registry = self.store.registry
        if not rest:
            return self._json(openapi.index(registry, self.store.crds))
        if rest[0] == "api" and len(rest) == 2:
            doc = openapi.gv_document(registry, "", rest[1], self.store.crds)
        elif rest[0] == "apis" and len(rest) == 3:
            doc = openapi.gv_document(registry, rest[1], rest[2], self.store.crds)
        else:
            doc = None
        if doc is None:
            raise ApiError(404, "the server could not find the requested resource", "NotFound")
        return self._json(doc)

    def _paths(self) -> list[str]:
        paths = {"/api", "/api/v1", "/apis", "/version", "/healthz", "/readyz", "/livez"}
        for group, versions in self.store.registry.groups().items():
            if group:
                paths.add(f"/apis/{group}")
                paths.update(f"/apis/{group}/{v}" for v in versions)
        return sorted(paths)

    def _group_entry(self, group: str, versions: list[str]) -> dict[str, Any]:
        gvs = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
        return {"name": group, "versions": gvs, "preferredVersion": gvs[0]}

    def _group_list(self) -> dict[str, Any]:
        groups = self.store.registry.groups()
        return {
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": [self._group_entry(g, v) for g, v in sorted(groups.items()) if g],
        }

    def _group(self, group: str) -> dict[str, Any]:
        versions = self.store.registry.groups().get(group)
        if not group or not versions:
            raise ApiError(404, "the server could not find the requested resource", "NotFound")
        return {"kind": "APIGroup", "apiVersion": "v1", **self._group_entry(group, versions)}

    def _resource_list(self, group: str, version: str) -> dict[str, Any]:
        types = self.store.registry.in_version(group, version)
        if not types:
            raise ApiError(404, "the server could not find the requested resource", "NotFound")
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": f"{group}/{version}" if group else version,
            "resources": [entry for rt in sorted(types, key=lambda r: r.plural)
                          for entry in rt.discovery()],
        }

    # --- resources --------------------------------------------------------------------------

    def _route(self, group: str, version: str, rest: list[str]) -> _Route:
        watch = False
        if rest and rest[0] == "watch":
            watch, rest = True, rest[1:]
        namespace = None
        if (len(rest) >= 3 and rest[0] == "namespaces"
                and not (len(rest) == 3 and rest[2] in ("status", "finalize"))):
            namespace, rest = rest[1], rest[2:]
        if not rest or len(rest) > 3:
            raise ApiError(404, "the server could not find the requested resource", "NotFound")
        rt = self.store.registry.get(group, version, rest[0])
        if rt is None or (namespace is not None and not rt.namespaced):
            raise ApiError(404, "the server could not find the requested resource", "NotFound")
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else ""
        if sub and not ((sub == "status" and rt.status) or (sub == "scale" and rt.scale)
                        or (sub == "finalize" and rt.key == "namespaces")):
            raise ApiError(404, "the server could not find the requested resource", "NotFound")
        if rt.namespaced and name is not None and namespace is None:
            raise ApiError(404, "the server could not find the requested resource", "NotFound")
        return _Route(rt, namespace, name, "status" if sub == "finalize" else sub, watch)

    async def _body(self, request: web.Request) -> Any:
        size = request.content_length
        if size is not None and size > MAX_BODY_BYTES:
            raise errors.too_large(MAX_BODY_BYTES)
        raw = await request.read()
        if len(raw) > MAX_BODY_BYTES:  # chunked: no length announced
            raise errors.too_large(MAX_BODY_BYTES)
        if "protobuf" in request.headers.get("Content-Type", ""):
            return protobuf.decode_body(raw)
        text = raw.decode("utf-8", errors="replace")
        if not text.strip():
            return {}
        try:
            if "yaml" in request.headers.get("Content-Type", "") and text.lstrip()[:1] != "{":
                body = yaml.load(text, Loader=_YamlLoader)
            else:
                body = json.loads(text)  # also apply-patch+yaml bodies in JSON, as clients send
        except RecursionError:
            body = too_deep = True
        except (ValueError, yaml.YAMLError) as exc:
            raise errors.bad_request(f"the request body is not valid: {exc}") from exc
        else:
            too_deep = _deeper_than(body, MAX_BODY_DEPTH)
        if too_deep:
            raise ApiError(422, f"the request body nests deeper than {MAX_BODY_DEPTH} levels",
                           "Invalid")
        return body

    def _manager(self, request: web.Request) -> str:
        manager = request.query.get("fieldManager")
        if manager:
            return manager
        agent = request.headers.get("User-Agent", "")
        return agent.split("/")[0].strip() or "unknown"

    async def _serve(self, request: web.Request, route: _Route,
                     record: RequestRecord) -> web.StreamResponse:
        q = request.query
        rt, ns, name, sub = route.rt, route.namespace or "", route.name, route.sub
        dry_run = q.get("dryRun") == "All"
        strict = q.get("fieldValidation") == "Strict"
        method = request.method
        as_table = "as=Table" in request.headers.get("Accept", "")
        store = self.store
        if method == "GET":
            watch = route.watch or _truthy(q.get("watch"))
            labels = parse_label_selector(q.get("labelSelector"))
            fields = parse_field_selector(q.get("fieldSelector"))
            if name is not None and (watch or (not sub and route.watch)):
                fields = [*fields, *parse_field_selector(f"metadata.name={name}")]
                name = None
            if watch:
                return await self._watch(request, rt, route.namespace, labels, fields, as_table,
                                         record)
            if name is None:
                items = store.select(rt, route.namespace, labels, fields)
                rv = str(store.rv)
                if as_table:
                    return self._json(tables.table(rt, items, rv, q.get("includeObject",
                                                                        "Metadata")))
                return self._json({"kind": f"{rt.kind}List", "apiVersion": rt.api_version,
                                   "metadata": {"resourceVersion": rv}, "items": items})
            if sub == "scale":
                return self._json(store.get_scale(rt, ns, name))
            obj = store.get(rt, ns, name)
            if as_table:
                return self._json(tables.table(rt, [obj], obj["metadata"]["resourceVersion"],
                                               q.get("includeObject", "Metadata")))
            return self._json(obj)
        if method == "POST":
            if name is not None:
                raise ApiError(405, f"POST is not supported on {request.path}",
                               "MethodNotAllowed")
            body = await self._body(request)
            obj = store.create(rt, ns, body, manager=self._manager(request), dry_run=dry_run,
                               strict=strict)
            return self._json(obj, 201)
        if name is None:
            if method == "DELETE":
                labels = parse_label_selector(q.get("labelSelector"))
                fields = parse_field_selector(q.get("fieldSelector"))
                items = store.delete_collection(rt, route.namespace, labels, fields,
                                                dry_run=dry_run)
                return self._json({"kind": f"{rt.kind}List", "apiVersion": rt.api_version,
                                   "metadata": {"resourceVersion": str(store.rv)},
                                   "items": items})
            raise ApiError(405, f"{method} needs an object name", "MethodNotAllowed")
        if method == "PUT":
            body = await self._body(request)
            obj = store.replace(rt, ns, name, body, sub=sub, manager=self._manager(request),
                                dry_run=dry_run, strict=strict)
            return self._json(obj)
        if method == "PATCH":
            ctype = request.headers.get("Content-Type", "").split(";")[0].strip()
            ptype = PATCH_TYPES.get(ctype)
            if ptype is None:
                raise ApiError(415, f"the body of the request was in an unknown format - "
                               f"accepted media types include: {', '.join(PATCH_TYPES)}",
                               "UnsupportedMediaType")
            body = await self._body(request)
            existed = store.find(rt, ns, name) is not None
            obj = store.patch(rt, ns, name, ptype, body, sub=sub,
                              manager=self._manager(request), dry_run=dry_run,
                              force=_truthy(q.get("force")), strict=strict)
            return self._json(obj, 200 if existed or ptype != "apply" else 201)
        if method == "DELETE":
            body = await self._body(request)
            opts = body if isinstance(body, dict) else {}
            propagation = q.get("propagationPolicy") or opts.get("propagationPolicy")
            if propagation is None and (_truthy(q.get("orphanDependents"))
                                        or opts.get("orphanDependents")):
                propagation = "Orphan"
            dry = dry_run or "All" in (opts.get("dryRun") or [])
            obj = store.delete(rt, ns, name, propagation=propagation or "Background",
                               dry_run=dry, preconditions=opts.get("preconditions"))
            return self._json(obj)
        raise ApiError(405, f"method {method} is not supported", "MethodNotAllowed")

    async def _watch(self, request: web.Request, rt: ResourceType, namespace: str | None,
                     labels: list[Any], fields: list[Any], as_table: bool,
                     record: RequestRecord) -> web.StreamResponse:
        q = request.query
        store = self.store
        watcher = Watcher(rt, namespace, labels, fields)
        rv_param = q.get("resourceVersion", "")
        send_initial = _truthy(q.get("sendInitialEvents"))
        bookmarks = _truthy(q.get("allowWatchBookmarks"))
        include = q.get("includeObject", "Metadata")
        initial: list[tuple[str, dict[str, Any]]] = []
        error: ApiError | None = None
        # No await between reading the state and registering: no event can fall in a gap.
        if send_initial or rv_param in ("", "0"):
            initial = [("ADDED", o) for o in store.select(rt, namespace, labels, fields)]
        else:
            try:
                since = int(rv_param)
            except ValueError as exc:
                raise errors.bad_request(f"invalid resourceVersion {rv_param!r}") from exc
            try:
                for ev in store.events_since(since):
                    seen = watcher.translate(ev)
                    if seen is not None:
                        initial.append((seen[0], store.view(rt, seen[1])))
            except ApiError as exc:
                error = exc
        stream = _Stream(watcher, request)
        if error is None:
            store.watchers.add(watcher)
            self._streams.add(stream)
        resp = web.StreamResponse(status=200)
        resp.content_type = "application/json"
        resp.enable_chunked_encoding()
        loop = asyncio.get_running_loop()
        timeout = q.get("timeoutSeconds")
        deadline = loop.time() + float(timeout) if timeout else None

        async def send(type_: str, obj: dict[str, Any]) -> None:
            if as_table and type_ in ("ADDED", "MODIFIED", "DELETED"):
                obj = tables.table(rt, [obj], obj["metadata"].get("resourceVersion", ""),
                                   include)
            line = json.dumps({"type": type_, "object": obj}, separators=(",", ":"))
            await resp.write(line.encode() + b"\n")

        def bookmark(annotations: dict[str, str] | None = None) -> dict[str, Any]:
            meta: dict[str, Any] = {"resourceVersion": str(store.rv)}
            if annotations:
                meta["annotations"] = annotations
            return {"kind": rt.kind, "apiVersion": rt.api_version, "metadata": meta}

        try:
            await resp.prepare(request)
            record.status = 200  # streaming
            if error is not None:
                await send("ERROR", error.status())
                return resp
            for type_, obj in initial:
                await send(type_, obj)
            if send_initial and bookmarks:
                await send("BOOKMARK", bookmark({"k8s.io/initial-events-end": "true"}))
            while True:
                wait = self.bookmark_interval
                if deadline is not None:
                    wait = min(wait, deadline - loop.time())
                    if wait <= 0:
                        break
                try:
                    item = await asyncio.wait_for(watcher.queue.get(), wait)
                except TimeoutError:
                    if bookmarks and (deadline is None or loop.time() < deadline):
                        await send("BOOKMARK", bookmark())
                    continue
                if item == _CLOSE:
                    break
                if item == _ABORT:
                    if request.transport is not None:
                        request.transport.close()
                    break
                await send(*item)
        except (ConnectionResetError, ConnectionError):
            pass
        finally:
            store.watchers.discard(watcher)
            self._streams.discard(stream)
        return resp

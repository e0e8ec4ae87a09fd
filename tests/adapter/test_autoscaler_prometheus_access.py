"""The autoscaler's queries against a secured Prometheus: a real Prometheus serving TLS with a
throwaway CA and basic auth (`--web.config.file`), and in front of it a token gateway (as
kube-rbac-proxy or a Mimir gateway) that wants a bearer token and an X-Scope-OrgID header.

TLS is verified by default (no CA: no data); the CA file, basic auth from a password file, a
bearer token file that is rotated while the source keeps running, and extra headers all work.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import os
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import bcrypt
import pytest
from aiohttp import web
from autoscaler_exporters import engine
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from poolpilot.autoscaler import queries as q
from poolpilot.autoscaler.observe import PrometheusSource, Snapshot
from poolpilot.autoscaler.promaccess import PrometheusAccess
from poolpilot.testkit.polling import wait_for
from poolpilot.testkit.prometheus import PrometheusProcess

pytestmark = pytest.mark.adapter

WINDOW = 4.0
USER, PASSWORD = "autoscaler", "s3cret-password"
TENANT = "team-a"


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))


def make_pki(tmp: Path) -> dict[str, Path]:
    """A CA and a server certificate for 127.0.0.1 signed by it, plus an unrelated CA."""
    now = datetime.datetime.now(datetime.UTC)
    out: dict[str, Path] = {}
    cas = {}
    for label in ("ca", "other-ca"):
        key = _key()
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"poolpilot test {label}")])
        cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=1))
                .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                .sign(key, hashes.SHA256()))
        out[label] = tmp / f"{label}.crt"
        out[label].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        cas[label] = (key, cert)
    ca_key, ca_cert = cas["ca"]
    key = _key()
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
            .issuer_name(ca_cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    out["server.crt"] = tmp / "server.crt"
    out["server.crt"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    out["server.key"] = tmp / "server.key"
    _write_key(key, out["server.key"])
    return out


class TokenGateway:
    """HTTPS reverse proxy: 401 without the current bearer token, 403 without the tenant
    header; forwards to Prometheus with its own basic auth (as a gateway would)."""

    def __init__(self, upstream: str, pki: dict[str, Path]) -> None:
        self.upstream = upstream
        self.pki = pki
        self.token = "token-1"
        self.seen_tokens: list[str] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self.port = 0

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        auth = request.headers.get("Authorization", "")
        self.seen_tokens.append(auth)
        if auth != f"Bearer {self.token}":
            return web.Response(status=401, text="bad token")
        if request.headers.get("X-Scope-OrgID") != TENANT:
            return web.Response(status=403, text="no tenant")
        ctx = ssl.create_default_context(cafile=str(self.pki["ca"]))
        headers = {"Authorization": aiohttp.encode_basic_auth(USER, PASSWORD),
                   "Content-Type": request.headers.get("Content-Type",
                                                       "application/x-www-form-urlencoded")}
        async with aiohttp.ClientSession() as http, \
                http.request(request.method, self.upstream + request.path_qs,
                             data=await request.read(), ssl=ctx, headers=headers) as r:
            return web.Response(status=r.status, body=await r.read(),
                                content_type=r.content_type)

    def start(self) -> TokenGateway:
        self._thread.start()

        async def serve() -> int:
            app = web.Application()
            app.router.add_route("*", "/{tail:.*}", self._handle)
            self._runner = web.AppRunner(app)
            await self._runner.setup()
            ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            ctx.load_cert_chain(str(self.pki["server.crt"]), str(self.pki["server.key"]))
            site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=ctx)
            await site.start()
            return int(self._runner.addresses[0][1])

        self.port = asyncio.run_coroutine_threadsafe(serve(), self._loop).result(30)
        return self

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


@dataclass
class Env:
    prom: PrometheusProcess
    gateway: TokenGateway
    pki: dict[str, Path]
    tmp: Path


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    tmp = tmp_path_factory.mktemp("secured-prom")
    pki = make_pki(tmp)
    exporter = engine(waiting=7, running=1, prompt_rate=50, text_only=True).start()
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
    web_config = {"tls_server_config": {"cert_file": str(pki["server.crt"]),
                                        "key_file": str(pki["server.key"])},
                  "basic_auth_users": {USER: hashed}}
    try:
        with PrometheusProcess(scrape_interval=0.5, web_config=web_config,
                               probe_auth=(USER, PASSWORD)) as prom:
            prom.start([exporter.target("ns", "p", "prefill")])
            gateway = TokenGateway(prom.url, pki).start()
            try:
                e = Env(prom, gateway, pki, tmp)
                src = source(e, prom.url, ca_file=str(pki["ca"]), basic=True)
                wait_for(lambda: has_data(src.fetch()), timeout=60, what="scraped data")
                yield e
            finally:
                gateway.stop()
    finally:
        exporter.stop()


def has_data(snap: Snapshot) -> bool:
    return snap.error is None and snap.get(q.WAITING, ("ns", "p", "prefill")) == 7


def source(env: Env, url: str, *, basic: bool = False, password: str = PASSWORD,
           **access: object) -> PrometheusSource:
    if basic:
        path = env.tmp / f"password-{password}"
        path.write_text(password + "\n")
        access |= {"username": USER, "password_file": str(path)}
    return PrometheusSource(url, q.QuerySet(window_seconds=WINDOW), timeout=5,
                            access=PrometheusAccess(**access))  # type: ignore[arg-type]


def test_tls_with_the_ca_file_and_basic_auth(env: Env) -> None:
    assert env.prom.url.startswith("https://")
    assert has_data(source(env, env.prom.url, ca_file=str(env.pki["ca"]), basic=True).fetch())


@pytest.mark.parametrize("access,error", [
    ({}, "CERTIFICATE_VERIFY_FAILED"),  # verification is on by default: the system CAs
    ({"ca_file": "other-ca"}, "CERTIFICATE_VERIFY_FAILED"),  # a CA that did not sign it
], ids=["no-ca-file", "wrong-ca"])
def test_tls_is_verified_by_default(env: Env, access: dict[str, str], error: str) -> None:
    if "ca_file" in access:
        access = {"ca_file": str(env.pki[access["ca_file"]])}
    snap = source(env, env.prom.url, basic=True, **access).fetch()
    assert snap.values == {} and snap.error is not None and error in snap.error


def test_insecure_skip_verify_is_an_explicit_choice(env: Env) -> None:
    snap = source(env, env.prom.url, basic=True, insecure_skip_verify=True).fetch()
    assert has_data(snap)


def test_a_wrong_password_is_reported(env: Env) -> None:
    snap = source(env, env.prom.url, ca_file=str(env.pki["ca"]), basic=True,
                  password="wrong").fetch()
    assert snap.values == {} and snap.error is not None and "401" in snap.error


def test_bearer_token_file_is_read_again_after_rotation(env: Env) -> None:
    token_file = env.tmp / "token"
    token_file.write_text("token-1\n")
    src = source(env, env.gateway.url, ca_file=str(env.pki["ca"]),
                 bearer_token_file=str(token_file), headers={"X-Scope-OrgID": TENANT})
    assert has_data(src.fetch())
    # The gateway now wants the new token; until the file has it, queries are refused...
    env.gateway.token = "token-2"
    refused = src.fetch()
    assert refused.values == {} and refused.error is not None and "401" in refused.error
    # ... and once the file is swapped (as kubelet swaps a projected token), the same source
    # works.
    new = env.tmp / "token.new"
    new.write_text("token-2\n")
    os.replace(new, token_file)
    assert has_data(src.fetch())
    assert env.gateway.seen_tokens[-1] == "Bearer token-2"


def test_extra_headers_are_sent(env: Env) -> None:
    token_file = env.tmp / "token-h"
    token_file.write_text(env.gateway.token)
    without = source(env, env.gateway.url, ca_file=str(env.pki["ca"]),
                     bearer_token_file=str(token_file)).fetch()
    assert without.error is not None and "403" in without.error
    with_header = source(env, env.gateway.url, ca_file=str(env.pki["ca"]),
                         bearer_token_file=str(token_file),
                         headers={"X-Scope-OrgID": TENANT}).fetch()
    assert has_data(with_header)

"""HTTPServer over real TLS on 127.0.0.1: HTTP/1.1 only (HTTP/2 is never negotiated nor
spoken), the connection metric, and a rotated certificate reaching new connections."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from anyio.streams.tls import TLSAttribute, TLSStream

from sdgruntime import metrics
from sdgruntime.envtest.certs import CertificateAuthority
from sdgruntime.httpserver import HTTPServer, Request, Response
from sdgruntime.webhook.certs import CertWatcher
from tests.runtime.helpers import both_event_loops as anyio_backend  # noqa: F401

pytestmark = pytest.mark.anyio

_CA = CertificateAuthority("tls-test-ca")


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """tls.crt and tls.key for 127.0.0.1, issued by ``_CA``."""
    _CA.serving(["127.0.0.1"]).write(tmp_path, "tls.crt", "tls.key")
    return tmp_path


def client_context(alpn: list[str], ca: CertificateAuthority = _CA) -> ssl.SSLContext:
    context = ssl.create_default_context(cadata=ca.cert_pem.decode())
    context.set_alpn_protocols(alpn)
    return context


async def echo(request: Request) -> Response:
    return Response.json({"body": request.body.decode()})


@asynccontextmanager
async def serving(**kwargs: Any) -> AsyncIterator[HTTPServer]:
    server = HTTPServer("127.0.0.1", 0, {"/echo": echo}, **kwargs)
    async with anyio.create_task_group() as tg:
        await tg.start(server.serve)
        try:
            yield server
        finally:
            tg.cancel_scope.cancel()


def connections(server: str, protocol: str) -> float:
    value = metrics.REGISTRY.get_sample_value(
        "sdgruntime_http_connections_total", {"server": server, "protocol": protocol}
    )
    return value or 0.0


async def connect(server: HTTPServer, alpn: list[str]) -> TLSStream:
    tcp = await anyio.connect_tcp("127.0.0.1", server.port)
    return await TLSStream.wrap(
        tcp, hostname="127.0.0.1", ssl_context=client_context(alpn), standard_compatible=False
    )


async def test_h2_is_never_negotiated_even_if_the_context_offers_it(folder: Path) -> None:
    """Go clients offer h2 first; the server only speaks HTTP/1.1, so it offers only that,
    whatever the context it was given."""
    offering = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    offering.load_cert_chain(folder / "tls.crt", folder / "tls.key")
    offering.set_alpn_protocols(["h2", "http/1.1"])
    before = connections("tls-h1", "http/1.1")  # the counter is the process's
    async with serving(ssl_context_provider=lambda: offering, name="tls-h1") as server:
        async with await connect(server, ["h2", "http/1.1"]) as stream:
            assert stream.extra(TLSAttribute.alpn_protocol) == "http/1.1"
            await stream.send(b"GET /echo HTTP/1.1\r\nhost: a\r\n\r\n")
            assert (await stream.receive()).startswith(b"HTTP/1.1 200")
        # offers h2 in ALPN, as Go clients do (httpx would fail on an h2 answer)
        async with httpx.AsyncClient(
            verify=client_context(["h2", "http/1.1"]), base_url=_url(server)
        ) as client:
            response = await client.post("/echo", content=b"one")
            assert response.http_version == "HTTP/1.1"
            assert response.json()["body"] == "one"
    assert connections("tls-h1", "http/1.1") == before + 2
    assert connections("tls-h1", "h2") == 0


async def test_an_h2_preface_gets_an_error_and_the_server_goes_on(folder: Path) -> None:
    """A client that speaks HTTP/2 with prior knowledge is refused, not served or hung."""
    watcher = CertWatcher(folder / "tls.crt", folder / "tls.key")
    async with serving(ssl_context_provider=watcher) as server:
        async with await connect(server, ["h2"]) as stream:
            settings = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # an empty SETTINGS frame
            await stream.send(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + settings)
            with anyio.fail_after(5):
                answer = b""
                try:
                    while True:
                        answer += await stream.receive()
                except (anyio.EndOfStream, anyio.BrokenResourceError):
                    pass
            assert answer.split(b"\r\n")[0].endswith(b" 400 Bad Request")
        async with httpx.AsyncClient(verify=client_context(["http/1.1"])) as client:
            assert (await client.post(f"{_url(server)}/echo", content=b"x")).status_code == 200


async def test_a_rotated_certificate_reaches_new_connections_only(folder: Path) -> None:
    watcher = CertWatcher(folder / "tls.crt", folder / "tls.key", min_interval=0)
    other = CertificateAuthority("tls-test-ca-2")
    async with serving(ssl_context_provider=watcher) as server:
        async with httpx.AsyncClient(
            verify=client_context(["http/1.1"]), base_url=_url(server)
        ) as old:
            assert (await old.post("/echo", content=b"a")).status_code == 200
            other.serving(["127.0.0.1"]).write(folder, "tls.crt", "tls.key")
            assert (await old.post("/echo", content=b"b")).status_code == 200  # kept alive
        async with httpx.AsyncClient(
            verify=client_context(["http/1.1"], other), base_url=_url(server)
        ) as new:
            assert (await new.post("/echo", content=b"c")).status_code == 200
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            async with httpx.AsyncClient(verify=client_context(["http/1.1"])) as stale:
                await stale.post(f"{_url(server)}/echo", content=b"d")


def _url(server: HTTPServer) -> str:
    return f"https://127.0.0.1:{server.port}"

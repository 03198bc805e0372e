"""HTTPServer(http2=True) over real TLS on 127.0.0.1: the HTTP/1.1 path's behaviour and
limits per stream, flow control, resets, rapid-reset and protocol-error handling, and
HTTP/1.1 clients on the same port."""

from __future__ import annotations

import ssl
import tempfile
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import h2.config
import h2.connection
import h2.events
import h2.settings
import httpx
import pytest
from anyio.streams.tls import TLSAttribute, TLSStream
from h2.errors import ErrorCodes

from sdgruntime import http2, metrics
from sdgruntime.envtest.certs import CertificateAuthority
from sdgruntime.httpserver import HTTPServer, Request, Response
from sdgruntime.webhook.certs import server_context

pytestmark = pytest.mark.anyio

_CA = CertificateAuthority("h2-test-ca")
_PAIR = _CA.serving(["127.0.0.1"])


def _server_context() -> ssl.SSLContext:
    directory = Path(tempfile.mkdtemp(prefix="h2-test-"))
    _PAIR.write(directory, "tls.crt", "tls.key")
    return server_context(directory / "tls.crt", directory / "tls.key", http2=True)


SERVER_CONTEXT = _server_context()


def client_context(alpn: list[str]) -> ssl.SSLContext:
    context = ssl.create_default_context(cadata=_CA.cert_pem.decode())
    context.set_alpn_protocols(alpn)
    return context


# --- handlers -------------------------------------------------------------------------

LARGE = bytes(range(256)) * 1024  # 256 KiB: four times the default flow-control window


class Probe:
    """Handlers that record what they saw; ``blocked`` waits until cancelled."""

    def __init__(self) -> None:
        self.started = anyio.Event()
        self.cancelled = anyio.Event()
        self.in_flight = 0
        self.max_in_flight = 0

    async def echo(self, request: Request) -> Response:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await anyio.sleep(0.05)  # so concurrent requests overlap
        finally:
            self.in_flight -= 1
        return Response.json(
            {
                "method": request.method,
                "path": request.path,
                "query": request.query,
                "host": request.headers.get("host"),
                "x": request.headers.get("x-test"),
                "body": request.body.decode(),
            },
            headers={"connection": "keep-alive", "x-answer": "1"},  # not forwarded on h2
        )

    async def large(self, request: Request) -> Response:
        return Response(200, {"content-type": "application/octet-stream"}, LARGE)

    async def blocked(self, request: Request) -> Response:
        self.started.set()
        try:
            await anyio.sleep_forever()
        finally:
            self.cancelled.set()
        raise AssertionError("unreachable")

    async def boom(self, request: Request) -> Response:
        raise RuntimeError("boom")

    async def slow(self, request: Request) -> Response:
        await anyio.sleep(5)
        return Response.text("late")


@asynccontextmanager
async def serving(**kwargs: Any) -> AsyncIterator[tuple[HTTPServer, Probe]]:
    probe = Probe()
    routes = {
        "/echo": probe.echo,
        "/large": probe.large,
        "/blocked": probe.blocked,
        "/boom": probe.boom,
        "/slow": probe.slow,
    }
    kwargs.setdefault("max_body_bytes", 64 * 1024)
    server = HTTPServer(
        "127.0.0.1",
        0,
        routes,
        ssl_context_provider=lambda: SERVER_CONTEXT,
        http2=True,
        name=kwargs.pop("name", "h2test"),
        **kwargs,
    )
    async with anyio.create_task_group() as tg:
        await tg.start(server.serve)
        try:
            yield server, probe
        finally:
            tg.cancel_scope.cancel()


def h2_client(server: HTTPServer, **kwargs: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        http2=True,
        verify=client_context(["h2", "http/1.1"]),
        base_url=f"https://127.0.0.1:{server.port}",
        **kwargs,
    )


class RawH2:
    """A hand-driven h2 client over TLS, for what httpx would never send."""

    def __init__(self, stream: TLSStream) -> None:
        self.stream = stream
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.events: list[h2.events.Event] = []

    @classmethod
    @asynccontextmanager
    async def connect(cls, server: HTTPServer) -> AsyncIterator[RawH2]:
        tcp = await anyio.connect_tcp("127.0.0.1", server.port)
        stream = await TLSStream.wrap(
            tcp,
            hostname="127.0.0.1",
            ssl_context=client_context(["h2"]),
            standard_compatible=False,
        )
        assert stream.extra(TLSAttribute.alpn_protocol) == "h2"
        client = cls(stream)
        client.conn.initiate_connection()
        await client.flush()
        async with stream:
            yield client

    async def flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            await self.stream.send(data)

    def headers(self, path: str, method: str = "POST", **extra: str) -> list[tuple[str, str]]:
        fields = [
            (":method", method),
            (":path", path),
            (":scheme", "https"),
            (":authority", "127.0.0.1"),
        ]
        return fields + list(extra.items())

    async def until(
        self, done: Callable[[h2.events.Event], bool], limit: float = 5.0
    ) -> h2.events.Event | None:
        """Reads until an event satisfies ``done``; ``None`` if the connection closed."""
        with anyio.fail_after(limit):
            while True:
                for event in self.events:
                    if done(event):
                        self.events.remove(event)
                        return event
                try:
                    data = await self.stream.receive()
                except (anyio.EndOfStream, anyio.BrokenResourceError):
                    return None
                for event in self.conn.receive_data(data):
                    if isinstance(event, h2.events.DataReceived):
                        assert event.stream_id is not None
                        self.conn.acknowledge_received_data(
                            event.flow_controlled_length or 0, event.stream_id
                        )
                    self.events.append(event)
                await self.flush()

    async def status(self, stream_id: int) -> str:
        event = await self.until(
            lambda e: isinstance(e, h2.events.ResponseReceived) and e.stream_id == stream_id
        )
        assert isinstance(event, h2.events.ResponseReceived) and event.headers
        return dict(event.headers)[b":status"].decode()


def connections(server: str, protocol: str) -> float:
    value = metrics.REGISTRY.get_sample_value(
        "sdgruntime_http_connections_total", {"server": server, "protocol": protocol}
    )
    return value or 0.0


# --- tests ----------------------------------------------------------------------------


async def test_many_concurrent_requests_share_one_connection() -> None:
    async with serving(name="h2-concurrent") as (server, probe), h2_client(server) as client:
        results: dict[int, httpx.Response] = {}

        async def one(i: int) -> None:
            results[i] = await client.post(f"/echo?i={i}", content=f"body {i}".encode())

        async with anyio.create_task_group() as tg:
            for i in range(40):
                tg.start_soon(one, i)
        for i, response in results.items():
            assert response.http_version == "HTTP/2"
            assert response.status_code == 200
            assert response.json() == {
                "method": "POST",
                "path": "/echo",
                "query": {"i": [str(i)]},
                "host": "127.0.0.1:" + str(server.port),
                "x": None,
                "body": f"body {i}",
            }
            assert "connection" not in response.headers
            assert response.headers["x-answer"] == "1"
        assert len(results) == 40
        assert probe.max_in_flight > 10  # served concurrently, not one after another
        assert connections("h2-concurrent", "h2") == 1


async def test_a_response_larger_than_the_window_arrives_whole() -> None:
    async with serving() as (server, _), h2_client(server) as client:
        response = await client.get("/large")
        assert response.status_code == 200
        assert response.content == LARGE
        assert response.headers["content-length"] == str(len(LARGE))


async def test_the_response_waits_for_window_updates() -> None:
    """A client that opens its window only bit by bit still gets every byte."""
    async with serving() as (server, _), RawH2.connect(server) as raw:
        stream_id = raw.conn.get_next_available_stream_id()
        raw.conn.send_headers(stream_id, raw.headers("/large", "GET"), end_stream=True)
        await raw.flush()
        received = bytearray()
        with anyio.fail_after(10):
            while True:
                event = await raw.until(
                    lambda e: isinstance(e, (h2.events.DataReceived, h2.events.StreamEnded))
                )
                if isinstance(event, h2.events.StreamEnded):
                    break
                assert isinstance(event, h2.events.DataReceived) and event.data is not None
                received += event.data
        assert bytes(received) == LARGE  # 4 x 64 KiB: needed three window refills at least


async def test_error_answers_match_http11() -> None:
    async with serving(handler_timeout=0.2) as (server, _), h2_client(server) as client:
        assert (await client.get("/nowhere")).status_code == 404
        assert (await client.get("/boom")).status_code == 500
        response = await client.get("/slow")
        assert response.status_code == 503
        assert response.text == "handler timeout\n"
        head = await client.head("/large")
        assert head.status_code == 200
        assert head.content == b""
        assert head.headers["content-length"] == str(len(LARGE))
        assert (await client.get("/echo")).status_code == 200  # the connection goes on


async def test_body_over_the_limit_gets_413_declared_or_streamed() -> None:
    async with serving(max_body_bytes=1000) as (server, _), h2_client(server) as client:
        declared = await client.post("/echo", content=b"x" * 1001)
        assert declared.status_code == 413
        assert "exceeds the limit of 1000 bytes" in declared.text

        async def chunks() -> AsyncIterator[bytes]:  # no content-length
            for _ in range(5):
                yield b"y" * 400

        streamed = await client.post("/echo", content=chunks())
        assert streamed.status_code == 413
        assert (await client.post("/echo", content=b"ok")).json()["body"] == "ok"
        assert server.buffered_bytes == 0


async def test_headers_over_the_limit_get_431_and_the_connection_goes_on() -> None:
    async with serving(max_header_bytes=4096) as (server, _), h2_client(server) as client:
        response = await client.get("/echo", headers={"x-test": "z" * 5000})
        assert response.status_code == 431
        assert "header fields exceed the limit of 4096 bytes" in response.text
        ok = await client.get("/echo", headers={"x-test": "small"})
        assert ok.json()["x"] == "small"
        assert connections("h2test", "h2") >= 1


async def test_bodies_in_progress_are_capped_in_total_with_503() -> None:
    async with (
        serving(max_body_bytes=1000, max_buffered_bytes=1500) as (server, _),
        RawH2.connect(server) as raw,
    ):
        first = raw.conn.get_next_available_stream_id()
        raw.conn.send_headers(first, raw.headers("/echo"))
        raw.conn.send_data(first, b"a" * 1000)  # held: the request is not finished
        second = raw.conn.get_next_available_stream_id()
        raw.conn.send_headers(second, raw.headers("/echo", **{"content-length": "800"}))
        await raw.flush()
        assert await raw.status(second) == "503"
        raw.conn.end_stream(first)
        await raw.flush()
        assert await raw.status(first) == "200"
        await raw.until(lambda e: isinstance(e, h2.events.StreamEnded) and e.stream_id == first)
        await anyio.sleep(0.05)
        assert server.buffered_bytes == 0


async def test_a_request_not_finished_in_time_gets_408() -> None:
    async with serving(request_timeout=0.3) as (server, _), RawH2.connect(server) as raw:
        stream_id = raw.conn.get_next_available_stream_id()
        raw.conn.send_headers(stream_id, raw.headers("/echo"))
        raw.conn.send_data(stream_id, b"partial")
        await raw.flush()
        assert await raw.status(stream_id) == "408"
        reset = await raw.until(lambda e: isinstance(e, h2.events.StreamReset))
        assert isinstance(reset, h2.events.StreamReset)
        assert reset.error_code == ErrorCodes.NO_ERROR  # "stop sending", RFC 9113 8.1


async def test_an_idle_connection_is_closed_with_goaway() -> None:
    async with (
        serving(request_timeout=0.3, idle_timeout=0.3) as (server, _),
        RawH2.connect(server) as raw,
    ):
        stream_id = raw.conn.get_next_available_stream_id()
        raw.conn.send_headers(stream_id, raw.headers("/echo", "GET"), end_stream=True)
        await raw.flush()
        assert await raw.status(stream_id) == "200"
        start = anyio.current_time()
        goaway = await raw.until(lambda e: isinstance(e, h2.events.ConnectionTerminated))
        assert isinstance(goaway, h2.events.ConnectionTerminated)
        assert goaway.error_code == ErrorCodes.NO_ERROR
        assert anyio.current_time() - start >= 0.2
        assert await raw.until(lambda e: False) is None  # then the socket closes


async def test_a_reset_stream_cancels_its_handler_and_the_connection_goes_on() -> None:
    async with serving() as (server, probe), RawH2.connect(server) as raw:
        stream_id = raw.conn.get_next_available_stream_id()
        raw.conn.send_headers(stream_id, raw.headers("/blocked", "GET"), end_stream=True)
        await raw.flush()
        with anyio.fail_after(5):
            await probe.started.wait()
        raw.conn.reset_stream(stream_id, ErrorCodes.CANCEL)
        await raw.flush()
        with anyio.fail_after(5):
            await probe.cancelled.wait()
        other = raw.conn.get_next_available_stream_id()
        raw.conn.send_headers(other, raw.headers("/echo", "GET"), end_stream=True)
        await raw.flush()
        assert await raw.status(other) == "200"


async def test_a_rapid_reset_flood_gets_goaway_and_others_are_still_served() -> None:
    async with serving() as (server, _), RawH2.connect(server) as raw:
        for _ in range(http2._RESET_BUDGET + 50):
            stream_id = raw.conn.get_next_available_stream_id()
            raw.conn.send_headers(stream_id, raw.headers("/blocked", "GET"), end_stream=True)
            raw.conn.reset_stream(stream_id, ErrorCodes.CANCEL)
        await raw.flush()
        goaway = await raw.until(lambda e: isinstance(e, h2.events.ConnectionTerminated))
        assert isinstance(goaway, h2.events.ConnectionTerminated)
        assert goaway.error_code == ErrorCodes.ENHANCE_YOUR_CALM
        assert await raw.until(lambda e: False) is None  # closed
        async with h2_client(server) as client:
            assert (await client.get("/echo")).status_code == 200


async def test_a_few_resets_are_tolerated() -> None:
    """Timeouts make a real client reset streams now and then: that is no attack."""
    async with serving() as (server, _), RawH2.connect(server) as raw:
        for _ in range(20):
            stream_id = raw.conn.get_next_available_stream_id()
            raw.conn.send_headers(stream_id, raw.headers("/blocked", "GET"), end_stream=True)
            raw.conn.reset_stream(stream_id, ErrorCodes.CANCEL)
        other = raw.conn.get_next_available_stream_id()
        raw.conn.send_headers(other, raw.headers("/echo", "GET"), end_stream=True)
        await raw.flush()
        assert await raw.status(other) == "200"


async def test_garbage_after_the_preface_closes_only_that_connection() -> None:
    async with serving() as (server, _), h2_client(server) as client:
        assert (await client.get("/echo")).status_code == 200  # a connection kept open
        async with RawH2.connect(server) as raw:
            # A DATA frame on stream 0 (a connection error), then noise.
            await raw.stream.send(b"\x00\x00\x01\x00\x00\x00\x00\x00\x00x" + b"\xff" * 64)
            goaway = await raw.until(lambda e: isinstance(e, h2.events.ConnectionTerminated))
            assert isinstance(goaway, h2.events.ConnectionTerminated)
            assert goaway.error_code != ErrorCodes.NO_ERROR
            assert await raw.until(lambda e: False) is None
        assert (await client.get("/echo")).status_code == 200
        assert server.connections == 1


async def test_settings_advertise_the_stream_and_header_limits_and_ping_is_answered() -> None:
    async with serving(max_header_bytes=8192) as (server, _), RawH2.connect(server) as raw:
        raw.conn.ping(b"12345678")
        await raw.flush()
        settings = await raw.until(lambda e: isinstance(e, h2.events.RemoteSettingsChanged))
        assert isinstance(settings, h2.events.RemoteSettingsChanged)
        changed = {code: s.new_value for code, s in settings.changed_settings.items()}
        assert changed[h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS] == 100
        assert changed[h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE] == 8192
        pong = await raw.until(lambda e: isinstance(e, h2.events.PingAckReceived))
        assert isinstance(pong, h2.events.PingAckReceived)
        assert pong.ping_data == b"12345678"


async def test_http11_clients_are_served_on_the_same_port() -> None:
    async with serving(name="h2-mixed") as (server, _):
        async with httpx.AsyncClient(
            verify=client_context(["http/1.1"]), base_url=f"https://127.0.0.1:{server.port}"
        ) as client:
            response = await client.post("/echo", content=b"one")
            assert response.http_version == "HTTP/1.1"
            assert response.json()["body"] == "one"
            assert response.headers["connection"] == "keep-alive"  # h1 keeps its headers
        assert connections("h2-mixed", "http/1.1") == 1
        assert connections("h2-mixed", "h2") == 0


async def test_a_server_without_http2_never_speaks_it() -> None:
    """The probes and metrics servers stay HTTP/1.1 even if a context offered h2."""
    server = HTTPServer(
        "127.0.0.1",
        0,
        {"/x": lambda r: _ok()},
        ssl_context_provider=lambda: SERVER_CONTEXT,
        name="h1-only",
    )
    async with anyio.create_task_group() as tg:
        await tg.start(server.serve)
        tcp = await anyio.connect_tcp("127.0.0.1", server.port)
        stream = await TLSStream.wrap(
            tcp,
            hostname="127.0.0.1",
            ssl_context=client_context(["h2", "http/1.1"]),
            standard_compatible=False,
        )
        assert stream.extra(TLSAttribute.alpn_protocol) == "h2"  # the context's choice
        async with stream:
            await stream.send(b"GET /x HTTP/1.1\r\nhost: a\r\n\r\n")
            assert (await stream.receive()).startswith(b"HTTP/1.1 200")
        tg.cancel_scope.cancel()
    assert connections("h1-only", "http/1.1") == 1


async def _ok() -> Response:
    return Response.text("ok")


async def test_cancelling_serve_closes_h2_connections() -> None:
    probe = Probe()
    server = HTTPServer(
        "127.0.0.1",
        0,
        {"/blocked": probe.blocked},
        ssl_context_provider=lambda: SERVER_CONTEXT,
        http2=True,
    )
    async with anyio.create_task_group() as tg:
        await tg.start(server.serve)
        async with RawH2.connect(server) as raw:
            stream_id = raw.conn.get_next_available_stream_id()
            raw.conn.send_headers(stream_id, raw.headers("/blocked", "GET"), end_stream=True)
            await raw.flush()
            with anyio.fail_after(5):
                await probe.started.wait()
            assert server.connections == 1
            tg.cancel_scope.cancel()
            with anyio.CancelScope(shield=True):
                assert await raw.until(lambda e: False) is None  # the server hung up
    assert probe.cancelled.is_set()
    assert server.connections == 0

"""The HTTP/1.1 server (real sockets on 127.0.0.1): routing, keep-alive, every limit and
graceful shutdown; and the probe/metrics servers on it."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import anyio
import anyio.abc
import httpx
import pytest

from sdgruntime.httpserver import HTTPServer, Request, Response, Router
from sdgruntime.probes import MetricsServer, ProbeServer, metrics_handler, parse_addr
from tests.runtime.helpers import both_event_loops as anyio_backend  # noqa: F401

pytestmark = pytest.mark.anyio


class Serving:
    """A running server: its port and an httpx client for it."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.url, timeout=10)

    async def connect(self) -> anyio.abc.SocketStream:
        return await anyio.connect_tcp("127.0.0.1", self.port)


@asynccontextmanager
async def running(server: Any) -> AsyncIterator[Serving]:
    async with anyio.create_task_group() as tg:
        port = await tg.start(server.serve)
        yield Serving(port)
        tg.cancel_scope.cancel()


class RawResponse:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body


class RawReader:
    """Reads HTTP responses off a raw socket, for what httpx will not send."""

    def __init__(self, stream: anyio.abc.SocketStream) -> None:
        self.stream = stream
        self.buffer = b""

    async def _fill(self) -> bool:
        try:
            with anyio.fail_after(10):
                self.buffer += await self.stream.receive()
        except (anyio.EndOfStream, anyio.BrokenResourceError):
            return False
        return True

    async def response(self, *, head: bool = False) -> RawResponse:
        while b"\r\n\r\n" not in self.buffer:
            assert await self._fill(), f"connection closed; got {self.buffer!r}"
        raw_head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        status_line, *lines = raw_head.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = 0 if head else int(headers.get("content-length", "0"))
        while len(self.buffer) < length:
            assert await self._fill(), "connection closed inside a body"
        body, self.buffer = self.buffer[:length], self.buffer[length:]
        return RawResponse(int(status_line.split()[1]), headers, body)

    async def closed(self) -> bool:
        """Whether the server closes the connection (without sending anything more)."""
        more = await self._fill()
        return not more and not self.buffer


async def echo(request: Request) -> Response:
    return Response.json(
        {
            "method": request.method,
            "path": request.path,
            "query": request.query,
            "headers": request.headers,
            "body": request.body.decode(),
            "client": list(request.client) if request.client else None,
        }
    )


async def boom(request: Request) -> Response:
    raise RuntimeError("handler bug")


async def slow(request: Request) -> Response:
    await anyio.sleep_forever()
    raise AssertionError


def make_server(**kwargs: Any) -> HTTPServer:
    return HTTPServer("127.0.0.1", 0, {"/echo": echo, "/boom": boom, "/slow": slow}, **kwargs)


async def test_request_fields_reach_the_handler() -> None:
    async with running(make_server()) as srv, srv.client() as client:
        r = await client.post(
            "/echo?a=1&a=2&flag",
            content=b"payload",
            headers=[("X-Multi", "one"), ("X-Multi", "two")],
        )
        assert r.status_code == 200
        got = r.json()
        assert got["method"] == "POST"
        assert got["path"] == "/echo"
        assert got["query"] == {"a": ["1", "2"], "flag": [""]}
        assert got["headers"]["x-multi"] == "one, two"
        assert got["body"] == "payload"
        assert got["client"][0] == "127.0.0.1"
        # percent-encoded paths are decoded before routing
        assert (await client.get("/%65cho")).json()["path"] == "/echo"


async def test_port_zero_binds_an_ephemeral_port_and_reports_it() -> None:
    server = make_server()
    with pytest.raises(RuntimeError):
        _ = server.port
    assert not server.listening
    async with running(server) as srv:
        assert srv.port == server.port != 0
        assert server.listening
    assert not server.listening


async def test_unknown_path_and_failing_handler_get_errors_and_the_server_goes_on() -> None:
    async with running(make_server()) as srv, srv.client() as client:
        assert (await client.get("/nope")).status_code == 404
        r = await client.get("/boom")
        assert r.status_code == 500
        assert "handler bug" not in r.text  # internals stay in the log
        assert (await client.get("/echo")).status_code == 200


async def test_keep_alive_serves_several_requests_on_one_connection() -> None:
    async with running(make_server()) as srv, srv.client() as client:
        ports = {tuple((await client.get("/echo")).json()["client"]) for _ in range(3)}
        assert len(ports) == 1


async def test_pipelined_requests_are_answered_in_order() -> None:
    async with running(make_server()) as srv:
        stream = await srv.connect()
        async with stream:
            await stream.send(
                b"GET /echo?n=1 HTTP/1.1\r\nHost: x\r\n\r\n"
                b"GET /echo?n=2 HTTP/1.1\r\nHost: x\r\n\r\n"
                b"GET /echo?n=3 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            )
            reader = RawReader(stream)
            seen = []
            for _ in range(3):
                resp = await reader.response()
                assert resp.status == 200
                seen.append(resp.body)
            for n, body in enumerate(seen, 1):
                assert f'"n":["{n}"]'.encode() in body
            assert await reader.closed()


async def test_body_over_the_limit_gets_413_whether_declared_or_chunked() -> None:
    async with running(make_server(max_body_bytes=1000)) as srv, srv.client() as client:
        r = await client.post("/echo", content=b"x" * 1001)
        assert r.status_code == 413

        async def chunks() -> AsyncIterator[bytes]:
            for _ in range(20):
                yield b"y" * 100

        r = await client.post("/echo", content=chunks())
        assert r.status_code == 413
        assert (await client.post("/echo", content=b"x" * 1000)).json()["body"] == "x" * 1000


async def test_a_large_rejected_upload_still_reads_the_413_not_a_reset() -> None:
    # The server answers before the body is sent; it must not reset the connection under
    # a client that is still writing megabytes.
    async with running(make_server(max_body_bytes=1024)) as srv, srv.client() as client:
        r = await client.post("/echo", content=b"z" * (8 * 1024 * 1024))
        assert r.status_code == 413
        assert "exceeds the limit" in r.text


async def test_malformed_request_gets_400_and_the_server_goes_on() -> None:
    async with running(make_server()) as srv:
        for garbage in (
            b"NOT HTTP AT ALL\r\n\r\n",
            b"GET /echo HTTP/1.1\r\nbad header\r\n\r\n",
            b"GET http://[/x HTTP/1.1\r\nhost: x\r\n\r\n",  # a target urlsplit refuses
        ):
            stream = await srv.connect()
            async with stream:
                await stream.send(garbage)
                reader = RawReader(stream)
                resp = await reader.response()
                assert resp.status == 400
                assert resp.headers["connection"] == "close"
                assert await reader.closed()
        async with srv.client() as client:
            assert (await client.get("/echo")).status_code == 200


async def test_oversized_headers_get_431_whole_or_still_arriving() -> None:
    big = b"GET /echo HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 8192
    many = b"GET /echo HTTP/1.1\r\nHost: x\r\n" + b"".join(
        b"X-%d: %s\r\n" % (n, b"m" * 500) for n in range(10)
    )
    countless = b"GET /echo HTTP/1.1\r\n" + b"".join(b"X-%d: c\r\n" % n for n in range(300))
    async with running(make_server(max_header_bytes=4096)) as srv:
        for head in (
            big + b"\r\n\r\n",  # one field over the cap, complete
            big,  # and with no end in sight
            many + b"\r\n",  # fields each under the cap, together over it
            countless + b"\r\n",  # more fields than any real client sends
        ):
            stream = await srv.connect()
            async with stream:
                await stream.send(head)
                resp = await RawReader(stream).response()
                assert resp.status == 431
                assert resp.body == b"request header fields exceed the limit of 4096 bytes\n"


async def test_request_not_finished_in_time_gets_408_and_is_closed() -> None:
    async with running(make_server(request_timeout=0.2)) as srv:
        stream = await srv.connect()
        async with stream:
            await stream.send(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc")
            reader = RawReader(stream)
            resp = await reader.response()
            assert resp.status == 408
            assert resp.body == b"request not received within 0.2s\n"
            assert await reader.closed()


async def test_a_request_head_not_finished_in_time_gets_408_however_slowly_it_comes() -> None:
    """Slowloris: a head that trickles in a byte at a time never resets the deadline."""
    async with running(make_server(request_timeout=0.5)) as srv:
        stalled = await srv.connect()
        async with stalled:
            await stalled.send(b"GET /echo HTTP/1.1\r\nHost: x\r\nX-Slow: a")
            reader = RawReader(stalled)
            resp = await reader.response()
            assert resp.status == 408
            assert resp.body == b"request not received within 0.5s\n"
            assert await reader.closed()

        dribbling = await srv.connect()
        async with dribbling:
            reader = RawReader(dribbling)

            async def dribble() -> None:
                with contextlib.suppress(anyio.BrokenResourceError, OSError):
                    for byte in b"GET /echo HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 1000:
                        await dribbling.send(bytes([byte]))
                        await anyio.sleep(0.05)

            async with anyio.create_task_group() as tg:
                tg.start_soon(dribble)
                assert (await reader.response()).status == 408
                tg.cancel_scope.cancel()
        async with srv.client() as client:
            assert (await client.get("/echo")).status_code == 200


async def test_a_second_request_on_a_kept_connection_has_its_own_deadline() -> None:
    async with running(make_server(request_timeout=0.3, idle_timeout=60)) as srv:
        stream = await srv.connect()
        async with stream:
            reader = RawReader(stream)
            await stream.send(b"GET /echo HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await reader.response()).status == 200
            await stream.send(b"GET /echo HTTP/1.1\r\nHost: x\r\n")  # and no end
            assert (await reader.response()).status == 408
            assert await reader.closed()


async def _until(condition: Callable[[], bool]) -> None:
    with anyio.fail_after(5):
        while not condition():  # noqa: ASYNC110 - polls the server's counters
            await anyio.sleep(0.01)


async def test_connections_over_the_limit_get_503_and_open_ones_keep_working() -> None:
    server = make_server(max_connections=2)
    get = b"GET /echo HTTP/1.1\r\nHost: x\r\n\r\n"
    async with running(server) as srv, AsyncExitStack() as stack:
        held = []
        for _ in range(2):
            stream = await stack.enter_async_context(await srv.connect())
            await stream.send(get)
            reader = RawReader(stream)
            assert (await reader.response()).status == 200  # kept alive: still counted
            held.append((stream, reader))
        assert server.connections == 2

        async with await srv.connect() as extra:
            await extra.send(get)
            reader = RawReader(extra)
            refused = await reader.response()
            assert refused.status == 503
            assert refused.body == b"too many connections (limit 2)\n"
            assert refused.headers["connection"] == "close"
            assert await reader.closed()
        async with srv.client() as client:  # as a real client sees it
            r = await client.get("/echo")
            assert r.status_code == 503 and r.text == "too many connections (limit 2)\n"

        for stream, reader in held:  # the open connections are served as before
            await stream.send(get)
            assert (await reader.response()).status == 200
        await held[0][0].aclose()
        await _until(lambda: server.connections == 1)
        async with srv.client() as client:
            assert (await client.get("/echo")).status_code == 200


async def test_bodies_in_progress_are_capped_in_total_with_503() -> None:
    server = make_server(max_body_bytes=1000, max_buffered_bytes=1500)
    async with running(server) as srv, await srv.connect() as slow:
        # One upload of 1000 bytes stops after 900: those stay buffered.
        await slow.send(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n")
        await slow.send(b"s" * 900)
        await _until(lambda: server.buffered_bytes == 900)

        async with srv.client() as client:
            declared = await client.post("/echo", content=b"d" * 1000)  # refused up front
            assert declared.status_code == 503
            assert "server busy" in declared.text and "1500 bytes" in declared.text

            async def chunks() -> AsyncIterator[bytes]:
                for _ in range(7):
                    yield b"c" * 100

            chunked = await client.post("/echo", content=chunks())  # refused once over
            assert chunked.status_code == 503 and "server busy" in chunked.text
            assert (await client.post("/echo", content=b"k" * 500)).status_code == 200  # fits

            await slow.send(b"s" * 100)
            answer = await RawReader(slow).response()
            assert answer.status == 200 and b'"body":"' + b"s" * 1000 in answer.body
            await _until(lambda: server.buffered_bytes == 0)  # given back after answering
            assert (await client.post("/echo", content=b"d" * 1000)).status_code == 200
    assert server.buffered_bytes == 0


async def test_refused_and_failed_requests_give_their_buffered_bytes_back() -> None:
    server = make_server(max_body_bytes=1000, max_buffered_bytes=1000, request_timeout=0.2)
    async with running(server) as srv:
        async with srv.client() as client:
            assert (await client.post("/echo", content=b"x" * 1001)).status_code == 413
            assert (await client.post("/boom", content=b"x" * 10)).status_code == 500
        async with await srv.connect() as stream:  # times out holding 500 bytes
            await stream.send(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 999\r\n\r\n")
            await stream.send(b"t" * 500)
            assert (await RawReader(stream).response()).status == 408
        async with await srv.connect() as stream:  # goes away holding 500 bytes
            await stream.send(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 999\r\n\r\n")
            await stream.send(b"t" * 500)
            await _until(lambda: server.buffered_bytes == 500)
        await _until(lambda: server.buffered_bytes == 0)
        async with srv.client() as client:  # the whole budget is available again
            assert (await client.post("/echo", content=b"y" * 1000)).status_code == 200


def test_limits_that_could_never_serve_are_refused() -> None:
    with pytest.raises(ValueError, match="max_connections"):
        make_server(max_connections=0)
    with pytest.raises(ValueError, match="max_buffered_bytes"):
        make_server(max_body_bytes=1000, max_buffered_bytes=999)


async def test_a_fresh_connection_waits_for_its_first_request_as_long_as_an_idle_one() -> None:
    # Go's transport pools connections it dialed but did not use; closing one before the
    # idle timeout makes the next request written on it fail with EOF.
    async with running(make_server(request_timeout=0.1, idle_timeout=60)) as srv:
        spare = await srv.connect()
        async with spare:
            await anyio.sleep(0.4)  # four request timeouts
            await spare.send(b"GET /echo HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await RawReader(spare).response()).status == 200


async def test_silent_and_idle_connections_are_closed_without_an_answer() -> None:
    async with running(make_server(request_timeout=0.2, idle_timeout=0.2)) as srv:
        silent = await srv.connect()
        async with silent:
            assert await RawReader(silent).closed()
        idle = await srv.connect()
        async with idle:
            await idle.send(b"GET /echo HTTP/1.1\r\nHost: x\r\n\r\n")
            reader = RawReader(idle)
            assert (await reader.response()).status == 200
            assert await reader.closed()


async def test_handler_over_its_deadline_gets_503() -> None:
    async with running(make_server(handler_timeout=0.1)) as srv, srv.client() as client:
        assert (await client.get("/slow")).status_code == 503
        assert (await client.get("/echo")).status_code == 200


async def test_head_answers_headers_without_a_body() -> None:
    async with running(make_server()) as srv:
        stream = await srv.connect()
        async with stream:
            await stream.send(
                b"HEAD /echo HTTP/1.1\r\nHost: x\r\n\r\nGET /echo HTTP/1.1\r\nHost: x\r\n\r\n"
            )
            reader = RawReader(stream)
            head = await reader.response(head=True)
            assert head.status == 200 and int(head.headers["content-length"]) > 0
            get = await reader.response()  # the next response starts right after the head
            assert get.status == 200 and get.body.startswith(b'{"method":"GET"')


async def test_expect_100_continue_is_honoured() -> None:
    async with running(make_server()) as srv:
        stream = await srv.connect()
        async with stream:
            await stream.send(
                b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
                b"Expect: 100-continue\r\n\r\n"
            )
            reader = RawReader(stream)
            assert (await reader.response(head=True)).status == 100
            await stream.send(b"hello")
            resp = await reader.response()
            assert resp.status == 200 and b'"body":"hello"' in resp.body


async def test_router_accepts_routes_added_while_serving() -> None:
    router = Router({"/echo": echo})
    with pytest.raises(ValueError):
        router.add("/echo", echo)
    with pytest.raises(ValueError):
        router.add("no-slash", echo)
    async with running(HTTPServer("127.0.0.1", 0, router)) as srv, srv.client() as client:
        assert (await client.get("/late")).status_code == 404
        router.add("/late", echo)
        assert (await client.get("/late")).status_code == 200


async def test_cancelling_serve_closes_the_listener_and_open_connections() -> None:
    server = make_server()
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            port = await tg.start(server.serve)
            stream = await anyio.connect_tcp("127.0.0.1", port)
            await stream.send(b"GET /echo HTTP/1.1\r\nHost: x\r\n\r\n")
            reader = RawReader(stream)
            assert (await reader.response()).status == 200  # kept alive
            tg.cancel_scope.cancel()
    assert await reader.closed()
    await stream.aclose()
    with pytest.raises(OSError):
        await anyio.connect_tcp("127.0.0.1", port)


async def test_shutdown_answers_requests_in_flight_and_takes_no_new_ones() -> None:
    started, release = anyio.Event(), anyio.Event()

    async def finishing(request: Request) -> Response:
        started.set()
        await release.wait()
        return Response.text("finished")

    server = HTTPServer("127.0.0.1", 0, {"/finishing": finishing, "/echo": echo})
    stop = anyio.CancelScope()

    async def run(*, task_status: anyio.abc.TaskStatus[int]) -> None:
        with stop:
            await server.serve(task_status=task_status)

    answers: list[httpx.Response] = []
    async with anyio.create_task_group() as tg:
        port = await tg.start(run)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:

            async def call() -> None:
                answers.append(await client.get("/finishing"))

            tg.start_soon(call)
            with anyio.fail_after(5):
                await started.wait()
            stop.cancel()  # shutdown begins: the listener closes, the request goes on
            await _until(lambda: not server.listening)
            with pytest.raises(OSError):
                await anyio.connect_tcp("127.0.0.1", port)
            release.set()
            await _until(lambda: bool(answers))
    assert [(r.status_code, r.text) for r in answers] == [(200, "finished")]


async def test_shutdown_cancels_what_is_still_running_after_its_timeout() -> None:
    server = make_server(shutdown_timeout=0.2)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            port = await tg.start(server.serve)
            stream = await anyio.connect_tcp("127.0.0.1", port)
            await stream.send(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
            await _until(lambda: server.connections == 1)
            await anyio.sleep(0.05)
            tg.cancel_scope.cancel()
    assert await RawReader(stream).closed()
    await stream.aclose()
    assert server.connections == 0


# --- probes and metrics -------------------------------------------------------------


def test_parse_addr() -> None:
    assert parse_addr(":8080") == (None, 8080)
    assert parse_addr("127.0.0.1:0") == ("127.0.0.1", 0)
    assert parse_addr("[::1]:8443") == ("::1", 8443)
    with pytest.raises(ValueError):
        parse_addr("8080")


async def test_readyz_names_the_failing_check_then_passes() -> None:
    state = {"ready": False}

    def cache_synced() -> bool:
        return state["ready"]

    async def webhook() -> bool:
        return True

    probes = ProbeServer("127.0.0.1:0", readyz_checks={"cache": cache_synced, "webhook": webhook})
    async with running(probes) as srv, srv.client() as client:
        r = await client.get("/readyz")
        assert r.status_code == 500
        assert "[-]cache failed" in r.text
        assert "[+]webhook ok" in r.text
        assert r.text.rstrip().endswith("readyz check failed")
        assert (await client.get("/readyz/cache")).status_code == 500
        assert (await client.get("/readyz/webhook")).status_code == 200
        assert (await client.get("/readyz", params={"exclude": "cache"})).status_code == 200

        state["ready"] = True
        r = await client.get("/readyz")
        assert (r.status_code, r.text) == (200, "ok")
        r = await client.get("/readyz?verbose")
        assert r.status_code == 200 and "[+]cache ok" in r.text
        assert (await client.get("/healthz")).text == "ok"  # no liveness checks: alive
        assert (await client.post("/readyz")).status_code == 405


async def test_healthz_check_that_raises_or_hangs_fails() -> None:
    def broken() -> bool:
        raise RuntimeError("wedged")

    async def hangs() -> bool:
        await anyio.sleep_forever()
        return True

    probes = ProbeServer("127.0.0.1:0", healthz_checks={"loop": broken}, check_timeout=0.1)
    probes.add_healthz_check("hangs", hangs)
    probes.add_readyz_check("none-means-ok", lambda: None)
    with pytest.raises(ValueError):
        probes.add_healthz_check("loop", broken)
    async with running(probes) as srv, srv.client() as client:
        r = await client.get("/healthz")
        assert r.status_code == 500
        assert "[-]loop failed" in r.text and "[-]hangs failed" in r.text
        assert "wedged" not in r.text  # reasons are logged, not served
        assert (await client.get("/readyz")).status_code == 200


async def test_metrics_server_serves_the_registry() -> None:
    async with running(MetricsServer("127.0.0.1:0")) as srv, srv.client() as client:
        r = await client.get("/metrics")
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/plain")
        assert "# TYPE controller_runtime_reconcile_total counter" in r.text
        assert (await client.get("/healthz")).status_code == 404


async def test_metrics_and_probes_can_share_one_port() -> None:
    probes = ProbeServer("127.0.0.1:0")
    probes.router.add("/metrics", metrics_handler())
    async with running(probes) as srv, srv.client() as client:
        assert (await client.get("/healthz")).text == "ok"
        assert "workqueue_depth" in (await client.get("/metrics")).text


async def test_a_response_header_with_a_line_break_is_never_sent() -> None:
    """A handler that echoes input into a header cannot split the answer."""

    async def echoing(request: Request) -> Response:
        return Response.text("hi", headers={"x-echo": request.query_value("v") or ""})

    server = HTTPServer("127.0.0.1", 0, {"/echoing": echoing})
    async with running(server) as srv, srv.client() as client:
        r = await client.get("/echoing", params={"v": "a\r\nx-injected: 1"})
        assert r.status_code == 500 and "x-injected" not in r.headers
        assert r.headers["connection"] == "close"
        r = await client.get("/echoing", params={"v": "fine"})
        assert r.status_code == 200 and r.headers["x-echo"] == "fine"

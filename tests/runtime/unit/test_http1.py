"""The request pool (sdgruntime.rest.http1) against a scripted TCP peer: answers in any
framing reach the right caller, a connection is reused only after a complete answer, the
pool's bound, its waiting and every way a request can end without an answer. The API
server itself is in tests/runtime/integration/test_client.py."""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest

from sdgruntime import errors
from sdgruntime.rest import http1
from sdgruntime.rest.http1 import Pool
from sdgruntime.rest.retry import RequestNotSent
from tests.runtime.helpers import both_event_loops as anyio_backend  # noqa: F401

pytestmark = pytest.mark.anyio

#: What the peer does with one request: given it (head line), it returns the bytes to send
#: (``None``: say nothing and keep the connection; ``b""``: hang up).
Script = Callable[[str], Awaitable[bytes | None]]


def ok(body: bytes = b"{}", *extra: str) -> bytes:
    head = "".join(f"{h}\r\n" for h in extra)
    return f"HTTP/1.1 200 OK\r\n{head}Content-Length: {len(body)}\r\n\r\n".encode() + body


class Peer:
    """A TCP server that reads requests one by one and answers as its script says."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.connections = 0
        self.requests: list[tuple[int, str]] = []  # (connection number, request line)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        number = self.connections
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                line = head.split(b"\r\n", 1)[0].decode()
                length = next(
                    (
                        int(h.split(b":", 1)[1])
                        for h in head.split(b"\r\n")
                        if h.lower().startswith(b"content-length:")
                    ),
                    0,
                )
                await reader.readexactly(length)
                self.requests.append((number, line))
                answer = await self.script(line)
                if answer == b"":
                    break
                if answer is not None:
                    writer.write(answer)
                    await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def plain_pool(port: int, **pool_args: float) -> Pool:
    """A pool to 127.0.0.1:``port`` over plain HTTP, 5 s for every timeout by default."""
    args = {"limit": 4, "pool_timeout": 5.0, "connect_timeout": 5.0, "read_timeout": 5.0}
    args.update(pool_args)
    return Pool(
        f"http://127.0.0.1:{port}",
        None,  # type: ignore[arg-type]  # plain HTTP: no TLS context is used
        None,
        limit=int(args["limit"]),
        pool_timeout=args["pool_timeout"],
        connect_timeout=args["connect_timeout"],
        read_timeout=args["read_timeout"],
    )


@asynccontextmanager
async def serving(script: Script, **pool_args: float) -> AsyncIterator[tuple[Pool, Peer]]:
    peer = Peer(script)
    server = await asyncio.start_server(peer.serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pool = plain_pool(port, **{"limit": 4, **pool_args})
    try:
        yield pool, peer
    finally:
        pool.close()
        server.close()


async def get(pool: Pool, path: str = "/api/v1/nodes") -> http1.Answer:
    return await pool.request(pool.request_bytes("GET", path, None, {}, None), f"GET {path}")


async def test_answers_in_chunks_and_gzip_reach_their_caller_whole() -> None:
    packed = gzip.compress(b'{"items":[]}')
    chunked = (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\n"
        b"Transfer-Encoding: chunked\r\nWarning: a\r\nWarning: b\r\n\r\n"
        + b"".join(
            f"{len(part):x}\r\n".encode() + part + b"\r\n" for part in (packed[:5], packed[5:])
        )
        + b"0\r\n\r\n"
    )

    async def script(line: str) -> bytes:
        return chunked

    async with serving(script) as (pool, peer):
        for _ in range(3):
            status, headers, body = await get(pool)
            assert (status, body) == (200, b'{"items":[]}')
            assert headers["content-type"] == "application/json"
            assert "content-encoding" not in headers  # decoded here
            assert headers["warning"] == "a, b"
        assert peer.connections == 1  # kept alive and reused


async def test_the_request_line_quotes_the_path_and_encodes_the_query() -> None:
    async with serving(lambda line: asyncio.sleep(0, ok())) as (pool, peer):
        data = pool.request_bytes(
            "GET", "/api/v1/pods", {"labelSelector": "a in (b,c)", "watch": "true"}, {}, None
        )
        await pool.request(data, "GET /api/v1/pods")
        assert peer.requests[0][1] == (
            "GET /api/v1/pods?labelSelector=a+in+%28b%2Cc%29&watch=true HTTP/1.1"
        )
        with pytest.raises(ValueError, match="line break"):
            pool.request_bytes("GET", "/x", None, {"Authorization": "Bearer a\r\nX: y"}, None)


async def test_at_most_limit_connections_and_waiters_are_served_in_turn() -> None:
    gate = asyncio.Event()

    async def script(line: str) -> bytes:
        await gate.wait()
        return ok(line.split()[1].encode())

    async with serving(script, limit=2) as (pool, peer):
        calls = [asyncio.ensure_future(get(pool, f"/{i}")) for i in range(6)]
        await asyncio.sleep(0.2)
        assert peer.connections == 2 and len(peer.requests) == 2
        gate.set()
        answers = await asyncio.gather(*calls)
        assert [a[2] for a in answers] == [f"/{i}".encode() for i in range(6)]
        assert peer.connections == 2


async def test_a_caller_that_finds_no_free_connection_in_time_sent_nothing() -> None:
    async def script(line: str) -> bytes | None:
        return None  # never answers

    async with serving(script, limit=1, pool_timeout=0.2, read_timeout=30) as (pool, peer):
        stuck = asyncio.ensure_future(get(pool))
        await asyncio.sleep(0.05)
        with pytest.raises(RequestNotSent, match="ConnectTimeout: no pooled connection"):
            await get(pool, "/second")
        assert [r[1].split()[1] for r in peer.requests] == ["/api/v1/nodes"]
        stuck.cancel()


async def test_a_silent_peer_is_a_read_timeout_and_its_connection_is_not_reused() -> None:
    answers = iter([None, ok(b"second")])

    async def script(line: str) -> bytes | None:
        return next(answers)

    async with serving(script, read_timeout=0.2) as (pool, peer):
        with pytest.raises(errors.TransportError, match="GET /api/v1/nodes: ReadTimeout") as err:
            await get(pool)
        assert not isinstance(err.value, RequestNotSent)  # it may have been handled
        assert (await get(pool))[2] == b"second"
        assert peer.connections == 2


async def test_a_cancelled_caller_leaves_its_late_answer_to_nobody() -> None:
    gate = asyncio.Event()

    async def script(line: str) -> bytes:
        if line.startswith("GET /slow "):
            await gate.wait()
            return ok(b"late")
        return ok(b"fresh")

    async with serving(script, limit=1) as (pool, peer):
        slow = asyncio.ensure_future(get(pool, "/slow"))
        await asyncio.sleep(0.05)
        slow.cancel()
        with pytest.raises(asyncio.CancelledError):
            await slow
        gate.set()
        assert (await get(pool, "/next"))[2] == b"fresh"
        assert peer.connections == 2  # the cancelled one was closed, not reused


async def test_a_hang_up_after_the_request_is_no_answer_and_not_unsent() -> None:
    async def script(line: str) -> bytes:
        return b""

    async with serving(script) as (pool, _):
        with pytest.raises(errors.TransportError, match="ServerDisconnected") as err:
            await get(pool)
        assert not isinstance(err.value, RequestNotSent)


async def test_refused_connections_are_unsent() -> None:
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    pool = Pool(
        f"http://127.0.0.1:{port}",
        None,  # type: ignore[arg-type]
        None,
        limit=1,
        pool_timeout=1,
        connect_timeout=1,
        read_timeout=1,
    )
    for _ in range(2):  # the failed attempt gave its room back
        with pytest.raises(RequestNotSent, match="ConnectError"):
            await get(pool)


async def test_connection_close_bytes_out_of_turn_and_old_idle_ones_are_not_reused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    answers = iter(
        [
            ok(b"1", "Connection: close"),  # the server ends this connection
            ok(b"2") + ok(b"unasked"),  # an answer nobody asked for follows
            ok(b"3"),
            ok(b"4"),
        ]
    )

    async def script(line: str) -> bytes:
        return next(answers)

    async with serving(script) as (pool, peer):
        assert (await get(pool))[2] == b"1"
        assert (await get(pool))[2] == b"2"
        await asyncio.sleep(0.05)
        assert (await get(pool))[2] == b"3"
        assert peer.connections == 3
        monkeypatch.setattr(http1, "KEEPALIVE_SECONDS", 0.0)
        assert (await get(pool))[2] == b"4"
        assert peer.connections == 4


async def test_an_answer_above_the_bound_is_cut_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http1, "MAX_RESPONSE_BYTES", 1000)

    async def script(line: str) -> bytes:
        return ok(b"x" * 1001)

    async with serving(script) as (pool, _):
        with pytest.raises(errors.TransportError, match="ProtocolError: answer larger"):
            await get(pool)


async def test_a_closed_pool_refuses_requests_and_wakes_its_waiters() -> None:
    async def script(line: str) -> bytes | None:
        return None

    async with serving(script, limit=1, read_timeout=30) as (pool, _):
        stuck = asyncio.ensure_future(get(pool))
        await asyncio.sleep(0.05)
        waiting = asyncio.ensure_future(get(pool))
        await asyncio.sleep(0.05)
        pool.close()
        with pytest.raises(RuntimeError, match="closed"):
            await waiting
        with pytest.raises(RuntimeError, match="closed"):
            await get(pool)
        stuck.cancel()


async def test_a_head_answer_has_no_body_and_ends_its_connection() -> None:
    async def script(line: str) -> bytes:
        # A HEAD's answer says how long the GET's body would be, and has none.
        return b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n" if line.startswith("HEAD") else ok()

    async with serving(script) as (pool, peer):
        data = pool.request_bytes("HEAD", "/api", None, {}, None)
        status, headers, body = await pool.request(data, "HEAD /api", head=True)
        assert (status, headers["content-length"], body) == (200, "5", b"")
        assert (await get(pool))[2] == b"{}"
        assert peer.connections == 2  # the parser could not be told: a new one


# --- streams (watches) ---------------------------------------------------------------------

#: A streamed answer's steps: bytes to send, seconds to wait, or None to hang up.
Step = bytes | float | None
STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
)


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


@asynccontextmanager
async def streaming(
    steps: list[Step], **pool_args: float
) -> AsyncIterator[tuple[Pool, list[bytes]]]:
    """A pool whose peer answers every request with ``steps``; the heads it got."""
    heads: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            heads.append(await reader.readuntil(b"\r\n\r\n"))
            for step in steps:
                if step is None:
                    return
                if isinstance(step, float):
                    await asyncio.sleep(step)
                else:
                    writer.write(step)
                    await writer.drain()
            await reader.read()  # until the client closes
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pool = plain_pool(port, **{"limit": 1, **pool_args})
    try:
        yield pool, heads
    finally:
        pool.close()
        server.close()


async def open_watch(pool: Pool, read_timeout: float | None = 5.0) -> http1.Stream:
    data = pool.request_bytes("GET", "/api/v1/pods", {"watch": "1"}, {}, None, gzip=False)
    return await pool.stream(data, "WATCH /api/v1/pods", read_timeout)


async def test_a_stream_gives_its_body_as_it_comes_and_ends_empty() -> None:
    steps: list[Step] = [STREAM_HEAD, chunk(b'{"type":"ADDED"}\n'), 0.2, chunk(b"tail\n")]
    async with streaming([*steps, b"0\r\n\r\n"]) as (pool, heads):
        stream = await open_watch(pool)
        try:
            assert stream.status == 200 and stream.headers["content-type"] == "application/json"
            assert await stream.read() == b'{"type":"ADDED"}\n'  # before the rest was sent
            assert await stream.read() == b"tail\n"
            assert await stream.read() == b""
            assert await stream.read() == b""  # and stays ended
        finally:
            stream.close()
        assert b"GET /api/v1/pods?watch=1 HTTP/1.1" in heads[0]
        assert b"gzip" not in heads[0].lower()  # read as it comes: not compressed


async def test_a_stream_holds_no_pool_slot() -> None:
    async with streaming([STREAM_HEAD]) as (pool, _):  # limit=1
        first, second = await open_watch(pool), await open_watch(pool)
        first.close()
        second.close()


async def test_a_silent_stream_is_a_read_timeout_but_a_slow_one_is_not() -> None:
    slow: list[Step] = [STREAM_HEAD]
    for n in range(5):  # a chunk every 0.1 s, 0.5 s in all: longer than the timeout
        slow += [chunk(b"%d\n" % n), 0.1]
    async with streaming([*slow, b"0\r\n\r\n"]) as (pool, _):
        stream = await open_watch(pool, read_timeout=0.3)
        got = b""
        while data := await stream.read():
            got += data
        assert got == b"0\n1\n2\n3\n4\n"
    async with streaming([STREAM_HEAD, chunk(b"one\n")]) as (pool, _):
        stream = await open_watch(pool, read_timeout=0.3)
        assert await stream.read() == b"one\n"
        with pytest.raises(errors.TransportError, match="WATCH /api/v1/pods: ReadTimeout"):
            await stream.read()
    async with streaming([]) as (pool, _):  # no head either
        with pytest.raises(errors.TransportError, match="ReadTimeout"):
            await open_watch(pool, read_timeout=0.3)


async def test_a_stream_cut_off_is_an_error_not_an_end() -> None:
    async with streaming([STREAM_HEAD, chunk(b"half"), None]) as (pool, _):
        stream = await open_watch(pool)
        assert await stream.read() == b"half"
        with pytest.raises(errors.TransportError, match="ServerDisconnected"):
            await stream.read()


async def test_an_error_answer_to_a_stream_is_read_whole() -> None:
    gone = b'{"kind":"Status","code":410,"reason":"Expired"}'
    answer = (
        b"HTTP/1.1 410 Gone\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(gone), gone)
    )
    async with streaming([answer]) as (pool, _):
        stream = await open_watch(pool)
        assert stream.status == 410
        assert await stream.read_all() == gone


async def test_a_reader_behind_stops_the_reading_and_loses_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(http1, "STREAM_BUFFER_BYTES", 1000)
    parts = [bytes([65 + n % 26]) * 1000 for n in range(1000)]  # 1 MB, 1 kB a chunk
    async with streaming([STREAM_HEAD, *map(chunk, parts), b"0\r\n\r\n"]) as (pool, _):
        stream = await open_watch(pool)
        await asyncio.sleep(0.3)  # everything is sent; the stream holds at most a read more
        assert stream._buffered <= 1000 + 256 * 1024, stream._buffered  # asyncio's read size
        got = b""
        while data := await stream.read():
            got += data
        assert got == b"".join(parts)

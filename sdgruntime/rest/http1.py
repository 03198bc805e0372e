"""A lean HTTP/1.1 client for the API server: asyncio protocols, httptools' parser.

Requests go through a bounded pool of keep-alive connections. Each costs one
``transport.write`` of a request built as bytes, one future and one timer. aiohttp's
request path (URL objects, a payload object, a task per body on Python 3.11, timeout
contexts) cost the manager 200-370 us per request, 11-24% of its busy time in the
benchmarks (hack/bench/RESULTS.md, session 29). Watches are streams (:meth:`Pool.stream`):
each on a connection of its own, outside the pool's bound (a watch holds its connection
for its whole life and must not starve requests), closed when the stream ends.

Invariants:

- A connection serves one request at a time. It is reused only after a complete answer on
  a connection the server keeps alive; anything else (an error, a cancelled caller, a
  timeout) closes it, so no answer is ever read by the wrong request.
- At most ``limit`` connections are open. A connection handed back goes to the first
  waiter, in order; a caller waits ``pool_timeout`` at most.
- Nothing is replayed here: a request without an answer raises and the retry policy
  decides. :class:`RequestNotSent` only when no byte left (no connection was had).
- A stream buffers at most ``STREAM_BUFFER_BYTES`` its reader has not taken: beyond that
  the connection stops reading (TCP flow control holds the server back).
"""

from __future__ import annotations

import asyncio
import ssl
import zlib
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, cast
from urllib.parse import quote, urlencode, urlsplit

import httptools

from sdgruntime import errors
from sdgruntime._readbuffer import BufferedReads
from sdgruntime.rest.retry import RequestNotSent

__all__ = [
    "KEEPALIVE_SECONDS",
    "MAX_RESPONSE_BYTES",
    "STREAM_BUFFER_BYTES",
    "Answer",
    "Pool",
    "Stream",
]

#: What a path may hold unquoted (RFC 3986 pchar and "/"), "%" too: escapes stay escapes.
_PATH_SAFE = "/:@!$&'()*+,;=-._~%"

#: The most one answer may hold, as read (a broken or hostile peer is cut off there). The
#: API server's answers are bounded by its own 3 MiB object limit and list pages by ``limit``.
MAX_RESPONSE_BYTES = 256 * 1024 * 1024

#: An idle connection older than this is closed, not reused (aiohttp's default too): the
#: server may close it meanwhile, and a request written into that race gets no answer.
KEEPALIVE_SECONDS = 15.0

#: What a stream holds that its reader has not taken, at most (then it stops reading).
STREAM_BUFFER_BYTES = 4 * 1024 * 1024

#: (status, headers with lower-case names, body)
Answer = tuple[int, dict[str, str], bytes]


class _Failed(Exception):
    """Why a connection ended without a complete answer ("Kind: detail")."""


_P = TypeVar("_P", bound=asyncio.BaseProtocol)


def _add_header(headers: dict[str, str], name: bytes, value: bytes) -> None:
    """One header field into ``headers`` (lower-case names; a repeated one joined)."""
    key = name.decode("latin-1").lower()
    text = value.decode("latin-1")
    old = headers.get(key)
    headers[key] = text if old is None else f"{old}, {text}"


class _Connection(BufferedReads):
    """One keep-alive connection; :meth:`send` answers one request at a time."""

    def __init__(self, loop: asyncio.AbstractEventLoop, read_timeout: float) -> None:
        self._loop = loop
        self._read_timeout = read_timeout
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._waiter: asyncio.Future[Answer] | None = None
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self._size = 0
        self._last_read = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self.closed = False
        self.idle_since = 0.0  # loop time it was last handed back
        self._head = False  # the request is a HEAD: its answer has no body

    # --- asyncio.Protocol --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # uvloop's: no base class
        self._transport = transport

    def data_received(self, data: memoryview) -> None:
        if self._waiter is None:
            self.close()  # bytes nobody asked for: the stream is out of step
            return
        self._last_read = self._loop.time()
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as err:
            cause = err.__context__ if isinstance(err.__context__, _Failed) else err
            self._fail(_Failed(f"ProtocolError: {cause}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(_Failed(f"ServerDisconnected: {exc}" if exc else "ServerDisconnected"))

    # --- httptools callbacks -------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        _add_header(self._headers, name, value)

    def on_headers_complete(self) -> None:
        if self._head:
            # No body follows, whatever Content-Length says; the parser cannot be told, so
            # the answer ends here and the connection with it.
            waiter, self._waiter = self._waiter, None
            self._stop_timer()
            self.close()
            if waiter is not None and not waiter.done():
                waiter.set_result((self._parser.get_status_code(), self._headers, b""))

    def on_body(self, body: bytes) -> None:
        self._size += len(body)
        if self._size > MAX_RESPONSE_BYTES:
            raise _Failed(f"answer larger than {MAX_RESPONSE_BYTES} bytes")
        self._body.append(body)

    def on_message_complete(self) -> None:
        waiter, self._waiter = self._waiter, None
        self._stop_timer()
        status = self._parser.get_status_code()
        headers, body = self._headers, b"".join(self._body)
        self._headers, self._body, self._size = {}, [], 0
        if waiter is None or not self._parser.should_keep_alive():
            self.close()  # the server ends it, or an answer came that nobody asked for
        if waiter is None or waiter.done():
            return
        if headers.get("content-encoding") == "gzip":
            try:
                body = zlib.decompress(body, 16 + zlib.MAX_WBITS)
            except zlib.error as err:
                self.close()
                waiter.set_exception(_Failed(f"ProtocolError: a bad gzip body: {err}"))
                return
            del headers["content-encoding"]
        waiter.set_result((status, headers, body))

    # --- one request -------------------------------------------------------------------

    def send(self, data: bytes, *, head: bool = False) -> asyncio.Future[Answer]:
        """Write one request (``head``: a HEAD); the future gets its answer or the reason
        there is none."""
        assert self._transport is not None and self.idle
        self._head = head
        self._waiter = waiter = self._loop.create_future()
        self._last_read = self._loop.time()
        self._timer = self._loop.call_at(self._last_read + self._read_timeout, self._check)
        self._transport.write(data)
        return waiter

    def _check(self) -> None:
        """The read timeout: no byte for ``read_timeout`` seconds ends the request."""
        due = self._last_read + self._read_timeout
        if self._loop.time() < due:
            self._timer = self._loop.call_at(due, self._check)
            return
        self._timer = None
        self._fail(_Failed(f"ReadTimeout: nothing read for {self._read_timeout:g} s"))

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _fail(self, why: _Failed) -> None:
        waiter, self._waiter = self._waiter, None
        self._stop_timer()
        self.close()
        if waiter is not None and not waiter.done():
            waiter.set_exception(why)

    @property
    def idle(self) -> bool:
        return self._waiter is None and not self.closed

    def close(self) -> None:
        self.closed = True
        if self._transport is not None:
            self._transport.close()


class Pool:
    """Keep-alive connections to one server: at most ``limit`` open, newest reused first."""

    def __init__(
        self,
        base: str,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None,
        *,
        limit: int,
        pool_timeout: float,
        connect_timeout: float,
        read_timeout: float,
    ) -> None:
        url = urlsplit(base)
        self._tls = ssl_context if url.scheme == "https" else None
        self._host = url.hostname or "localhost"
        self._port = url.port or (443 if self._tls else 80)
        self._prefix = url.path.rstrip("/")
        self._host_header = url.netloc.rsplit("@", 1)[-1]
        self._sni = (server_hostname or self._host) if self._tls else None
        self._limit = limit
        self._pool_timeout = pool_timeout
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._idle: list[_Connection] = []
        self._open = 0  # connections open or being opened, idle or not
        self._waiting: deque[asyncio.Future[_Connection | None]] = deque()
        self._closed = False

    def request_bytes(
        self,
        method: str,
        path: str,
        query: Mapping[str, Any] | None,
        headers: Mapping[str, str],
        content: bytes | None,
        *,
        gzip: bool = True,
    ) -> bytes:
        """The request as it goes on the wire; a header with a line break is refused.
        ``gzip``: the answer may come compressed (not for streams, read as they come)."""
        target = quote(self._prefix + path, safe=_PATH_SAFE)
        if query:
            target += "?" + urlencode(query, doseq=True)
        lines = [f"{method} {target} HTTP/1.1\r\nHost: {self._host_header}\r\n"]
        for name, value in headers.items():
            if "\n" in value or "\r" in value or "\n" in name or "\r" in name:
                raise ValueError(f"header {name!r} holds a line break")
            lines.append(f"{name}: {value}\r\n")
        if gzip:
            lines.append("Accept-Encoding: gzip\r\n")
        if content is not None:
            lines.append(f"Content-Length: {len(content)}\r\n\r\n")
            return "".join(lines).encode("latin-1") + content
        if method in ("POST", "PUT", "PATCH"):
            lines.append("Content-Length: 0\r\n")
        lines.append("\r\n")
        return "".join(lines).encode("latin-1")

    async def request(self, data: bytes, label: str, *, head: bool = False) -> Answer:
        """Send one request (from :meth:`request_bytes`; ``head``: it is a HEAD) and read
        its whole answer. No answer raises :class:`~sdgruntime.errors.TransportError`,
        "``label``: why"."""
        conn = await self._acquire(label)
        try:
            try:
                answer = await conn.send(data, head=head)
            except _Failed as why:
                raise errors.TransportError(f"{label}: {why}") from None
        except BaseException:
            conn.close()  # an answer may still come: nobody else may read it
            self._release(conn)
            raise
        self._release(conn)
        return answer

    async def _acquire(self, label: str) -> _Connection:
        """A live idle connection, a new one while under ``limit``, else the first one
        handed back (or room to open one), waiting ``pool_timeout`` at most."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._pool_timeout
        while True:
            if self._closed:
                raise RuntimeError("the client is closed")
            stale = loop.time() - KEEPALIVE_SECONDS
            while self._idle:
                conn = self._idle.pop()
                if not conn.closed and conn.idle_since > stale:
                    return conn
                conn.close()
                self._open -= 1
            if self._open < self._limit:
                self._open += 1
                try:
                    return await self._connect(label)
                except BaseException:
                    self._open -= 1
                    self._pass_on(None)
                    raise
            waiter: asyncio.Future[_Connection | None] = loop.create_future()
            self._waiting.append(waiter)
            try:
                async with asyncio.timeout_at(deadline):
                    handed = await waiter
            except BaseException as exc:
                if waiter.done() and not waiter.cancelled():
                    self._pass_on(waiter.result())  # handed a turn as it gave up
                elif waiter in self._waiting:
                    waiter.cancel()
                    self._waiting.remove(waiter)
                if isinstance(exc, TimeoutError):
                    raise RequestNotSent(
                        f"{label}: ConnectTimeout: no pooled connection free within "
                        f"{self._pool_timeout:g} s"
                    ) from None
                raise
            if handed is not None:
                if not handed.closed:
                    return handed
                handed.close()
                self._open -= 1
            # else a connection was closed: there is room to open one

    async def _connect(self, label: str) -> _Connection:
        loop = asyncio.get_running_loop()
        read_timeout = self._read_timeout
        return await self._dial(label, lambda: _Connection(loop, read_timeout))

    async def _dial(self, label: str, factory: Callable[[], _P]) -> _P:
        """A new connection with ``factory``'s protocol; unsent if none is had in time."""
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout):
                _, conn = await loop.create_connection(
                    factory,
                    self._host,
                    self._port,
                    ssl=self._tls,
                    server_hostname=self._sni,
                )
        except TimeoutError:
            raise RequestNotSent(
                f"{label}: ConnectTimeout: no connection to {self._host}:{self._port} "
                f"within {self._connect_timeout:g} s"
            ) from None
        except OSError as err:  # refused, unreachable, TLS handshake or verification
            raise RequestNotSent(
                f"{label}: ConnectError: {self._host}:{self._port}: {err}"
            ) from err
        return conn

    def _release(self, conn: _Connection) -> None:
        """A connection whose request ended: to the first waiter, else kept idle, while it
        lives; a closed one makes room for the first waiter."""
        if conn.idle and not self._closed:
            conn.idle_since = asyncio.get_running_loop().time()
            self._pass_on(conn)
        else:
            conn.close()
            self._open -= 1
            self._pass_on(None)

    def _pass_on(self, conn: _Connection | None) -> None:
        """Give the first waiter ``conn`` (``None``: room to open one); else keep it."""
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return
        if conn is not None:
            self._idle.append(conn)

    async def stream(self, data: bytes, label: str, read_timeout: float | None) -> Stream:
        """Send ``data`` (from :meth:`request_bytes`, without gzip) on a new connection and
        wait for the answer's head: its status and headers are the Stream's, its body is
        read as it comes. Raises as :meth:`request` does; ``read_timeout`` (``None``:
        none) bounds every wait for bytes, the head's too."""
        if self._closed:
            raise RuntimeError("the client is closed")
        loop = asyncio.get_running_loop()
        conn = await self._dial(label, lambda: Stream(loop, label, read_timeout))
        try:
            await conn.start(data)
        except BaseException:
            conn.close()
            raise
        return conn

    def close(self) -> None:
        """Close the idle connections; those in use close as their request ends."""
        self._closed = True
        for conn in self._idle:
            conn.close()
        self._open -= len(self._idle)
        self._idle.clear()
        while self._waiting:
            self._pass_on(None)  # each waiter wakes to find the pool closed


class Stream(BufferedReads):
    """One answer read as it arrives, on a connection of its own (:meth:`Pool.stream`).
    ``status`` and ``headers`` are known once it is returned; :meth:`read` gives what came
    since the last call, ``b""`` at the end of the body. Close it when done."""

    def __init__(self, loop: asyncio.AbstractEventLoop, label: str, timeout: float | None):
        self._loop = loop
        self._label = label
        self._timeout = timeout
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._chunks: list[bytes] = []
        self._buffered = 0
        self._paused = False
        self._ended = False  # the body is complete
        self._failed: _Failed | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._last_read = loop.time()
        self.status = 0
        self.headers: dict[str, str] = {}
        self._head_done = False

    # --- asyncio.Protocol and httptools callbacks ----------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # uvloop's: no base class
        self._transport = transport

    def data_received(self, data: memoryview) -> None:
        self._last_read = self._loop.time()
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as err:
            self._fail(_Failed(f"ProtocolError: {err}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        if not self._ended:
            self._fail(_Failed(f"ServerDisconnected: {exc}" if exc else "ServerDisconnected"))

    def on_header(self, name: bytes, value: bytes) -> None:
        _add_header(self.headers, name, value)

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        self._head_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        self._buffered += len(body)
        if self._buffered > STREAM_BUFFER_BYTES and not self._paused:
            self._paused = True
            if self._transport is not None:
                self._transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self._ended = True
        self._wake()
        self.close()  # one answer per stream connection

    # --- the reader ----------------------------------------------------------------------

    async def start(self, data: bytes) -> None:
        """Send the request and wait for the answer's head."""
        assert self._transport is not None
        self._transport.write(data)
        self._last_read = self._loop.time()
        while not self._head_done:
            await self._wait()
        encoding = self.headers.get("content-encoding", "identity")
        if encoding != "identity":
            raise errors.TransportError(
                f"{self._label}: ProtocolError: a {encoding} stream was not asked for"
            )

    async def read(self) -> bytes:
        """What arrived since the last call (waiting for some), ``b""`` once it ended.
        Raises :class:`~sdgruntime.errors.TransportError` if it broke or stayed silent."""
        while not self._chunks:
            if self._ended:
                return b""
            await self._wait()
        data = self._chunks[0] if len(self._chunks) == 1 else b"".join(self._chunks)
        self._chunks.clear()
        self._buffered = 0
        if self._paused:
            self._paused = False
            if self._transport is not None:
                self._transport.resume_reading()
        return data

    async def read_all(self, limit: int = MAX_RESPONSE_BYTES) -> bytes:
        """The rest of the body (an error answer's), cut off above ``limit`` bytes."""
        parts, size = [], 0
        while chunk := await self.read():
            size += len(chunk)
            if size > limit:
                raise errors.TransportError(f"{self._label}: answer larger than {limit} bytes")
            parts.append(chunk)
        return b"".join(parts)

    async def _wait(self) -> None:
        """Until the protocol has news; a silence of ``timeout`` seconds fails it."""
        if self._failed is not None:
            raise errors.TransportError(f"{self._label}: {self._failed}")
        self._waiter = self._loop.create_future()
        try:
            if self._timeout is None:
                await self._waiter
                return
            due = self._last_read + self._timeout
            try:
                async with asyncio.timeout_at(due):
                    await self._waiter
            except TimeoutError:
                waiter = self._waiter
                if not waiter.cancelled() or self._loop.time() < self._last_read + self._timeout:
                    return  # news came, or bytes did meanwhile: look again
                self._fail(_Failed(f"ReadTimeout: nothing read for {self._timeout:g} s"))
        finally:
            self._waiter = None
        if self._failed is not None:
            raise errors.TransportError(f"{self._label}: {self._failed}")

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _fail(self, why: _Failed) -> None:
        if self._failed is None:
            self._failed = why
        self.close()
        self._wake()

    def close(self) -> None:
        """Closes the connection (what is buffered can still be read)."""
        if self._transport is not None:
            self._transport.close()

"""The HTTP/1.1 server of webhooks, probes and metrics: asyncio protocols and httptools'
C parser, with the limits a server reachable from a whole cluster needs. (aiohttp.web's
request path cost the manager a sixth of its busy time in the benchmarks; RESULTS.md.)

:class:`HTTPServer` serves a :class:`Router` until cancelled. Invariant: every input is
bounded and every refusal says why in a text body: connections in total and per client
address (503), buffered bodies (503), body size (413), head size (431), time to a complete
request (408), a handler's time (503); idle connections are closed, sooner under pressure.
TLS contexts come from ``ssl_context_provider``, so certificates rotate without a restart;
ALPN offers only ``http/1.1``. Cancelling ``serve`` closes idle connections and gives
requests in flight ``shutdown_timeout`` seconds. Needs the asyncio backend.
"""

from __future__ import annotations

import asyncio
import email.utils
import functools
import logging
import re
import socket
import ssl
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, cast
from urllib.parse import parse_qs, unquote, urlsplit

import anyio
import anyio.abc
import httptools

from sdgruntime import jsoncodec, metrics
from sdgruntime._readbuffer import BufferedReads

log = logging.getLogger(__name__)

DEFAULT_MAX_CONNECTIONS = 256
# Over HTTP/1.1 the API server holds one connection per review in flight (client-go keeps
# up to 25 idle), so a burst of 64 pod creates is 64 connections from one address: half
# the default total lets such bursts through while one address (a pod of the cluster)
# can never hold every slot.
DEFAULT_MAX_CONNECTIONS_PER_CLIENT = 128
DEFAULT_PRESSURE_IDLE_TIMEOUT = 5.0
_PRESSURE_SHARE = 0.75  # of max_connections: from there on idle connections go early
_LINGER_SECONDS = 2.0  # reading the rest of a refused request, so the answer is not reset
# Refusing a connection over the cap costs a protocol object and a linger: bound those
# too; beyond them a connection is closed unanswered.
_MAX_REFUSING = 32
_REFUSAL_LOG_INTERVAL = 10.0  # a flood of refusals is one warning per interval
_BACKLOG = 511
MAX_HEADER_FIELDS = 128  # as aiohttp's parser; no real client sends more
_MAX_PIPELINED = 16  # requests received and waiting behind the one being served
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


@dataclass(slots=True)
class Request:
    """One fully read HTTP request. Header names are lower case; repeated headers are
    joined with ``", "``. ``path`` is percent-decoded; ``query`` maps each parameter to
    all its values."""

    method: str
    path: str
    query: dict[str, list[str]] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    client: tuple[str, int] | None = None

    def query_value(self, name: str, default: str | None = None) -> str | None:
        """The first value of query parameter ``name``."""
        values = self.query.get(name)
        return values[0] if values else default


@dataclass(slots=True)
class Response:
    """An HTTP response. ``content-length`` is set by the server."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""

    @classmethod
    def text(
        cls, body: str, status: int = 200, headers: Mapping[str, str] | None = None
    ) -> Response:
        """A ``text/plain`` response."""
        return cls(
            status,
            {"content-type": "text/plain; charset=utf-8", **(headers or {})},
            body.encode(),
        )

    @classmethod
    def json(
        cls, obj: Any, status: int = 200, headers: Mapping[str, str] | None = None
    ) -> Response:
        """An ``application/json`` response."""
        # jsoncodec: a string with a lone surrogate (a valid JSON escape, so it can arrive
        # in any request) falls back to ASCII escapes instead of failing.
        body = jsoncodec.dumps(obj)
        return cls(status, {"content-type": "application/json", **(headers or {})}, body)


Handler = Callable[[Request], Awaitable[Response]]


class Router:
    """Exact-path routing. Routes may be added while the server runs (a webhook can be
    registered after the manager started), so servers keep a reference, not a copy."""

    def __init__(self, routes: Mapping[str, Handler] | None = None) -> None:
        self._routes: dict[str, Handler] = {}
        for path, handler in (routes or {}).items():
            self.add(path, handler)

    def add(self, path: str, handler: Handler) -> None:
        """Serves ``handler`` on ``path``; a path is registered once."""
        if not path.startswith("/"):
            raise ValueError(f"route path must start with '/': {path!r}")
        if path in self._routes:
            raise ValueError(f"route {path!r} is already registered")
        self._routes[path] = handler

    def resolve(self, path: str) -> Handler | None:
        """The handler of ``path``, if any."""
        return self._routes.get(path)

    @property
    def paths(self) -> list[str]:
        return sorted(self._routes)


class _Reject(Exception):
    """The request cannot be served; answer ``status`` and close the connection."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class HTTPServer:
    """Serves ``routes`` on ``host:port`` until cancelled (module doc).

    ``port=0`` binds an ephemeral port; the bound port is ``self.port`` and is also the
    value ``serve`` reports through ``task_status.started`` (so
    ``port = await tg.start(server.serve)`` works). ``host=None`` binds all interfaces
    (IPv4 and IPv6, one port).
    """

    def __init__(
        self,
        host: str | None,
        port: int,
        routes: Mapping[str, Handler] | Router,
        *,
        ssl_context_provider: Callable[[], ssl.SSLContext] | None = None,
        max_body_bytes: int = 1024 * 1024,
        max_header_bytes: int = 64 * 1024,
        request_timeout: float = 30.0,
        idle_timeout: float = 120.0,
        handler_timeout: float | None = None,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        max_connections_per_client: int | None = DEFAULT_MAX_CONNECTIONS_PER_CLIENT,
        pressure_connections: int | None = None,
        pressure_idle_timeout: float = DEFAULT_PRESSURE_IDLE_TIMEOUT,
        max_buffered_bytes: int | None = None,
        shutdown_timeout: float = 5.0,
        name: str = "http",
    ) -> None:
        if max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, got {max_connections}")
        if max_connections_per_client is not None and max_connections_per_client < 1:
            raise ValueError(
                "max_connections_per_client must be at least 1 (or None for no per-client "
                f"limit), got {max_connections_per_client}"
            )
        if pressure_idle_timeout <= 0:
            raise ValueError(
                f"pressure_idle_timeout must be over 0 seconds, got {pressure_idle_timeout}"
            )
        if pressure_connections is None:
            pressure_connections = int(max_connections * _PRESSURE_SHARE)
        if max_buffered_bytes is not None and max_buffered_bytes < max_body_bytes:
            raise ValueError(
                f"max_buffered_bytes ({max_buffered_bytes}) is below max_body_bytes "
                f"({max_body_bytes}): a request of the allowed size could never be read"
            )
        self.host = host
        self.router = routes if isinstance(routes, Router) else Router(routes)
        self.ssl_context_provider = ssl_context_provider
        self.max_body_bytes = max_body_bytes
        self.max_header_bytes = max_header_bytes
        self.request_timeout = request_timeout
        # Longer than client-go's 90 s idle-connection timeout, so the API server (not us)
        # closes idle connections and never writes a request onto a socket we closed.
        self.idle_timeout = idle_timeout
        self.handler_timeout = handler_timeout
        self.max_connections = max_connections
        self.max_connections_per_client = max_connections_per_client
        # Over this many open connections, idle ones are closed after pressure_idle_timeout.
        self.pressure_connections = pressure_connections
        self.pressure_idle_timeout = pressure_idle_timeout
        self.max_buffered_bytes = max_buffered_bytes
        self.shutdown_timeout = shutdown_timeout
        self.name = name
        self._requested_port = port
        self._port: int | None = None
        self._listening = False
        self._active = 0  # connections being served
        self._per_client: dict[str, int] = {}  # connections being served, by client address
        self._waiting: set[_Connection] = set()  # served connections waiting for a request
        self._refusing: set[_Refusal] = set()  # connections being answered 503
        self._buffered = 0  # body bytes of requests being read or served
        self._refused = 0  # connections refused since the last warning
        self._refusal_logged = float("-inf")
        self._context: ssl.SSLContext | None = None
        self._warned_context = False  # the provider returned another context (logged once)
        self._connections: set[_Connection] = set()  # served connections, open now
        self._stopping = False  # shutting down: answers close their connections
        self._drained: asyncio.Event | None = None  # set when the last connection closes
        self._opened = metrics.HTTP_CONNECTIONS.labels(server=name, protocol="http/1.1")

    @property
    def connections(self) -> int:
        """Connections being served now (not counting ones being refused)."""
        return self._active

    def connections_from(self, address: str) -> int:
        """Connections being served now for client ``address`` (an IP address)."""
        return self._per_client.get(_client_key(address), 0)

    @property
    def under_pressure(self) -> bool:
        """Whether idle connections are closed after ``pressure_idle_timeout`` now."""
        return self._active > self.pressure_connections

    @property
    def buffered_bytes(self) -> int:
        """Request body bytes held now, across connections."""
        return self._buffered

    @property
    def port(self) -> int:
        """The bound port (only known once serving)."""
        if self._port is None:
            raise RuntimeError(f"{self.name} server is not listening yet")
        return self._port

    @property
    def listening(self) -> bool:
        return self._listening

    async def serve(
        self, *, task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Serves until cancelled, then shuts down gracefully (module doc)."""
        loop = asyncio.get_running_loop()
        self._context = self.ssl_context_provider() if self.ssl_context_provider else None
        if self._context is not None:
            # HTTP/1.1 is all this server speaks: a Go client offered h2 would pick it.
            self._context.set_alpn_protocols(["http/1.1"])
        self._active, self._buffered = 0, 0
        self._per_client.clear()
        self._waiting.clear()
        self._connections.clear()
        self._stopping = False
        sockets = _bind(self.host, self._requested_port)
        servers: list[asyncio.Server] = []
        try:
            for sock in sockets:
                servers.append(
                    await loop.create_server(
                        self._new_connection,
                        sock=sock,
                        ssl=self._context,
                        ssl_handshake_timeout=self.request_timeout if self._context else None,
                        backlog=_BACKLOG,
                    )
                )
            self._port = sockets[0].getsockname()[1]
            self._listening = True
            log.info(
                "%s server listening on %s:%d (%s)",
                self.name,
                self.host or "*",
                self._port,
                "https" if self._context else "http",
            )
            task_status.started(self._port)
            await anyio.sleep_forever()
        finally:
            self._listening = False
            with anyio.CancelScope(shield=True):
                await self._shutdown(servers, sockets)

    async def _shutdown(self, servers: list[asyncio.Server], sockets: list[socket.socket]) -> None:
        """Stops listening, closes idle connections, lets requests in flight finish."""
        for server in servers:
            server.close()
        for sock in sockets[len(servers) :]:  # bound, never served
            sock.close()
        self._stopping = True
        for connection in list(self._connections):
            connection.stop()  # idle ones close now, busy ones after their answer
        if self._connections:
            self._drained = asyncio.Event()
            with anyio.move_on_after(self.shutdown_timeout):
                await self._drained.wait()
            for connection in list(self._connections):
                connection.abort()  # cancels what still runs
            with anyio.move_on_after(1):  # connection_lost comes on a later loop turn
                await self._drained.wait()
            self._drained = None
        for refusal in list(self._refusing):
            refusal.abort()

    # --- connections -------------------------------------------------------------------

    def _new_connection(self) -> _Connection:
        """The listener's protocol factory: called per accepted connection."""
        if self.ssl_context_provider is not None:
            try:
                context = self.ssl_context_provider()  # may pick up a new pair
            except Exception:
                log.exception("%s server: the TLS context provider failed", self.name)
            else:
                if context is not self._context and not self._warned_context:
                    self._warned_context = True
                    log.error(
                        "%s server: the TLS context provider returned a new context; the "
                        "listener keeps the first (rotate behind it instead, as CertWatcher does)",
                        self.name,
                    )
        return _Connection(self, asyncio.get_running_loop())

    def _admit(self, client: str | None) -> str | None:
        """Serves a connection just made (TLS handshake done) from ``client`` (its
        address key), or returns why it is refused."""
        if self._active >= self.max_connections:
            return f"too many connections (limit {self.max_connections})"
        limit = self.max_connections_per_client
        held = self._per_client.get(client, 0) if client is not None else 0
        if limit is not None and client is not None and held >= limit:
            return f"too many connections from {client} (limit {limit} per client address)"
        self._active += 1
        if client is not None:
            self._per_client[client] = held + 1
        self._opened.inc()
        if self._active == self.pressure_connections + 1:  # pressure begins: idle ones go
            for connection in list(self._waiting):
                connection.pressure_began()
        return None

    def _release(self, client: str | None) -> None:
        """A served connection from ``client`` closed."""
        self._active -= 1
        if client is not None:
            held = self._per_client.get(client, 0) - 1
            if held > 0:
                self._per_client[client] = held
            else:
                self._per_client.pop(client, None)

    def _warn_refused(self, reason: str) -> None:
        self._refused += 1
        now = time.monotonic()
        if now - self._refusal_logged >= _REFUSAL_LOG_INTERVAL:
            log.warning(
                "%s server: refused %d connection(s) (%d open), the last one: %s",
                self.name,
                self._refused,
                self._active,
                reason,
            )
            self._refused, self._refusal_logged = 0, now

    # --- requests ----------------------------------------------------------------------

    def _fits(self, more: int) -> bool:
        """Whether ``more`` body bytes fit in the buffered-bytes budget."""
        limit = self.max_buffered_bytes
        return limit is None or self._buffered + more <= limit

    def _busy(self) -> _Reject:
        return _Reject(
            503,
            f"server busy: request bodies in progress would hold over "
            f"{self.max_buffered_bytes} bytes; retry later",
        )

    def _headers_too_large(self) -> _Reject:
        return _Reject(
            431, f"request header fields exceed the limit of {self.max_header_bytes} bytes"
        )

    async def _dispatch(self, request: Request) -> Response:
        handler = self.router.resolve(request.path)
        if handler is None:
            return Response.text("404 page not found\n", 404)
        try:
            if self.handler_timeout is None:  # the handler bounds itself (the webhooks)
                response = await handler(request)
                if not isinstance(response, Response):
                    raise TypeError(f"handler returned {type(response).__name__}, not Response")
                return response
            with anyio.move_on_after(self.handler_timeout) as scope:
                response = await handler(request)
            if scope.cancelled_caught:
                log.warning(
                    "%s handler for %s %s timed out after %ss",
                    self.name,
                    request.method,
                    request.path,
                    self.handler_timeout,
                )
                return Response.text("handler timeout\n", 503)
            if not isinstance(response, Response):
                raise TypeError(f"handler returned {type(response).__name__}, not Response")
            return response
        except Exception:
            log.exception("%s handler for %s %s failed", self.name, request.method, request.path)
            return Response.text("internal server error\n", 500)


class _Stop(Exception):
    """Raised in a parser callback: the connection answered already, parse no further."""


class _Incoming:
    """A request being received, or received and waiting its turn (pipelined)."""

    __slots__ = (
        "body",
        "continue_due",
        "fields",
        "head_bytes",
        "held",
        "keep_alive",
        "method",
        "seen",
        "started",
        "url",
    )

    def __init__(self, started: float) -> None:
        self.started = started  # loop time of its first byte
        self.url = b""
        self.fields: list[tuple[str, str]] = []
        self.head_bytes = 0  # of the head, as parsed so far
        self.seen = -1  # bytes received while its head was incomplete (-1: head done)
        self.body: list[bytes] = []
        self.held = 0  # body bytes counted in the server's budget
        self.method = ""
        self.keep_alive = True
        self.continue_due = False  # "100 Continue" owed once it is the connection's turn


class _Connection(BufferedReads):
    """One client connection: httptools' C parser, one handler task at a time, answers
    written in order, every limit of the module doc.

    One timer per connection: from the first byte of a request until it is fully received
    it is the request deadline (408 when it passes); before a connection's first request
    and between requests the idle timeout (closed silently). A fresh connection waits as
    long as a kept one: HTTP clients (Go's among them) dial spare connections and pool them
    unused, and one closed early fails the next request written on it with EOF. While it
    waits for a request, the server under pressure shortens that to
    ``pressure_idle_timeout`` since the wait began. Requests pipelined behind the one being
    served are parsed (reading pauses while one waits) and served in order, at most
    ``_MAX_PIPELINED``; a connection that sent more is closed after those are answered.
    """

    __slots__ = (
        "_admitted",
        "_client_key",
        "_closing",
        "_current",
        "_discarding",
        "_loop",
        "_owner",
        "_parser",
        "_paused",
        "_pending",
        "_ready",
        "_task",
        "_timer",
        "_transport",
        "_waiting_since",
        "_waiting_until",
        "client",
    )

    def __init__(self, owner: HTTPServer, loop: asyncio.AbstractEventLoop) -> None:
        self._owner = owner
        self._loop = loop
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpRequestParser(self)
        self._admitted = False
        self._current: _Incoming | None = None  # the request being received
        self._ready: deque[_Incoming] = deque()  # received, waiting for the handler
        self._task: asyncio.Task[None] | None = None  # the handler's, while serving
        self._timer: asyncio.TimerHandle | None = None
        self._closing = False  # no request after those received is served
        self._discarding = False  # what arrives is dropped: answered, or lingering
        self._paused = False
        self._pending: _Reject | None = None  # the answer owed after those received
        self._waiting_since: float | None = None  # waiting for a request since (loop time)
        self._waiting_until = 0.0  # ... at most until then, without pressure
        self._client_key: str | None = None  # the address the per-client cap counts
        self.client: tuple[str, int] | None = None

    # --- asyncio.Protocol --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # TCP or TLS; uvloop's transports have the interface without the base class
        transport = cast(asyncio.Transport, transport)
        owner = self._owner
        peer = transport.get_extra_info("peername")
        client = (str(peer[0]), int(peer[1])) if isinstance(peer, tuple) else None
        key = _client_key(client[0]) if client is not None else None
        refused = owner._admit(key)
        if refused is not None:
            owner._warn_refused(refused)
            if len(owner._refusing) >= _MAX_REFUSING:
                transport.abort()
                return
            refusal = _Refusal(owner, refused)
            transport.set_protocol(refusal)  # asyncio's public API: it gets what follows
            refusal.connection_made(transport)
            return
        self._admitted = True
        self._transport = transport
        self.client, self._client_key = client, key
        owner._connections.add(self)
        if owner._stopping:
            self._closing = True
            transport.close()
            return
        self._wait(owner.idle_timeout)

    def connection_lost(self, exc: BaseException | None) -> None:
        if not self._admitted:
            return
        self._admitted = False
        self._transport = None
        self._cancel_timer()
        self._stop_waiting()
        owner = self._owner
        owner._release(self._client_key)
        owner._connections.discard(self)
        if self._task is not None:
            self._task.cancel()  # the client went away: its handler stops
        for incoming in (self._current, *self._ready):
            if incoming is not None:
                self._give_back(incoming)
        self._current = None
        self._ready.clear()
        if not owner._connections and owner._drained is not None:
            owner._drained.set()

    def data_received(self, data: memoryview) -> None:
        if self._discarding:
            return
        current = self._current
        if current is not None and current.seen >= 0:
            current.seen += len(data)
        try:
            self._parser.feed_data(data)
        except _Stop:
            return
        except httptools.HttpParserCallbackError as err:
            if isinstance(err.__context__, _Stop):
                return
            log.error("%s server: a parser callback failed", self._owner.name, exc_info=err)
            self._refuse(500, "internal server error")
            return
        except httptools.HttpParserUpgrade:
            # The request asking for another protocol is served; nothing after it is read.
            self._closing, self._discarding = True, True
            return
        except httptools.HttpParserError as err:
            self._refuse(400, f"bad request: {err}")
            return
        current = self._current
        if current is not None and current.seen == 0:
            # It began in this chunk and its head is not complete: it holds at most the
            # bytes after the chunk's last blank line (none, if it began the chunk).
            chunk = bytes(data)  # (a memoryview has no rfind; this branch is rare)
            current.seen = len(chunk) - (
                chunk.rfind(b"\r\n\r\n") + 4 if b"\r\n\r\n" in chunk else 0
            )
        if current is not None and current.seen > self._owner.max_header_bytes:
            self._refuse_with(self._owner._headers_too_large())  # a head with no end in sight

    def eof_received(self) -> bool:
        if self._task is not None or self._ready:
            self._closing = True  # the client sends no more: answer what came, then close
            return True
        return False

    # --- httptools callbacks -------------------------------------------------------------

    def on_message_begin(self) -> None:
        now = self._loop.time()
        self._current = _Incoming(now)
        self._current.seen = 0
        if self._task is None and not self._ready:  # it is this request's turn
            self._stop_waiting()
            self._arm(self._owner.request_timeout)

    def on_url(self, url: bytes) -> None:
        current = self._current
        assert current is not None
        current.url += url
        current.head_bytes += len(url)
        if current.head_bytes > self._owner.max_header_bytes:
            self._refuse_with(self._owner._headers_too_large())
            raise _Stop

    def on_header(self, name: bytes, value: bytes) -> None:
        current = self._current
        assert current is not None
        current.head_bytes += len(name) + len(value) + 4
        current.fields.append((name.decode("latin-1").lower(), value.decode("latin-1")))
        if current.head_bytes > self._owner.max_header_bytes or (
            len(current.fields) > MAX_HEADER_FIELDS
        ):
            self._refuse_with(self._owner._headers_too_large())
            raise _Stop

    def on_headers_complete(self) -> None:
        current = self._current
        assert current is not None
        owner, parser = self._owner, self._parser
        current.seen = -1
        current.method = parser.get_method().decode("ascii", "replace")
        current.keep_alive = parser.should_keep_alive()
        length: int | None = None
        expect = ""
        for key, value in current.fields:
            if key == "content-length" and value.strip().isdigit():
                length = int(value)  # the parser refuses any other (and duplicates)
            elif key == "expect":
                expect = value.lower()
        reject: _Reject | None = None
        if length is not None and length > owner.max_body_bytes:
            reject = _Reject(
                413,
                f"request body of {length} bytes exceeds the limit of {owner.max_body_bytes} bytes",
            )
        elif length is not None and not owner._fits(length):
            reject = owner._busy()
        if reject is not None:
            self._refuse_with(reject)
            raise _Stop
        if expect == "100-continue" and parser.get_http_version() != "1.0":
            current.continue_due = True
            if self._task is None and not self._ready:
                self._continue(current)

    def on_body(self, body: bytes) -> None:
        current = self._current
        assert current is not None
        owner = self._owner
        size = len(body)
        current.held += size
        owner._buffered += size
        current.body.append(body)
        if current.held > owner.max_body_bytes:
            self._refuse_with(
                _Reject(413, f"request body exceeds the limit of {owner.max_body_bytes} bytes")
            )
            raise _Stop
        if not owner._fits(0):
            self._refuse_with(owner._busy())
            raise _Stop

    def on_message_complete(self) -> None:
        current, self._current = self._current, None
        assert current is not None
        if self._closing or len(self._ready) >= _MAX_PIPELINED:
            self._give_back(current)  # not served: the client sees the close and may retry
            self._closing, self._discarding = True, True
            raise _Stop
        self._ready.append(current)
        last = not current.keep_alive
        if last:  # nothing after it is served
            self._closing, self._discarding = True, True
        if self._task is None:
            self._cancel_timer()
            self._next()
        elif not self._paused and self._transport is not None:
            self._paused = True
            self._transport.pause_reading()  # one waits its turn: read no further for now
        if last:
            raise _Stop

    # --- serving -----------------------------------------------------------------------

    def _next(self) -> None:
        """Serves the first received request, or waits for one."""
        transport = self._transport
        if transport is None:
            return
        if self._ready:
            incoming = self._ready.popleft()
            try:
                request = _make_request(
                    incoming.method,
                    incoming.url.decode("utf-8", "surrogateescape"),
                    incoming.fields,
                    b"".join(incoming.body),
                    self.client,
                )
            except _Reject as reject:
                self._give_back(incoming)
                self._ready.clear()
                self._answer_and_close(reject)
                return
            self._task = self._loop.create_task(self._serve(incoming, request))
            return
        if self._pending is not None:
            self._answer_and_close(self._pending)
            return
        if self._closing:
            transport.close()
            return
        if self._paused:
            self._paused = False
            transport.resume_reading()
        current = self._current
        if current is not None:  # it began while the last one was served: its deadline holds
            if current.continue_due:
                self._continue(current)
            self._arm(current.started + self._owner.request_timeout - self._loop.time())
        else:
            self._wait(self._owner.idle_timeout)

    async def _serve(self, incoming: _Incoming, request: Request) -> None:
        try:
            response = await self._owner._dispatch(request)
        finally:
            self._give_back(incoming)
        self._task = None
        transport = self._transport
        if transport is None:
            return
        # The last answer before the connection closes says so.
        last = self._closing and not self._ready and self._pending is None
        keep = incoming.keep_alive and not last and not self._owner._stopping
        try:
            answer = _encode(response, head=request.method == "HEAD", close=not keep)
        except (ValueError, TypeError) as err:  # a header it cannot carry, a body not bytes
            log.error(
                "%s handler for %s %s: %s", self._owner.name, request.method, request.path, err
            )
            answer = _encode(Response.text("internal server error\n", 500), close=True)
            keep = False
        transport.write(answer)
        if not keep:
            self._closing = True
            self._ready.clear()  # answered with connection: close; the rest is dropped
            self._pending = None
            transport.close()
            return
        self._next()

    def _continue(self, incoming: _Incoming) -> None:
        incoming.continue_due = False
        if self._transport is not None:
            self._transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def _give_back(self, incoming: _Incoming) -> None:
        self._owner._buffered -= incoming.held
        incoming.held = 0
        incoming.body = []

    # --- refusals ------------------------------------------------------------------------

    def _refuse(self, status: int, message: str) -> None:
        self._refuse_with(_Reject(status, message))

    def _refuse_with(self, reject: _Reject) -> None:
        """The request being received cannot be served: it is answered after those before
        it, then the connection closes."""
        log.debug("%s rejecting request from %s: %s", self._owner.name, self.client, reject)
        self._discarding, self._closing = True, True
        if self._current is not None:
            self._give_back(self._current)
            self._current = None
        if self._task is None and not self._ready:
            self._answer_and_close(reject)
        else:
            self._pending = reject  # answered in its turn: those before it still are

    def _answer_and_close(self, reject: _Reject) -> None:
        """Answers ``reject`` and closes; what the client still sends is read and dropped
        for ``_LINGER_SECONDS``, so the answer is not destroyed by a reset (a 408 closes at
        once: the client stalled)."""
        transport = self._transport
        if transport is None:
            return
        self._discarding, self._closing = True, True
        self._cancel_timer()
        self._stop_waiting()
        transport.write(_raw_answer(reject.status, reject.message))
        if reject.status == 408:
            transport.close()
            return
        if self._paused:
            self._paused = False
            transport.resume_reading()
        if transport.can_write_eof():
            transport.write_eof()
        self._timer = self._loop.call_later(_LINGER_SECONDS, transport.close)

    # --- timers --------------------------------------------------------------------------

    def _wait(self, delay: float) -> None:
        """Waits for a request for ``delay`` seconds, or ``pressure_idle_timeout`` if
        shorter while the server is under pressure (then closes, ``_expired``)."""
        owner = self._owner
        now = self._loop.time()
        self._waiting_since, self._waiting_until = now, now + delay
        owner._waiting.add(self)
        if owner.under_pressure:
            delay = min(delay, owner.pressure_idle_timeout)
        self._arm(delay)

    def _stop_waiting(self) -> None:
        if self._waiting_since is not None:
            self._waiting_since = None
            self._owner._waiting.discard(self)

    def pressure_began(self) -> None:
        """The server came under pressure: a connection waiting for a request is closed
        ``pressure_idle_timeout`` after its wait began (at once if that has passed)."""
        since = self._waiting_since
        if since is None or self._transport is None:
            return
        deadline = min(self._waiting_until, since + self._owner.pressure_idle_timeout)
        self._arm(deadline - self._loop.time())

    def stop(self) -> None:
        """The server shuts down: a connection that is not serving closes now, one that
        is closes after its answer."""
        self._closing = True
        if self._task is None and not self._ready and self._transport is not None:
            self._transport.close()

    def abort(self) -> None:
        """Closes now, cancelling the handler."""
        if self._transport is not None:
            self._transport.abort()

    def _arm(self, delay: float) -> None:
        self._cancel_timer()
        self._timer = self._loop.call_later(max(delay, 0.0), self._expired)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self) -> None:
        self._timer = None
        self._stop_waiting()
        transport = self._transport
        if self._task is not None or transport is None:
            return
        if self._current is not None:
            owner = self._owner
            log.debug("%s request from %s not received in time", owner.name, self.client)
            self._give_back(self._current)
            self._current = None
            self._answer_and_close(
                _Reject(408, f"request not received within {owner.request_timeout:g}s")
            )
            return
        transport.close()


class _Refusal(BufferedReads):
    """Answers a connection over a cap with 503 and closes it: the answer goes out at
    once, what the client sends is read and discarded until it closes or for
    ``_LINGER_SECONDS``, so the answer is not destroyed by a reset."""

    def __init__(self, owner: HTTPServer, message: str) -> None:
        self._owner = owner
        self._message = message
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # uvloop's: no base class
        self._owner._refusing.add(self)
        self._transport = transport
        transport.write(_raw_answer(503, self._message, retry_after=True))
        if transport.can_write_eof():
            transport.write_eof()
        self._timer = asyncio.get_running_loop().call_later(_LINGER_SECONDS, self.abort)

    def data_received(self, data: memoryview) -> None:
        pass  # the request is not read: it is answered already

    def eof_received(self) -> bool:
        return False  # the transport closes

    def connection_lost(self, exc: BaseException | None) -> None:
        self._owner._refusing.discard(self)
        if self._timer is not None:
            self._timer.cancel()

    def abort(self) -> None:
        """Closes the connection now."""
        if self._transport is not None:
            self._transport.abort()


def _bind(host: str | None, port: int) -> list[socket.socket]:
    """Listening sockets for ``host`` (``None``: every interface, IPv4 and IPv6), all on
    one port (the first one's when ``port`` is 0)."""
    if host is None:
        candidates = [(socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")]
    else:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        candidates = list(dict.fromkeys((info[0], str(info[4][0])) for info in infos))
    sockets: list[socket.socket] = []
    try:
        for family, address in candidates:
            sock = socket.socket(family, socket.SOCK_STREAM)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock.bind((address, sockets[0].getsockname()[1] if sockets else port))
                sock.listen(_BACKLOG)
                sock.setblocking(False)
            except OSError:
                sock.close()
                if host is None and family == socket.AF_INET6:
                    continue  # no IPv6 on this machine: IPv4 alone
                raise
            sockets.append(sock)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def _client_key(address: str) -> str:
    """The address the per-client cap counts: an IPv4-mapped IPv6 address as IPv4."""
    if address.startswith("::ffff:") and "." in address:
        return address[len("::ffff:") :]
    return address


def _raw_answer(status: int, message: str, *, retry_after: bool = False) -> bytes:
    """A whole ``connection: close`` answer as bytes, for a connection with no request."""
    body = (message + "\n").encode()
    head = [
        f"HTTP/1.1 {status} {_phrase(status)}",
        "content-type: text/plain; charset=utf-8",
        f"content-length: {len(body)}",
        *(["retry-after: 1"] if retry_after else []),
        "connection: close",
    ]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def _encode(response: Response, *, head: bool = False, close: bool = False) -> bytes:
    """``response`` as bytes: its status line, headers (``content-length``, ``date`` and
    ``connection`` set here) and body (none for ``head``). ``ValueError`` for a header a
    response cannot carry (a line break in it, or a name that is not a token)."""
    parts = [_status_line(response.status)]
    for name, value in response.headers.items():
        lower = name.lower()
        if lower in ("content-length", "connection", "date"):
            continue
        if not _TOKEN.fullmatch(name) or "\r" in value or "\n" in value:
            raise ValueError(f"the response header {name!r} cannot be sent")
        parts.append(f"{name}: {value}\r\n")
    body = response.body
    parts.append(f"content-length: {len(body)}\r\ndate: {_date()}\r\n")
    if close:
        parts.append("connection: close\r\n")
    parts.append("\r\n")
    encoded = "".join(parts).encode("latin-1")
    return encoded if head else encoded + body


@functools.cache
def _status_line(status: int) -> str:
    return f"HTTP/1.1 {status} {_phrase(status)}\r\n"


_date_cache: list[Any] = [0, ""]  # [second, its HTTP date]


def _date() -> str:
    """The HTTP date of now, made once per second."""
    now = int(time.time())
    if _date_cache[0] != now:
        _date_cache[0], _date_cache[1] = now, email.utils.formatdate(now, usegmt=True)
    return str(_date_cache[1])


def _make_request(
    method: str,
    target: str,
    fields: Iterable[tuple[str, str]],
    body: bytes,
    client: tuple[str, int] | None,
) -> Request:
    """A ``Request`` from a parsed head; ``_Reject`` (400) for a target that cannot be
    split."""
    if target.startswith("/"):
        raw_path, _, raw_query = target.partition("?")
    else:  # absolute-form ("http://host/path") or "*"
        try:
            parts = urlsplit(target)
        except ValueError as exc:  # "http://[/x": an invalid IPv6 host
            raise _Reject(400, f"bad request target: {exc}") from None
        raw_path, raw_query = parts.path or target, parts.query
    headers: dict[str, str] = {}
    for key, text in fields:
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    return Request(
        method=method,
        path=unquote(raw_path),
        query=parse_qs(raw_query, keep_blank_values=True),
        headers=headers,
        body=body,
        client=client,
    )

"""The HTTP/1.1 server of webhooks, probes and metrics: ``aiohttp.web``'s low-level server
with the limits a server reachable from a whole cluster needs.

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
import logging
import socket
import ssl
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import anyio
import anyio.abc
from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage, LineTooLong

from sdgruntime import jsoncodec, metrics

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
        self._web: web.Server | None = None
        self._protocol_kwargs: dict[str, Any] = {}
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
        # handler_cancellation: a client that goes away cancels its handler.
        self._web = web.Server(self._serve_request, handler_cancellation=True, loop=loop)
        self._protocol_kwargs = {
            "loop": loop,
            # Ours closes idle connections (_Connection); aiohttp's is a later backstop.
            "keepalive_timeout": self.idle_timeout + self.request_timeout,
            "access_log": None,
            # One field (name and value) or the request line may be as long as the whole
            # head may be; the whole head is checked once parsed (_serve_request).
            "max_line_size": self.max_header_bytes,
            "max_field_size": self.max_header_bytes,
            "lingering_time": _LINGER_SECONDS,
            "auto_decompress": False,  # bodies are bounded as sent, and served as sent
        }
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
        assert self._web is not None
        self._web.pre_shutdown()  # idle keep-alive connections close now
        with anyio.move_on_after(self.shutdown_timeout + 1):
            await self._web.shutdown(self.shutdown_timeout)
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
        assert self._web is not None
        return _Connection(self, self._web, **self._protocol_kwargs)

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

    async def _serve_request(self, request: web.BaseRequest) -> web.StreamResponse:
        """aiohttp's handler: reads the body within the limits, then dispatches."""
        connection = request.protocol
        assert isinstance(connection, _Connection)
        deadline = connection.request_began(request)
        held = _Held()
        try:
            try:
                req = await self._read_request(request, connection, deadline, held)
            except _Reject as reject:
                log.debug("%s rejecting request from %s: %s", self.name, connection.client, reject)
                answer = _plain(reject.status, reject.message)
                if reject.status == 408:  # the client stalled: nothing left to linger for
                    await answer.prepare(request)
                    await answer.write_eof()
                    connection.force_close()
                return answer
            return _to_web(await self._dispatch(req))
        finally:
            self._buffered -= held.bytes
            connection.request_ended()

    async def _read_request(
        self,
        request: web.BaseRequest,
        connection: _Connection,
        deadline: float,
        held: _Held,
    ) -> Request:
        raw_headers = request.raw_headers
        raw_path = request.raw_path
        # aiohttp bounds each field; bound the whole head as well.
        size = len(raw_path) + sum(len(k) + len(v) + 4 for k, v in raw_headers)
        if size > self.max_header_bytes:
            raise _Reject(431, self._headers_too_large())
        body = b""
        if request.can_read_body:
            length = request.content_length
            if length is not None and length > self.max_body_bytes:
                raise _Reject(
                    413,
                    f"request body of {length} bytes exceeds the limit of "
                    f"{self.max_body_bytes} bytes",
                )
            if length is not None and not self._fits(length):
                raise self._busy()
            if request.version >= (1, 1) and request.headers.get("expect", "").lower() == (
                "100-continue"
            ):
                await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            body = await self._read_body(request, deadline, held)
        fields = [(k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in raw_headers]
        return _make_request(request.method, raw_path, fields, body, connection.client)

    async def _read_body(self, request: web.BaseRequest, deadline: float, held: _Held) -> bytes:
        """The whole body, counted in ``_buffered`` (and ``held``) as it arrives."""
        chunks = bytearray()
        content = request.content
        try:
            async with asyncio.timeout_at(deadline):
                while chunk := await content.readany():
                    chunks += chunk
                    held.bytes += len(chunk)
                    self._buffered += len(chunk)
                    if len(chunks) > self.max_body_bytes:
                        raise _Reject(
                            413, f"request body exceeds the limit of {self.max_body_bytes} bytes"
                        )
                    if not self._fits(0):
                        raise self._busy()
        except TimeoutError:
            raise _Reject(408, f"request not received within {self.request_timeout:g}s") from None
        return bytes(chunks)

    def _fits(self, more: int) -> bool:
        limit = self.max_buffered_bytes
        return limit is None or self._buffered + more <= limit

    def _busy(self) -> _Reject:
        return _Reject(
            503,
            f"server busy: request bodies in progress would hold over "
            f"{self.max_buffered_bytes} bytes; retry later",
        )

    def _headers_too_large(self) -> str:
        return f"request header fields exceed the limit of {self.max_header_bytes} bytes"

    async def _dispatch(self, request: Request) -> Response:
        handler = self.router.resolve(request.path)
        if handler is None:
            return Response.text("404 page not found\n", 404)
        try:
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


class _Held:
    """Body bytes one request holds in the server's budget."""

    __slots__ = ("bytes",)

    def __init__(self) -> None:
        self.bytes = 0


class _Connection(web.RequestHandler):
    """aiohttp's HTTP/1.1 protocol with the connection caps, the request-head deadline
    and idle timeout, and 431/400 answers for heads aiohttp's parser refuses.

    One timer per connection: from the first byte of a request until its head is parsed
    it is the request deadline (408 when it passes); before a connection's first request
    and between requests the idle timeout (closed silently). A fresh connection waits as
    long as a kept one: HTTP clients (Go's among them) dial spare connections and pool them
    unused, and one closed early fails the next request written on it with EOF. While it
    waits for a request, the server under pressure shortens that to
    ``pressure_idle_timeout`` since the wait began.
    """

    __slots__ = (
        "_admitted",
        "_body",
        "_client_key",
        "_deadline_timer",
        "_evloop",
        "_head_started",
        "_next_started",
        "_owner",
        "_serving",
        "_waiting_since",
        "_waiting_until",
        "client",
    )

    def __init__(
        self, owner: HTTPServer, manager: web.Server, loop: asyncio.AbstractEventLoop, **kwargs: Any
    ) -> None:
        super().__init__(manager, loop=loop, **kwargs)
        self._owner = owner
        self._evloop = loop
        self._admitted = False
        self._deadline_timer: asyncio.TimerHandle | None = None
        self._head_started: float | None = None  # first byte of the request being received
        self._serving = False  # a request is being served
        self._body: Any = None  # the served request's body stream
        self._next_started: float | None = None  # first byte of a request sent while serving
        self._waiting_since: float | None = None  # waiting for a request since (loop time)
        self._waiting_until = 0.0  # ... at most until then, without pressure
        self._client_key: str | None = None  # the address the per-client cap counts
        self.client: tuple[str, int] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        owner = self._owner
        peer = transport.get_extra_info("peername")
        client = (str(peer[0]), int(peer[1])) if isinstance(peer, tuple) else None
        key = _client_key(client[0]) if client is not None else None
        refused = owner._admit(key)
        if refused is not None:
            owner._warn_refused(refused)
            if len(owner._refusing) >= _MAX_REFUSING:
                assert isinstance(transport, asyncio.Transport)  # TCP or TLS
                transport.abort()
                return
            refusal = _Refusal(owner, refused)
            transport.set_protocol(refusal)  # asyncio's public API: it gets what follows
            refusal.connection_made(transport)
            return
        self._admitted = True
        self.client, self._client_key = client, key
        super().connection_made(transport)
        self._wait(owner.idle_timeout)

    def connection_lost(self, exc: BaseException | None) -> None:
        if not self._admitted:
            return
        self._admitted = False
        self._cancel_timer()
        self._stop_waiting()
        self._owner._release(self._client_key)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if data:
            if not self._serving:
                if self._head_started is None:
                    self._stop_waiting()
                    self._head_started = self._evloop.time()
                    self._arm(self._owner.request_timeout)
            elif self._next_started is None and self._body is not None and self._body.is_eof():
                self._next_started = self._evloop.time()  # the body is in: the next request
        super().data_received(data)

    def request_began(self, request: web.BaseRequest) -> float:
        """The request's head is parsed: returns the deadline for its body."""
        self._cancel_timer()
        self._stop_waiting()
        now = self._evloop.time()
        started = self._head_started if self._head_started is not None else now
        self._serving, self._body, self._head_started = True, request.content, None
        return started + self._owner.request_timeout

    def request_ended(self) -> None:
        """The handler is done: the connection waits for the next request."""
        self._serving, self._body = False, None
        if self.transport is None:
            return
        if self._next_started is not None:
            self._head_started, self._next_started = self._next_started, None
            self._arm(self._head_started + self._owner.request_timeout - self._evloop.time())
        else:
            self._wait(self._owner.idle_timeout)

    def _wait(self, delay: float) -> None:
        """Waits for a request for ``delay`` seconds, or ``pressure_idle_timeout`` if
        shorter while the server is under pressure (then closes, ``_expired``)."""
        owner = self._owner
        now = self._evloop.time()
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
        if since is None or self.transport is None:
            return
        deadline = min(self._waiting_until, since + self._owner.pressure_idle_timeout)
        self._arm(deadline - self._evloop.time())

    def _arm(self, delay: float) -> None:
        self._cancel_timer()
        self._deadline_timer = self._evloop.call_later(max(delay, 0.0), self._expired)

    def _cancel_timer(self) -> None:
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
            self._deadline_timer = None

    def _expired(self) -> None:
        self._deadline_timer = None
        self._stop_waiting()
        transport = self.transport
        if self._serving or transport is None:
            return
        if self._head_started is not None:
            owner = self._owner
            log.debug("%s request from %s not received in time", owner.name, self.client)
            message = f"request not received within {owner.request_timeout:g}s"
            transport.write(_raw_answer(408, message))
        self.force_close()

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """A request aiohttp could not parse (or a failure aiohttp caught): 431 for a
        head over the caps, else aiohttp's status; logged at debug only, since any client
        can send garbage."""
        if request.writer.output_size > 0:  # as aiohttp's: an answer is on its way already
            raise ConnectionError("response already started")
        owner = self._owner
        if isinstance(exc, LineTooLong) or (
            isinstance(exc, BadHttpMessage) and "Too many headers" in exc.message
        ):
            status, text = 431, owner._headers_too_large()
        elif status == 400:
            text = f"bad request: {message or exc}"
        else:
            text = _phrase(status).lower()
        if status >= 500:  # not the client's doing
            log.error("%s request from %s failed", owner.name, self.client, exc_info=exc)
        else:
            log.debug("%s request from %s refused (%s): %r", owner.name, self.client, status, exc)
        return _plain(status, text)


class _Refusal(asyncio.Protocol):
    """Answers a connection over a cap with 503 and closes it: the answer goes out at
    once, what the client sends is read and discarded until it closes or for
    ``_LINGER_SECONDS``, so the answer is not destroyed by a reset."""

    def __init__(self, owner: HTTPServer, message: str) -> None:
        self._owner = owner
        self._message = message
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._owner._refusing.add(self)
        self._transport = transport
        transport.write(_raw_answer(503, self._message, retry_after=True))
        if transport.can_write_eof():
            transport.write_eof()
        self._timer = asyncio.get_running_loop().call_later(_LINGER_SECONDS, self.abort)

    def data_received(self, data: bytes) -> None:
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


def _plain(status: int, message: str) -> web.Response:
    """A text answer after which the connection is closed."""
    response = web.Response(
        status=status,
        text=message + "\n",
        content_type="text/plain",
        charset="utf-8",
        headers={"connection": "close"},  # also on an HTTP/1.0 answer to a garbled head
    )
    response.force_close()
    return response


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


def _to_web(response: Response) -> web.Response:
    headers = {k: v for k, v in response.headers.items() if k.lower() != "content-length"}
    return web.Response(status=response.status, body=response.body, headers=headers)


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

"""A small HTTP/1.1 (and opt-in HTTP/2) server on anyio + h11, for webhooks, probes and
metrics.

Why not a framework: we need three tiny endpoints sets, per-connection TLS with a
certificate that can change at any time, strict limits, and structured concurrency
(the server is one task; each connection is a child task; cancelling ``serve`` shuts
everything down). h11 does the protocol parsing; this module adds routing, limits,
timeouts and error answers.

Behaviour worth knowing:

- keep-alive and pipelining are supported (h11 handles the framing);
- every input is bounded, and every refusal says why in a text body: a request body
  larger than ``max_body_bytes`` gets 413 (from ``Content-Length`` before reading the
  body, or while reading a chunked body), headers larger than ``max_header_bytes`` get
  431, malformed requests get 400; after such an error the connection is closed
  *gracefully* (half-close, then the rest of the request is read and discarded for a
  moment) so the client reads the answer instead of a reset;
- at most ``max_connections`` connections are served at once; one more gets an
  immediate 503 ``too many connections (limit N)`` and is closed (over TLS after the
  handshake, so the client can read it; at most ``_MAX_REFUSING`` such answers are in
  progress, connections beyond those are closed unanswered);
- request bodies being read or served hold at most ``max_buffered_bytes`` in total
  (``None``: only the per-request cap); a request that would go over gets 503;
- a client that starts a request but does not finish it within ``request_timeout``
  gets 408; a TLS handshake or a response send that takes longer is dropped; a
  connection that sends nothing is closed after ``request_timeout``, an idle
  keep-alive connection after ``idle_timeout``;
- a handler that raises gets 500, one that outlives ``handler_timeout`` gets 503;
- with ``ssl_context_provider`` each new connection is wrapped with the context the
  provider returns *at that moment*, so a rotated certificate takes effect for new
  connections without a restart;
- with ``http2=True``, a TLS connection whose ALPN chose ``h2`` is served by
  ``sdgruntime.http2`` (same limits and handlers, per stream; see there); the context
  must then offer ``h2`` (``server_context(..., http2=True)``). Without it, ALPN must not
  offer h2 (``server_context`` by default does not). Each served connection counts in
  ``sdgruntime_http_connections_total{server,protocol}``.

Shutdown is cancellation: in-flight requests are cancelled with their connection.
"""

from __future__ import annotations

import contextlib
import logging
import ssl
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import anyio
import anyio.abc
import h11
from anyio.abc import SocketAttribute
from anyio.streams.tls import TLSAttribute, TLSStream

from sdgruntime import jsoncodec, metrics

log = logging.getLogger(__name__)

_RECEIVE_SIZE = 65536
_LINGER_SECONDS = 2.0
_ACCEPT_BACKOFF_MIN = 0.005
_ACCEPT_BACKOFF_MAX = 1.0
_LINGER_MAX_BYTES = 64 * 1024 * 1024
# Refusing a connection over the cap costs a task, a TLS handshake and a linger: bound
# those too, and keep them short.
_MAX_REFUSING = 32
_REFUSE_SECONDS = 5.0
_REFUSAL_LOG_INTERVAL = 10.0  # a flood of refusals is one warning per interval
DEFAULT_MAX_CONNECTIONS = 256
_NETWORK_ERRORS = (
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
    anyio.EndOfStream,
    ssl.SSLError,
    OSError,
)


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
        return cls(
            status,
            {"content-type": "text/plain; charset=utf-8", **(headers or {})},
            body.encode(),
        )

    @classmethod
    def json(
        cls, obj: Any, status: int = 200, headers: Mapping[str, str] | None = None
    ) -> Response:
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
        if not path.startswith("/"):
            raise ValueError(f"route path must start with '/': {path!r}")
        if path in self._routes:
            raise ValueError(f"route {path!r} is already registered")
        self._routes[path] = handler

    def resolve(self, path: str) -> Handler | None:
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
    """Serves ``routes`` on ``host:port`` until cancelled.

    ``port=0`` binds an ephemeral port; the bound port is ``self.port`` and is also the
    value ``serve`` reports through ``task_status.started`` (so
    ``port = await tg.start(server.serve)`` works). ``host=None`` binds all interfaces
    (IPv4 and IPv6).
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
        max_buffered_bytes: int | None = None,
        name: str = "http",
        http2: bool = False,
    ) -> None:
        if max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, got {max_connections}")
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
        self.max_buffered_bytes = max_buffered_bytes
        self.name = name
        self.http2 = http2
        self._requested_port = port
        self._port: int | None = None
        self._listening = False
        self._active = 0  # connections being served
        self._refusing = 0  # connections being answered 503 over the cap
        self._buffered = 0  # body bytes of requests being read or served
        self._refused = 0  # connections refused since the last warning
        self._refusal_logged = float("-inf")

    @property
    def connections(self) -> int:
        """Connections being served now (not counting ones being refused)."""
        return self._active

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
        listener = await anyio.create_tcp_listener(
            local_host=self.host, local_port=self._requested_port
        )
        # A connection task cancelled before it ran never counted itself out: start clean.
        self._active = self._refusing = self._buffered = 0
        try:
            async with listener, anyio.create_task_group() as connections:
                self._port = listener.extra(SocketAttribute.local_port)
                self._listening = True
                log.info(
                    "%s server listening on %s:%d (%s)",
                    self.name,
                    self.host or "*",
                    self._port,
                    "https" if self.ssl_context_provider else "http",
                )
                for socket_listener in listener.listeners:  # one per address family
                    # create_tcp_listener's: SocketListeners, whose accept() _accept uses
                    assert isinstance(socket_listener, anyio.abc.SocketListener)
                    connections.start_soon(self._accept, socket_listener, connections)
                task_status.started(self._port)
        finally:
            self._listening = False

    async def _accept(
        self,
        listener: anyio.abc.SocketListener,
        connections: anyio.abc.TaskGroup,
    ) -> None:
        """Accepts until cancelled. Accept errors (out of file descriptors, a connection
        aborted before it was accepted) are retried with backoff instead of ending the
        server, as Go's net/http does."""
        backoff = _ACCEPT_BACKOFF_MIN
        while True:
            try:
                stream = await listener.accept()
            except OSError as exc:
                log.warning(
                    "%s server: accept failed (%s); retrying in %gs", self.name, exc, backoff
                )
                await anyio.sleep(backoff)
                backoff = min(backoff * 2, _ACCEPT_BACKOFF_MAX)
                continue
            backoff = _ACCEPT_BACKOFF_MIN
            if self._active < self.max_connections:
                self._active += 1  # counted here, so the next accept sees it
                connections.start_soon(self._on_connection, stream)
            elif self._refusing < _MAX_REFUSING:
                self._refusing += 1
                connections.start_soon(self._refuse, stream)
            else:
                self._warn_refused()
                await stream.aclose()

    def _warn_refused(self) -> None:
        self._refused += 1
        now = anyio.current_time()
        if now - self._refusal_logged >= _REFUSAL_LOG_INTERVAL:
            log.warning(
                "%s server: refused %d connection(s): %d open (limit %d)",
                self.name,
                self._refused,
                self._active,
                self.max_connections,
            )
            self._refused, self._refusal_logged = 0, now

    # --- one connection ------------------------------------------------------------

    async def _on_connection(self, raw: anyio.abc.SocketStream) -> None:
        """Connection task: never raises (except cancellation), so one bad client cannot
        take the server down."""
        peer = raw.extra(SocketAttribute.remote_address, None)
        client = (peer[0], peer[1]) if isinstance(peer, tuple) else None
        try:
            async with raw:
                try:
                    stream: anyio.abc.ByteStream = raw
                    protocol = "http/1.1"
                    if self.ssl_context_provider is not None:
                        wrapped = await self._handshake(raw, client)
                        if wrapped is None:
                            return
                        stream = wrapped
                        if self.http2 and wrapped.extra(TLSAttribute.alpn_protocol) == "h2":
                            protocol = "h2"
                    metrics.HTTP_CONNECTIONS.labels(server=self.name, protocol=protocol).inc()
                    if protocol == "h2":
                        from sdgruntime.http2 import H2Session  # h2 only loaded if used

                        await H2Session(self, stream, client).run()
                    else:
                        await self._serve_connection(raw, stream, client)
                except _NETWORK_ERRORS as exc:
                    log.debug("%s connection from %s ended: %r", self.name, client, exc)
                except Exception:
                    log.exception("%s connection from %s failed", self.name, client)
        finally:
            self._active -= 1

    async def _refuse(self, raw: anyio.abc.SocketStream) -> None:
        """Answers a connection over ``max_connections`` with 503 and closes it, within
        ``_REFUSE_SECONDS`` (plus the linger). The answer goes out before the request is
        read (the linger then reads and discards it), so a refusal buffers nothing."""
        message = f"too many connections (limit {self.max_connections})\n".encode()
        answer = (
            b"HTTP/1.1 503 Service Unavailable\r\n"
            b"content-type: text/plain; charset=utf-8\r\n"
            b"content-length: " + str(len(message)).encode() + b"\r\n"
            b"retry-after: 1\r\nconnection: close\r\n\r\n" + message
        )
        self._warn_refused()
        try:
            async with raw:
                stream: anyio.abc.ByteStream = raw
                with anyio.move_on_after(_REFUSE_SECONDS):
                    if self.ssl_context_provider is not None:
                        wrapped = await self._handshake(raw, None)
                        if wrapped is None:
                            return
                        stream = wrapped
                    with contextlib.suppress(*_NETWORK_ERRORS):
                        await stream.send(answer)
                await self._linger(raw)
        except Exception:
            log.exception("%s server: refusing a connection failed", self.name)
        finally:
            self._refusing -= 1

    async def _handshake(
        self, raw: anyio.abc.SocketStream, client: tuple[str, int] | None
    ) -> TLSStream | None:
        """The TLS stream, or ``None`` if the handshake failed or took longer than
        ``request_timeout``."""
        assert self.ssl_context_provider is not None
        try:
            context = self.ssl_context_provider()
        except Exception:
            log.exception("%s server has no TLS context; dropping connection", self.name)
            return None
        with anyio.move_on_after(self.request_timeout):
            try:
                return await TLSStream.wrap(
                    raw, server_side=True, ssl_context=context, standard_compatible=False
                )
            except _NETWORK_ERRORS as exc:
                log.debug("%s TLS handshake with %s failed: %r", self.name, client, exc)
                return None
        log.debug("%s TLS handshake with %s timed out", self.name, client)
        return None

    async def _serve_connection(
        self,
        raw: anyio.abc.SocketStream,
        stream: anyio.abc.ByteStream,
        client: tuple[str, int] | None,
    ) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=self.max_header_bytes)
        first = True
        while True:
            try:
                request = await self._read_request(conn, stream, client, first)
            except _Reject as reject:
                log.debug("%s rejecting request from %s: %s", self.name, client, reject)
                await self._send_error(conn, stream, reject.status, reject.message)
                await self._linger(raw)
                return
            if request is None:
                return
            try:
                response = await self._dispatch(request)
                if not await self._send_response(conn, stream, request, response):
                    return
            finally:
                self._buffered -= len(request.body)  # taken by _read_request
            conn.start_next_cycle()
            first = False

    async def _read_request(
        self,
        conn: h11.Connection,
        stream: anyio.abc.ByteStream,
        client: tuple[str, int] | None,
        first: bool,
    ) -> Request | None:
        """Reads one whole request; ``None`` means the client went away or stayed idle.

        The body's bytes count in ``_buffered`` from the moment they are read; on a
        returned request the caller gives them back, otherwise this does."""
        body = bytearray()
        try:
            request = await self._read_into(conn, stream, client, first, body)
        except BaseException:
            self._buffered -= len(body)
            raise
        if request is None:
            self._buffered -= len(body)
        return request

    async def _read_into(
        self,
        conn: h11.Connection,
        stream: anyio.abc.ByteStream,
        client: tuple[str, int] | None,
        first: bool,
        body: bytearray,
    ) -> Request | None:
        head: h11.Request | None = None
        started = bool(conn.trailing_data[0])  # a pipelined request is already buffered
        wait = self.request_timeout if started or first else self.idle_timeout
        with anyio.CancelScope(deadline=anyio.current_time() + wait) as scope:
            while True:
                try:
                    event = conn.next_event()
                except h11.RemoteProtocolError as exc:
                    if exc.error_status_hint == 431:  # a head still incomplete at the cap
                        raise _Reject(431, self._headers_too_large()) from None
                    raise _Reject(exc.error_status_hint, f"bad request: {exc}") from None
                if event is h11.NEED_DATA:
                    if conn.they_are_waiting_for_100_continue:
                        await stream.send(
                            conn.send(h11.InformationalResponse(status_code=100, headers=[]))
                        )
                    try:
                        data = await stream.receive(_RECEIVE_SIZE)
                    except anyio.EndOfStream:
                        data = b""
                    if data and not started:
                        started = True
                        scope.deadline = anyio.current_time() + self.request_timeout
                    conn.receive_data(data)
                elif isinstance(event, h11.Request):
                    head = event
                    # h11 bounds only heads that arrive in pieces; bound whole ones too.
                    size = len(event.target) + sum(len(k) + len(v) + 4 for k, v in event.headers)
                    if size > self.max_header_bytes:
                        raise _Reject(431, self._headers_too_large())
                    length = _content_length(event.headers)
                    if length is not None and length > self.max_body_bytes:
                        raise _Reject(
                            413,
                            f"request body of {length} bytes exceeds the limit of "
                            f"{self.max_body_bytes} bytes",
                        )
                    if length is not None and not self._fits(length):
                        raise self._busy()
                elif isinstance(event, h11.Data):
                    body += event.data
                    self._buffered += len(event.data)
                    if len(body) > self.max_body_bytes:
                        raise _Reject(
                            413, f"request body exceeds the limit of {self.max_body_bytes} bytes"
                        )
                    if not self._fits(0):
                        raise self._busy()
                elif isinstance(event, h11.EndOfMessage):
                    assert head is not None
                    return _make_request(head, bytes(body), client)
                else:  # ConnectionClosed (or PAUSED, which cannot happen here)
                    return None
        if scope.cancelled_caught and started:
            raise _Reject(408, f"request not received within {self.request_timeout:g}s")
        return None

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

    async def _send_response(
        self,
        conn: h11.Connection,
        stream: anyio.abc.ByteStream,
        request: Request,
        response: Response,
    ) -> bool:
        """Sends ``response``; returns whether the connection can serve another request."""
        headers = [
            (k.lower(), v) for k, v in response.headers.items() if k.lower() != "content-length"
        ]
        body = response.body
        if response.status in (204, 304) or 100 <= response.status < 200:
            body = b""
        else:
            headers.append(("content-length", str(len(body))))
        try:
            data = conn.send(
                h11.Response(
                    status_code=response.status,
                    headers=_encode(headers),
                    reason=_reason(response.status),
                )
            )
            if body and request.method != "HEAD":
                data += conn.send(h11.Data(data=body))
            data += conn.send(h11.EndOfMessage())
        except h11.LocalProtocolError:
            log.exception(
                "%s cannot send response to %s %s", self.name, request.method, request.path
            )
            return False
        with anyio.move_on_after(self.request_timeout) as scope:
            await stream.send(data)
        if scope.cancelled_caught:
            return False
        return conn.our_state is h11.DONE and conn.their_state is h11.DONE

    async def _send_error(
        self, conn: h11.Connection, stream: anyio.abc.ByteStream, status: int, message: str
    ) -> None:
        if conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            return
        body = (message + "\n").encode()
        headers = [
            ("content-type", "text/plain; charset=utf-8"),
            ("content-length", str(len(body))),
            ("connection", "close"),
        ]
        try:
            data = conn.send(
                h11.Response(status_code=status, headers=_encode(headers), reason=_reason(status))
            )
            data += conn.send(h11.Data(data=body)) + conn.send(h11.EndOfMessage())
        except h11.LocalProtocolError:
            return
        with anyio.move_on_after(self.request_timeout):
            with contextlib.suppress(*_NETWORK_ERRORS):
                await stream.send(data)

    async def _linger(self, raw: anyio.abc.SocketStream) -> None:
        """Closes gracefully after an early answer: without this, closing a socket with
        unread request bytes sends a TCP reset that can destroy our answer in flight."""
        with anyio.move_on_after(_LINGER_SECONDS):
            try:
                await raw.send_eof()
                drained = 0
                while drained < _LINGER_MAX_BYTES:
                    drained += len(await raw.receive(_RECEIVE_SIZE))
            except _NETWORK_ERRORS:
                pass


def _content_length(headers: Iterable[tuple[bytes, bytes]]) -> int | None:
    for name, value in headers:
        if name == b"content-length":
            return int(value)  # h11 has validated it
    return None


def _reason(status: int) -> bytes:
    try:
        return HTTPStatus(status).phrase.encode()
    except ValueError:
        return b""


def _encode(headers: list[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    return [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers]


def _make_request(head: h11.Request, body: bytes, client: tuple[str, int] | None) -> Request:
    return make_request(
        head.method.decode("ascii"),
        head.target.decode("latin-1"),
        [(name.decode("latin-1"), value.decode("latin-1")) for name, value in head.headers],
        body,
        client,
    )


def make_request(
    method: str,
    target: str,
    fields: Iterable[tuple[str, str]],
    body: bytes,
    client: tuple[str, int] | None,
) -> Request:
    """A ``Request`` from a parsed head (either protocol's); ``_Reject`` (400) for a
    target that cannot be split."""
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

"""HTTP/2 for ``HTTPServer`` (opt-in, over TLS with ALPN ``h2``), on the ``h2`` library.

Why: the API server (Go's net/http) keeps at most 25 idle HTTP/1.1 connections per
webhook host, so with more reviews in flight it opens and closes TLS connections all the
time (a handshake costs us about twice a review). Over HTTP/2 it multiplexes every call
on one connection.

One connection is one task (``H2Session.run``) reading frames; every stream is a child
task in the connection's task group, which waits for its request to be complete, runs the
handler (``HTTPServer._dispatch``: routing, 404, 500, handler timeout) and sends the
answer. The HTTP/1.1 path's limits hold per stream, and a refused stream does not close
the connection (the others go on):

- 413 for a body over ``max_body_bytes`` (from ``content-length`` or while reading), 431
  for headers over ``max_header_bytes`` (counted as HTTP/2 does: name + value + 32 per
  field; also advertised as SETTINGS_MAX_HEADER_LIST_SIZE), 503 when the server's
  ``max_buffered_bytes`` budget would be exceeded, 408 for a request not complete within
  ``request_timeout``; after an early answer the rest of the request is refused with
  RST_STREAM(NO_ERROR), as RFC 9113 8.1 describes;
- a connection with no open stream is closed (GOAWAY) after ``idle_timeout``, or after
  ``request_timeout`` if it never sent a request; a socket write that takes longer than
  ``request_timeout`` drops the connection;
- at most ``MAX_CONCURRENT_STREAMS`` streams at once (advertised; h2 refuses more);
  decoded headers beyond twice the cap are a connection error (HPACK bombs);
- received data is acknowledged as soon as it is counted, so the client's windows never
  stall; responses larger than the client's window are sent in chunks as WINDOW_UPDATEs
  arrive;
- a stream reset by the client cancels its handler. A client that resets more than
  ``_RESET_BUDGET`` unfinished streams within ``_RESET_PERIOD`` seconds (the "rapid
  reset" attack, CVE-2023-44487: each reset frees a slot, so the stream limit alone does
  not bound the handlers started) gets GOAWAY(ENHANCE_YOUR_CALM) and is closed;
- a protocol error closes that connection with GOAWAY (h2 picks the code); PING and
  SETTINGS are answered by h2.

All writes to the socket go through one lock, so frames of concurrent streams never
interleave inside a TLS record sequence.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING

import anyio
import anyio.abc
import anyio.lowlevel
import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
from h2.errors import ErrorCodes
from h2.settings import SettingCodes

from sdgruntime.httpserver import _NETWORK_ERRORS, Response, _Reject, make_request

if TYPE_CHECKING:
    from sdgruntime.httpserver import HTTPServer, Request

log = logging.getLogger(__name__)

MAX_CONCURRENT_STREAMS = 100
_RECEIVE_SIZE = 65536
# Receive windows: a stream may send up to 1 MiB before we acknowledge (we do at once),
# the connection 16 MiB: a 7 MiB review needs no round trip per 64 KiB (the default).
_STREAM_WINDOW = 1 << 20
_CONNECTION_WINDOW = 16 << 20
_RESET_BUDGET = 200
_RESET_PERIOD = 10.0
# Fields h2 (and RFC 9113 8.2.2) forbid in a response; content-length is set by us.
_NOT_FORWARDED = frozenset(
    {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade",
     "content-length"}
)  # fmt: skip


#: Closed streams whose way of closing h2 remembers, per connection (h2's default: 65536,
#: ~95 bytes each: ~6 MiB per long-lived connection, reached after 65536 webhook calls).
#: A frame for a stream closed longer ago than this many newer ones is a protocol error:
#: peers send late frames (after a reset) within a round trip, not thousands of streams on.
CLOSED_STREAMS_KEPT = 4096


class _Connection(h2.connection.H2Connection):
    """h2's connection with a bounded memory of closed streams (``CLOSED_STREAMS_KEPT``)."""

    MAX_CLOSED_STREAMS = CLOSED_STREAMS_KEPT


class _Stream:
    """One request stream as the reader fills it and its task serves it."""

    __slots__ = ("body", "complete", "ended", "headers", "refusal", "scope", "stream_id")

    def __init__(self, stream_id: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.stream_id = stream_id
        self.headers = headers
        self.body = bytearray()  # counted in the server's buffered bytes
        self.complete = anyio.Event()  # the request ended, or the reader refused it
        self.ended = False  # the client sent END_STREAM
        self.refusal: _Reject | None = None
        self.scope = anyio.CancelScope()  # cancelled when the client resets the stream


class H2Session:
    """Serves one HTTP/2 connection until the client leaves, it idles out or misbehaves."""

    def __init__(
        self,
        server: HTTPServer,
        stream: anyio.abc.ByteStream,
        client: tuple[str, int] | None,
    ) -> None:
        self._server = server
        self._stream = stream
        self._client = client
        conn = _Connection(h2.config.H2Configuration(client_side=False, header_encoding=None))
        # Set directly (not update_settings), so they hold from the first frame on.
        conn.local_settings = h2.settings.Settings(
            client=False,
            initial_values={
                SettingCodes.MAX_CONCURRENT_STREAMS: MAX_CONCURRENT_STREAMS,
                SettingCodes.MAX_HEADER_LIST_SIZE: server.max_header_bytes,
                SettingCodes.INITIAL_WINDOW_SIZE: _STREAM_WINDOW,
            },
        )
        # The decoder's hard bound (a connection error); between the cap and it: 431.
        conn.decoder.max_header_list_size = 2 * server.max_header_bytes
        self._conn = conn
        self._streams: dict[int, _Stream] = {}
        self._send_lock = anyio.Lock()
        self._window_opened = anyio.Event()
        self._idle = anyio.CancelScope()
        self._task_group: anyio.abc.TaskGroup | None = None
        self._resets = 0
        self._resets_since = anyio.current_time()
        self._draining = False  # the client sent GOAWAY: finish what is open, then close

    @property
    def streams(self) -> int:
        """Streams being served now."""
        return len(self._streams)

    async def run(self) -> None:
        async with anyio.create_task_group() as tg:
            self._task_group = tg
            self._conn.initiate_connection()
            self._conn.increment_flow_control_window(_CONNECTION_WINDOW - 65535)
            await self._flush()
            await self._read()
            if not self._draining:
                tg.cancel_scope.cancel()  # nobody left to answer

    # --- reading -------------------------------------------------------------------

    async def _read(self) -> None:
        server = self._server
        self._idle.deadline = anyio.current_time() + server.request_timeout
        while True:
            data = b""
            with self._idle:
                try:
                    data = await self._stream.receive(_RECEIVE_SIZE)
                except anyio.EndOfStream:
                    return
            if self._idle.cancelled_caught:
                log.debug("%s h2 connection from %s idle: closing", server.name, self._client)
                await self._goaway(ErrorCodes.NO_ERROR)
                return
            self._idle = anyio.CancelScope(deadline=self._idle.deadline)
            try:
                events = self._conn.receive_data(data)
            except h2.exceptions.ProtocolError as exc:  # h2 has queued a GOAWAY
                log.debug("%s h2 protocol error from %s: %s", server.name, self._client, exc)
                await self._flush()
                return
            for event in events:
                if not self._on_event(event):
                    await self._goaway(ErrorCodes.ENHANCE_YOUR_CALM)
                    return
            await self._flush()
            if self._draining and not self._streams:
                return

    def _on_event(self, event: h2.events.Event) -> bool:
        """Applies one event; ``False`` if the connection must be closed (rapid reset)."""
        if isinstance(event, h2.events.RequestReceived):
            assert event.stream_id is not None and event.headers is not None
            self._on_request(event.stream_id, list(event.headers))
        elif isinstance(event, h2.events.DataReceived):
            assert event.stream_id is not None and event.data is not None
            self._on_data(event.stream_id, event.data, event.flow_controlled_length or 0)
        elif isinstance(event, h2.events.StreamEnded):
            assert event.stream_id is not None
            self._on_end(event.stream_id)
        elif isinstance(event, h2.events.StreamReset):
            assert event.stream_id is not None
            return self._on_reset(event.stream_id)
        elif isinstance(event, (h2.events.WindowUpdated, h2.events.RemoteSettingsChanged)):
            self._window_opened.set()  # senders waiting for window look again
            self._window_opened = anyio.Event()
        elif isinstance(event, h2.events.ConnectionTerminated):
            self._draining = True
        return True

    def _on_request(self, stream_id: int, headers: list[tuple[bytes, bytes]]) -> None:
        assert self._task_group is not None
        server = self._server
        state = _Stream(stream_id, headers)
        self._streams[stream_id] = state
        self._idle.deadline = float("inf")
        size = sum(len(name) + len(value) + 32 for name, value in headers)
        if size > server.max_header_bytes:
            self._refuse(state, _Reject(431, server._headers_too_large()))
        else:
            length = _content_length(headers)
            if length is not None and length > server.max_body_bytes:
                self._refuse(
                    state,
                    _Reject(
                        413,
                        f"request body of {length} bytes exceeds the limit of "
                        f"{server.max_body_bytes} bytes",
                    ),
                )
            elif length is not None and not server._fits(length):
                self._refuse(state, server._busy())
        self._task_group.start_soon(self._serve_stream, state)

    def _on_data(self, stream_id: int, data: bytes, flow_controlled: int) -> None:
        # Acknowledged whatever becomes of it: the connection window is shared.
        self._conn.acknowledge_received_data(flow_controlled, stream_id)
        state = self._streams.get(stream_id)
        if state is None or state.complete.is_set():
            return  # answered (or refused) already; the rest is discarded
        server = self._server
        state.body += data
        server._buffered += len(data)
        if len(state.body) > server.max_body_bytes:
            self._refuse(
                state,
                _Reject(413, f"request body exceeds the limit of {server.max_body_bytes} bytes"),
            )
        elif not server._fits(0):
            self._refuse(state, server._busy())

    def _on_end(self, stream_id: int) -> None:
        state = self._streams.get(stream_id)
        if state is not None:
            state.ended = True
            state.complete.set()

    def _on_reset(self, stream_id: int) -> bool:
        state = self._streams.get(stream_id)
        if state is None:
            return True
        state.scope.cancel()
        now = anyio.current_time()
        if now - self._resets_since > _RESET_PERIOD:
            self._resets, self._resets_since = 0, now
        self._resets += 1
        if self._resets > _RESET_BUDGET:
            log.warning(
                "%s h2 client %s reset %d streams within %gs: closing the connection",
                self._server.name,
                self._client,
                self._resets,
                _RESET_PERIOD,
            )
            return False
        return True

    def _refuse(self, state: _Stream, reject: _Reject) -> None:
        """Answers ``reject`` instead of serving; what was read is let go at once."""
        state.refusal = reject
        state.complete.set()
        self._server._buffered -= len(state.body)
        state.body = bytearray()

    # --- one stream ----------------------------------------------------------------

    async def _serve_stream(self, state: _Stream) -> None:
        server = self._server
        try:
            with state.scope:
                if not state.complete.is_set():  # usually the whole request came at once
                    with anyio.move_on_after(server.request_timeout):
                        await state.complete.wait()
                if state.refusal is None and not state.complete.is_set():
                    state.refusal = _Reject(
                        408, f"request not received within {server.request_timeout:g}s"
                    )
                if state.refusal is not None:
                    log.debug(
                        "%s rejecting h2 request from %s: %s",
                        server.name,
                        self._client,
                        state.refusal.message,
                    )
                    response = Response.text(state.refusal.message + "\n", state.refusal.status)
                    method = "GET"
                else:
                    try:
                        request = _request(state.headers, bytes(state.body), self._client)
                    except _Reject as reject:
                        response, method = Response.text(reject.message + "\n", reject.status), ""
                    else:
                        method = request.method
                        response = await server._dispatch(request)
                await self._respond(state, method, response)
        finally:
            server._buffered -= len(state.body)
            del self._streams[state.stream_id]
            if not self._streams:
                self._idle.deadline = anyio.current_time() + server.idle_timeout
                if self._draining:
                    self._idle.cancel()  # the reader waits for nothing more

    async def _respond(self, state: _Stream, method: str, response: Response) -> None:
        """Sends ``response`` on the stream, within ``request_timeout`` (else resets it)."""
        conn, stream_id = self._conn, state.stream_id
        headers = [(":status", str(response.status))]
        headers += [
            (k.lower(), v) for k, v in response.headers.items() if k.lower() not in _NOT_FORWARDED
        ]
        body = response.body
        if response.status in (204, 304) or 100 <= response.status < 200:
            body = b""
        else:
            headers.append(("content-length", str(len(body))))
        if method == "HEAD":
            body = b""
        with anyio.move_on_after(self._server.request_timeout) as scope:
            try:
                conn.send_headers(stream_id, _encode(headers), end_stream=not body)
                view = memoryview(body)
                while view:
                    window = min(
                        conn.local_flow_control_window(stream_id), conn.max_outbound_frame_size
                    )
                    if window <= 0:
                        opened = self._window_opened
                        await self._flush()
                        await opened.wait()
                        continue
                    chunk, view = view[:window], view[window:]
                    conn.send_data(stream_id, chunk.tobytes(), end_stream=not view)
                    await self._flush()
                if not state.ended:
                    # Answered early: the client need not send the rest (RFC 9113 8.1).
                    self._reset(stream_id, ErrorCodes.NO_ERROR)
                await self._flush()
            except h2.exceptions.StreamClosedError:
                return  # the client reset it meanwhile
            except h2.exceptions.ProtocolError:
                log.exception(
                    "%s cannot send h2 response on stream %d", self._server.name, stream_id
                )
                self._reset(stream_id, ErrorCodes.INTERNAL_ERROR)
                await self._flush()
        if scope.cancelled_caught:
            self._reset(stream_id, ErrorCodes.CANCEL)
            await self._flush()

    def _reset(self, stream_id: int, code: ErrorCodes) -> None:
        with contextlib.suppress(h2.exceptions.ProtocolError):  # closed meanwhile
            self._conn.reset_stream(stream_id, code)

    # --- writing -------------------------------------------------------------------

    async def _flush(self) -> None:
        """Sends what h2 has queued; a socket that does not take it within
        ``request_timeout`` (or is broken) ends the connection."""
        async with self._send_lock:
            data = self._conn.data_to_send()
            if not data:
                return
            # Shielded: a stream cancelled (reset) mid-send would cut a TLS record and
            # break the connection for every stream; the timeout still bounds it.
            with anyio.CancelScope(shield=True):
                with anyio.move_on_after(self._server.request_timeout) as scope:
                    try:
                        await self._stream.send(data)
                        return
                    except _NETWORK_ERRORS as exc:
                        log.debug(
                            "%s h2 send to %s failed: %r", self._server.name, self._client, exc
                        )
                if scope.cancelled_caught:
                    log.debug("%s h2 send to %s timed out", self._server.name, self._client)
        assert self._task_group is not None
        self._task_group.cancel_scope.cancel()
        await anyio.lowlevel.checkpoint()  # raises the cancellation

    async def _goaway(self, code: ErrorCodes) -> None:
        self._draining = False
        try:
            self._conn.close_connection(error_code=code)
        except h2.exceptions.ProtocolError:
            return
        await self._flush()


def _request(
    headers: list[tuple[bytes, bytes]], body: bytes, client: tuple[str, int] | None
) -> Request:
    """The ``Request`` an HTTP/1.1 handler would see: pseudo-header fields become the
    method and target, ``:authority`` the ``host`` field (unless one was sent)."""
    pseudo: dict[bytes, bytes] = {}
    fields: list[tuple[str, str]] = []
    for name, value in headers:
        if name.startswith(b":"):
            pseudo[name] = value
        else:
            fields.append((name.decode("latin-1"), value.decode("latin-1")))
    authority = pseudo.get(b":authority")
    if authority and not any(name == "host" for name, _ in fields):
        fields.insert(0, ("host", authority.decode("latin-1")))
    return make_request(
        pseudo.get(b":method", b"GET").decode("ascii", "replace"),
        pseudo.get(b":path", b"/").decode("latin-1"),
        fields,
        body,
        client,
    )


def _content_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    for name, value in headers:
        if name == b"content-length":
            return int(value)  # h2 has validated it is a number
    return None


def _encode(headers: list[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    return [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers]

"""HTTP/1.1 to the API server: two pools, TLS, timeouts, metrics, typed errors.

Requests go through a bounded pool of our own (:mod:`sdgruntime.rest.http1`: asyncio
protocols and httptools' C parser, a fraction of aiohttp's cost per request); watches
through an unbounded aiohttp pool, since each holds a connection for its whole life and
must not starve requests. Both run on asyncio, so the client needs anyio's asyncio backend
(the default), not trio, and share one TLS context. The transport never replays a request
itself (aiohttp's own replay is off too): replays are the caller's retry policy
(:mod:`sdgruntime.rest.retry`), and every attempt counts in the request metrics.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import anyio

from sdgruntime import errors
from sdgruntime.jsoncodec import dumps, loads
from sdgruntime.metrics import REST_CLIENT_LATENCY, REST_CLIENT_REQUESTS
from sdgruntime.rest.config import ConnectionSettings
from sdgruntime.rest.http1 import Pool
from sdgruntime.rest.retry import RequestNotSent

__all__ = [
    "Response",
    "Transport",
    "api_error",
    "decode",
    "dumps",
    "loads",
    "transport_error",
]


# --- JSON ---------------------------------------------------------------------------------


def decode(content: bytes, content_type: str) -> Any:
    """A response body: decoded JSON if it is JSON, else text (``None`` if empty)."""
    if not content:
        return None
    if "json" in content_type or content[:1] in (b"{", b"["):
        try:
            return loads(content)
        except ValueError:
            pass
    return content.decode("utf-8", "replace")


# --- responses and errors ------------------------------------------------------------------


@dataclass(slots=True)
class Response:
    """A complete answer: status, headers (case-insensitive), the body as read."""

    status_code: int
    headers: Mapping[str, str]
    content: bytes

    def json(self) -> Any:
        return decode(self.content, self.headers.get("content-type", ""))


def _retry_after(headers: Mapping[str, str], body: Any) -> float | None:
    value = headers.get("retry-after")
    if value:
        try:
            return float(value)
        except ValueError:
            pass  # an HTTP date: the apiserver never sends one; fall back to backoff
    if isinstance(body, dict):
        seconds = (body.get("details") or {}).get("retryAfterSeconds")
        if isinstance(seconds, int | float):
            return float(seconds)
    return None


def api_error(resp: Any, content: bytes | None = None) -> errors.ApiError:
    """The typed error for a non-2xx answer, from its Status body and Retry-After.

    ``resp`` is a :class:`Response`, or anything with ``status_code``, ``headers`` and
    ``content`` (an ``httpx.Response`` too); ``content`` overrides its body.
    """
    raw = resp.content if content is None else content
    if not isinstance(raw, bytes | bytearray):
        raw = b""
    body = decode(bytes(raw), resp.headers.get("content-type", ""))
    return errors.from_status(resp.status_code, body, _retry_after(resp.headers, body))


#: What a request or a stream may raise that means "no (complete) answer".
TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (
    aiohttp.ClientError,
    asyncio.TimeoutError,
    OSError,
)


def _failure_kind(exc: BaseException) -> tuple[str, bool]:
    """(name for the message, whether the request provably never left)."""
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return "ConnectTimeout", True  # connecting, or waiting for a free pooled connection
    if isinstance(exc, aiohttp.ClientConnectorError):
        return "ConnectError", True  # refused, unreachable, TLS handshake or verification
    if isinstance(exc, aiohttp.ServerTimeoutError | asyncio.TimeoutError):
        return "ReadTimeout", False
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "ServerDisconnected", False
    if isinstance(exc, aiohttp.ClientPayloadError | aiohttp.ClientOSError | OSError):
        return "ReadError", False
    if isinstance(exc, aiohttp.ClientResponseError):
        return "ProtocolError", False  # a malformed answer
    return type(exc).__name__, False


def transport_error(exc: BaseException, method: str, path: str) -> errors.TransportError:
    """The typed error for a request that got no answer: :class:`RequestNotSent` when it
    never reached the server (connect failed or timed out, no pooled connection free)."""
    kind, not_sent = _failure_kind(exc)
    cls = RequestNotSent if not_sent else errors.TransportError
    return cls(f"{method} {path}: {kind}: {exc}".rstrip(": "))


def _query(params: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """Query parameters as httpx encoded them: booleans as true/false, None as empty."""
    if not params:
        return None
    if all(isinstance(v, str | int) and not isinstance(v, bool) for v in params.values()):
        return params
    out: dict[str, Any] = {}
    for k, v in params.items():
        if isinstance(v, bool):
            out[k] = "true" if v else "false"
        elif v is None:
            out[k] = ""
        elif isinstance(v, list | tuple):
            out[k] = [("true" if x else "false") if isinstance(x, bool) else x for x in v]
        else:
            out[k] = v
    return out


# --- the transport -------------------------------------------------------------------------


class Transport:
    """Requests and watch streams to one API server, over two pools.

    The pools are opened on first use in the running event loop (a client may be built
    before the loop runs, as the Manager does) and closed by :meth:`aclose`.
    """

    def __init__(
        self,
        settings: ConnectionSettings,
        ssl_context: ssl.SSLContext,
        *,
        max_connections: int = 32,
        timeout: float = 30.0,
        connect_timeout: float = 10.0,
    ) -> None:
        self.settings = settings
        self.host = settings.host_port  # the metrics' host label
        self.max_connections = max_connections
        self._base = settings.host
        self._ssl = ssl_context
        self._sni = settings.tls_server_name
        self._connect_timeout = connect_timeout
        # Waiting for a pooled connection counts against ``connect`` (httpx: pool=timeout);
        # establishing one against ``sock_connect``; every read against ``sock_read``.
        self._timeout = aiohttp.ClientTimeout(
            total=None, connect=timeout, sock_connect=connect_timeout, sock_read=timeout
        )
        self._timeouts = (timeout, connect_timeout)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._http: Pool | None = None
        self._watch_http: aiohttp.ClientSession | None = None
        self._closed = False
        self._counters: dict[tuple[str, str], Any] = {}
        self._latency: dict[str, Any] = {}

    # --- pools ---------------------------------------------------------------------------

    def _session(self, limit: int, timeout: aiohttp.ClientTimeout) -> aiohttp.ClientSession:
        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=self._ssl, limit=limit, limit_per_host=0),
            timeout=timeout,
            cookie_jar=aiohttp.DummyCookieJar(),  # the API server sets none
            trust_env=False,  # no proxies from the environment, as before with httpx
            raise_for_status=False,
        )
        # No silent replay of GET/PUT/DELETE after a dropped connection: the retry policy
        # decides, with backoff, and counts each attempt. (aiohttp's own test client sets
        # this attribute the same way; there is no constructor argument for it.)
        if hasattr(session, "_retry_connection"):
            session._retry_connection = False
        return session

    def _sessions(self) -> tuple[Pool, aiohttp.ClientSession]:
        if self._closed:
            raise RuntimeError("the client is closed")
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError(
                "sdgruntime's client runs on asyncio (anyio's default backend), not trio"
            ) from None
        if self._loop is not loop or self._http is None or self._watch_http is None:
            # First use, or a new event loop (the old loop's connections cannot be reused).
            self._forget_sessions()
            self._loop = loop
            timeout, connect_timeout = self._timeouts
            self._http = Pool(
                self._base,
                self._ssl,
                self._sni,
                limit=self.max_connections,
                pool_timeout=timeout,
                connect_timeout=connect_timeout,
                read_timeout=timeout,
            )
            self._watch_http = self._session(0, self._timeout)  # 0: unbounded
        return self._http, self._watch_http

    def _forget_sessions(self) -> None:
        """Drop the pools of a loop that has ended (they cannot be awaited any more)."""
        old = [self._watch_http] if self._watch_http is not None else []
        self._http = self._watch_http = None
        if self._loop is None or not self._loop.is_closed():
            return  # never opened, or the loop still runs elsewhere: leave them be
        for session in old:
            connector = session.connector
            session.detach()
            if connector is not None:
                # marks it closed without touching the dead loop (aiohttp checks
                # loop.is_closed()), so it does not warn about unclosed connections
                connector._close()

    async def aclose(self) -> None:
        """Close both pools (shielded from cancellation, so connections are not leaked)."""
        self._closed = True
        if self._loop is not asyncio.get_running_loop():
            self._forget_sessions()  # opened in a loop that has ended (or never opened)
            return
        if self._http is not None:
            self._http.close()
        watch, self._http, self._watch_http = self._watch_http, None, None
        if watch is not None:
            with anyio.CancelScope(shield=True):
                await watch.close()

    # --- metrics ---------------------------------------------------------------------------

    def count(self, code: str, method: str, seconds: float) -> None:
        """One attempt in ``rest_client_requests_total`` and its latency histogram."""
        c = self._counters.get((code, method))
        if c is None:
            c = self._counters[(code, method)] = REST_CLIENT_REQUESTS.labels(
                code=code, method=method, host=self.host
            )
        c.inc()
        h = self._latency.get(method)
        if h is None:
            h = self._latency[method] = REST_CLIENT_LATENCY.labels(verb=method, host=self.host)
        h.observe(seconds)

    # --- requests --------------------------------------------------------------------------

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        content: bytes | None = None,
        headers: Mapping[str, str],
    ) -> Response:
        """One attempt; the whole answer, whatever its status. No answer raises
        :class:`~sdgruntime.errors.TransportError` (:class:`RequestNotSent` if it never
        left)."""
        http, _ = self._sessions()
        data = http.request_bytes(method, path, _query(params), headers, content)
        start = time.perf_counter()
        try:
            status, resp_headers, body = await http.request(
                data, f"{method} {path}", head=method == "HEAD"
            )
        except errors.TransportError:
            self.count("<error>", method, time.perf_counter() - start)
            raise
        self.count(str(status), method, time.perf_counter() - start)
        return Response(status, resp_headers, body)

    async def stream(
        self,
        path: str,
        *,
        params: Mapping[str, Any] | None,
        headers: Mapping[str, str],
        read_timeout: float | None,
        label: str = "WATCH",
    ) -> AsyncGenerator[bytes]:
        """GET ``path`` on the watch pool and yield the body's chunks as they arrive.

        A non-2xx answer is raised as its typed error; a connection that fails or stays
        silent for ``read_timeout`` seconds (``None``: forever) as TransportError, named
        ``label`` in the message. Counted once, when the answer's status arrives.
        """
        _, http = self._sessions()
        c = self._connect_timeout
        timeout = aiohttp.ClientTimeout(
            total=None, connect=c, sock_connect=c, sock_read=read_timeout
        )
        start = time.perf_counter()
        counted = False
        try:
            async with http.get(
                self._base + path,
                params=_query(params),
                headers=headers,
                timeout=timeout,
                allow_redirects=False,
                server_hostname=self._sni,
            ) as resp:
                self.count(str(resp.status), "GET", time.perf_counter() - start)
                counted = True
                if resp.status >= 300:
                    body = await resp.read()
                    raise api_error(Response(resp.status, resp.headers, body))
                async for chunk in resp.content.iter_any():
                    yield chunk
        except aiohttp.InvalidURL:
            raise
        except TRANSPORT_ERRORS as exc:
            if not counted:
                self.count("<error>", "GET", time.perf_counter() - start)
            raise transport_error(exc, label, path) from exc

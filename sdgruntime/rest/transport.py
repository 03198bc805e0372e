"""HTTP/1.1 to the API server: the connections, TLS, timeouts, metrics, typed errors.

Requests go through a bounded pool of keep-alive connections and watches each through a
connection of its own (:mod:`sdgruntime.rest.http1`: asyncio protocols and httptools' C
parser, a fraction of aiohttp's cost per request, and 11 MiB less RSS than importing
aiohttp). It runs on asyncio, so the client needs anyio's asyncio backend (the default),
not trio. The transport never replays a request itself: replays are the caller's retry
policy (:mod:`sdgruntime.rest.retry`), and every attempt counts in the request metrics.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass
from typing import Any

from sdgruntime import errors
from sdgruntime.jsoncodec import dumps, loads
from sdgruntime.metrics import REST_CLIENT_LATENCY, REST_CLIENT_REQUESTS
from sdgruntime.rest.config import ConnectionSettings
from sdgruntime.rest.http1 import Pool

__all__ = [
    "Response",
    "Transport",
    "api_error",
    "decode",
    "dumps",
    "loads",
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
    """Requests and watch streams to one API server.

    The pool is opened on first use in the running event loop (a client may be built
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
        # Waiting for a pooled connection and every read count against ``timeout``,
        # establishing a connection against ``connect_timeout``.
        self._timeouts = (timeout, connect_timeout)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._http: Pool | None = None
        self._closed = False
        self._counters: dict[tuple[str, str], Any] = {}
        self._latency: dict[str, Any] = {}

    # --- the pool ------------------------------------------------------------------------

    def _pool(self) -> Pool:
        if self._closed:
            raise RuntimeError("the client is closed")
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError(
                "sdgruntime's client runs on asyncio (anyio's default backend), not trio"
            ) from None
        if self._loop is not loop or self._http is None:
            # First use, or a new event loop (the old loop's connections cannot be reused:
            # they are dropped with it).
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
        return self._http

    async def aclose(self) -> None:
        """Closes the pool's idle connections; those in use close as they end."""
        self._closed = True
        if self._http is not None and self._loop is asyncio.get_running_loop():
            self._http.close()
        self._http = None

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
        http = self._pool()
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
        """GET ``path`` on a connection of its own and yield the body's chunks as they
        arrive.

        A non-2xx answer is raised as its typed error; a connection that fails or stays
        silent for ``read_timeout`` seconds (``None``: forever) as TransportError, named
        ``label`` in the message. Counted once, when the answer's status arrives.
        """
        http = self._pool()
        data = http.request_bytes("GET", path, _query(params), headers, None, gzip=False)
        start = time.perf_counter()
        try:
            stream = await http.stream(data, f"{label} {path}", read_timeout)
        except errors.TransportError:
            self.count("<error>", "GET", time.perf_counter() - start)
            raise
        try:
            self.count(str(stream.status), "GET", time.perf_counter() - start)
            if stream.status >= 300:
                body = await stream.read_all()
                raise api_error(Response(stream.status, stream.headers, body))
            while chunk := await stream.read():
                yield chunk
        finally:
            stream.close()

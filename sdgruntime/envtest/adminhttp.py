"""envtest's synchronous admin HTTP client, on the standard library.

For a test's setup work (apply a CRD, read a pod's log, poll /readyz), not for code under
test: one TLS connection per request (safe from any thread), JSON in and out. The method
and attribute names are the common ones (``get``/``post``, ``status_code``, ``json()``),
so setup code reads as it does with any HTTP client.
"""

from __future__ import annotations

import contextlib
import http.client
import json as jsonlib
import ssl
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urlsplit

__all__ = ["AdminHTTP", "AdminResponse", "StreamedResponse", "TransportError"]

#: What a request that got no answer raises (refused, reset, timed out, TLS failed).
TransportError = (OSError, http.client.HTTPException)


@dataclass(frozen=True, slots=True)
class AdminResponse:
    status_code: int
    headers: Mapping[str, str]
    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode(errors="replace")

    @property
    def is_success(self) -> bool:
        return 200 <= self.status_code < 300

    def json(self) -> Any:
        return jsonlib.loads(self.content)


@dataclass(frozen=True, slots=True)
class StreamedResponse:
    status_code: int
    headers: Mapping[str, str]
    raw: http.client.HTTPResponse

    def iter_lines(self) -> Iterator[str]:
        """The body's lines as they arrive, without their line ends."""
        for line in self.raw:
            yield line.decode(errors="replace").rstrip("\r\n")


class Headers(dict[str, str]):
    """Response headers by lower-cased name (looked up in any case); a repeated header's
    values joined by ", " (as HTTP allows: several Warning headers read as one)."""

    def __init__(self, pairs: list[tuple[str, str]]) -> None:
        super().__init__()
        for name, value in pairs:
            key = name.lower()
            super().__setitem__(key, f"{self[key]}, {value}" if key in self else value)

    def __getitem__(self, name: str) -> str:
        return super().__getitem__(name.lower())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and super().__contains__(name.lower())

    def get(self, name: str, default: Any = None) -> Any:
        return super().get(name.lower(), default)


def _args(kw: Mapping[str, Any]) -> tuple[Any, ...]:
    unknown = set(kw) - {"params", "json", "content", "headers", "timeout"}
    if unknown:
        raise TypeError(f"unexpected arguments {sorted(unknown)}")
    return tuple(kw.get(k) for k in ("params", "json", "content", "headers", "timeout"))


def _query(params: Mapping[str, Any]) -> str:
    """Booleans as ``true``/``false`` (what the API server parses), None as empty."""
    pairs = []
    for key, value in params.items():
        if isinstance(value, bool):
            value = "true" if value else "false"
        pairs.append((key, "" if value is None else str(value)))
    return urlencode(pairs)


class AdminHTTP:
    """Requests to ``base_url`` with ``ssl_context`` (None: plain HTTP)."""

    def __init__(
        self, base_url: str, ssl_context: ssl.SSLContext | None, timeout: float = 30.0
    ) -> None:
        parts = urlsplit(base_url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.ssl_context = ssl_context if parts.scheme == "https" else None
        self.timeout = timeout

    def _connect(self, timeout: float) -> http.client.HTTPConnection:
        if self.ssl_context is not None:
            return http.client.HTTPSConnection(
                self.host, self.port, timeout=timeout, context=self.ssl_context
            )
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def _send(
        self,
        method: str,
        path: str,
        params: Mapping[str, Any] | None,
        json: Any,
        content: bytes | str | None,
        headers: Mapping[str, str] | None,
        timeout: float | None,
    ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        sent = dict(headers or {})
        body: bytes | None = None
        if json is not None:
            body = jsonlib.dumps(json).encode()
            sent.setdefault("Content-Type", "application/json")
        elif content is not None:
            body = content.encode() if isinstance(content, str) else content
        if params:
            path += ("&" if "?" in path else "?") + _query(params)
        conn = self._connect(self.timeout if timeout is None else timeout)
        try:
            conn.request(method, path, body=body, headers=sent)
            return conn, conn.getresponse()
        except BaseException:
            conn.close()
            raise

    @contextlib.contextmanager
    def stream(self, method: str, path: str, **kw: Any) -> Iterator[StreamedResponse]:
        """A response read as it comes (a watch): ``iter_lines()`` yields its lines."""
        conn, r = self._send(method, path, *_args(kw))
        try:
            yield StreamedResponse(r.status, Headers(r.getheaders()), r)
        finally:
            conn.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        json: Any = None,
        content: bytes | str | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> AdminResponse:
        """Send one request; raise one of ``TransportError`` when no answer came."""
        conn, r = self._send(method, path, params, json, content, headers, timeout)
        try:
            return AdminResponse(r.status, Headers(r.getheaders()), r.read())
        finally:
            conn.close()

    def get(self, path: str, **kw: Any) -> AdminResponse:
        return self.request("GET", path, **kw)

    def post(self, path: str, **kw: Any) -> AdminResponse:
        return self.request("POST", path, **kw)

    def put(self, path: str, **kw: Any) -> AdminResponse:
        return self.request("PUT", path, **kw)

    def patch(self, path: str, **kw: Any) -> AdminResponse:
        return self.request("PATCH", path, **kw)

    def delete(self, path: str, **kw: Any) -> AdminResponse:
        return self.request("DELETE", path, **kw)

    def close(self) -> None:
        """Nothing is kept open between requests; here for ``with``-style owners."""

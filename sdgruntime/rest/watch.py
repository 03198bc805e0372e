"""Watch streams: line-delimited JSON events, bookmarks, server and read timeouts.

A watch is one long GET (``?watch=1``) whose chunked body carries one JSON event per line:
``{"type": "ADDED"|"MODIFIED"|"DELETED"|"BOOKMARK"|"ERROR", "object": {...}}``. Lines may
be cut anywhere by chunk borders (:class:`LineSplitter`); an ERROR event is raised as its
typed error (410 -> :class:`~sdgruntime.errors.Gone`). Watches are never retried here:
the informer owns reconnecting and resuming from the last resourceVersion.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping
from contextlib import aclosing
from typing import Any

from sdgruntime import errors
from sdgruntime.rest.transport import Transport, loads

__all__ = [
    "INITIAL_EVENTS_END",
    "LineSplitter",
    "parse_watch_line",
    "watch_events",
    "watch_params",
]

#: The annotation of the bookmark that ends a streamed list's initial events.
INITIAL_EVENTS_END = "k8s.io/initial-events-end"

#: Without an explicit read timeout, a stream the server ends after ``timeoutSeconds`` may
#: stay silent that long plus this margin before it counts as dead.
READ_TIMEOUT_MARGIN = 30.0


def parse_watch_line(line: bytes) -> dict[str, Any]:
    """One watch event; an ERROR event is raised as its typed error (410 -> Gone)."""
    event = loads(line)
    if event.get("type") == "ERROR":
        status = event.get("object")
        if not isinstance(status, dict):
            status = {}
        raise errors.from_status(int(status.get("code") or 500), status)
    return event


class LineSplitter:
    """Split a byte stream into newline-terminated lines across arbitrary chunk borders."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        """The complete, non-blank lines this chunk finishes."""
        if b"\n" not in chunk:
            self._buf += chunk
            return []
        lines = (self._buf + chunk).split(b"\n")
        self._buf = lines.pop()
        return [line for line in lines if line.strip()]

    def rest(self) -> bytes:
        """What is left unterminated when the stream ends."""
        rest, self._buf = self._buf, b""
        return rest if rest.strip() else b""


def watch_params(
    *,
    resource_version: str | None = None,
    label_selector: str | None = None,
    field_selector: str | None = None,
    timeout_seconds: int | None = None,
    allow_bookmarks: bool = True,
    send_initial_events: bool = False,
) -> dict[str, Any]:
    """The query of a watch request. ``send_initial_events``: a streamed list (KEP-3157):
    every current object as an ADDED event, then a bookmark marked ``INITIAL_EVENTS_END``."""
    params: dict[str, Any] = {"watch": "1"}
    if allow_bookmarks or send_initial_events:
        params["allowWatchBookmarks"] = "true"
    if send_initial_events:
        params["sendInitialEvents"] = "true"
        params["resourceVersionMatch"] = "NotOlderThan"
        params["resourceVersion"] = resource_version or ""
    elif resource_version is not None:
        params["resourceVersion"] = resource_version
    if label_selector:
        params["labelSelector"] = label_selector
    if field_selector:
        params["fieldSelector"] = field_selector
    if timeout_seconds is not None:
        params["timeoutSeconds"] = int(timeout_seconds)
    return params


async def watch_events(
    transport: Transport,
    path: str,
    params: Mapping[str, Any],
    headers: Mapping[str, str],
    *,
    read_timeout: float | None = None,
) -> AsyncGenerator[dict[str, Any]]:
    """Yield the events of one watch stream until the server ends it.

    Without a ``read_timeout``, a stream with ``timeoutSeconds`` gets that plus 30 s, so a
    silently dead connection surfaces as TransportError instead of hanging.
    """
    if read_timeout is None and params.get("timeoutSeconds") is not None:
        read_timeout = float(params["timeoutSeconds"]) + READ_TIMEOUT_MARGIN
    lines = LineSplitter()
    stream = transport.stream(path, params=params, headers=headers, read_timeout=read_timeout)
    async with aclosing(stream) as chunks:
        async for chunk in chunks:
            for line in lines.feed(chunk):
                yield parse_watch_line(line)
    if rest := lines.rest():
        yield parse_watch_line(rest)

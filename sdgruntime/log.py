"""Logging: a logger per reconcile that carries its request, and a setup for programs.

As controller-runtime's ``log`` package, on the standard :mod:`logging`. sdgruntime modules
log to ``logging.getLogger(__name__)`` and install no handler: the program configures
logging (:func:`setup_logging`, or its own handlers). While a controller reconciles,
:func:`from_context` is a logger whose records carry ``controller``, ``request`` and
``reconcile_id``, like ``log.FromContext(ctx)``; :class:`ContextFilter` adds the same to
every record logged meanwhile, by any logger.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import uuid
from collections.abc import Iterator, Mapping, MutableMapping
from contextvars import ContextVar
from typing import IO, Any, Literal

from sdgruntime.reconcile import Request

__all__ = [
    "ContextFilter",
    "JSONFormatter",
    "Reconciling",
    "TextFormatter",
    "current",
    "from_context",
    "reconciling",
    "setup_logging",
]

#: What :func:`from_context` names its logger when given none.
DEFAULT_LOGGER = "sdgruntime.reconcile"


class Reconciling:
    """The reconcile in progress: which controller, which request, and a unique id (made
    when first read, since most reconciles log nothing: a uuid4 per reconcile was 0.7% of
    the manager's busy time in S1)."""

    __slots__ = ("_reconcile_id", "controller", "request")

    def __init__(self, controller: str, request: Request, reconcile_id: str | None = None):
        self.controller = controller
        self.request = request
        self._reconcile_id = reconcile_id

    @property
    def reconcile_id(self) -> str:
        if self._reconcile_id is None:
            self._reconcile_id = str(uuid.uuid4())
        return self._reconcile_id

    def fields(self) -> dict[str, Any]:
        """The record attributes: ``controller``, ``request`` and ``reconcile_id``."""
        return {
            "controller": self.controller,
            "request": self.request,
            "reconcile_id": self.reconcile_id,
        }

    def __repr__(self) -> str:
        return f"Reconciling({self.controller!r}, {self.request!r}, {self.reconcile_id!r})"


_current: ContextVar[Reconciling | None] = ContextVar("sdgruntime_reconciling", default=None)


def current() -> Reconciling | None:
    """The reconcile this task (or the task that started it) is running, if any."""
    return _current.get()


@contextlib.contextmanager
def reconciling(controller: str, request: Request) -> Iterator[Reconciling]:
    """Mark the code inside as the reconcile of ``request`` by ``controller`` (the
    controller does this around each reconcile; tests may too)."""
    info = Reconciling(controller, request)
    token = _current.set(info)
    try:
        yield info
    finally:
        _current.reset(token)


class _ReconcileLogger(logging.LoggerAdapter[logging.Logger]):
    """Adds the reconcile's fields to each record, keeping the call's own ``extra``."""

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, Any]:
        kwargs["extra"] = {**(self.extra or {}), **(kwargs.get("extra") or {})}
        return msg, kwargs


def from_context(logger: logging.Logger | str | None = None) -> logging.LoggerAdapter[Any]:
    """``logger`` (a name or a Logger; default ``sdgruntime.reconcile``) with the current
    reconcile's fields on every record; outside a reconcile, with none."""
    if not isinstance(logger, logging.Logger):
        logger = logging.getLogger(logger or DEFAULT_LOGGER)
    info = current()
    return _ReconcileLogger(logger, info.fields() if info else {})


class ContextFilter(logging.Filter):
    """Adds the current reconcile's fields to each record that does not carry them."""

    def filter(self, record: logging.LogRecord) -> bool:
        info = current()
        if info is not None and not hasattr(record, "controller"):
            for key, value in info.fields().items():
                setattr(record, key, value)
        return True


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    request = getattr(record, "request", None)
    if not isinstance(request, Request):
        return {}
    out = {"controller": getattr(record, "controller", ""), "name": request.name}
    if request.namespace:
        out["namespace"] = request.namespace
    out["reconcileID"] = getattr(record, "reconcile_id", "")
    return out


class TextFormatter(logging.Formatter):
    """``2024-05-01 12:00:00,000 INFO my.operator: message`` and, inside a reconcile,
    `` controller=greeting request=ns/name reconcileID=...``."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        text = super().formatMessage(record)
        request = getattr(record, "request", None)
        if isinstance(request, Request):
            text += (
                f" controller={getattr(record, 'controller', '')} request={request}"
                f" reconcileID={getattr(record, 'reconcile_id', '')}"
            )
        return text


class JSONFormatter(logging.Formatter):
    """One JSON object per line: ``ts``, ``level``, ``logger``, ``msg``, inside a reconcile
    ``controller``, ``namespace``, ``name`` and ``reconcileID`` (controller-runtime's keys),
    and ``error`` with the traceback of an exception."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            **_fields(record),
        }
        if record.exc_info:
            out["error"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def setup_logging(
    level: int | str = "INFO",
    format: Literal["text", "json"] = "text",
    stream: IO[str] | None = None,
    levels: Mapping[str, int | str] | None = None,
) -> logging.Handler:
    """Make the root logger write to ``stream`` (default stderr) alone, in ``format``, at
    ``level``, with the reconcile's fields (:class:`ContextFilter`); ``levels`` sets other
    loggers' levels (e.g. ``{"sdgruntime.cache": "WARNING"}``). Returns the handler."""
    if format not in ("text", "json"):
        raise ValueError(f"log format {format!r} is not 'text' or 'json'")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JSONFormatter() if format == "json" else TextFormatter())
    handler.addFilter(ContextFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper() if isinstance(level, str) else level)
    for name, value in (levels or {}).items():
        logging.getLogger(name).setLevel(value.upper() if isinstance(value, str) else value)
    return handler

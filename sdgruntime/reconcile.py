"""What a reconciler sees and says: ``Request`` in, ``Result`` (or an exception) out.

As controller-runtime's ``reconcile`` package: a request names one object (not an event,
not a diff), so a reconciler must compute the desired state from what it reads now; the
controller collapses any number of events for one object into one request.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol, runtime_checkable

from sdgruntime._checks import is_async_callable, name_of

__all__ = [
    "Reconciler",
    "ReconcilerFunc",
    "Request",
    "Result",
    "TerminalError",
    "check_reconciler",
]


@dataclass(frozen=True, slots=True)
class Request:
    """The object to reconcile: ``namespace`` is ``None`` for cluster-scoped kinds.

    Frozen and hashable: it is the work queue's key, so a burst of events for one object
    becomes one reconcile.
    """

    name: str
    namespace: str | None = None

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}" if self.namespace else self.name


@dataclass(frozen=True, slots=True)
class Result:
    """How to follow up a successful reconcile.

    ``requeue_after`` (seconds, or a ``timedelta``) reconciles the request again after that
    delay, without counting it as a failure; ``requeue=True`` re-queues it with the rate
    limiter's backoff (as a failure, but without an error). Returning ``None`` or
    ``Result()`` means done until the next event. A negative, NaN or infinite
    ``requeue_after`` raises ``ValueError``.
    """

    requeue: bool = False
    requeue_after: float | None = None

    def __post_init__(self) -> None:
        after = self.requeue_after
        if isinstance(after, timedelta):
            after = after.total_seconds()
            object.__setattr__(self, "requeue_after", after)
        # NaN passes "< 0" and would poison the work queue's delay heap; inf never fires.
        if after is not None and not (math.isfinite(after) and after >= 0):
            raise ValueError(f"requeue_after must be a finite number >= 0, not {after!r}")

    def is_zero(self) -> bool:
        return not self.requeue and not self.requeue_after


class TerminalError(Exception):
    """A failure that retrying cannot fix (invalid spec, ...): the request is not re-queued.

    It is logged and counted in ``controller_runtime_terminal_reconcile_errors_total``; the
    next event for the object triggers a new reconcile as usual. Raise it directly or
    ``raise TerminalError("...") from cause``.
    """


@runtime_checkable
class Reconciler(Protocol):
    """Drives one object towards its desired state.

    Return ``None``/``Result`` on success; raise to be retried with backoff (or
    :class:`TerminalError` to give up). Calls for the same request never overlap; calls for
    different requests may, up to the controller's ``max_concurrent_reconciles``.
    """

    async def reconcile(self, request: Request) -> Result | None: ...


def check_reconciler(reconciler: Any) -> None:
    """Refuse, with what to write instead, anything the controller could not await: a
    class instead of an instance, an object without ``reconcile``, a sync ``reconcile``."""
    if isinstance(reconciler, type):
        raise TypeError(
            f"got the class {reconciler.__qualname__} as reconciler; pass an instance, "
            f"e.g. complete({reconciler.__qualname__}(...))"
        )
    method = getattr(reconciler, "reconcile", None)
    if method is None or not callable(method):
        raise TypeError(
            f"{reconciler!r} has no reconcile(request) method: define "
            "`async def reconcile(self, request) -> Result | None`"
        )
    if not is_async_callable(method):
        raise TypeError(
            f"{name_of(method)} is not async: the controller awaits it, so define it as "
            "`async def reconcile(self, request) -> Result | None`"
        )


class ReconcilerFunc:
    """Adapts an ``async def fn(request)`` to the :class:`Reconciler` protocol."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[[Request], Awaitable[Result | None]]) -> None:
        if not is_async_callable(fn):
            raise TypeError(
                f"reconciler {name_of(fn)} is not async: the controller awaits it, so "
                "define it as `async def reconcile(request) -> Result | None`"
            )
        self.fn = fn

    async def reconcile(self, request: Request) -> Result | None:
        return await self.fn(request)

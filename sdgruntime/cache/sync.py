"""Waiting for informers to sync: fail fast, and say which kind and why."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import anyio

from sdgruntime import errors
from sdgruntime.kinds import Kind

__all__ = [
    "CacheNotSynced",
    "CacheSyncError",
    "Notifier",
    "describe_sync_error",
    "is_permanent",
    "wait_synced",
]


class CacheSyncError(RuntimeError):
    """Informers did not sync: one ``kind: cause`` per failing kind.

    ``failures`` lists ``(kind, last list error or None)``; ``kind`` and ``cause`` are the
    first of them. ``timed_out`` tells a timeout from a permanent error seen early.
    """

    def __init__(
        self,
        failures: Sequence[tuple[Kind, BaseException | None]],
        *,
        timeout: float | None,
        hints: Mapping[Kind, str] | None = None,
    ) -> None:
        self.failures = list(failures)
        self.kind, self.cause = self.failures[0]
        self.timed_out = timeout is not None
        self.timeout = timeout
        self.hints = dict(hints or {})
        parts = [
            describe_sync_error(k, e, timeout=timeout, hint=self.hints.get(k))
            for k, e in self.failures
        ]
        super().__init__("; ".join(parts))

    def with_hints(self, hints: Mapping[Kind, str]) -> CacheSyncError:
        """The same failures, each kind in ``hints`` explained by its hint."""
        return CacheSyncError(self.failures, timeout=self.timeout, hints={**self.hints, **hints})


class CacheNotSynced(errors.ApiError):
    """A read from an informer that has not synced yet (code 503: try again later).

    Deliberately *not* a NotFound: the object may well exist, and a reconciler that does
    ``except NotFound: return`` (deleted, nothing to do) or cleans up after a deletion must
    not act on "not synced yet". In a reconciler it is an ordinary error (retried with
    backoff); code that can answer from the API server instead catches it next to
    NotFound and does a live GET.
    """

    code = 503


def is_permanent(err: BaseException | None) -> bool:
    """Whether a list error will not heal by retrying: RBAC, a missing CRD, a bad selector.

    Transport errors, 429 and 5xx heal; anything else that is not an API error is a bug in
    a transform or indexer, which does not heal either.
    """
    if err is None:
        return False
    if isinstance(err, errors.ApiError):
        return not errors.is_retriable(err) and not isinstance(err, errors.Gone)
    return True


_FORBIDDEN_PREFIX = re.compile(r"^\S+ is forbidden: ")


def _crd_kind(kind: Kind) -> bool:
    # CRD groups must contain a dot; built-in groups are dotless (apps) or end in .k8s.io.
    return "." in kind.group and not kind.group.endswith(".k8s.io")


def describe_sync_error(
    kind: Kind, err: BaseException | None, *, timeout: float | None, hint: str | None = None
) -> str:
    """``pods: forbidden: User "x" cannot list ...``, ``sdgs.x.io: ... (CRD not installed?)``.

    ``hint`` (what discovery says of a 404: :func:`sdgruntime.discovery.explain_missing`)
    replaces the guess."""
    if err is None:
        return f"{kind.name}: not synced within {timeout:g}s (still listing, no error yet)"
    if isinstance(err, errors.Forbidden):
        cause = _FORBIDDEN_PREFIX.sub("forbidden: ", err.message)
    elif isinstance(err, errors.NotFound):
        # An unknown API group answers a plain-text "404 page not found", an unknown
        # resource in a known group a Status; say the same for both.
        cause = err.message.strip() if err.status else "the server could not find the resource"
        if hint:
            cause += f": {hint}"
        elif _crd_kind(kind):
            cause += " (CRD not installed, or the Kind's version or plural not the served one?)"
    elif isinstance(err, errors.ApiError):
        cause = err.message.strip()
    else:
        cause = f"{type(err).__name__}: {err}"
    if timeout is not None:
        return f"{kind.name}: not synced within {timeout:g}s; last error: {cause}"
    return f"{kind.name}: {cause}"


class Notifier:
    """Wake every waiter when something changes (a broadcast, re-armed after each notify).

    The event is made lazily, inside the event loop, so objects holding a notifier can be
    built outside one.
    """

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event: anyio.Event | None = None

    def notify(self) -> None:
        if self._event is not None:
            self._event.set()
            self._event = None

    async def wait(self) -> None:
        if self._event is None:
            self._event = anyio.Event()
        await self._event.wait()


class Syncing(Protocol):
    """What :func:`wait_synced` reads of an informer (the informer module imports this
    one, not the reverse)."""

    @property
    def kind(self) -> Kind: ...
    @property
    def has_synced(self) -> bool: ...
    @property
    def last_sync_error(self) -> BaseException | None: ...


async def wait_synced(
    informers: Callable[[], Sequence[Syncing]],
    changed: Notifier,
    timeout: float,  # noqa: ASYNC109 - the timeout is part of the error it raises
) -> None:
    """Return once every informer (as listed now, or added meanwhile) has synced.

    Raise :class:`CacheSyncError` as soon as an unsynced informer's list failed
    permanently, or at the timeout with each pending kind's last error.
    """
    with anyio.move_on_after(timeout):
        while True:
            pending = [i for i in informers() if not i.has_synced]
            if not pending:
                return
            fatal = [(i.kind, e) for i in pending if is_permanent(e := i.last_sync_error)]
            if fatal:
                raise CacheSyncError(fatal, timeout=None)
            await changed.wait()
    pending = [i for i in informers() if not i.has_synced]
    if pending:
        raise CacheSyncError([(i.kind, i.last_sync_error) for i in pending], timeout=timeout)

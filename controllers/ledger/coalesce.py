"""Group commit per key: changes that arrive while a write for their key is in flight go
together in the next single write.

A node's claim record is one object written conditionally on its resourceVersion, so
concurrent binds onto one node would 409 each other; serialising per node removes the
409s and coalescing makes N queued claims cost one write. :class:`Coalescer` is the one
entry point; its docstring states the semantics (``tests/unit/test_coalesce.py``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Generic, TypeVar

import anyio

K = TypeVar("K", bound=Hashable)
C = TypeVar("C")

#: ``flush(key, changes)`` -> one outcome per change: None (done) or its exception.
Flush = Callable[[K, list[C]], Awaitable[Sequence[BaseException | None]]]


class Abandoned(Exception):
    """The flush that carried this change was cancelled: whether it was written is
    unknown (decide again on a fresh view)."""


class _Slot(Generic[C]):
    __slots__ = ("change", "done", "error")

    def __init__(self, change: C) -> None:
        self.change = change
        self.done = False
        self.error: BaseException | None = None


class Coalescer(Generic[K, C]):
    """Serialises and batches ``flush`` calls per key.

    - per key at most one flush runs at a time; different keys do not wait for each other;
    - a change submitted while its key is idle is flushed at once, alone;
    - changes submitted while a flush of their key runs are flushed next, together, by one
      call, in the order they were submitted (one of their submitters runs it);
    - each submitter gets its own outcome: ``flush`` returns one result per change (None, or
      the exception that change fails with); a flush that raises fails every change of its
      batch with that exception;
    - a submitter cancelled before its batch started is left out of it; once its batch runs
      the write goes on without it (like a request already sent), and if the submitter that
      runs a batch is cancelled, the others of that batch fail with :class:`Abandoned`.
    """

    def __init__(self, flush: Flush[K, C]) -> None:
        self._flush = flush
        self._pending: dict[K, list[_Slot[C]]] = {}
        self._locks: dict[K, anyio.Lock] = {}
        self._users: dict[K, int] = {}

    async def submit(self, key: K, change: C) -> None:
        """Have ``change`` flushed with whatever else is waiting for ``key``; raises the
        exception its flush gave it."""
        slot: _Slot[C] = _Slot(change)
        self._pending.setdefault(key, []).append(slot)
        lock = self._locks.setdefault(key, anyio.Lock())
        self._users[key] = self._users.get(key, 0) + 1
        try:
            async with lock:
                if not slot.done:
                    await self._run(key)
        except BaseException:
            self._withdraw(key, slot)
            raise
        finally:
            self._users[key] -= 1
            if not self._users[key]:
                del self._users[key], self._locks[key]
        if slot.error is not None:
            raise slot.error

    def _withdraw(self, key: K, slot: _Slot[C]) -> None:
        """Leave a change whose submitter is gone out of the next batch, if not taken yet."""
        pending = self._pending.get(key)
        if pending is not None and slot in pending:
            pending.remove(slot)
            if not pending:
                del self._pending[key]

    async def _run(self, key: K) -> None:
        """Flush every change waiting for ``key`` (the lock is held)."""
        batch = self._pending.pop(key)
        try:
            outcomes = list(await self._flush(key, [s.change for s in batch]))
            if len(outcomes) != len(batch):
                raise RuntimeError(f"flush gave {len(outcomes)} outcomes for {len(batch)}")
        except Exception as err:  # every change of the batch fails with it
            outcomes = [err] * len(batch)
        except BaseException:
            for s in batch:
                s.done, s.error = True, Abandoned(f"the write for {key!r} was cancelled")
            raise
        for s, outcome in zip(batch, outcomes, strict=True):
            s.done, s.error = True, outcome

"""An async work queue with client-go's semantics: dedup, dirty re-queue, delays, backoff.

Handlers ``add`` keys; workers ``get`` a key, reconcile it and call ``done``. Invariants: a
queued key is queued once, a key held by a worker is never handed to a second one (an
``add`` meanwhile hands it out again after ``done``), otherwise FIFO. Delayed keys fire
only while :meth:`WorkQueue.run` runs. Unlike client-go, ``shutdown()`` abandons queued
and delayed keys at once (docs/contracts.md, "The work queue"). Single event loop: no
method awaits between reading and writing state.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections import deque
from collections.abc import Hashable
from typing import Generic, Protocol, TypeVar

import anyio
import anyio.lowlevel

from sdgruntime import metrics
from sdgruntime.ratelimiter import RateLimiter, default_controller_rate_limiter

__all__ = ["Clock", "FakeClock", "ShutDown", "SystemClock", "WorkQueue"]

T = TypeVar("T", bound=Hashable)


class ShutDown(Exception):
    """Raised by :meth:`WorkQueue.get` when the queue is shutting down."""


# --- clocks ---------------------------------------------------------------------------------


class Clock(Protocol):
    """Monotonic seconds plus a way to wait for a deadline on the same scale."""

    def now(self) -> float: ...

    async def sleep_until(self, deadline: float) -> None: ...


class SystemClock:
    """The real monotonic clock."""

    def now(self) -> float:
        return time.monotonic()

    async def sleep_until(self, deadline: float) -> None:
        await anyio.sleep(max(0.0, deadline - time.monotonic()))


class FakeClock:
    """A clock that moves only when told to, for tests (like k8s.io/utils/clock/testing).

    ``advance`` wakes every ``sleep_until`` whose deadline has been reached; woken tasks run
    at the caller's next checkpoint (``await anyio.wait_all_tasks_blocked()`` lets them).
    Invariant: every entry in ``_sleepers`` has ``deadline > _now``.
    """

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._sleepers: list[tuple[float, int, anyio.Event]] = []
        self._seq = itertools.count()

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a monotonic clock does not go back")
        self._now += seconds
        while self._sleepers and self._sleepers[0][0] <= self._now:
            heapq.heappop(self._sleepers)[2].set()

    async def sleep_until(self, deadline: float) -> None:
        if deadline <= self._now:
            await anyio.lowlevel.checkpoint()
            return
        entry = (deadline, next(self._seq), anyio.Event())
        heapq.heappush(self._sleepers, entry)
        try:
            await entry[2].wait()
        finally:
            if entry in self._sleepers:  # cancelled before it was due
                self._sleepers.remove(entry)
                heapq.heapify(self._sleepers)


# --- metrics --------------------------------------------------------------------------------


class _NoMetrics(Generic[T]):
    """Metrics of an unnamed queue: none (as client-go's noop provider)."""

    def add(self, item: T, now: float) -> None: ...
    def get(self, item: T, now: float) -> None: ...
    def done(self, started: float, now: float) -> None: ...
    def drop(self, item: T) -> None: ...
    def retry(self) -> None: ...
    def unfinished(self, starts: list[float], now: float) -> None: ...


class _QueueMetrics(_NoMetrics[T]):
    """client-go's defaultQueueMetrics on the shared registry.

    Invariant: ``workqueue_depth`` == number of dirty items == ``len(_add_times)``: an item
    counts from the ``add`` that made it dirty until a worker ``get``s it (so an item
    re-added while processing counts while it waits for ``done``).
    """

    def __init__(self, name: str, controller: str) -> None:
        labels = {"name": name, "controller": controller}
        self._depth = metrics.WORKQUEUE_DEPTH.labels(**labels)
        self._adds = metrics.WORKQUEUE_ADDS.labels(**labels)
        self._latency = metrics.WORKQUEUE_QUEUE_DURATION.labels(**labels)
        self._work = metrics.WORKQUEUE_WORK_DURATION.labels(**labels)
        self._unfinished = metrics.WORKQUEUE_UNFINISHED_WORK.labels(**labels)
        self._longest = metrics.WORKQUEUE_LONGEST_RUNNING.labels(**labels)
        self._retries = metrics.WORKQUEUE_RETRIES.labels(**labels)
        self._add_times: dict[T, float] = {}

    def add(self, item: T, now: float) -> None:
        self._adds.inc()
        self._depth.inc()
        self._add_times.setdefault(item, now)

    def get(self, item: T, now: float) -> None:
        self._depth.dec()
        self._latency.observe(now - self._add_times.pop(item, now))

    def done(self, started: float, now: float) -> None:
        self._work.observe(now - started)

    def drop(self, item: T) -> None:
        self._depth.dec()
        self._add_times.pop(item, None)

    def retry(self) -> None:
        self._retries.inc()

    def unfinished(self, starts: list[float], now: float) -> None:
        self._unfinished.set(sum(now - s for s in starts))
        self._longest.set(max((now - s for s in starts), default=0.0))


# --- the queue ------------------------------------------------------------------------------


class WorkQueue(Generic[T]):
    """A rate-limited, delaying work queue of hashable items (client-go's
    TypedRateLimitingInterface, async).

    Invariants (between any two awaits):

    * ``_queue`` has no duplicates and ``set(_queue) == _dirty - _processing.keys()``:
      an item is queued iff it is dirty and not held by a worker.
    * ``_processing`` maps each item held by a worker to when it was handed out; an item
      is held by at most one worker.
    * ``_shutting_down`` implies ``_queue``, ``_dirty``, ``_waiting`` and ``_heap`` are empty,
      and stay so (adds are ignored).
    * ``_waiting[item]`` is the (ready_at, seq) of the one live heap entry for ``item``;
      other heap entries for it are stale and skipped when they surface.
    * ``_getters`` holds the wake-up events of blocked ``get`` calls; a getter blocks only
      while ``_queue`` is empty, and each push onto ``_queue`` wakes (pops) at most one.
      A getter that is woken but cancelled passes its wake-up on, so none is lost.
    * ``_drained`` (made by the first draining call) is set once ``_processing`` is empty
      after shutdown began, or when ``shutdown()`` abandons the drain.
    * ``_run_wake`` is the cancel scope of ``run()``'s current sleep (None when not
      sleeping); that sleep ends no later than the earliest live deadline in ``_heap``.
    """

    def __init__(
        self,
        name: str | None = None,
        *,
        controller: str | None = None,
        rate_limiter: RateLimiter[T] | None = None,
        clock: Clock | None = None,
    ) -> None:
        """``name`` turns on the ``workqueue_*`` metrics, labelled ``name`` and
        ``controller`` (default: ``name``)."""
        self.name = name
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._rate_limiter: RateLimiter[T] = (
            rate_limiter
            if rate_limiter is not None
            else default_controller_rate_limiter(self._clock.now)
        )
        self._metrics: _NoMetrics[T] = (
            _QueueMetrics(name, controller or name) if name else _NoMetrics()
        )
        self._queue: deque[T] = deque()
        self._dirty: set[T] = set()
        self._processing: dict[T, float] = {}
        self._getters: deque[anyio.Event] = deque()
        self._shutting_down = False
        self._drained: anyio.Event | None = None
        # Delayed adds: a min-heap of (ready_at, seq, item); seq breaks ties in add order
        # and keeps items (which need not be orderable) out of comparisons.
        self._heap: list[tuple[float, int, T]] = []
        self._waiting: dict[T, tuple[float, int]] = {}
        self._seq = itertools.count()
        self._running = False
        self._run_wake: anyio.CancelScope | None = None

    # --- basic queue ------------------------------------------------------------------------

    def __len__(self) -> int:
        """Items ready to be handed out (not those held by workers or still delayed)."""
        return len(self._queue)

    @property
    def shutting_down(self) -> bool:
        return self._shutting_down

    def add(self, item: T) -> None:
        """Mark ``item`` as needing processing. No-op while shutting down."""
        if self._shutting_down or item in self._dirty:
            return
        self._metrics.add(item, self._clock.now())
        self._dirty.add(item)
        if item in self._processing:
            return  # handed out again by done()
        self._push(item)

    async def get(self) -> T:
        """Wait for an item and hand it to the caller, who must call :meth:`done` with it.

        Raises :class:`ShutDown` once the queue is shutting down.
        """
        await anyio.lowlevel.checkpoint()
        while True:
            if self._queue:
                item = self._queue.popleft()
                now = self._clock.now()
                self._dirty.discard(item)
                self._processing[item] = now
                self._metrics.get(item, now)
                return item
            if self._shutting_down:
                raise ShutDown
            wake = anyio.Event()
            self._getters.append(wake)
            try:
                await wake.wait()
            except BaseException:
                if wake.is_set():
                    self._wake_getter()  # pass on the wake-up this getter will not use
                else:
                    self._getters.remove(wake)
                raise

    def done(self, item: T) -> None:
        """Mark ``item`` as processed; if it was added meanwhile, queue it again.

        Raises ``ValueError`` if ``item`` is not held by a worker (a caller bug that would
        otherwise break dedup).
        """
        try:
            started = self._processing.pop(item)
        except KeyError:
            raise ValueError(f"done({item!r}) for an item that is not being processed") from None
        self._metrics.done(started, self._clock.now())
        if item in self._dirty:
            self._push(item)
        if not self._processing:
            self.update_unfinished_work()  # idle: both gauges read 0 at once
            if self._drained is not None:
                self._drained.set()

    def update_unfinished_work(self) -> None:
        """Refresh the unfinished-work and longest-running gauges. As client-go's queue,
        the owner calls it periodically (the controller every ``UNFINISHED_WORK_INTERVAL``):
        per get/done it would cost O(items in flight) on every item. ``done`` of the last
        item in flight refreshes them too, so an idle queue reads 0 at once."""
        self._metrics.unfinished(list(self._processing.values()), self._clock.now())

    def __aiter__(self) -> WorkQueue[T]:
        return self

    async def __anext__(self) -> T:
        try:
            return await self.get()
        except ShutDown:
            raise StopAsyncIteration from None

    # --- delays and rate limiting -----------------------------------------------------------

    def add_after(self, item: T, delay: float) -> None:
        """Add ``item`` once ``delay`` seconds have passed (at once if ``delay <= 0``).

        If ``item`` is already waiting, the earlier deadline wins. Counts as a retry.
        Raises ``ValueError`` if ``delay`` is NaN or infinite: a NaN deadline breaks the
        heap's order (``run`` would spin and later items never fire).
        """
        if not math.isfinite(delay):
            raise ValueError(f"add_after delay must be finite, not {delay!r}")
        if self._shutting_down:
            return
        self._metrics.retry()
        if delay <= 0:
            self.add(item)
            return
        ready_at = self._clock.now() + delay
        current = self._waiting.get(item)
        if current is not None and current[0] <= ready_at:
            return
        entry = (ready_at, next(self._seq), item)
        self._waiting[item] = entry[:2]
        heapq.heappush(self._heap, entry)
        if self._heap[0] is entry and self._run_wake is not None:
            self._run_wake.cancel()  # run() sleeps until a later deadline: recompute

    def add_rate_limited(self, item: T) -> None:
        """Add ``item`` after the delay the rate limiter gives it (one more failure)."""
        if self._shutting_down:
            return
        self.add_after(item, self._rate_limiter.when(item))

    def forget(self, item: T) -> None:
        """Tell the rate limiter ``item`` succeeded; does not remove it from the queue."""
        self._rate_limiter.forget(item)

    def num_requeues(self, item: T) -> int:
        return self._rate_limiter.num_requeues(item)

    async def run(self) -> None:
        """Move delayed items into the queue when they are due; returns on shutdown.

        Run exactly one per queue, in the owner's task group. Sleeps until the earliest
        deadline; ``add_after`` with an earlier one, or shutdown, cancels that sleep.
        """
        if self._running:
            raise RuntimeError("WorkQueue.run() is already running")
        self._running = True
        try:
            while not self._shutting_down:
                self._promote_due()
                with anyio.CancelScope() as self._run_wake:
                    if self._heap:
                        await self._clock.sleep_until(self._heap[0][0])
                    else:
                        await anyio.sleep_forever()
                self._run_wake = None
        finally:
            self._running = False
            self._run_wake = None

    # --- shutdown ---------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Stop: ignore adds, drop queued and delayed items, make ``get`` raise ShutDown.

        Items held by workers are abandoned (their ``done`` still works but re-queues
        nothing); a pending :meth:`shutdown_with_drain` returns at once.
        """
        self._begin_shutdown()
        if self._drained is not None:
            self._drained.set()

    async def shutdown_with_drain(self) -> None:
        """As :meth:`shutdown`, then wait until every item being processed is ``done``."""
        self._begin_shutdown()
        if not self._processing:
            await anyio.lowlevel.checkpoint()
            return
        if self._drained is None:
            self._drained = anyio.Event()
        await self._drained.wait()

    # --- internals --------------------------------------------------------------------------

    def _push(self, item: T) -> None:
        self._queue.append(item)
        self._wake_getter()

    def _wake_getter(self) -> None:
        if self._getters and self._queue:
            self._getters.popleft().set()

    def _promote_due(self) -> None:
        now = self._clock.now()
        while self._heap and self._heap[0][0] <= now:
            ready_at, seq, item = heapq.heappop(self._heap)
            if self._waiting.get(item) == (ready_at, seq):
                del self._waiting[item]
                self.add(item)
        # Surface the next live deadline so run() never sleeps on a stale entry.
        while self._heap and self._waiting.get(self._heap[0][2]) != self._heap[0][:2]:
            heapq.heappop(self._heap)

    def _begin_shutdown(self) -> None:
        if self._shutting_down:
            return
        self._shutting_down = True
        for item in self._dirty:
            self._metrics.drop(item)
        self._dirty.clear()
        self._queue.clear()
        self._heap.clear()
        self._waiting.clear()
        while self._getters:
            self._getters.popleft().set()
        if self._run_wake is not None:
            self._run_wake.cancel()

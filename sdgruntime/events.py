"""Event recorder: core/v1 Events about objects, with client-go's repeat aggregation.

A reconciler that reports the same thing on every pass would otherwise write one Event per
pass; as in client-go, an identical event (same object, type, reason, message) seen again
within ``window`` seconds bumps ``count`` and ``lastTimestamp`` of the Event already written.
Recording is best effort: failures are logged, never raised into the reconciler.

Stopping :meth:`EventRecorder.run` (cancelling it) still writes what is queued, within a
deadline: the last Events a component emits before a restart (the binds before a rolling
update) are the ones ``kubectl describe`` is read for.
"""

from __future__ import annotations

import logging
import math
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from sdgruntime import errors, metrics
from sdgruntime.kinds import EVENTS
from sdgruntime.lru import LRU
from sdgruntime.ratelimiter import BucketRateLimiter

if TYPE_CHECKING:
    from sdgruntime.client import Client

__all__ = ["EventRecorder", "EventType"]

log = logging.getLogger(__name__)

EventType = Literal["Normal", "Warning"]

_MAX_MESSAGE = 1024  # the API's limit for events.k8s.io notes; keeps etcd objects small


_stamp: tuple[int, str] = (-1, "")


def _now() -> str:
    """The time now as an Event's timestamps have it (whole seconds, UTC), formatted once
    per second: every Event write asks for it."""
    global _stamp
    second = int(time.time())
    if second != _stamp[0]:
        _stamp = (second, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(second)))
    return _stamp[1]


@dataclass(slots=True)
class _Seen:
    """The Event written for one aggregation key. ``lock`` serialises the writes of the
    key; it exists only while ``users`` (writers holding or waiting for it) > 0: an idle
    key costs no lock (an anyio Lock and its waiter deque are ~700 bytes, more than the
    rest of the entry; thousands of keys sit idle until they expire)."""

    name: str
    namespace: str
    count: int
    last_seen: float  # monotonic
    lock: anyio.Lock | None = None
    users: int = 0

    def acquire(self) -> anyio.Lock:
        """This key's lock (made on first use); pair every call with :meth:`leave`."""
        if self.lock is None:
            self.lock = anyio.Lock()
        self.users += 1
        return self.lock

    def leave(self) -> None:
        self.users -= 1
        if not self.users:
            self.lock = None


#: Paced writes wait for the first multiple of this many seconds (of the loop's clock) at or
#: after their token is due, so the writes due within one tick go out together: one wake
#: of an idle process for several Events, not one each. A write after an idle gap costs
#: ~4x one in a run (cold caches, a halted vCPU), and a burst of thousands of Events paced
#: one by one cost ~0.7 ms of CPU each instead of ~0.25 (hack/bench/RESULTS.md, session
#: 38). The average rate stays the limiter's; a tick holds at most ``qps * PACE_TICK``.
PACE_TICK = 0.25

#: Identities of objects seen deleted (``forget``) that are remembered, so that an Event
#: emitted about one after its deletion is written but not kept for aggregation.
GONE_KEPT = 1024


_Pending = tuple[Mapping[str, Any], "EventType", str, str, str | None]


class EventRecorder:
    """Writes Events for one component (``source.component``/``reportingComponent``).

    ``writers`` Events are in flight at once and ``buffer`` wait (a scheduler binding
    hundreds of pods a second emits one Event per bind; too few writers drop them).
    A waiting Event holds a reference to its (cached) object and its strings: ~1 KB.
    ``limiter`` (a token bucket, which recorders may share: the manager's is
    ``event_qps``/``event_burst``) paces the writers, as the kubelet's ``--event-qps``
    does: a burst of emits reaches the API server at that rate, not as ``writers``
    concurrent writes beside the requests that matter more; the paced writes go out
    together once per ``pace_tick`` seconds (never before their token is due).
    :meth:`event` is not paced.
    When :meth:`run` is cancelled, the queued and in-flight Events get ``drain_timeout``
    seconds to be written (the manager passes its ``graceful_shutdown_timeout``).

    Memory: the aggregation keys are an LRU of at most ``max_keys`` (client-go's correlator
    keeps 4096 too); a key older than ``window`` is dropped when the next new key comes,
    and :meth:`forget` drops an object's keys when it is deleted, so a manager under churn
    holds keys only for objects that exist or were written about in the last ``window``.
    """

    def __init__(
        self,
        client: Client,
        component: str,
        *,
        host: str = "",
        window: float = 600.0,
        max_keys: int = 4096,
        buffer: int = 4096,
        writers: int = 16,
        drain_timeout: float = 30.0,
        limiter: BucketRateLimiter[Any] | None = None,
        pace_tick: float = PACE_TICK,
    ) -> None:
        self.client = client
        self.component = component
        self.host = host
        self.window = window
        self.max_keys = max_keys
        self.buffer = buffer
        self.writers = writers
        self.drain_timeout = drain_timeout
        self.limiter = limiter
        self.pace_tick = pace_tick
        self._seen: OrderedDict[tuple[str, ...], _Seen] = OrderedDict()
        #: identity (UID, else kind/namespace/name) -> its keys in ``_seen`` (for ``forget``)
        self._keys_of: dict[str, list[tuple[str, ...]]] = {}
        #: identities of deleted objects, newest last, at most GONE_KEPT
        self._gone: LRU[str, None] = LRU(GONE_KEPT)
        # set while run() takes events; None before, while stopping, and after
        self._send: MemoryObjectSendStream[_Pending] | None = None
        self._writing: anyio.CancelScope | None = None  # the writers' scope, while running
        self._dropped = 0
        self._queued = metrics.EVENTS_QUEUED.labels(component)
        self._dropped_total = metrics.EVENTS_DROPPED.labels(component)
        self._cut_off = 0  # writes of this run cancelled by its drain deadline or abort()

    def emit(
        self,
        obj: Mapping[str, Any],
        type_: EventType,
        reason: str,
        message: str,
        *,
        action: str | None = None,
    ) -> None:
        """Queue an event for :meth:`run` to write; never waits, never raises.

        Events are best-effort (as client-go's broadcaster makes them): a reconcile or a
        webhook must not spend its time on them. Measured at 1000 nodes, awaiting each
        Event took 13% of a group decision and 36% of the pod workers' time. When the
        buffer is full, or no :meth:`run` is active (or it is stopping), the event is
        dropped and counted.
        """
        send = self._send
        if send is None:
            self._drop(reason, "the recorder is not running")
            return
        try:
            send.send_nowait((obj, type_, reason, message, action))
        except anyio.WouldBlock:
            self._drop(reason, "the buffer is full")
        else:
            self._queued.inc()

    def _drop(self, reason: str, why: str) -> None:
        self._dropped += 1
        self._dropped_total.inc()
        if self._dropped == 1 or self._dropped % 100 == 0:
            log.warning("dropped event %s (%d so far): %s", reason, self._dropped, why)

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Write emitted events with ``writers`` concurrent writers until cancelled.

        Cancellation stops taking events; the writers, shielded from it, go on with what
        is queued and in flight until the buffer is empty, for at most ``drain_timeout``
        seconds (or until :meth:`abort`). What is left then is dropped, counted and
        logged in one line: a hanging API server delays a stop by that bound, no more.
        """
        if self._writing is not None:
            raise RuntimeError(f"event recorder {self.component} is already running")
        send, receive = anyio.create_memory_object_stream[_Pending](self.buffer)
        writing = self._writing = anyio.CancelScope(shield=True)
        self._cut_off = 0
        try:
            async with anyio.create_task_group() as tg:
                try:
                    await tg.start(self._write_all, writing, receive)
                    self._send = send
                    task_status.started()
                    await anyio.sleep_forever()
                finally:
                    self._send = None  # before close: a late emit drops instead of raising
                    send.close()  # the writers stop once the buffer is empty
                    writing.deadline = anyio.current_time() + self.drain_timeout
                    queued = receive.statistics().current_buffer_used
                    if queued and not writing.cancel_called:
                        log.info(
                            "event recorder %s: stopping, writing %d queued events (up to %gs)",
                            self.component,
                            queued,
                            self.drain_timeout,
                        )
        finally:
            self._send = self._writing = None
            self._drop_unwritten(receive)
            receive.close()

    def abort(self) -> None:
        """Stop writing at once: what is queued or in flight is dropped (and logged when
        :meth:`run` returns). The manager calls it when its graceful-shutdown deadline
        has passed, so one deadline bounds its whole stop."""
        self._send = None
        if self._writing is not None:
            self._writing.cancel()

    @property
    def dropped(self) -> int:
        """Events emitted but never written: buffer full, not running, or still queued
        (or being written) when :meth:`run` gave up on them."""
        return self._dropped

    def _drop_unwritten(self, receive: MemoryObjectReceiveStream[_Pending]) -> None:
        """Count what the stopped writers left, so a later run does not write stale events
        and the loss is visible (one log line, not one per event)."""
        queued = 0
        while True:
            try:
                receive.receive_nowait()
            except (anyio.WouldBlock, anyio.EndOfStream):
                break
            queued += 1
        self._queued.dec(queued)
        lost = queued + self._cut_off
        if lost:
            self._dropped += lost
            self._dropped_total.inc(lost)
            log.warning(
                "event recorder %s: dropped %d events at shutdown (%d queued, %d cut off "
                "while being written; %d dropped so far): not written before the deadline",
                self.component,
                lost,
                queued,
                self._cut_off,
                self._dropped,
            )

    async def _write_all(
        self,
        writing: anyio.CancelScope,
        receive: MemoryObjectReceiveStream[_Pending],
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """The writers, in the shielded scope :meth:`run` gives its deadline when stopping."""
        with writing:
            async with anyio.create_task_group() as tg:
                for _ in range(self.writers):
                    tg.start_soon(self._write, receive.clone())
                task_status.started()

    async def _write(self, receive: MemoryObjectReceiveStream[_Pending]) -> None:
        async with receive:
            async for obj, type_, reason, message, action in receive:
                self._queued.dec()
                try:
                    if self.limiter is not None:  # a token reserved: due this far out
                        delay = self.limiter.when(None)
                        if delay > 0:
                            await anyio.sleep(self._on_tick(delay))
                    await self.event(obj, type_, reason, message, action=action)
                except anyio.get_cancelled_exc_class():
                    self._cut_off += 1  # the POST may have landed; counted as not written
                    raise

    def _on_tick(self, delay: float) -> float:
        """Seconds from now to the first tick at or after ``delay`` from now."""
        if self.pace_tick <= 0:
            return delay
        now = anyio.current_time()
        return max(delay, math.ceil((now + delay) / self.pace_tick) * self.pace_tick - now)

    async def event(
        self,
        obj: Mapping[str, Any],
        type_: EventType,
        reason: str,
        message: str,
        *,
        action: str | None = None,
    ) -> None:
        """Record an event about ``obj`` (a decoded object with apiVersion/kind/metadata)."""
        try:
            await self._record(obj, type_, reason, message, action)
        except Exception as exc:
            meta = obj.get("metadata") or {}
            log.warning(
                "could not record event %s/%s on %s %s/%s: %s",
                type_,
                reason,
                obj.get("kind", "?"),
                meta.get("namespace", ""),
                meta.get("name", "?"),
                exc,
            )

    def forget(self, obj: Mapping[str, Any]) -> None:
        """``obj`` was deleted: drop its aggregation keys (no Event about it will repeat).

        Its identity is remembered among the last ``GONE_KEPT`` deleted ones, so an Event
        emitted about it afterwards (a reconcile that saw it last) is written, but not kept
        for an aggregation that cannot come. Called by the owner's informer delete handlers.
        """
        identity = _identity(_involved(obj))
        for key in self._keys_of.pop(identity, ()):
            self._seen.pop(key, None)
        self._gone.put(identity, None)

    def __len__(self) -> int:
        """Aggregation keys held."""
        return len(self._seen)

    def _keep(self, key: tuple[str, ...], seen: _Seen) -> None:
        if key in self._seen:
            return
        self._seen[key] = seen
        self._keys_of.setdefault(key[0], []).append(key)

    def _discard(self, key: tuple[str, ...]) -> None:
        del self._seen[key]
        keys = self._keys_of.get(key[0])
        if keys is not None:
            keys.remove(key)
            if not keys:
                del self._keys_of[key[0]]

    def _prune(self, now: float) -> None:
        """Keys past the window (oldest first) and beyond ``max_keys`` go."""
        seen = self._seen
        while seen:
            key, first = next(iter(seen.items()))
            if len(seen) <= self.max_keys and now - first.last_seen < self.window:
                break
            self._discard(key)

    async def _record(
        self,
        obj: Mapping[str, Any],
        type_: str,
        reason: str,
        message: str,
        action: str | None,
    ) -> None:
        if type_ not in ("Normal", "Warning"):
            raise ValueError(f"event type must be Normal or Warning, not {type_!r}")
        involved = _involved(obj)
        message = message[:_MAX_MESSAGE]
        identity = _identity(involved)
        key = (identity, type_, reason, message, action or "")
        now = time.monotonic()

        seen = self._seen.get(key)
        if seen is not None and now - seen.last_seen < self.window:
            self._seen.move_to_end(key)
            seen.last_seen = now
            lock = seen.acquire()
            try:
                async with lock:
                    if seen.name:  # else the create we waited for failed
                        seen.count += 1
                        try:
                            await self.client.patch(
                                EVENTS,
                                seen.name,
                                {"count": seen.count, "lastTimestamp": _now()},
                                seen.namespace,
                                metadata_only=True,
                            )
                            return
                        except errors.NotFound:
                            pass  # expired (event TTL) or deleted: write a fresh one
                    seen.count = 1
                    await self._create(seen, involved, type_, reason, message, action)
                    if identity not in self._gone:
                        self._keep(key, seen)
            finally:
                seen.leave()
            return

        # New key (or its window passed). Register and lock it before the first await, so a
        # concurrent identical event waits for this create and then patches it.
        seen = _Seen(name="", namespace="", count=1, last_seen=now)
        lock = seen.acquire()
        lock.acquire_nowait()
        if key in self._seen:
            self._discard(key)  # its window passed: this one replaces it
        if identity not in self._gone:
            self._keep(key, seen)
            self._prune(now)
        try:
            await self._create(seen, involved, type_, reason, message, action)
        except BaseException:
            if self._seen.get(key) is seen:
                self._discard(key)
            raise
        finally:
            lock.release()
            seen.leave()

    async def _create(
        self,
        seen: _Seen,
        involved: dict[str, Any],
        type_: str,
        reason: str,
        message: str,
        action: str | None,
    ) -> None:
        # cluster-scoped objects get their Events in "default", as client-go does
        namespace = involved.get("namespace") or "default"
        name = f"{involved.get('name', 'unknown')}.{time.time_ns():x}"
        ts = _now()
        event: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": namespace},
            "involvedObject": involved,
            "type": type_,
            "reason": reason,
            "message": message,
            "source": {"component": self.component, **({"host": self.host} if self.host else {})},
            "firstTimestamp": ts,
            "lastTimestamp": ts,
            "count": seen.count,
            "reportingComponent": self.component,
            "reportingInstance": self.host or self.component,
        }
        if action:
            event["action"] = action
        await self.client.create(EVENTS, event, namespace, metadata_only=True)
        seen.name, seen.namespace = name, namespace


def _involved(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The Event's ``involvedObject``: who ``obj`` is (its set fields only)."""
    meta = obj.get("metadata") or {}
    return {
        k: v
        for k, v in (
            ("apiVersion", obj.get("apiVersion")),
            ("kind", obj.get("kind")),
            ("name", meta.get("name")),
            ("namespace", meta.get("namespace")),
            ("uid", meta.get("uid")),
            ("resourceVersion", meta.get("resourceVersion")),
        )
        if v
    }


def _identity(involved: Mapping[str, Any]) -> str:
    """What aggregation keys an object by: its UID, else kind/namespace/name."""
    return str(involved.get("uid") or "") or "/".join(
        (involved.get("kind", ""), involved.get("namespace", ""), involved.get("name", ""))
    )

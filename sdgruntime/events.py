"""Event recorder: core/v1 Events about objects, with client-go's repeat aggregation.

A reconciler that reports the same thing on every pass would otherwise write one Event per
pass; as in client-go, an identical event (same object, type, reason, message) seen again
within ``window`` seconds bumps ``count`` and ``lastTimestamp`` of the Event already written.
Recording is best effort: failures are logged, never raised into the reconciler.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

import anyio

from sdgruntime import errors
from sdgruntime.kinds import EVENTS

if TYPE_CHECKING:
    from sdgruntime.client import Client

__all__ = ["EventRecorder", "EventType"]

log = logging.getLogger(__name__)

EventType = Literal["Normal", "Warning"]

_MAX_MESSAGE = 1024  # the API's limit for events.k8s.io notes; keeps etcd objects small


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(slots=True)
class _Seen:
    """The Event written for one aggregation key."""

    name: str
    namespace: str
    count: int
    last_seen: float  # monotonic
    lock: anyio.Lock = field(default_factory=anyio.Lock)


_Pending = tuple[Mapping[str, Any], "EventType", str, str, str | None]


class EventRecorder:
    """Writes Events for one component (``source.component``/``reportingComponent``).

    ``writers`` Events are in flight at once and ``buffer`` wait: a scheduler binding
    400+ pods/s emits one Event per bind, and at ~10-30 ms per POST under that load 4
    writers and 1024 places dropped half of them (hack/bench/RESULTS.md, session 14).
    A waiting Event holds a reference to its (cached) object and its strings: ~1 KB."""

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
    ) -> None:
        self.client = client
        self.component = component
        self.host = host
        self.window = window
        self.max_keys = max_keys
        self.writers = writers
        self._seen: OrderedDict[tuple[str, ...], _Seen] = OrderedDict()
        self._send, self._receive = anyio.create_memory_object_stream[_Pending](buffer)
        self._running = False
        self._dropped = 0

    def emit(
        self,
        obj: Mapping[str, Any],
        type_: EventType,
        reason: str,
        message: str,
        *,
        action: str | None = None,
    ) -> None:
        """Queue an event for :meth:`run` to write; never waits.

        Events are best-effort (as client-go's broadcaster makes them): a reconcile or a
        webhook must not spend its time on them. Measured at 1000 nodes, awaiting each
        Event took 13% of a group decision and 36% of the pod workers' time. When the
        buffer is full, or no :meth:`run` is active, the event is dropped and counted.
        """
        if not self._running:
            self._drop(reason, "the recorder is not running")
            return
        try:
            self._send.send_nowait((obj, type_, reason, message, action))
        except anyio.WouldBlock:
            self._drop(reason, "the buffer is full")

    def _drop(self, reason: str, why: str) -> None:
        self._dropped += 1
        if self._dropped == 1 or self._dropped % 100 == 0:
            log.warning("dropped event %s (%d so far): %s", reason, self._dropped, why)

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Write emitted events with ``writers`` concurrent writers until cancelled."""
        self._running = True
        try:
            async with anyio.create_task_group() as tg:
                for _ in range(self.writers):
                    tg.start_soon(self._drain, self._receive.clone())
                task_status.started()
        finally:
            self._running = False
            self._drop_queued()

    @property
    def dropped(self) -> int:
        """Events emitted but never written: buffer full, not running, or still queued
        when :meth:`run` stopped."""
        return self._dropped

    def _drop_queued(self) -> None:
        """Count what the stopped writers left in the buffer, so a later run does not write
        stale events and the loss is visible (one log line, not one per event)."""
        lost = 0
        while True:
            try:
                self._receive.receive_nowait()
            except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                break
            lost += 1
        if lost:
            self._dropped += lost
            log.warning(
                "dropped %d queued events (%d so far): the recorder stopped before writing them",
                lost,
                self._dropped,
            )

    async def _drain(self, receive: anyio.abc.ObjectReceiveStream[_Pending]) -> None:
        async with receive:
            async for obj, type_, reason, message, action in receive:
                await self.event(obj, type_, reason, message, action=action)

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
        meta = obj.get("metadata") or {}
        involved = {
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
        message = message[:_MAX_MESSAGE]
        identity = involved.get("uid") or "/".join(
            (involved.get("kind", ""), involved.get("namespace", ""), involved.get("name", ""))
        )
        key = (identity, type_, reason, message, action or "")
        now = time.monotonic()

        seen = self._seen.get(key)
        if seen is not None and now - seen.last_seen < self.window:
            self._seen.move_to_end(key)
            seen.last_seen = now
            async with seen.lock:
                if seen.name:  # else the create we waited for failed
                    seen.count += 1
                    try:
                        await self.client.patch(
                            EVENTS,
                            seen.name,
                            {"count": seen.count, "lastTimestamp": _now()},
                            seen.namespace,
                        )
                        return
                    except errors.NotFound:
                        pass  # expired (event TTL) or deleted: write a fresh one
                seen.count = 1
                await self._create(seen, involved, type_, reason, message, action)
                self._seen.setdefault(key, seen)
            return

        # New key (or its window passed). Register and lock it before the first await, so a
        # concurrent identical event waits for this create and then patches it.
        seen = _Seen(name="", namespace="", count=1, last_seen=now)
        seen.lock.acquire_nowait()
        self._seen[key] = seen
        self._seen.move_to_end(key)
        while len(self._seen) > self.max_keys:
            self._seen.popitem(last=False)
        try:
            await self._create(seen, involved, type_, reason, message, action)
        except BaseException:
            if self._seen.get(key) is seen:
                del self._seen[key]
            raise
        finally:
            seen.lock.release()

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
        await self.client.create(EVENTS, event, namespace)
        seen.name, seen.namespace = name, namespace

"""The status controller: ``status.allocatedPods`` / ``podCount`` equal the group's active pods.

It writes only those fields, as a JSON merge patch guarded by the group's UID, so it never
races the group scheduler's conditional writes of conditions or binding. Writes are batched
per group (at most one per ``batch_period``, the first at once), so a burst of joining pods
costs one write per period; while pods wait in the pod scheduler's queue (``busy``), a
write waits too, at most ``hold`` seconds, so binds go first. ``allocatedPods`` lists at
most ``MAX_ALLOCATED_PODS`` pods and ``podCount`` stays exact; ``--allocated-pods counts``
writes ``allocatedPodCounts`` instead, and no pod names in Events either (docs/design.md,
"Inside the controllers").
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable
from typing import Any, Final, Literal

import anyio

from api.constants import MAX_ALLOCATED_PODS, SDG_KIND
from api.pods import POD_GROUP_INDEX, is_active, pod_key
from api.v1alpha1 import pod_list_update
from controllers.podevents import EVENT_PODS, PodEvents
from controllers.watches import group_of_pod, pod_moved
from sdgruntime import errors
from sdgruntime.cache import Cache
from sdgruntime.client import Client
from sdgruntime.events import EventRecorder
from sdgruntime.handler import EnqueueRequestsFromMapFunc
from sdgruntime.kinds import PODS, Obj, status_of
from sdgruntime.manager import Manager
from sdgruntime.predicate import Funcs
from sdgruntime.reconcile import Request, Result

__all__ = [
    "EVENT_PODS",
    "STATUS_BATCH_PERIOD",
    "STATUS_HOLD",
    "STATUS_WORKERS",
    "StatusController",
    "namespace_counts",
    "setup",
]

#: Concurrent reconciles, each mostly one status PATCH's round trip: after a burst of
#: pods across many groups nearly every group needs its last write, and 8 workers make
#: the API server, not the workers, the limit (``--status-workers``; S4 in RESULTS.md).
STATUS_WORKERS: Final = 8
#: Seconds between two status writes of one group (``--status-batch-period``): as the Job
#: controller's pod update batching, a burst is written once per period, not per pod.
STATUS_BATCH_PERIOD: Final = 1.0
#: Seconds a group's status write may wait while pods wait to be bound: after a failover
#: (a backlog of thousands of pods) the binds go first and each group is written once,
#: after them. Its pods are bound meanwhile; only the status is this much behind.
STATUS_HOLD: Final = 10.0
#: How often held writes are checked for release (the queue emptied, or the hold ended).
HOLD_TICK: Final = 0.25


def namespace_counts(keys: Iterable[str], limit: int = MAX_ALLOCATED_PODS) -> dict[str, int]:
    """``status.allocatedPodCounts``: active pods per namespace, from ``namespace/name``
    keys; the sorted first ``limit`` namespaces (as ``allocatedPods``, so the object stays
    small; ``podCount`` stays exact)."""
    counts = Counter(key.partition("/")[0] for key in set(keys))
    return {ns: counts[ns] for ns in sorted(counts)[:limit]}


class StatusController:
    """Reconciler for SharedDeviceGroups, triggered by their pods."""

    def __init__(
        self,
        client: Client,
        cache: Cache,
        recorder: EventRecorder,
        *,
        events: PodEvents | None = None,
        batch_period: float = STATUS_BATCH_PERIOD,
        clock: Callable[[], float] = time.monotonic,
        allocated_pods: Literal["names", "counts"] = "names",
        busy: Callable[[], bool] | None = None,
        hold: float = STATUS_HOLD,
    ) -> None:
        """``busy``: whether pods wait in the pod scheduler's queue (None: never held)."""
        self.client = client
        self.allocated_pods = allocated_pods
        self.cache = cache
        self.recorder = recorder
        self.events = events if events is not None else PodEvents(recorder)
        self.batch_period = batch_period
        self.clock = clock
        #: group -> when its status was last written, oldest first; only the writes of the
        #: last ``batch_period`` are kept (an older one delays nothing).
        self._written: OrderedDict[str, float] = OrderedDict()
        #: group -> the resourceVersion our last write gave it, until the watch brings that
        #: version back (at most one entry per group; a deleted group's goes with it).
        self._echoes: dict[str, str] = {}
        self.busy = busy
        self.hold = hold
        #: group -> when its write was first held for ``busy``, oldest first; an entry goes
        #: when the group is reconciled past its hold or forgotten (at most one per group).
        self._held: OrderedDict[str, float] = OrderedDict()
        self._holding = anyio.Event()  # set when a write is held: the runner wakes

    def is_echo(self, group: Obj) -> bool:
        """Whether this version of ``group`` is our own last write coming back: it needs
        no reconcile (the pods it was computed from wake their group if they change)."""
        meta = group["metadata"]
        name = meta["name"]
        if self._echoes.get(name) != meta.get("resourceVersion"):
            return False
        del self._echoes[name]
        return True

    def _forget(self, name: str) -> None:
        """The group is gone: tell what is pending, keep nothing of it."""
        self.events.flush(name)
        self._written.pop(name, None)
        self._echoes.pop(name, None)
        self._held.pop(name, None)

    def _wait(self, name: str, now: float) -> float:
        """Seconds until ``name`` may be written again (0: now); forgets stale writes."""
        written = self._written
        while written:
            oldest, at = next(iter(written.items()))
            if now - at < self.batch_period:
                break
            del written[oldest]
        last = written.get(name)
        return 0.0 if last is None else self.batch_period - (now - last)

    def _binds_wait(self) -> bool:
        """Whether pods wait in the pod scheduler's queue (never, without ``busy``)."""
        return self.busy is not None and self.busy()

    def _held_for(self, name: str, now: float) -> bool:
        """Whether ``name``'s write waits for the binds: pods wait to be bound and its hold
        (from its first wait) has not ended. ``release_held`` wakes it when either ends."""
        if not self._binds_wait():
            return False
        since = self._held.get(name)
        if since is None:
            since = self._held[name] = now
            self._holding.set()
        return now - since < self.hold

    def due_held(self, now: float) -> list[str]:
        """The held groups to reconcile now: all once no pod waits to be bound, else those
        whose hold has ended (oldest first)."""
        if not self._binds_wait():
            return list(self._held)
        due = []
        for name, since in self._held.items():
            if now - since < self.hold:
                break
            due.append(name)
        return due

    async def release_held(self, wake: Callable[[Request], None]) -> None:
        """Until cancelled: every ``HOLD_TICK`` while writes are held, ``wake`` the held
        groups that are due (idle, it sleeps until one is held)."""
        while True:
            if not self._held:
                await self._holding.wait()
                self._holding = anyio.Event()
            await anyio.sleep(HOLD_TICK)
            for name in self.due_held(self.clock()):
                wake(Request(name))

    def __len__(self) -> int:
        """Groups whose last write is recent enough to delay the next."""
        return len(self._written)

    async def reconcile(self, request: Request) -> Result | None:
        try:
            # Read-only: no deep copy (most reconciles are the echo of our own write and
            # change nothing).
            group = self.cache.get(SDG_KIND, request.name, copy=False)
        except errors.NotFound:
            self._forget(request.name)
            return None
        now = self.clock()
        wait = self._wait(request.name, now)
        if wait > 0:
            # Written within the period: once more when it ends, from the cache as it is then
            # (pod events meanwhile find the same wait and read no pods: a burst into a
            # group of thousands costs one pass over its pods per period, not per pod).
            return Result(requeue_after=wait)
        if self._held_for(request.name, now):
            return None  # release_held wakes it
        self._held.pop(request.name, None)
        pods = self.cache.list(PODS, index=POD_GROUP_INDEX, value=request.name, copy=False)
        status = status_of(group)
        before = status.get("allocatedPods") or []
        before_count = status.get("podCount", 0)
        if not isinstance(before_count, int) or isinstance(before_count, bool):
            before_count = len(before)
        active = [pod_key(p) for p in pods if is_active(p)]
        before_counts = status.get("allocatedPodCounts") or {}
        fields: dict[str, Any]
        if self.allocated_pods == "counts":
            counts = namespace_counts(active)
            count = len(set(active))
            joined: list[str] = []
            left: list[str] = []
            unchanged = not before and before_counts == counts
            # Namespaces no pod uses any more go (a merge patch merges maps).
            gone = {ns: None for ns in before_counts if ns not in counts}
            fields = {"allocatedPods": [], "allocatedPodCounts": {**gone, **counts}}
        else:
            update = pod_list_update(before, before_count, active)
            count, joined, left = update.count, update.joined, update.left
            unchanged = before == update.listed and not before_counts
            fields = {"allocatedPods": update.listed}
            if before_counts:  # the manager ran with --allocated-pods counts before
                fields["allocatedPodCounts"] = None
        # A new group has neither field: that already says "no pods" (the scheduler's first
        # status write sets podCount 0), and writing it here would only make the
        # scheduler's conditional finalizer patch of the new group conflict.
        if unchanged and status.get("podCount", 0) == count:
            return None
        patch = {
            "metadata": {"uid": group["metadata"]["uid"]},
            "status": {**fields, "podCount": count},
        }
        try:
            # Only the new resourceVersion is read back: the answer is metadata alone.
            written = await self.client.patch(
                SDG_KIND, request.name, patch, subresource="status", metadata_only=True
            )
        except errors.NotFound:
            self._forget(request.name)
            return None
        self._echoes[request.name] = written["metadata"]["resourceVersion"]
        if self.batch_period > 0:
            self._written[request.name] = now
            self._written.move_to_end(request.name)
        self.events.record({**group, "metadata": written["metadata"]}, joined, left)
        return None


def setup(mgr: Manager, controller: StatusController, *, workers: int = STATUS_WORKERS) -> None:
    """Register the status controller: woken by its groups (not by its own writes coming
    back) and their pods' comings and goings (status-only pod churn changes nothing it
    writes); its events go out from a leader-only runnable, as the reconciles do."""
    ctrl = (
        mgr.controller("group-status")
        .for_(SDG_KIND, [Funcs(update=lambda _old, new: not controller.is_echo(new))])
        .watches(PODS, EnqueueRequestsFromMapFunc(group_of_pod), [pod_moved])
        .with_options(max_concurrent_reconciles=workers)
        .complete(controller)
    )
    mgr.add_runnable(controller.events.run)
    mgr.add_runnable(lambda: controller.release_held(ctrl.enqueue))

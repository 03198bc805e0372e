"""The status controller: ``status.allocatedPods`` / ``podCount`` equal the group's active pods.

It writes only those two fields, with a JSON merge patch guarded by the group's UID, so it
never races the group scheduler's conditional status writes over conditions or binding.
``allocatedPods`` lists at most ``MAX_ALLOCATED_PODS`` pods (``api.v1alpha1.pod_list_update``)
and ``podCount`` stays exact; PodsJoined/PodsLeft events name at most ``EVENT_PODS`` pods.
"""

from __future__ import annotations

from typing import Final

from api.constants import SDG_KIND
from api.pods import POD_GROUP_INDEX, is_active, pod_key
from api.v1alpha1 import pod_list_update
from controllers.groupstatus import listed
from controllers.watches import group_of_pod, pod_moved
from sdgruntime import errors
from sdgruntime.cache import Cache
from sdgruntime.client import Client
from sdgruntime.events import EventRecorder
from sdgruntime.handler import EnqueueRequestsFromMapFunc
from sdgruntime.kinds import PODS
from sdgruntime.manager import Manager
from sdgruntime.reconcile import Request, Result

#: Pods named in one PodsJoined/PodsLeft event; the rest are counted.
EVENT_PODS: Final = 10


class StatusController:
    """Reconciler for SharedDeviceGroups, triggered by their pods."""

    def __init__(self, client: Client, cache: Cache, recorder: EventRecorder) -> None:
        self.client = client
        self.cache = cache
        self.recorder = recorder

    async def reconcile(self, request: Request) -> Result | None:
        try:
            group = self.cache.get(SDG_KIND, request.name)
        except errors.NotFound:
            return None
        pods = self.cache.list(PODS, index=POD_GROUP_INDEX, value=request.name, copy=False)
        status = group.get("status") or {}
        before = list(status.get("allocatedPods") or [])
        before_count = status.get("podCount", 0)
        if not isinstance(before_count, int) or isinstance(before_count, bool):
            before_count = len(before)
        update = pod_list_update(before, before_count, (pod_key(p) for p in pods if is_active(p)))
        # A new group has neither field: that already says "no pods" (the scheduler's first
        # status write sets podCount 0), and writing it here would only make the
        # scheduler's conditional finalizer patch of the new group conflict.
        if before == update.listed and status.get("podCount", 0) == update.count:
            return None
        patch = {
            "metadata": {"uid": group["metadata"]["uid"]},
            "status": {"allocatedPods": update.listed, "podCount": update.count},
        }
        try:
            updated = await self.client.patch(SDG_KIND, request.name, patch, subresource="status")
        except errors.NotFound:
            return None
        if update.joined:
            self.recorder.emit(
                updated, "Normal", "PodsJoined", f"pods joined: {listed(update.joined, EVENT_PODS)}"
            )
        if update.left:
            self.recorder.emit(
                updated, "Normal", "PodsLeft", f"pods left: {listed(update.left, EVENT_PODS)}"
            )
        return None


def setup(mgr: Manager, controller: StatusController, *, workers: int = 2) -> None:
    """Register the status controller: woken by its groups and their pods' comings and
    goings (status-only pod churn changes nothing it writes)."""
    (
        mgr.controller("group-status")
        .for_(SDG_KIND)
        .watches(PODS, EnqueueRequestsFromMapFunc(group_of_pod), [pod_moved])
        .with_options(max_concurrent_reconciles=workers)
        .complete(controller)
    )

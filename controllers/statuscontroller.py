"""The status controller: ``status.allocatedPods`` / ``podCount`` equal the group's active pods.

It writes only those two fields, with a JSON merge patch guarded by the group's UID, so it
never races the group scheduler's conditional status writes over conditions or binding.
"""

from __future__ import annotations

from api.constants import SDG_KIND
from api.pods import POD_GROUP_INDEX, is_active, pod_key
from sdgruntime import errors
from sdgruntime.cache import Cache
from sdgruntime.client import Client
from sdgruntime.events import EventRecorder
from sdgruntime.kinds import PODS
from sdgruntime.reconcile import Request, Result


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
        active = sorted(pod_key(p) for p in pods if is_active(p))
        status = group.get("status") or {}
        before = list(status.get("allocatedPods") or [])
        # A new group has neither field: that already says "no pods" (the scheduler's first
        # status write sets podCount 0), and writing it here would only make the
        # scheduler's conditional finalizer patch of the new group conflict.
        if before == active and status.get("podCount", 0) == len(active):
            return None
        patch = {
            "metadata": {"uid": group["metadata"]["uid"]},
            "status": {"allocatedPods": active, "podCount": len(active)},
        }
        try:
            updated = await self.client.patch(SDG_KIND, request.name, patch, subresource="status")
        except errors.NotFound:
            return None
        joined = sorted(set(active) - set(before))
        left = sorted(set(before) - set(active))
        if joined:
            self.recorder.emit(
                updated, "Normal", "PodsJoined", f"pods joined: {', '.join(joined[:10])}"
            )
        if left:
            self.recorder.emit(updated, "Normal", "PodsLeft", f"pods left: {', '.join(left[:10])}")
        return None

"""Mutating webhook for SharedDeviceGroups: the protection finalizer, given at creation.

The group scheduler adds ``deviceshare.io/protection`` before it binds a group, and still
does for a group created while this webhook is down (its failurePolicy is Ignore). Given
at admission it costs no write of its own: one PATCH of the group, its watch event and a
reconcile less per group.
"""

from __future__ import annotations

from api.constants import FINALIZER, SDG_KIND
from sdgruntime.webhook import AdmissionRequest, AdmissionResponse, allowed, patch_ops


class GroupDefaulter:
    """``/mutate-deviceshare-io-v1alpha1-shareddevicegroup``: CREATE only."""

    async def mutate(self, request: AdmissionRequest) -> AdmissionResponse:
        if request.kind.get("kind") != SDG_KIND.kind or request.operation != "CREATE":
            return allowed()
        meta = (request.object or {}).get("metadata")
        if not isinstance(meta, dict):
            return allowed()  # nothing to add to; the API server judges the object
        finalizers = meta.get("finalizers")
        if finalizers is None:
            return patch_ops([{"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]}])
        if not isinstance(finalizers, list) or FINALIZER in finalizers:
            return allowed()  # malformed (the API server refuses it) or present already
        return patch_ops([{"op": "add", "path": "/metadata/finalizers/-", "value": FINALIZER}])

"""Every write the group scheduler and recovery make to a SharedDeviceGroup, in one place.

It remembers the resourceVersion of its own last write per group until the cache shows
it: a reconcile on an older cached copy would only earn a 409, so ``behind`` tells the
caller to wait for the watch event that brings the newer object.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from api.conditions import rfc3339
from api.constants import CONDITION_SCHEDULED, REASON_CLAIM_GIVEN_BACK, SDG_KIND
from controllers.ledger.records import resource_version
from controllers.ledger.release import live_group
from sdgruntime import errors
from sdgruntime.client import Client
from sdgruntime.controllerutil import add_finalizer, remove_finalizer
from sdgruntime.kinds import MutableObj, meta_of, status_of


class GroupWriter:
    """Conditional writes of groups' status and finalizers, remembering what it wrote."""

    def __init__(self, client: Client) -> None:
        self.client = client
        #: group -> resourceVersion of our last write, until the cache shows it.
        self._written: dict[str, int] = {}

    def behind(self, group: Mapping[str, Any]) -> bool:
        """Whether ``group`` (a cached copy) is older than our own last write to it."""
        name = group["metadata"]["name"]
        expected = self._written.get(name)
        if expected is None:
            return False
        if resource_version(group) < expected:
            return True
        del self._written[name]
        return False

    def forget(self, name: str) -> None:
        self._written.pop(name, None)

    async def live(self, name: str) -> MutableObj | None:
        """The group as the API server has it now (None: it does not exist)."""
        return await live_group(self.client, name)

    async def status(
        self, group: Mapping[str, Any], status: Mapping[str, Any]
    ) -> MutableObj | None:
        """Write ``status`` conditionally on ``group``'s resourceVersion; no write when it
        is unchanged. Raises Conflict (someone wrote first) and NotFound."""
        if dict(status) == status_of(group):
            return None
        written = await self.client.update_status(SDG_KIND, {**group, "status": dict(status)})
        self._written[group["metadata"]["name"]] = resource_version(written)
        return written

    async def add_finalizer(self, group: Mapping[str, Any], finalizer: str) -> MutableObj:
        """``group`` with ``finalizer`` (written only when it lacks it)."""
        edited = {**group, "metadata": dict(group["metadata"])}
        if not add_finalizer(edited, finalizer):
            return dict(group)
        return await self._finalizers(group, edited["metadata"]["finalizers"])

    async def remove_finalizer(self, group: Mapping[str, Any], finalizer: str) -> MutableObj | None:
        """``group`` without ``finalizer`` (written only when it has it)."""
        edited = {**group, "metadata": dict(group["metadata"])}
        if not remove_finalizer(edited, finalizer):
            return None
        return await self._finalizers(group, edited["metadata"]["finalizers"])

    async def _finalizers(self, group: Mapping[str, Any], finalizers: list[str]) -> MutableObj:
        """Set the finalizer list with a merge patch conditional on the version we read."""
        meta = group["metadata"]
        patch = {"metadata": {"finalizers": finalizers, "resourceVersion": meta["resourceVersion"]}}
        written = await self.client.patch(SDG_KIND, meta["name"], patch)
        self._written[meta["name"]] = resource_version(written)
        return written

    async def fence(self, live: Mapping[str, Any], node: str) -> MutableObj | None:
        """Bump a Pending group's resourceVersion before its claim on ``node`` is given back
        (``controllers.ledger.release`` calls it).

        The claim may be the first half of a bind still in flight in another manager (or
        another worker): its status write is conditional on the version it read, so after
        this write it fails instead of marking the group Bound on devices about to be
        freed. None when that write came first (409) or the group is gone: then nothing
        is released."""
        rv = meta_of(live).get("resourceVersion", "")
        status = dict(status_of(live))
        status["conditions"] = [
            c for c in status.get("conditions") or () if c.get("type") != CONDITION_SCHEDULED
        ] + [
            {
                "type": CONDITION_SCHEDULED,
                "status": "False",
                "reason": REASON_CLAIM_GIVEN_BACK,
                "message": f"the claim on node {node} (resourceVersion {rv}) was given back; "
                "placing the group again",
                "lastTransitionTime": rfc3339(),
            }
        ]
        try:
            written = await self.status(live, status)
        except (errors.Conflict, errors.NotFound):
            return None
        return written if written is not None else dict(live)

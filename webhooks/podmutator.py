"""Mutating webhook for pods of a SharedDeviceGroup: give them the group's devices.

Pod CREATE, and UPDATE of ``pods/ephemeralcontainers`` (``kubectl debug``) of a group's
pod. It only reads (cached objects without a copy; nothing here edits them): the group
from the shared cache (a live GET when the cache has not
seen it yet), waiting briefly for a group that was just created and is still being bound,
and the group's node the same way (its ``deviceshare.io/delivery`` label chooses how the
devices are given). The decisions themselves are pure (``webhooks.injection``,
``webhooks.delivery``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

import anyio

from api.constants import (
    CONDITION_SCHEDULED,
    DEFAULT_ENV_TABLE,
    PHASE_BOUND,
    REASON_WAITING_FOR_HOLDER,
    SCHEDULER_NAME,
    SDG_KIND,
)
from sdgruntime import errors
from sdgruntime.cache import Cache, CacheNotSynced
from sdgruntime.client import Client
from sdgruntime.kinds import NODES
from sdgruntime.webhook import AdmissionRequest, AdmissionResponse, allowed, denied, patch_ops
from webhooks.injection import (
    Delivery,
    Denial,
    build_ephemeral_injection,
    build_injection,
    check_annotation,
    group_annotation,
)

log = logging.getLogger(__name__)

#: How long a pod CREATE waits for a group that has not been scheduled yet.
BINDING_WAIT = 2.0
_POLL = 0.05


def _still_binding(group: Mapping[str, Any]) -> bool:
    """Neither Bound nor judged unschedulable yet: the scheduler has not decided, or has
    placed the group and waits for the kubelet to give its holder pod the devices."""
    status = group.get("status") or {}
    if status.get("phase") == PHASE_BOUND:
        return False
    return all(
        c.get("reason") == REASON_WAITING_FOR_HOLDER
        for c in status.get("conditions") or ()
        if c.get("type") == CONDITION_SCHEDULED
    )


class PodMutator:
    """``/mutate-v1-pod``: the group's devices into every container as the node's runtime
    takes them (device env into ephemeral ones too), our schedulerName, the shared-node
    toleration. ``delivery`` is the manager's delivery settings (``Settings.delivery_settings``)."""

    def __init__(
        self,
        cache: Cache,
        client: Client,
        env_table: Mapping[str, str] = DEFAULT_ENV_TABLE,
        binding_wait: float = BINDING_WAIT,
        scheduler_name: str = SCHEDULER_NAME,
        delivery: Delivery | None = None,
    ) -> None:
        self.scheduler_name = scheduler_name
        self.cache = cache
        self.client = client
        self.env_table = env_table
        self.binding_wait = binding_wait
        self.delivery = delivery if delivery is not None else Delivery()

    async def mutate(self, request: AdmissionRequest) -> AdmissionResponse:
        pod = request.object or {}
        if request.kind.get("kind") != "Pod":
            return allowed()
        if request.operation == "UPDATE" and request.sub_resource == "ephemeralcontainers":
            return await self._ephemeral(pod, request.old_object or {})
        if request.operation != "CREATE" or request.sub_resource:
            return allowed()
        bad = check_annotation(pod, self.scheduler_name)
        if bad is not None:
            return denied(bad.message)
        name = group_annotation(pod)
        group = await self._group(name) if name else None
        node = await self._node(group) if group is not None else None
        result = build_injection(
            pod, group, self.env_table, self.scheduler_name, delivery=self.delivery, node=node
        )
        if isinstance(result, Denial):
            return denied(result.message)
        return patch_ops(result.operations, warnings=result.warnings)

    async def _ephemeral(
        self, pod: Mapping[str, Any], old_pod: Mapping[str, Any]
    ) -> AdmissionResponse:
        name = group_annotation(pod)
        if not name:
            return allowed()  # not a group's pod: its debug containers are not ours
        # A member's group is Bound already: no waiting for the scheduler here.
        group = await self._lookup(name)
        result = build_ephemeral_injection(pod, old_pod, group, self.env_table)
        if isinstance(result, Denial):
            return denied(result.message)
        return patch_ops(result.operations, warnings=result.warnings)

    async def _group(self, name: str) -> dict[str, Any] | None:
        group = await self._lookup(name)
        deadline = time.monotonic() + self.binding_wait
        while group is not None and _still_binding(group) and time.monotonic() < deadline:
            await anyio.sleep(_POLL)
            try:
                group = self.cache.get(SDG_KIND, name, copy=False)
            except (errors.NotFound, CacheNotSynced):
                continue  # seen live, not cached yet: keep what the live read said
        return group

    async def _node(self, group: Mapping[str, Any]) -> dict[str, Any] | None:
        """The bound group's node (None when not bound or gone): its label may override
        the delivery mode. The cache first, like groups; the API server when it cannot say."""
        name = (group.get("status") or {}).get("nodeName")
        if not name or (group.get("status") or {}).get("phase") != PHASE_BOUND:
            return None
        try:
            return self.cache.get(NODES, name, copy=False)
        except (errors.NotFound, CacheNotSynced):
            pass  # a node added a moment ago, or the cache has not synced: ask
        try:
            return await self.client.get(NODES, name)
        except errors.NotFound:
            return None

    async def _lookup(self, name: str) -> dict[str, Any] | None:
        try:
            return self.cache.get(SDG_KIND, name, copy=False)
        except (errors.NotFound, CacheNotSynced):
            pass  # not cached (yet), or the cache has not synced: ask the API server
        try:
            return await self.client.get(SDG_KIND, name)
        except errors.NotFound:
            return None

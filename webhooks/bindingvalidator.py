"""Validating webhook for Bindings: a pod of a SharedDeviceGroup is bound only to its
group's node.

A group pod's device env names device IDs of its group's node; bound to another node it
would use that node's devices of the same IDs, someone else's. SDG's and kube-scheduler's
own Bindings skip this handler (``matchConditions``). A Binding carries no annotations of
its pod, so the handler reads the pod and its group (cache first, then ``client``). A pod
outside any group is allowed; for a group pod it fails closed: a group that is missing,
not Bound or unreadable, or a pod that cannot be read, refuses the bind.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from api.constants import GROUP_ANNOTATION, SDG_KIND
from api.v1alpha1 import group_node, is_bound
from sdgruntime import errors
from sdgruntime.cache import Cache, CacheNotSynced
from sdgruntime.client import Client
from sdgruntime.kinds import PODS, Kind, meta_of
from sdgruntime.webhook import AdmissionRequest, AdmissionResponse, allowed, denied

log = logging.getLogger(__name__)


class BindingValidator:
    """``/validate-v1-binding``: Bindings of group pods name the group's node."""

    def __init__(self, cache: Cache, client: Client) -> None:
        self.cache = cache
        self.client = client

    async def validate(self, request: AdmissionRequest) -> AdmissionResponse:
        binding = request.object or {}
        if request.operation != "CREATE" or request.kind.get("kind") != "Binding":
            return allowed()
        meta = meta_of(binding)
        name = str(meta.get("name") or request.name or "")
        namespace = str(meta.get("namespace") or request.namespace or "")
        target = binding.get("target") or {}
        node = str(target.get("name") or "")
        ref = f"{namespace}/{name}"
        try:
            pod = await self._read(PODS, name, namespace)
        except errors.ApiError as err:
            return denied(
                f"cannot tell whether pod {ref} is in a SharedDeviceGroup (reading it failed: "
                f"{err.message}); a group's pod may be bound only to its group's node. Retry "
                "the Binding."
            )
        if pod is None:
            return allowed()  # the API server answers a Binding of a missing pod itself
        annotations = meta_of(pod).get("annotations") or {}
        group_name = annotations.get(GROUP_ANNOTATION)
        if group_name is None:
            return allowed()
        try:
            group = await self._read(SDG_KIND, str(group_name))
        except errors.ApiError as err:
            return denied(
                f"pod {ref} is in SharedDeviceGroup {group_name!r}, which could not be read "
                f"({err.message}); its pods may be bound only to the group's node. Retry the "
                "Binding."
            )
        if group is None:
            return denied(
                f"pod {ref} is in SharedDeviceGroup {group_name!r}, which does not exist, so "
                "no node has its devices; do not bind the pod (delete it, or create the group "
                "and the pod again)."
            )
        if not is_bound(group):
            return denied(
                f"pod {ref} is in SharedDeviceGroup {group_name!r}, which is not Bound to a node "
                "yet; deviceshare-scheduler binds its pods to the group's node once it is."
            )
        want = group_node(group)
        if node != want:
            return denied(
                f"pod {ref} is in SharedDeviceGroup {group_name!r}, whose devices are on node "
                f"{want}: it may be bound only there, not to {node or '(no node)'}, where its "
                f"device IDs name other devices. Bind it to {want}, or leave the pod to "
                "deviceshare-scheduler."
            )
        return allowed()

    async def _read(
        self, kind: Kind, name: str, namespace: str | None = None
    ) -> Mapping[str, Any] | None:
        """The object from the cache, else the API server; None when it does not exist."""
        try:
            return self.cache.get(kind, name, namespace, copy=False)
        except (errors.NotFound, CacheNotSynced):
            pass  # not cached (yet), or the cache has not synced: ask the API server
        try:
            obj: dict[str, Any] = await self.client.get(kind, name, namespace)
        except errors.NotFound:
            return None
        return obj

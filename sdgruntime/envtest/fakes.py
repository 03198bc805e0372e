"""Stand-ins for what has no process here: nodes (no kubelet registers them) and a kubelet
that moves bound pods to Running and finishes the deletion of bound pods."""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import anyio

from sdgruntime import errors
from sdgruntime.kinds import NODES, PODS

if TYPE_CHECKING:
    from sdgruntime.client import Client

log = logging.getLogger(__name__)

DEFAULT_ALLOCATABLE = {"cpu": "8", "memory": "32Gi", "pods": "110", "ephemeral-storage": "100Gi"}


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def make_node(
    name: str,
    *,
    labels: Mapping[str, str] | None = None,
    allocatable: Mapping[str, str | int] | None = None,
    taints: Sequence[Mapping[str, str]] = (),
    ready: bool = True,
    unschedulable: bool = False,
) -> dict[str, Any]:
    """A Node object as a kubelet would register it; ``allocatable`` adds to the defaults."""
    alloc = {**DEFAULT_ALLOCATABLE, **{k: str(v) for k, v in (allocatable or {}).items()}}
    spec: dict[str, Any] = {}
    if taints:
        spec["taints"] = [dict(t) for t in taints]
    if unschedulable:
        spec["unschedulable"] = True
    now = _now()
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
        "spec": spec,
        "status": {
            "capacity": dict(alloc),
            "allocatable": dict(alloc),
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True" if ready else "False",
                    "reason": "KubeletReady" if ready else "KubeletNotReady",
                    "message": "fake node" if ready else "fake node not ready",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
            ],
            "nodeInfo": {
                "kubeletVersion": "fake",
                "architecture": "amd64",
                "operatingSystem": "linux",
            },
        },
    }


async def create_node(client: Client, node: dict[str, Any]) -> dict[str, Any]:
    """Create a node and set its status (status on create is not guaranteed to be kept).

    The status is merge-patched, not updated: controllers (the controller-manager's TTL
    controller, where it runs) may change the new Node at once.
    """
    created = await client.create(NODES, node)
    name = created["metadata"]["name"]
    return await client.patch(NODES, name, {"status": node["status"]}, subresource="status")


class Kubelet:
    """A fake kubelet for every node (or only ``nodes``): bound Pending pods become Running;
    bound pods that are being deleted are removed at once (a real kubelet would confirm
    the stop)."""

    def __init__(
        self, client: Client, namespace: str | None = None, nodes: Collection[str] | None = None
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.nodes = None if nodes is None else frozenset(nodes)

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        started = False
        while True:
            try:
                items, rv = await self.client.list_all(PODS, self.namespace)
                for pod in items:
                    await self._handle(pod)
                if not started:
                    task_status.started()
                    started = True
                async with contextlib.aclosing(
                    self.client.watch(PODS, self.namespace, resource_version=rv, timeout_seconds=60)
                ) as events:
                    async for event in events:
                        if event["type"] in ("ADDED", "MODIFIED"):
                            await self._handle(event["object"])
            except errors.ApiError as e:
                log.debug("fake kubelet: %s; relisting", e)
                await anyio.sleep(0.2)

    async def _handle(self, pod: dict[str, Any]) -> None:
        meta, spec = pod["metadata"], pod.get("spec", {})
        if not spec.get("nodeName") or (
            self.nodes is not None and spec["nodeName"] not in self.nodes
        ):
            return
        ns, name = meta["namespace"], meta["name"]
        try:
            if meta.get("deletionTimestamp"):
                await self.client.delete(
                    PODS, name, ns, grace_period_seconds=0, uid=meta.get("uid")
                )
            elif pod.get("status", {}).get("phase", "Pending") == "Pending":
                await self.client.patch(PODS, name, running_status(pod), ns, subresource="status")
        except (errors.NotFound, errors.Conflict):
            pass


def running_status(pod: dict[str, Any]) -> dict[str, Any]:
    """A merge patch body that makes a pod Running and Ready."""
    now = _now()
    containers = pod.get("spec", {}).get("containers", [])
    return {
        "status": {
            "phase": "Running",
            "hostIP": "127.0.0.1",
            "podIP": "10.244.0.10",
            "startTime": now,
            "conditions": [
                {"type": t, "status": "True", "lastTransitionTime": now}
                for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
            ],
            "containerStatuses": [
                {
                    "name": c["name"],
                    "image": c.get("image", ""),
                    "imageID": "",
                    "ready": True,
                    "restartCount": 0,
                    "started": True,
                    "state": {"running": {"startedAt": now}},
                }
                for c in containers
            ],
        }
    }

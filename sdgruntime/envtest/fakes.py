"""Stand-ins for what has no process here: nodes (no kubelet registers them) and a kubelet
that moves bound pods to Running and finishes the deletion of bound pods."""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
from collections.abc import Callable, Collection, Mapping, Sequence
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


#: Names the devices of ``resource`` on ``node`` (a Node object) as its device plugin would
#: (None: the resource is not a device plugin's).
DeviceNames = Callable[[Mapping[str, Any], str], Sequence[str] | None]


def indexed_devices(node: Mapping[str, Any], resource: str) -> Sequence[str] | None:
    """Devices named ``0..N-1`` for every extended resource (``vendor/name``) of a node's
    allocatable, as a device plugin with index IDs does."""
    if "/" not in resource or resource.startswith(("hugepages-", "kubernetes.io/")):
        return None
    count = ((node.get("status") or {}).get("allocatable") or {}).get(resource)
    try:
        n = int(str(count))
    except ValueError:
        return None
    return [str(i) for i in range(min(n, 1024))]


class Kubelet:
    """A fake kubelet for every node (or only ``nodes``): bound Pending pods become Running;
    bound pods that are being deleted are removed at once (a real kubelet would confirm
    the stop).

    With ``devices``, it also plays the kubelet's device manager: a pod asking for device
    resources (limits) is given free devices of its node, named by ``devices``, reported
    as the kubelet reports them (``status.containerStatuses[].allocatedResourcesStatus``),
    or refused at admission (phase Failed, ``UnexpectedAdmissionError``) when too few are
    free. Devices are free again when the pod ends or is gone."""

    def __init__(
        self,
        client: Client,
        namespace: str | None = None,
        nodes: Collection[str] | None = None,
        devices: DeviceNames | None = None,
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.nodes = None if nodes is None else frozenset(nodes)
        self.devices = devices
        #: (node, resource) -> device -> UID of the pod given it.
        self._given: dict[tuple[str, str], dict[str, str]] = {}

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        started = False
        while True:
            try:
                items, rv = await self.client.list_all(PODS, self.namespace)
                self._given = {}
                for pod in items:
                    self._remember(pod)
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
                        elif event["type"] == "DELETED":
                            self._free(event["object"])
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
                body = running_status(pod)
                if self.devices is not None:
                    body = await self._admit(pod, body)
                await self.client.patch(PODS, name, body, ns, subresource="status")
            elif pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
                self._free(pod)
        except (errors.NotFound, errors.Conflict):
            pass

    # --- the device manager (with ``devices``) ----------------------------------------
    def _remember(self, pod: Mapping[str, Any]) -> None:
        """What a relisted running pod was given, from its own status."""
        node = (pod.get("spec") or {}).get("nodeName")
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        if not node or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            return
        for cs in (pod.get("status") or {}).get("containerStatuses") or ():
            for rs in cs.get("allocatedResourcesStatus") or ():
                given = self._given.setdefault((node, rs["name"]), {})
                for r in rs.get("resources") or ():
                    given[r["resourceID"]] = uid

    def _free(self, pod: Mapping[str, Any]) -> None:
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        for given in self._given.values():
            for device in [d for d, owner in given.items() if owner == uid]:
                del given[device]

    async def _admit(self, pod: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
        """Give each container the devices it asks for, or refuse the pod."""
        assert self.devices is not None
        spec, uid = pod.get("spec") or {}, str(pod["metadata"].get("uid") or "")
        node_name = spec["nodeName"]
        wants: list[tuple[str, str, int]] = []  # (container, resource, count)
        for c in spec.get("containers") or ():
            for res, n in ((c.get("resources") or {}).get("limits") or {}).items():
                if "/" in res and str(n).isdigit() and int(n) > 0:
                    wants.append((c["name"], res, int(n)))
        if not wants:
            return body
        node = await self.client.get(NODES, node_name)
        picked: dict[str, dict[str, list[str]]] = {}
        taken: dict[str, set[str]] = {}
        for container, res, n in wants:
            names = self.devices(node, res)
            if names is None:
                continue
            given = self._given.get((node_name, res), {})
            free = [d for d in names if given.get(d, uid) == uid and d not in taken.get(res, ())]
            if len(free) < n:
                return {
                    "status": {
                        "phase": "Failed",
                        "reason": "UnexpectedAdmissionError",
                        "message": "Pod was rejected: Allocate failed due to requested number "
                        f"of devices unavailable for {res}. Requested: {n}, Available: "
                        f"{len(free)}, which is unexpected",
                    }
                }
            picked.setdefault(container, {})[res] = free[:n]
            taken.setdefault(res, set()).update(free[:n])
        for res_devices in picked.values():
            for res, ids in res_devices.items():
                self._given.setdefault((node_name, res), {}).update(dict.fromkeys(ids, uid))
        for cs in body["status"]["containerStatuses"]:
            mine = picked.get(cs["name"])
            if mine:
                cs["allocatedResourcesStatus"] = [
                    {
                        "name": res,
                        "resources": [{"resourceID": d, "health": "Healthy"} for d in ids],
                    }
                    for res, ids in sorted(mine.items())
                ]
        return body


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

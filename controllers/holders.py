"""Holder pods: how a group's devices on a device-plugin node enter the kubelet's books.

On a node whose resource comes from a device plugin, kube-scheduler and the kubelet count
devices by pod requests. A group's pods request none (they are given the group's devices
by env, RuntimeClass or CDI), so SDG creates one *holder pod* per group on the group's
node, asking for exactly the group's devices: kube-scheduler and the kubelet then count
them, and no plain pod is ever given them. The devices the group holds are the ones the
kubelet gave its holder, read back from the holder's ``status.containerStatuses[].
allocatedResourcesStatus`` (written by the kubelet's device manager; feature
ResourceHealthStatus, on by default since Kubernetes 1.36).
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from api.constants import GROUP, GROUP_ANNOTATION, KIND, MAX_DEVICES_PER_RESOURCE, VERSION
from api.pods import is_active
from controllers.inventory import SOURCE_SLICE, Offer, annotation_key
from sdgruntime import errors
from sdgruntime.cache import Cache
from sdgruntime.client import Client
from sdgruntime.kinds import PODS, Obj, meta_of, spec_of, status_of
from sdgruntime.predicate import Funcs

#: Label on every holder pod SDG creates (value ``holder``), in the manager's namespace.
ROLE_LABEL: Final = "deviceshare.io/role"
ROLE_HOLDER: Final = "holder"
#: Annotation naming the group a holder pod holds devices for.
HOLDER_FOR_ANNOTATION: Final = "deviceshare.io/holder-for"


def is_holder(pod: Obj, namespace: str | None) -> bool:
    """Whether ``pod`` is one of SDG's holder pods: labelled so *in the manager's
    namespace* (only SDG writes there; the same label elsewhere proves nothing)."""
    if not namespace:
        return False
    meta = meta_of(pod)
    return (
        meta.get("namespace") == namespace
        and (meta.get("labels") or {}).get(ROLE_LABEL) == ROLE_HOLDER
    )


_MAX_NAME = 253
_PREFIX = "sdg-holder."


def holder_name(group: str) -> str:
    """The holder pod's name for group ``group`` (a DNS subdomain, as group names are)."""
    name = _PREFIX + group
    if len(name) <= _MAX_NAME:
        return name
    digest = hashlib.sha256(group.encode()).hexdigest()[:12]
    return f"{name[: _MAX_NAME - 13].rstrip('.-')}-{digest}"


def plugin_requests(resources: Mapping[str, Any], offers: Mapping[str, Offer]) -> dict[str, int]:
    """Of a group's ``resources``, those the node's device plugin provides (counted in
    the node's allocatable, not published as ResourceSlices): what its holder asks for."""
    out: dict[str, int] = {}
    for res, n in resources.items():
        offer = offers.get(res)
        if offer is not None and offer.source != SOURCE_SLICE and int(n) > 0:
            out[res] = int(n)
    return out


def holder_pod(
    group: Obj,
    node: str,
    requests: Mapping[str, int],
    *,
    namespace: str,
    image: str,
    priority_class: str = "",
) -> dict[str, Any]:
    """The holder pod of ``group`` on ``node``: asks the kubelet for ``requests`` and does
    nothing else (the pause image). Bound to the node directly (kube-scheduler counts it
    all the same), tolerating every taint, owned by the group (deletion cascades), no
    service account token, the smallest footprint the kubelet accepts."""
    meta = meta_of(group)
    name = str(meta.get("name") or "")
    limits = {res: str(n) for res, n in sorted(requests.items())}
    spec: dict[str, Any] = {
        "nodeName": node,
        "restartPolicy": "Always",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 0,
        "tolerations": [{"operator": "Exists"}],
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 65535,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [
            {
                "name": "holder",
                "image": image,
                "imagePullPolicy": "IfNotPresent",
                "resources": {
                    "limits": {**limits, "cpu": "1m", "memory": "8Mi"},
                    "requests": {**limits, "cpu": "1m", "memory": "8Mi"},
                },
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "readOnlyRootFilesystem": True,
                    "capabilities": {"drop": ["ALL"]},
                },
            }
        ],
    }
    if priority_class:
        spec["priorityClassName"] = priority_class
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": holder_name(name),
            "namespace": namespace,
            "labels": {ROLE_LABEL: ROLE_HOLDER},
            "annotations": {HOLDER_FOR_ANNOTATION: name},
            "ownerReferences": [
                {
                    "apiVersion": f"{GROUP}/{VERSION}",
                    "kind": KIND,
                    "name": name,
                    "uid": str(meta.get("uid") or ""),
                    "controller": True,
                }
            ],
        },
        "spec": spec,
    }


def holder_for(pod: Obj) -> str | None:
    """The group a holder pod holds devices for (its annotation), if any."""
    value = (meta_of(pod).get("annotations") or {}).get(HOLDER_FOR_ANNOTATION)
    return value if isinstance(value, str) and value else None


def owner_uid(pod: Obj) -> str:
    """The UID of the group that owns a holder pod ("" if none does)."""
    for ref in meta_of(pod).get("ownerReferences") or ():
        if ref.get("kind") == KIND and str(ref.get("apiVersion", "")).startswith(GROUP + "/"):
            return str(ref.get("uid") or "")
    return ""


def requested(pod: Obj) -> dict[str, int]:
    """The device counts a holder pod asks for (its container's limits)."""
    out: dict[str, int] = {}
    for container in spec_of(pod).get("containers") or ():
        for res, n in ((container.get("resources") or {}).get("limits") or {}).items():
            if res not in ("cpu", "memory"):
                try:
                    out[res] = out.get(res, 0) + int(n)
                except (TypeError, ValueError):
                    continue
    return out


@dataclass(frozen=True, slots=True)
class Given:
    """The kubelet gave the holder these devices (SDG's IDs per resource)."""

    devices: dict[str, list[int]]
    #: The device plugin's own names of them (UUIDs or indices), per resource.
    plugin_ids: dict[str, list[str]]


@dataclass(frozen=True, slots=True)
class Waiting:
    """The kubelet has not reported the holder's devices yet."""

    why: str


@dataclass(frozen=True, slots=True)
class Refused:
    """The holder cannot hold the group's devices (refused at admission, failed, or given
    devices SDG cannot name): it must be replaced or the group told."""

    why: str


HolderState = Given | Waiting | Refused


def read_holder(pod: Obj, offers: Mapping[str, Offer]) -> HolderState:
    """What the kubelet says about a holder pod: the devices it gave it, read from
    ``status.containerStatuses[].allocatedResourcesStatus`` and named by SDG's IDs
    through the node's offers (UUID, else the plugin's index)."""
    key = (
        f"{(pod.get('metadata') or {}).get('namespace')}/{(pod.get('metadata') or {}).get('name')}"
    )
    status = status_of(pod)
    phase = status.get("phase")
    if phase in ("Failed", "Succeeded"):
        why = status.get("message") or status.get("reason") or f"phase {phase}"
        return Refused(f"the kubelet stopped holder pod {key}: {why}")
    want = requested(pod)
    got: dict[str, list[str]] = {}
    for cs in status.get("containerStatuses") or ():
        for rs in cs.get("allocatedResourcesStatus") or ():
            res = rs.get("name")
            if res in want:
                for r in (rs.get("resources") or ())[:MAX_DEVICES_PER_RESOURCE]:
                    rid = r.get("resourceID")
                    if isinstance(rid, str) and rid:
                        got.setdefault(res, []).append(rid)
    if not got:
        if phase != "Running":
            return Waiting(f"waiting for the kubelet to admit holder pod {key}")
        return Waiting(
            f"the kubelet has not reported which devices it gave holder pod {key} "
            "(status.containerStatuses[].allocatedResourcesStatus; it needs Kubernetes 1.36 "
            "or feature gate ResourceHealthStatus on the kubelet)"
        )
    devices: dict[str, list[int]] = {}
    for res, n in sorted(want.items()):
        ids = got.get(res, [])
        if len(set(ids)) != n:
            return Waiting(f"holder pod {key} reports {len(set(ids))} of its {n} {res}")
        offer = offers.get(res)
        mapped = [sdg_id(offer, rid) for rid in ids]
        unknown = [rid for rid, m in zip(ids, mapped, strict=True) if m is None]
        if unknown:
            return Refused(
                f"the kubelet gave holder pod {key} {res} {', '.join(sorted(unknown))}, which "
                "SDG cannot match to the node's devices: list them in the node annotation "
                f"{annotation_key(res)} (UUIDs in nvidia-smi order), or run the device "
                "plugin with index IDs"
            )
        devices[res] = sorted(m for m in mapped if m is not None)
    return Given(devices, {r: sorted(got.get(r, [])) for r in devices})


def sdg_id(offer: Offer | None, plugin_id: str) -> int | None:
    """SDG's ID of the device the plugin calls ``plugin_id``: by UUID, else by index."""
    if offer is None:
        return None
    for d in offer.devices:
        if d.uuid and d.uuid == plugin_id:
            return d.id
    if plugin_id.isascii() and plugin_id.isdigit() and offer.device(int(plugin_id)):
        return int(plugin_id)
    return None


class Holders:
    """Creates, finds and deletes the holder pods of groups (one per group, in the
    manager's namespace, named by ``holder_name``)."""

    def __init__(
        self,
        client: Client,
        cache: Cache,
        namespace: str,
        *,
        enabled: bool = True,
        image: str = "registry.k8s.io/pause:3.10.2",
        priority_class: str = "",
    ) -> None:
        self.client = client
        self.cache = cache
        self.namespace = namespace
        self.enabled = enabled
        self.image = image
        self.priority_class = priority_class

    def needed(
        self, resources: Mapping[str, Any], offers: Mapping[str, Offer] | None
    ) -> dict[str, int]:
        """What a group of ``resources`` on a node with ``offers`` must hold through a
        holder pod ({}: nothing, holders are off or no resource is a device plugin's)."""
        return plugin_requests(resources, offers or {}) if self.enabled else {}

    def of(self, group: str) -> Obj | None:
        """Group ``group``'s holder pod as cached (not copied), if it exists."""
        try:
            pod = self.cache.get(PODS, holder_name(group), self.namespace, copy=False)
        except errors.NotFound:
            return None
        return pod if is_holder(pod, self.namespace) and holder_for(pod) == group else None

    async def create(self, group: Obj, node: str, requests: Mapping[str, int]) -> None:
        pod = holder_pod(
            group,
            node,
            requests,
            namespace=self.namespace,
            image=self.image,
            priority_class=self.priority_class,
        )
        # AlreadyExists: ours from an earlier reconcile; its event brings it to the cache.
        with contextlib.suppress(errors.AlreadyExists):
            await self.client.create(PODS, pod, self.namespace)

    async def delete(self, pod: Obj) -> None:
        """Delete a holder pod (that very one: conditional on its UID)."""
        meta = meta_of(pod)
        if meta.get("deletionTimestamp"):
            return
        # NotFound, Conflict: gone already, or replaced: that one's own events follow.
        with contextlib.suppress(errors.NotFound, errors.Conflict):
            await self.client.delete(
                PODS, str(meta.get("name")), self.namespace, uid=meta.get("uid")
            )


def holder_changed(namespace: str) -> Funcs:
    """Holder pods: created, deleted, or given (or refused) their devices."""

    def facts(pod: Obj) -> tuple[Any, ...]:
        if not is_holder(pod, namespace):
            return ()
        status = status_of(pod)
        meta = meta_of(pod)
        return (
            bool(meta.get("deletionTimestamp")),
            status.get("phase"),
            repr(status.get("containerStatuses")),
        )

    return Funcs(
        create=lambda p: bool(facts(p)),
        update=lambda o, n: facts(o) != facts(n),
        delete=lambda p: bool(facts(p)),
    )


@dataclass(frozen=True, slots=True)
class KubeletHold:
    """What a pod outside any group holds in the kubelet's books: device-plugin resources
    it asks for, and the plugin IDs the kubelet reported giving it (maybe not yet)."""

    wants: dict[str, int]
    given: dict[str, tuple[str, ...]]


def kubelet_hold(pod: Obj, holders_namespace: str | None) -> tuple[str, KubeletHold] | None:
    """(node, hold) of an active pod outside any group (and not a holder) that asks a
    device plugin for devices; None for every other pod."""
    meta, spec = meta_of(pod), spec_of(pod)
    node = spec.get("nodeName")
    if (
        not isinstance(node, str)
        or not node
        or GROUP_ANNOTATION in (meta.get("annotations") or {})
        or is_holder(pod, holders_namespace)
        or not is_active(pod)
    ):
        return None
    wants = _device_limits(spec)
    if not wants:
        return None
    given: dict[str, list[str]] = {}
    for cs in status_of(pod).get("containerStatuses") or ():
        if not isinstance(cs, Mapping):
            continue
        for rs in cs.get("allocatedResourcesStatus") or ():
            res = rs.get("name") if isinstance(rs, Mapping) else None
            if res in wants:
                for r in (rs.get("resources") or ())[:MAX_DEVICES_PER_RESOURCE]:
                    if isinstance(r, Mapping) and isinstance(r.get("resourceID"), str):
                        given.setdefault(res, []).append(r["resourceID"])
    return node, KubeletHold(wants, {r: tuple(sorted(set(i))) for r, i in given.items()})


def _device_limits(spec: Obj) -> dict[str, int]:
    """Extended resources (``vendor/name``) a pod's containers ask for, as the kubelet
    counts them: the app containers' sum, or the largest init container's if more."""

    def limits(container: Any) -> dict[str, int]:
        out: dict[str, int] = {}
        if not isinstance(container, Mapping):
            return out
        res = container.get("resources") or {}
        for section in ("requests", "limits"):
            for name, n in (res.get(section) or {}).items():
                if "/" in str(name) and not str(name).startswith(("hugepages-", "kubernetes.io/")):
                    try:
                        out[name] = max(
                            out.get(name, 0), min(int(str(n)), MAX_DEVICES_PER_RESOURCE)
                        )
                    except ValueError:
                        continue
        return out

    total: dict[str, int] = {}
    for c in spec.get("containers") or ():
        for name, n in limits(c).items():
            total[name] = total.get(name, 0) + n
    for c in spec.get("initContainers") or ():
        for name, n in limits(c).items():
            total[name] = max(total.get(name, 0), n)
    return {r: n for r, n in total.items() if n > 0}

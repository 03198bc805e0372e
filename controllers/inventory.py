"""What devices a node really has: per resource, each device SDG may hand out, with a
stable ID and, where known, its UUID and health.

From the best source the cluster has, per node and resource:

1. **DRA ResourceSlices** (``resource.k8s.io/v1``) published for the node by a driver
   SDG knows (``gpu.nvidia.com`` -> ``nvidia.com/gpu``, ...): each device's ``index``
   attribute is its ID (what ``nvidia-smi`` numbers it) where published, else IDs follow
   the PCI bus order (NVML's, ``resource.kubernetes.io/pciBusID``), ``uuid`` its UUID; a device
   with a NoSchedule/NoExecute taint is unhealthy; a device that left the slice is gone.
2. **A node annotation** ``deviceshare.io/devices.<resource with / as _>`` written by an
   operator's DaemonSet or by hand, e.g. ``deviceshare.io/devices.nvidia.com_gpu:
   "GPU-aaa,GPU-bbb"`` (IDs are the positions) or ``"0=GPU-aaa,3=GPU-ddd:unhealthy"``.
3. **The count** in ``status.allocatable``: IDs ``0..N-1``, guessed (allocatable counts
   only healthy devices, so which one failed cannot be known).

Pure: plain decoded JSON in, ``Offer`` per resource out. Every loop is bounded by
``MAX_DEVICES_PER_RESOURCE`` (and a slice's own 128-device limit), whatever a node or a
driver publishes; anything beyond is reported, never iterated.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final

from api.constants import MAX_DEVICES_PER_RESOURCE
from controllers.placement import node_device_capacity
from sdgruntime.kinds import Kind

#: DRA's published devices (resource.k8s.io/v1, GA in Kubernetes 1.34).
RESOURCESLICES: Final = Kind(
    "resource.k8s.io", "v1", "ResourceSlice", "resourceslices", namespaced=False
)

Obj = Mapping[str, Any]

SOURCE_SLICE: Final = "ResourceSlice"
SOURCE_ANNOTATION: Final = "annotation"
SOURCE_COUNT: Final = "count"

#: DRA driver -> the device resource its devices count as (``--dra-driver`` extends it).
DEFAULT_DRA_DRIVERS: Final = MappingProxyType(
    {"gpu.nvidia.com": "nvidia.com/gpu", "gpu.amd.com": "amd.com/gpu"}
)
ANNOTATION_PREFIX: Final = "deviceshare.io/devices."
UNHEALTHY_SUFFIX: Final = ":unhealthy"
#: The standard DRA attribute of a PCI device's address (k8s.io/dynamic-resource-allocation
#: deviceattribute, v0.37.2); NVIDIA's DRA driver publishes it on each GPU.
PCI_BUS_ID_ATTRIBUTE: Final = "resource.kubernetes.io/pciBusID"
_UNHEALTHY_TAINT_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
#: Device ``type`` attributes that are whole devices (NVIDIA's driver also publishes MIG
#: partitions, which SDG does not hand out).
_WHOLE_DEVICE_TYPES = frozenset({"gpu", "GPU", "device"})


def annotation_key(resource: str) -> str:
    """The node annotation that lists ``resource``'s devices."""
    return ANNOTATION_PREFIX + resource.replace("/", "_")


@dataclass(frozen=True, slots=True)
class Device:
    id: int
    uuid: str = ""
    healthy: bool = True
    name: str = ""  # the DRA device name, when from a ResourceSlice
    driver: str = ""  # and the driver and pool that publish it (DRA's books name all three)
    pool: str = ""


@dataclass(frozen=True, slots=True)
class Offer:
    """The devices of one resource a node offers, from one source."""

    resource: str
    source: str
    devices: tuple[Device, ...] = ()
    #: Why the source offers less than it lists (malformed, over the cap), if it does.
    problem: str = ""
    _by_id: Mapping[int, Device] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_id", {d.id: d for d in self.devices})

    @property
    def capacity(self) -> int:
        """One past the highest ID (IDs below it that are not usable are holes)."""
        return max((d.id for d in self.devices), default=-1) + 1

    def usable(self) -> list[int]:
        return [d.id for d in self.devices if d.healthy]

    def device(self, device_id: int) -> Device | None:
        return self._by_id.get(device_id)

    @property
    def guessed(self) -> bool:
        return self.source == SOURCE_COUNT

    def uuids(self, ids: Iterable[int]) -> list[str] | None:
        """The UUIDs of ``ids`` (None unless every one is known)."""
        out = []
        for i in ids:
            d = self._by_id.get(i)
            if d is None or not d.uuid:
                return None
            out.append(d.uuid)
        return out

    def missing(self, ids: Iterable[int]) -> list[str]:
        """Of ``ids`` (held by a group), those the node no longer offers, described."""
        out = []
        for i in ids:
            d = self._by_id.get(i)
            if d is None:
                out.append(f"{self.resource} {i} (gone)")
            elif not d.healthy:
                out.append(f"{self.resource} {i}{f' {d.uuid}' if d.uuid else ''} (unhealthy)")
        return out


def count_offer(resource: str, count: int) -> Offer:
    return Offer(resource, SOURCE_COUNT, tuple(Device(i) for i in range(count)))


def parse_annotation(resource: str, text: str) -> Offer:
    """``"GPU-a,GPU-b"`` or ``"0=GPU-a,3=GPU-d:unhealthy"``; malformed offers nothing."""
    key = annotation_key(resource)

    def bad(why: str) -> Offer:
        return Offer(resource, SOURCE_ANNOTATION, (), f"node annotation {key} {why}")

    if not isinstance(text, str):
        return bad("is not a string")
    entries = [e.strip() for e in text.split(",", MAX_DEVICES_PER_RESOURCE)]
    if len(entries) > MAX_DEVICES_PER_RESOURCE:
        return bad(f"lists more than {MAX_DEVICES_PER_RESOURCE} devices")
    devices: dict[int, Device] = {}
    uuids: set[str] = set()
    for pos, entry in enumerate(e for e in entries if e):
        healthy = not entry.endswith(UNHEALTHY_SUFFIX)
        entry = entry.removesuffix(UNHEALTHY_SUFFIX)
        index, sep, uuid = entry.partition("=")
        if sep:
            if not index.isascii() or not index.isdigit():
                return bad(f"has {entry!r}: the ID before '=' must be a number")
            device_id = int(index)
        else:
            device_id, uuid = pos, index
        if device_id >= MAX_DEVICES_PER_RESOURCE:
            return bad(f"has ID {device_id}, beyond the {MAX_DEVICES_PER_RESOURCE} SDG addresses")
        if not uuid or len(uuid) > 128 or any(c.isspace() or c in "=," for c in uuid):
            return bad(f"has {entry!r}: expected a device UUID")
        if device_id in devices or uuid in uuids:
            return bad(f"lists device {device_id} or {uuid} twice")
        devices[device_id] = Device(device_id, uuid, healthy)
        uuids.add(uuid)
    return Offer(resource, SOURCE_ANNOTATION, tuple(sorted(devices.values(), key=lambda d: d.id)))


def _attribute(device: Obj, driver: str, name: str) -> Any:
    attrs = device.get("attributes") or {}
    value = attrs.get(name) or attrs.get(f"{driver}/{name}") or {}
    if not isinstance(value, Mapping):
        return None
    for kind in ("int", "string", "version", "bool"):
        if kind in value:
            return value[kind]
    return None


def slice_offers(
    slices: Iterable[Obj], drivers: Mapping[str, str] = DEFAULT_DRA_DRIVERS
) -> dict[str, Offer]:
    """Offers from one node's ResourceSlices: per pool, its newest complete generation
    (all ``resourceSliceCount`` slices there), else its newest, so that a driver
    republishing a pool slice by slice never makes devices look gone."""
    # (driver, pool) -> generation -> its slices
    pools: dict[tuple[str, str], dict[int, list[Obj]]] = {}
    for s in slices:
        spec = s.get("spec") or {}
        driver = spec.get("driver")
        if driver not in drivers:
            continue
        pool = spec.get("pool") or {}
        gens = pools.setdefault((str(driver), str(pool.get("name") or "")), {})
        gens.setdefault(int(pool.get("generation") or 0), []).append(s)
    per_res: dict[str, list[tuple[str, str, Obj]]] = {}
    for (driver, pool_name), gens in pools.items():
        complete = [g for g, ss in gens.items() if len(ss) >= _slice_count(ss[0])]
        for s in gens[max(complete or gens)]:
            for device in ((s.get("spec") or {}).get("devices") or ())[:MAX_DEVICES_PER_RESOURCE]:
                kind = _attribute(device, driver, "type")
                if kind is None or kind in _WHOLE_DEVICE_TYPES:
                    per_res.setdefault(drivers[driver], []).append((driver, pool_name, device))
    return {res: _offer_from_devices(res, listed) for res, listed in per_res.items()}


def _slice_count(resource_slice: Obj) -> int:
    """How many slices its pool's generation has (``pool.resourceSliceCount``, at least 1)."""
    pool = (resource_slice.get("spec") or {}).get("pool") or {}
    count = pool.get("resourceSliceCount")
    return count if isinstance(count, int) and count > 0 else 1


def _enumeration_order(device: Obj) -> tuple[str, tuple[tuple[int, str], ...]]:
    """NVML numbers GPUs in PCI bus order, so devices that publish no ``index`` (NVIDIA's
    DRA driver since v25.8) are ordered by the standard ``resource.kubernetes.io/pciBusID``
    attribute; without one, by name with numbers compared as numbers (``gpu-2`` before
    ``gpu-10``). Devices with an ``index`` keep it whatever this order says."""
    attr = (device.get("attributes") or {}).get(PCI_BUS_ID_ATTRIBUTE) or {}
    bus = attr.get("string") if isinstance(attr, Mapping) else None
    name = str(device.get("name") or "")
    parts = tuple((int(p), "") if p.isdigit() else (-1, p) for p in re.split(r"(\d+)", name) if p)
    # Bus IDs are fixed-width hex ("0000:3b:00.0"): as strings they sort in bus order.
    return (bus.lower() if isinstance(bus, str) and bus else "\uffff", parts)


def _offer_from_devices(resource: str, listed: list[tuple[str, str, Obj]]) -> Offer:
    if len(listed) > MAX_DEVICES_PER_RESOURCE:
        return Offer(
            resource,
            SOURCE_SLICE,
            (),
            f"ResourceSlices list more than {MAX_DEVICES_PER_RESOURCE} {resource} devices",
        )
    devices: dict[int, Device] = {}
    unindexed: list[tuple[str, str, bool, str, str]] = []
    problems: list[str] = []
    for driver, pool, device in sorted(listed, key=lambda dv: _enumeration_order(dv[2])):
        name = str(device.get("name") or "")
        index = _attribute(device, driver, "index")
        uuid = _attribute(device, driver, "uuid")
        uuid = uuid if isinstance(uuid, str) else ""
        healthy = not any(
            (t or {}).get("effect") in _UNHEALTHY_TAINT_EFFECTS for t in device.get("taints") or ()
        )
        if isinstance(index, int) and not isinstance(index, bool):
            if not 0 <= index < MAX_DEVICES_PER_RESOURCE or index in devices:
                problems.append(f"device {name} has index {index}, out of range or taken twice")
                continue
            devices[index] = Device(index, uuid, healthy, name, driver, pool)
        else:
            unindexed.append((name, uuid, healthy, driver, pool))
    next_id = max(devices, default=-1) + 1
    for name, uuid, healthy, driver, pool in unindexed:  # no index: IDs in NVML's order
        devices[next_id] = Device(next_id, uuid, healthy, name, driver, pool)
        next_id += 1
    if unindexed:
        problems.append(
            f"{len(unindexed)} device(s) publish no index; IDs follow their PCI bus IDs "
            "(else their names, numbers compared as numbers)"
        )
    return Offer(
        resource,
        SOURCE_SLICE,
        tuple(sorted(devices.values(), key=lambda d: d.id)),
        "; ".join(problems),
    )


def node_offers(
    node: Obj,
    slices: Iterable[Obj] = (),
    drivers: Mapping[str, str] = DEFAULT_DRA_DRIVERS,
) -> dict[str, Offer]:
    """Every device resource ``node`` offers, each from its best source."""
    offers = {res: count_offer(res, n) for res, n in node_device_capacity(node).items() if n}
    annotations = (node.get("metadata") or {}).get("annotations") or {}
    for key, value in annotations.items():
        if key.startswith(ANNOTATION_PREFIX):
            res = key[len(ANNOTATION_PREFIX) :].replace("_", "/", 1)
            offers[res] = parse_annotation(res, value)
    offers.update(slice_offers(slices, drivers))
    return offers


def node_of_slice(resource_slice: Obj) -> str | None:
    """The node a ResourceSlice's devices are on (None for pools shared by many nodes,
    which SDG does not hand out: a group's devices are on one node)."""
    node = (resource_slice.get("spec") or {}).get("nodeName")
    return node if isinstance(node, str) and node else None


class Inventory:
    """Every node's offers, kept current from the node and ResourceSlice informers.

    ``on_change(node, offers)`` is called only when what a node offers changed (not for
    heartbeats), so the claim book re-mirrors a node only then.
    """

    def __init__(
        self,
        drivers: Mapping[str, str] = DEFAULT_DRA_DRIVERS,
        on_change: Callable[[str, dict[str, Offer]], None] | None = None,
    ) -> None:
        self.drivers = drivers
        self.on_change = on_change
        self._nodes: dict[str, Obj] = {}
        #: node -> ResourceSlice name -> slice
        self._slices: dict[str, dict[str, Obj]] = {}
        self._slice_node: dict[str, str] = {}
        self._offers: dict[str, dict[str, Offer]] = {}

    def of(self, node: str) -> dict[str, Offer]:
        return self._offers.get(node, {})

    def knows(self, node: str) -> bool:
        """Whether the node exists (as last seen)."""
        return node in self._nodes

    def observe_node(self, node: Obj) -> None:
        name = str(node["metadata"]["name"])
        self._nodes[name] = node
        self._recompute(name)

    def forget_node(self, node: Obj) -> None:
        name = str(node["metadata"]["name"])
        self._nodes.pop(name, None)
        self._recompute(name)

    def observe_slice(self, resource_slice: Obj) -> None:
        name = str(resource_slice["metadata"]["name"])
        old = self._slice_node.get(name)
        node = node_of_slice(resource_slice)
        if old is not None and old != node:
            self._drop_slice(name, old)
        if node is not None:
            self._slices.setdefault(node, {})[name] = resource_slice
            self._slice_node[name] = node
            self._recompute(node)

    def forget_slice(self, resource_slice: Obj) -> None:
        name = str(resource_slice["metadata"]["name"])
        node = self._slice_node.get(name)
        if node is not None:
            self._drop_slice(name, node)

    def _drop_slice(self, name: str, node: str) -> None:
        del self._slice_node[name]
        slices = self._slices.get(node, {})
        slices.pop(name, None)
        if not slices:
            self._slices.pop(node, None)
        self._recompute(node)

    def _recompute(self, node: str) -> None:
        obj = self._nodes.get(node)
        offers = (
            node_offers(obj, self._slices.get(node, {}).values(), self.drivers)
            if obj is not None
            else {}
        )
        if obj is not None and offers == self._offers.get(node):
            return
        if obj is not None:
            self._offers[node] = offers
        elif self._offers.pop(node, None) is None:
            return
        if self.on_change is not None:
            self.on_change(node, offers)

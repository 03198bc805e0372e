"""What devices a node really has: per resource, each device SDG may hand out, with a
stable ID and, where known, its UUID and health.

Sources, best first: DRA ResourceSlices of a driver SDG knows (:func:`slice_offers`), the
``deviceshare.io/devices.<resource>`` node annotation (:func:`parse_annotation`), else the
count in ``status.allocatable`` (:func:`count_offer`, IDs guessed); :func:`node_offers`
picks. The functions are pure (decoded JSON in, an :class:`Offer` per resource out);
:class:`Inventory` keeps every node's offers current from the informers. Invariant: every
loop is bounded by ``MAX_DEVICES_PER_RESOURCE``, whatever a node or driver publishes.
How IDs are chosen: docs/design.md, "Devices are real".
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final

from api.constants import MAX_DEVICES_PER_RESOURCE
from controllers.placement import node_device_capacity
from sdgruntime.kinds import Kind, Obj, meta_of, spec_of

#: DRA's published devices (resource.k8s.io/v1, GA in Kubernetes 1.34).
RESOURCESLICES: Final = Kind(
    "resource.k8s.io", "v1", "ResourceSlice", "resourceslices", namespaced=False
)


SOURCE_SLICE: Final = "ResourceSlice"
SOURCE_ANNOTATION: Final = "annotation"
SOURCE_COUNT: Final = "count"

#: DRA driver -> the device resource its devices count as (``--dra-driver`` extends it).
DEFAULT_DRA_DRIVERS: Final = MappingProxyType(
    {"gpu.nvidia.com": "nvidia.com/gpu", "gpu.amd.com": "amd.com/gpu"}
)
ANNOTATION_PREFIX: Final = "deviceshare.io/devices."
UNHEALTHY_SUFFIX: Final = ":unhealthy"
#: DeviceTaintRules (resource.k8s.io/v1 since Kubernetes 1.37, where DRADeviceTaintRules is
#: GA and on by default; v1beta2 in 1.36 and v1alpha3 in 1.33-1.35 are off by default).
DEVICETAINTRULES: Final = Kind(
    "resource.k8s.io", "v1", "DeviceTaintRule", "devicetaintrules", namespaced=False
)
#: The standard DRA attribute of a PCI device's address (k8s.io/dynamic-resource-allocation
#: deviceattribute, v0.37.2); NVIDIA's DRA driver publishes it on each GPU since v25.12.
PCI_BUS_ID_ATTRIBUTE: Final = "resource.kubernetes.io/pciBusID"
_UNHEALTHY_TAINT_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
#: Device ``type`` attributes that are whole devices: NVIDIA's ``gpu``, AMD's ``amdgpu``.
#: The drivers' other types are not handed out: NVIDIA's ``mig`` (a statically MIG-enabled
#: GPU is published only as its MIG devices) and ``vfio`` (the same GPU for passthrough),
#: AMD's ``amdgpu-partition``.
_WHOLE_DEVICE_TYPES = frozenset({"gpu", "GPU", "device", "amdgpu"})
#: Partition types the vendor's runtime numbers as devices of their own, so that a
#: partitioned GPU takes as many IDs as it has partitions: AMD's (ROCm/container-toolkit
#: internal/amdgpu GetAMDGPUs lists each partition, ``amd-ctk cdi generate`` names each
#: ``amd.com/gpu=<N>``). An NVIDIA GPU keeps one NVML index whatever its MIG devices.
_NUMBERED_PARTITION_TYPES = frozenset({"amdgpu-partition"})
#: Where a device's PCI address is published: the standard attribute (NVIDIA since v25.12),
#: NVIDIA's own ``pcieBusID`` (v25.3 to v25.8), AMD's ``pciAddr``. NVIDIA's MIG and VFIO
#: devices carry the address of the GPU they are part of in the same attributes.
_BUS_ATTRIBUTES = (PCI_BUS_ID_ATTRIBUTE, "pcieBusID", "pciAddr")
#: Where a partition names its parent's address: AMD's ``amdgpu-partition``.
_PARENT_BUS = ("parentPciAddr",)
#: Types of a GPU published for passthrough to a VM (NVIDIA's ``vfio``, beside the same GPU's
#: ``gpu`` device while NVIDIA's kernel driver has it, alone while vfio-pci has it).
_PASSTHROUGH_TYPES = frozenset({"vfio"})
#: NVIDIA's device names: ``gpu-<minor>`` for a GPU, ``gpu-<parent minor>-mig-...`` for
#: its MIG devices (deviceinfo.go CanonicalName, mig.go ToCanonicalName).
_NVIDIA_NAME = re.compile(r"gpu-(\d+)(?:-mig-.*)?")
#: Devices of other types (partitions) read per resource, beyond which they are ignored.
_MAX_PARTS = 8 * MAX_DEVICES_PER_RESOURCE


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
    slices: Iterable[Obj],
    drivers: Mapping[str, str] = DEFAULT_DRA_DRIVERS,
    taint_rules: Iterable[Obj] = (),
) -> dict[str, Offer]:
    """Offers from one node's ResourceSlices: per pool, its newest complete generation
    (all ``resourceSliceCount`` slices there), else its newest, so that a driver
    republishing a pool slice by slice never makes devices look gone. ``taint_rules``
    (DeviceTaintRules) taint the devices they select, as kube-scheduler sees them."""
    # (driver, pool) -> generation -> its slices
    pools: dict[tuple[str, str], dict[int, list[Obj]]] = {}
    for s in apply_taint_rules(slices, taint_rules):
        spec = spec_of(s)
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
            for device in (spec_of(s).get("devices") or ())[:MAX_DEVICES_PER_RESOURCE]:
                if isinstance(device, Mapping):
                    per_res.setdefault(drivers[driver], []).append((driver, pool_name, device))
    return {res: _offer_from_devices(res, listed) for res, listed in per_res.items()}


def _slice_count(resource_slice: Obj) -> int:
    """How many slices its pool's generation has (``pool.resourceSliceCount``, at least 1)."""
    pool = spec_of(resource_slice).get("pool") or {}
    count = pool.get("resourceSliceCount")
    return count if isinstance(count, int) and count > 0 else 1


def _is_whole(device: Obj, driver: str) -> bool:
    kind = _attribute(device, driver, "type")
    return kind is None or kind in _WHOLE_DEVICE_TYPES


def _bus(device: Obj, driver: str, names: tuple[str, ...] = _BUS_ATTRIBUTES) -> str | None:
    """The PCI address a device publishes (lower case: ``0000:3b:00.0``), if any."""
    for name in names:
        value = _attribute(device, driver, name)
        if isinstance(value, str) and value:
            return value.lower()
    return None


def _name_order(device: Obj) -> tuple[tuple[int, str], ...]:
    """By name, numbers compared as numbers (``gpu-2`` before ``gpu-10``)."""
    name = str(device.get("name") or "")
    return tuple((int(p), "") if p.isdigit() else (-1, p) for p in re.split(r"(\d+)", name) if p)


def _enumeration_order(device: Obj, driver: str) -> tuple[str, tuple[tuple[int, str], ...]]:
    """PCI bus order, then names (devices without a bus ID last)."""
    # Bus IDs are fixed-width hex ("0000:3b:00.0"): as strings they sort in bus order.
    return (_bus(device, driver) or "\uffff", _name_order(device))


def _runtime_ids(
    listed: list[tuple[str, str, Obj]],
) -> tuple[dict[str, int], list[str]]:
    """PCI address -> the ID the vendor's runtime gives the whole device there, from every
    device listed (partitions too), and what makes those IDs uncertain.

    NVML (``nvidia-smi``'s index, ``NVIDIA_VISIBLE_DEVICES=<index>``, the toolkit's CDI
    ``nvidia.com/gpu=<index>``) numbers every GPU bound to NVIDIA's kernel driver in PCI
    bus order, a MIG-enabled one too: its MIG devices carry their parent's bus ID, so it
    keeps its place and the GPUs after it keep theirs. A GPU published only as a ``vfio``
    device is bound to vfio-pci for passthrough, which NVML does not see. ``amd-ctk``
    (``amd.com/gpu=<N>``, ``AMD_VISIBLE_DEVICES=<N>``) lists GPUs in PCI address order,
    each partition of a partitioned GPU one entry.

    A GPU the driver publishes nothing for (NVIDIA: MIG mode with no MIG device, or left
    out as unhealthy) would shift the IDs after it; NVIDIA's names (``gpu-<minor>``,
    ``gpu-<minor>-mig-...``) then skip its minor number. Where the other GPUs' minor
    numbers follow their bus order, each GPU's ID is its minor number (the missing one
    keeps its place); otherwise the IDs after the gap are uncertain, and said so."""
    numbered: set[str] = set()  # buses of the devices the runtime numbers
    passthrough: set[str] = set()
    slots: dict[str, int] = {}  # bus -> partitions the runtime numbers on their own
    minors: dict[int, str] = {}
    conflicting = False
    for driver, _pool, device in listed:
        kind = _attribute(device, driver, "type")
        parent = None if _is_whole(device, driver) else _bus(device, driver, _PARENT_BUS)
        bus = parent or _bus(device, driver)
        if bus is None:
            continue
        if kind in _PASSTHROUGH_TYPES:
            passthrough.add(bus)
            continue
        numbered.add(bus)
        if kind in _NUMBERED_PARTITION_TYPES:
            slots[bus] = slots.get(bus, 0) + 1
        named = _NVIDIA_NAME.fullmatch(str(device.get("name") or ""))
        if named and (minor := int(named[1])) < MAX_DEVICES_PER_RESOURCE:
            conflicting |= minors.setdefault(minor, bus) != bus
        elif named:
            conflicting = True
    order = sorted(numbered)
    problems: list[str] = []
    unseen = sorted(passthrough - numbered)
    if unseen:
        problems.append(
            f"the GPU(s) at {', '.join(unseen[:8])} are published only for VFIO passthrough "
            "(bound to vfio-pci, which NVML does not number)"
        )
    missing = [m for m in range(max(minors, default=-1) + 1) if m not in minors]
    if missing and len(missing) != len(unseen):
        gaps = ", ".join(f"gpu-{m}" for m in missing[:8]) + (", ..." if len(missing) > 8 else "")
        why = f"no device of {gaps} is published (MIG mode without MIG devices, or left out"
        if (
            not unseen
            and not conflicting
            and not slots
            and [minors[m] for m in sorted(minors)] == order
        ):
            return {bus: m for m, bus in minors.items()}, [
                f"{why} as unhealthy): the other GPUs' minor numbers follow their PCI bus "
                "order, so their IDs are their minor numbers"
            ]
        problems.append(f"{why} as unhealthy): IDs after it may not be NVML's (deliver by UUID)")
    ids: dict[str, int] = {}
    next_id = 0
    for bus in order:
        ids[bus] = next_id
        next_id += slots.get(bus) or 1
    return ids, problems


def _offer_from_devices(resource: str, listed: list[tuple[str, str, Obj]]) -> Offer:
    whole = [entry for entry in listed if _is_whole(entry[2], entry[0])]
    if len(whole) > MAX_DEVICES_PER_RESOURCE:
        return Offer(
            resource,
            SOURCE_SLICE,
            (),
            f"ResourceSlices list more than {MAX_DEVICES_PER_RESOURCE} {resource} devices",
        )
    problems: list[str] = []
    parts = [entry for entry in listed if not _is_whole(entry[2], entry[0])]
    if len(parts) > _MAX_PARTS:
        problems.append(f"only the first {_MAX_PARTS} partitions are read")
        parts = parts[:_MAX_PARTS]
    indexed = any(
        isinstance(i := _attribute(d, drv, "index"), int) and not isinstance(i, bool)
        for drv, _pool, d in whole
    )
    # The older NVIDIA shape publishes each GPU's index: it is the ID. Else the runtime's.
    runtime_ids: dict[str, int] = {}
    if not indexed:
        runtime_ids, found = _runtime_ids(whole + parts)
        problems += found
    devices: dict[int, Device] = {}
    rest: list[tuple[str, str, bool, str, str]] = []
    for driver, pool, device in sorted(whole, key=lambda e: _enumeration_order(e[2], e[0])):
        name = str(device.get("name") or "")
        uuid = _attribute(device, driver, "uuid")
        uuid = uuid if isinstance(uuid, str) else ""
        healthy = not any(
            isinstance(t, Mapping) and t.get("effect") in _UNHEALTHY_TAINT_EFFECTS
            for t in device.get("taints") or ()
        )
        index = _attribute(device, driver, "index") if indexed else None
        if not isinstance(index, int) or isinstance(index, bool):
            index = runtime_ids.get(_bus(device, driver) or "")
        if index is None:
            rest.append((name, uuid, healthy, driver, pool))
            continue
        if not 0 <= index < MAX_DEVICES_PER_RESOURCE or index in devices:
            problems.append(f"device {name} has ID {index}, out of range or taken twice")
            continue
        devices[index] = Device(index, uuid, healthy, name, driver, pool)
    # Without an index or a bus ID: after every other ID (holes included), in name order.
    next_id = max([*devices, *runtime_ids.values()], default=-1) + 1
    for name, uuid, healthy, driver, pool in rest:
        if next_id >= MAX_DEVICES_PER_RESOURCE:
            problems.append(f"device {name} has no ID below {MAX_DEVICES_PER_RESOURCE}")
            continue
        devices[next_id] = Device(next_id, uuid, healthy, name, driver, pool)
        next_id += 1
    if rest:
        problems.append(
            f"{len(rest)} device(s) publish no index"
            + ("" if indexed else " and no PCI bus ID")
            + "; their IDs follow "
            + ("their PCI bus IDs, else " if indexed else "")
            + "their names (numbers compared as numbers): they are guessed"
        )
    return Offer(
        resource,
        SOURCE_SLICE,
        tuple(sorted(devices.values(), key=lambda d: d.id)),
        "; ".join(problems),
    )


def _selects(rule: Obj, driver: object, pool: object) -> bool:
    """Whether a DeviceTaintRule may select devices of ``driver``'s pool ``pool``: every
    selector field that is set must match, no selector selects nothing
    (k8s.io/dynamic-resource-allocation v0.37.2, resourceslice/tracker/tracker.go
    applyPatches)."""
    selector = spec_of(rule).get("deviceSelector")
    return isinstance(selector, Mapping) and all(
        selector.get(key) is None or selector.get(key) == value
        for key, value in (("driver", driver), ("pool", pool))
    )


def _selects_device(rule: Obj, name: object) -> bool:
    """Whether a rule that selects a device's pool selects the device named ``name``."""
    wanted = (spec_of(rule).get("deviceSelector") or {}).get("device")
    return wanted is None or wanted == name


def apply_taint_rules(slices: Iterable[Obj], rules: Iterable[Obj]) -> list[Obj]:
    """The slices with each device also carrying the taint of every DeviceTaintRule that
    selects it, as kube-scheduler applies them ("the same effect as if the taint was
    specified directly in the ResourceSlice by the DRA driver", k8s.io/api v0.37.2
    resource/v1 DeviceTaintRule). Slices no rule touches are returned as they are."""
    rules = [r for r in rules if isinstance(spec_of(r).get("taint"), Mapping)]
    out: list[Obj] = []
    for s in slices:
        spec = spec_of(s)
        driver, pool = spec.get("driver"), (spec.get("pool") or {}).get("name")
        mine = [r for r in rules if _selects(r, driver, pool)]
        if not mine:
            out.append(s)
            continue
        devices: list[Any] = []
        changed = False
        for device in (spec.get("devices") or ())[:MAX_DEVICES_PER_RESOURCE]:
            if not isinstance(device, Mapping):
                devices.append(device)
                continue
            added = [r["spec"]["taint"] for r in mine if _selects_device(r, device.get("name"))]
            if added:
                changed = True
                device = {**device, "taints": [*(device.get("taints") or ()), *added]}
            devices.append(device)
        out.append({**s, "spec": {**spec, "devices": devices}} if changed else s)
    return out


def node_offers(
    node: Obj,
    slices: Iterable[Obj] = (),
    drivers: Mapping[str, str] = DEFAULT_DRA_DRIVERS,
    taint_rules: Iterable[Obj] = (),
) -> dict[str, Offer]:
    """Every device resource ``node`` offers, each from its best source."""
    offers = {res: count_offer(res, n) for res, n in node_device_capacity(node).items() if n}
    annotations = meta_of(node).get("annotations") or {}
    for key, value in annotations.items():
        if key.startswith(ANNOTATION_PREFIX):
            res = key[len(ANNOTATION_PREFIX) :].replace("_", "/", 1)
            offers[res] = parse_annotation(res, value)
    offers.update(slice_offers(slices, drivers, taint_rules))
    return offers


def node_of_slice(resource_slice: Obj) -> str | None:
    """The node a ResourceSlice's devices are on (None for pools shared by many nodes,
    which SDG does not hand out: a group's devices are on one node)."""
    node = spec_of(resource_slice).get("nodeName")
    return node if isinstance(node, str) and node else None


class Inventory:
    """Every node's offers, kept current from the node, ResourceSlice and (where served)
    DeviceTaintRule informers.

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
        #: DeviceTaintRule name -> rule
        self._rules: dict[str, Obj] = {}

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

    def observe_taint_rule(self, rule: Obj) -> None:
        name = str(rule["metadata"]["name"])
        old = self._rules.get(name)
        self._rules[name] = rule
        self._rule_changed(old, rule)

    def forget_taint_rule(self, rule: Obj) -> None:
        old = self._rules.pop(str(rule["metadata"]["name"]), None)
        if old is not None:
            self._rule_changed(old, None)

    def _rule_changed(self, old: Obj | None, new: Obj | None) -> None:
        """Recompute the nodes with a slice either version of the rule may select."""
        for node, slices in list(self._slices.items()):
            for s in slices.values():
                spec = spec_of(s)
                driver, pool = spec.get("driver"), (spec.get("pool") or {}).get("name")
                if any(r is not None and _selects(r, driver, pool) for r in (old, new)):
                    self._recompute(node)
                    break

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
            node_offers(
                obj, self._slices.get(node, {}).values(), self.drivers, self._rules.values()
            )
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

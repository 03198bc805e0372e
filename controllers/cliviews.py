"""What ``sdg devices`` and ``sdg explain`` print: pure views of plain API objects.

Every function takes decoded JSON (Nodes, SharedDeviceGroups, claim-record ConfigMaps,
Pods) and returns the text to print, so the exact output is tested on a known state
without a server; ``controllers.cli`` only fetches and prints. The views cross-check the
fenced claim records against group statuses instead of trusting either, because the
moments an operator runs them are the moments the two may disagree.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from api.conditions import find_condition
from api.constants import (
    CONDITION_SCHEDULED,
    FINALIZER,
    GROUP_ANNOTATION,
    MAX_DEVICES_PER_RESOURCE,
    NODE_MODE_LABEL,
    NODE_MODE_SHARED,
    SCHEDULER_NAME,
)
from api.envvars import env_var_for
from api.pods import is_active, pod_group, pod_key, tolerates
from api.v1alpha1 import (
    format_ids,
    group_name,
    group_node,
    group_phase,
    group_pod_count,
    group_resources,
    group_strategy,
    is_bound,
    pods_truncated,
    selected_devices,
)
from controllers.claims import DATA_CLAIMS, DATA_NODE, record_name
from controllers.inventory import (
    SOURCE_ANNOTATION,
    SOURCE_COUNT,
    Offer,
    annotation_key,
    node_of_slice,
    node_offers,
)
from controllers.placement import (
    node_device_capacity,
    node_name,
    place,
    unaddressable_devices,
)
from controllers.podfit import pod_fits_node
from controllers.tracker import Devices, decode_claims

Obj = Mapping[str, Any]

NONE = "<none>"
#: Pods listed in one table cell before "+ N more...".
MAX_PODS_IN_CELL = 3


# --- text layout ------------------------------------------------------------------------------


def table(headers: Sequence[str], rows: Iterable[Sequence[object]], indent: str = "") -> str:
    """kubectl's table layout: left-aligned columns three spaces apart, no trailing blanks."""
    cells = [[str(h) for h in headers], *([str(c) for c in row] for row in rows)]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join(
        indent + "   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
        for r in cells
    )


def fields(pairs: Sequence[tuple[str, str]]) -> str:
    """``kubectl describe``'s ``Key:   value`` block, values aligned."""
    width = max(len(k) for k, _ in pairs) + 2
    return "\n".join(f"{k + ':':<{width}}{v}".rstrip() for k, v in pairs)


def _join_sections(*sections: str | None) -> str:
    return "\n\n".join(s for s in sections if s) + "\n"


def _devices_text(devices: Mapping[str, Iterable[int]]) -> str:
    return ", ".join(f"{res} {format_ids(ids)}" for res, ids in sorted(devices.items())) or NONE


def _pods_cell(pods: Sequence[str]) -> str:
    if not pods:
        return NONE
    shown = ",".join(pods[:MAX_PODS_IN_CELL])
    more = len(pods) - MAX_PODS_IN_CELL
    return f"{shown} + {more} more..." if more > 0 else shown


def _allocated_pods(group: Obj | None) -> list[str]:
    return list(((group or {}).get("status") or {}).get("allocatedPods") or [])


def _labels(obj: Obj) -> dict[str, str]:
    return dict((obj.get("metadata") or {}).get("labels") or {})


def _is_shared(node: Obj) -> bool:
    return _labels(node).get(NODE_MODE_LABEL) == NODE_MODE_SHARED


def _too_many_text(res: str, count: int) -> str:
    return (
        f"advertises {count} {res}, more than the {MAX_DEVICES_PER_RESOURCE} devices SDG "
        "addresses per node, so it offers none (not a device count)"
    )


def node_problems(node: Obj) -> list[str]:
    """Why a node may not run pods now: not Ready, cordoned (taints are per pod)."""
    problems = []
    for cond in (node.get("status") or {}).get("conditions") or ():
        if cond.get("type") == "Ready" and cond.get("status") != "True":
            why = cond.get("reason") or f"Ready={cond.get('status')}"
            problems.append(f"not Ready ({why})")
    if (node.get("spec") or {}).get("unschedulable"):
        problems.append("cordoned (spec.unschedulable)")
    return problems


# --- the claim view: records cross-checked with group statuses --------------------------------


@dataclass
class ClaimView:
    """Who holds which device, from both sources, and what disagrees."""

    #: node -> group -> devices, from the fenced per-node records.
    records: dict[str, dict[str, Devices]] = field(default_factory=dict)
    #: group -> (node, devices), from the status of Bound groups.
    statuses: dict[str, tuple[str, Devices]] = field(default_factory=dict)
    #: (node, resource, id) -> group -> {"record", "status"}.
    holders: dict[tuple[str, str, int], dict[str, set[str]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(set))
    )
    warnings: list[str] = field(default_factory=list)

    def held_ids(self, node: str, resource: str) -> set[int]:
        return {i for (n, r, i), hs in self.holders.items() if n == node and r == resource and hs}

    def nodes(self) -> set[str]:
        return {n for (n, _, _), hs in self.holders.items() if hs}

    def resources_on(self, node: str) -> set[str]:
        return {r for (n, r, _), hs in self.holders.items() if n == node and hs}

    def free(self, node: str, resource: str, capacity: int) -> int:
        return capacity - len({i for i in self.held_ids(node, resource) if i < capacity})


def claim_view(groups: Iterable[Obj], configmaps: Iterable[Obj]) -> ClaimView:
    view = ClaimView()
    for cm in sorted(configmaps, key=lambda c: (c.get("metadata") or {}).get("name") or ""):
        data = cm.get("data") or {}
        node = data.get(DATA_NODE)
        name = (cm.get("metadata") or {}).get("name") or record_name(str(node))
        if not node:
            view.warnings.append(f"claim record {name}: names no node (data.{DATA_NODE})")
            continue
        try:
            claims = decode_claims(data.get(DATA_CLAIMS, ""))
        except ValueError as err:
            view.warnings.append(f"claim record {name}: malformed: {err}")
            continue
        view.records[node] = claims
        for group, devices in claims.items():
            for res, ids in devices.items():
                for i in ids:
                    view.holders[(node, res, i)][group].add("record")
    for group in sorted(groups, key=group_name):
        if not is_bound(group):
            continue
        name = group_name(group)
        try:
            devices = selected_devices(group)
        except ValueError as err:
            view.warnings.append(f"group {name}: status.selectedDevices is malformed: {err}")
            continue
        node = str(group_node(group))
        view.statuses[name] = (node, devices)
        for res, ids in devices.items():
            for i in ids:
                view.holders[(node, res, i)][name].add("status")
    return view


def _cross_check(view: ClaimView, by_group: Mapping[str, Obj]) -> list[str]:
    """One line per group whose record and status disagree."""
    out: list[str] = []
    recorded: dict[str, list[tuple[str, Devices]]] = defaultdict(list)
    for node, claims in sorted(view.records.items()):
        for group, devices in claims.items():
            recorded[group].append((node, devices))
    for name in sorted(set(recorded) | set(view.statuses)):
        places = recorded.get(name, [])
        status = view.statuses.get(name)
        if len(places) > 1:
            where = "; ".join(f"{n} ({_devices_text(d)})" for n, d in places)
            out.append(f"group {name}: claim records on several nodes: {where}")
        if name not in by_group:
            for node, devices in places:
                out.append(
                    f"group {name}: does not exist, but the claim record of node {node} "
                    f"still holds {_devices_text(devices)} for it"
                )
            continue
        if status is None:
            for node, devices in places:
                out.append(
                    f"group {name}: {group_phase(by_group[name])}, but the claim record of node "
                    f"{node} holds {_devices_text(devices)} for it (binding in progress, or "
                    "its status was lost)"
                )
            continue
        node, devices = status
        if not places:
            out.append(
                f"group {name}: Bound on {node} ({_devices_text(devices)}), but no claim record "
                "lists it"
            )
        elif len(places) == 1 and places[0] != (node, devices):
            out.append(
                f"group {name}: status says {node} ({_devices_text(devices)}), the claim record "
                f"says {places[0][0]} ({_devices_text(places[0][1])})"
            )
    return out


def _slices_of(slices: Iterable[Obj]) -> dict[str, list[Obj]]:
    by_node: dict[str, list[Obj]] = defaultdict(list)
    for s in slices:
        node = node_of_slice(s)
        if node:
            by_node[node].append(s)
    return by_node


def _source_text(offer: Offer) -> str:
    if offer.source == SOURCE_COUNT:
        return "counted in status.allocatable: IDs are guessed"
    if offer.source == SOURCE_ANNOTATION:
        return f"from node annotation {annotation_key(offer.resource)}"
    return "from DRA ResourceSlices"


def _physical_text(group: Obj, devices: Devices, offers: Mapping[str, Offer]) -> str:
    recorded = (group.get("status") or {}).get("physicalDevices") or {}
    parts = []
    for res, ids in sorted(devices.items()):
        offer = offers.get(res)
        known = recorded.get(res) or ",".join((offer.uuids(ids) or []) if offer else [])
        where = _source_text(offer) if offer else "the node offers none now"
        parts.append(f"{res} {known} ({where})" if known else f"{res} unknown ({where})")
    return "; ".join(parts) or NONE


def inventory_lines(nodes: Iterable[Obj], slices: Iterable[Obj] = ()) -> list[str]:
    """One line per shared node and resource: how many devices, from which source."""
    by_slices = _slices_of(slices)
    out = []
    for obj in sorted(nodes, key=node_name):
        if not _is_shared(obj):
            continue
        for res, offer in sorted(node_offers(obj, by_slices.get(node_name(obj), ())).items()):
            bad = len(offer.devices) - len(offer.usable())
            health = f", {bad} unhealthy" if bad else ""
            note = f"; {offer.problem}" if offer.problem else ""
            out.append(
                f"{node_name(obj)} {res}: {len(offer.devices)} device(s){health}, "
                f"{_source_text(offer)}{note}"
            )
    return out


# --- sdg devices ------------------------------------------------------------------------------


def devices_view(
    nodes: Iterable[Obj],
    groups: Iterable[Obj],
    configmaps: Iterable[Obj],
    slices: Iterable[Obj] = (),
) -> str:
    """The device map: every device ID of every shared node (and of any node holding
    claims) -> the group holding it -> that group's pods; free IDs marked ``-``/``free``.

    STATE is ``held`` when the claim record and the group's status agree, ``free``,
    ``record-only`` / ``status-only`` when only one of them says so, ``conflict`` when two
    groups hold one ID, ``missing`` when the node no longer offers a held ID (gone from its
    inventory or unhealthy), ``unhealthy`` for a free device the inventory marks so. A UUID
    column appears when the inventory identifies devices; the Inventory section says, per
    node and resource, where the devices come from (IDs counted from allocatable are
    guessed).
    """
    nodes, groups, slices = list(nodes), list(groups), list(slices)
    by_slices = _slices_of(slices)
    by_node = {node_name(n): n for n in nodes}
    by_group = {group_name(g): g for g in groups}
    view = claim_view(groups, configmaps)
    shown = sorted({n for n, obj in by_node.items() if _is_shared(obj)} | view.nodes())

    rows: list[tuple[str, ...]] = []
    warnings = list(view.warnings)
    for node in shown:
        obj = by_node.get(node)
        offers = node_offers(obj, by_slices.get(node, ())) if obj else {}
        capacity = {r: o.capacity for r, o in offers.items()}
        if obj is None:
            warnings.append(f"node {node}: not found, but devices are recorded on it")
        else:
            if not _is_shared(obj):
                warnings.append(
                    f"node {node}: not labelled {NODE_MODE_LABEL}={NODE_MODE_SHARED}; its "
                    "groups keep their devices, new groups will not bind there"
                )
            warnings += [f"node {node}: {p}" for p in node_problems(obj)]
            warnings += [
                f"node {node}: {_too_many_text(res, count)}"
                for res, count in sorted(unaddressable_devices(obj).items())
            ]
        too_many = set(unaddressable_devices(obj)) if obj else set()
        resources = sorted(set(capacity) | view.resources_on(node) | too_many)
        if not resources:
            rows.append((node, NONE, "-", "-", "-", "-"))
        for res in resources:
            offer = offers.get(res)
            usable = set(offer.usable()) if offer else set()
            listed_ids = {d.id for d in offer.devices} if offer else set()
            held = view.held_ids(node, res)
            beyond = sorted(i for i in held if i not in usable)
            if beyond and obj is not None:
                warnings.append(
                    f"node {node}: offers {len(usable)} {res}, but {res} {format_ids(beyond)} "
                    "is still held"
                )
            if offer is not None and offer.problem:
                warnings.append(f"node {node}: {offer.problem}")
            for i in sorted(listed_ids | held):
                device = offer.device(i) if offer else None
                cells = _device_cells(view, by_group, node, res, i, usable)
                rows.append((node, res, str(i), device.uuid if device else "", *cells))
    warnings += _cross_check(view, by_group)

    pending = sorted(name for name, g in by_group.items() if not is_bound(g))
    headers = ["NODE", "RESOURCE", "ID", "UUID", "GROUP", "STATE", "PODS"]
    if any(r[3] for r in rows if len(r) > 6):
        rows = [r if len(r) > 6 else (*r[:3], "", *r[3:]) for r in rows]
    else:
        # No device is identified: no UUID column (count-only inventories).
        headers.remove("UUID")
        rows = [(*r[:3], *r[4:]) if len(r) > 6 else r for r in rows]
    inventory = inventory_lines(by_node.values(), slices)
    sections = [
        table(headers, rows)
        if rows
        else f"No shared nodes: label a node {NODE_MODE_LABEL}={NODE_MODE_SHARED} to offer "
        "its devices.",
        "Pending groups (hold no devices; sdg explain GROUP says why): " + ", ".join(pending)
        if pending
        else None,
        "Inventory:\n" + "\n".join(f"  {line}" for line in inventory) if inventory else None,
        "Warnings:\n" + "\n".join(f"  {w}" for w in warnings) if warnings else None,
    ]
    return _join_sections(*sections)


def _device_cells(
    view: ClaimView, by_group: Mapping[str, Obj], node: str, res: str, i: int, usable: set[int]
) -> tuple[str, str, str]:
    """GROUP, STATE, PODS of one device ID."""
    holders = view.holders.get((node, res, i)) or {}
    holders = {g: s for g, s in holders.items() if s}
    if not holders:
        return "-", "free" if i in usable else "unhealthy", "-"
    if len(holders) > 1:
        return ",".join(sorted(holders)), "conflict", "-"
    ((group, sources),) = holders.items()
    if i not in usable:
        state = "missing"
    elif sources == {"record", "status"}:
        state = "held"
    elif sources == {"record"}:
        state = "record-only"
    else:
        state = "status-only"
    pods = _pods_cell(_allocated_pods(by_group.get(group))) if group in by_group else "-"
    return group, state, pods


# --- sdg explain GROUP ------------------------------------------------------------------------


def _conditions_section(obj: Obj, kinds: Sequence[str] | None = None) -> str:
    conds = [
        c
        for c in (obj.get("status") or {}).get("conditions") or ()
        if kinds is None or c.get("type") in kinds
    ]
    if not conds:
        return f"Conditions: {NONE}"
    rows = [
        (c.get("type", ""), c.get("status", ""), c.get("reason") or "-", c.get("message") or "")
        for c in conds
    ]
    return "Conditions:\n" + table(["TYPE", "STATUS", "REASON", "MESSAGE"], rows, indent="  ")


def _env_text(resources: Iterable[str], devices: Mapping[str, Iterable[int]]) -> str:
    parts = []
    for res in sorted(resources):
        var = env_var_for(res)
        ids = format_ids(devices.get(res, ()))
        parts.append(f"{var}={ids}" if var else f"{res}: no default env var (--device-env)")
    return ", ".join(parts)


def _scheduled_message(group: Obj) -> str:
    cond = find_condition((group.get("status") or {}).get("conditions"), CONDITION_SCHEDULED)
    msg = ((cond or {}).get("message") or "").strip()
    return msg or "not scheduled yet: no Scheduled condition (is the manager running?)"


def _waiting_reason(pod: Obj) -> str:
    status = pod.get("status") or {}
    for key in ("initContainerStatuses", "containerStatuses"):
        for cs in status.get(key) or ():
            waiting = (cs.get("state") or {}).get("waiting")
            if waiting and waiting.get("reason"):
                return f"container {cs.get('name')}: {waiting['reason']}" + (
                    f" ({waiting['message']})" if waiting.get("message") else ""
                )
    return ""


def _pod_note(pod: Obj, group: Obj, allocated: set[str], listed_until: str | None) -> str:
    spec = pod.get("spec") or {}
    node = spec.get("nodeName")
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return "terminating"
    if not node:
        cond = find_condition((pod.get("status") or {}).get("conditions"), "PodScheduled")
        if cond and cond.get("status") == "False":
            return f"not scheduled: {cond.get('message') or cond.get('reason')}"
        return "waiting for deviceshare-scheduler"
    if is_bound(group) and node != group_node(group):
        return f"on {node}, not on the group's node {group_node(group)}"
    key = pod_key(pod)
    if is_active(pod) and key not in allocated and (listed_until is None or key < listed_until):
        return "not yet in status.allocatedPods"
    return _waiting_reason(pod)


def explain_group(
    name: str,
    groups: Iterable[Obj],
    nodes: Iterable[Obj],
    configmaps: Iterable[Obj],
    pods: Iterable[Obj],
    slices: Iterable[Obj] = (),
) -> str:
    """Why a group is Pending (per node, now) or where it is bound, with its devices (and
    which physical devices they are, or that the IDs are guessed from a count), its pods
    and its conditions. ``pods`` may hold any pods; those naming the group are used."""
    groups, nodes = list(groups), list(nodes)
    by_group = {group_name(g): g for g in groups}
    group = by_group.get(name)
    if group is None:
        known = ", ".join(sorted(by_group)) or NONE
        return f'SharedDeviceGroup "{name}" not found. Groups: {known}\n'
    by_node = {node_name(n): n for n in nodes}
    view = claim_view(groups, configmaps)
    spec = group.get("spec") or {}
    resources = group_resources(group)
    selector = spec.get("nodeSelector") or {}
    meta = group.get("metadata") or {}
    allocated = _allocated_pods(group)

    info = [("Name", name), ("Phase", group_phase(group))]
    problems: list[str] = []
    if is_bound(group):
        node, devices = view.statuses.get(name, (str(group_node(group)), {}))
        info += [
            ("Node", node),
            ("Devices", f"{_devices_text(devices)} ({_env_text(resources, devices)})"),
        ]
        obj = by_node.get(node)
        if obj is None:
            problems.append(f"node {node} does not exist any more; its pods cannot run")
        else:
            problems += [f"node {node} is {p}" for p in node_problems(obj)]
            offers = node_offers(obj, _slices_of(slices).get(node, ()))
            info.append(("Device UUIDs", _physical_text(group, devices, offers)))
            too_many = unaddressable_devices(obj)
            for res, ids in sorted(devices.items()):
                offer = offers.get(res)
                if ids and res in too_many and offer is None:
                    problems.append(
                        f"node {node} {_too_many_text(res, too_many[res])}; the group holds "
                        f"{res} {format_ids(ids)}"
                    )
                elif ids and offer is None:
                    problems.append(
                        f"node {node} offers no {res} now; the group holds {res} {format_ids(ids)}"
                    )
                elif ids and offer.missing(ids):
                    problems.append(
                        f"node {node} no longer offers {', '.join(offer.missing(ids))} "
                        f"({_source_text(offer)}); the group holds {res} {format_ids(ids)}"
                    )
        recorded = view.records.get(node, {}).get(name)
        if recorded is None:
            problems.append(f"the claim record of node {node} does not list the group")
        elif recorded != devices:
            problems.append(
                f"the claim record of node {node} says {_devices_text(recorded)}, "
                f"the status says {_devices_text(devices)}"
            )
    info += [
        ("Strategy", group_strategy(group)),
        ("Resources", ", ".join(f"{r}: {n}" for r, n in sorted(resources.items())) or NONE),
        ("Node Selector", ",".join(f"{k}={v}" for k, v in sorted(selector.items())) or NONE),
    ]

    pod_count = group_pod_count(group)
    if meta.get("deletionTimestamp"):
        active = pod_count
        summary = (
            f"Being deleted: the finalizer {FINALIZER} holds it until its {active} pod(s) are "
            "gone; delete them to release the devices."
            if active
            else "Being deleted: no pods use it; the devices are released once it is gone."
        )
    elif is_bound(group):
        node, devices = view.statuses.get(name, (str(group_node(group)), {}))
        summary = f"Bound to node {node} with {_devices_text(devices)}; {pod_count} pod(s) use it."
    else:
        summary = f"Pending: {_scheduled_message(group)}"
    if pods_truncated(group):
        summary += (
            f"\nstatus.allocatedPods lists the first {len(allocated)} of {pod_count} pods; "
            "the table below lists every pod found."
        )
    if problems:
        summary += "\nProblems:\n" + "\n".join(f"  {p}" for p in problems)

    nodes_section = None
    if not is_bound(group) and resources:
        nodes_section = _nodes_now(spec, nodes, view)

    member_pods = sorted((p for p in pods if pod_group(p) == name), key=lambda p: pod_key(p))
    seen = {pod_key(p) for p in member_pods}
    allocated_set = set(allocated)
    # A cut list names the first pods only: one sorting after its end is not "missing".
    listed_until = max(allocated) if pods_truncated(group) and allocated else None
    rows = [
        (
            pod_key(p),
            (p.get("status") or {}).get("phase") or "Pending",
            (p.get("spec") or {}).get("nodeName") or NONE,
            _pod_note(p, group, allocated_set, listed_until),
        )
        for p in member_pods
    ]
    rows += [
        (key, "-", "-", "in status.allocatedPods, but no such pod")
        for key in allocated
        if key not in seen
    ]
    pods_section = (
        "Pods:\n" + table(["POD", "PHASE", "NODE", "NOTE"], rows, indent="  ")
        if rows
        else f"Pods: {NONE}"
    )
    return _join_sections(
        fields(info), summary, nodes_section, pods_section, _conditions_section(group)
    )


def _nodes_now(spec: Obj, nodes: Sequence[Obj], view: ClaimView) -> str:
    """Each shared node's verdict for the group right now (the scheduler's own filters)."""
    free: dict[str, dict[str, int]] = {}
    for node in nodes:
        name = node_name(node)
        free[name] = {
            res: view.free(name, res, cap) for res, cap in node_device_capacity(node).items()
        }
    decision = place(spec, nodes, free)
    shared = [n for n in nodes if _is_shared(n)]
    rows = []
    for node in sorted(shared, key=node_name):
        name = node_name(node)
        why = decision.reasons.get(name)
        if why:
            rows.append((name, "no", "; ".join(why)))
        else:
            left = decision.free_after.get(name, 0)
            rows.append((name, "yes", f"{left} device(s) would stay free"))
    lines = [f"Nodes now ({decision.feasible}/{len(nodes)} fit):"]
    if rows:
        lines.append(table(["NODE", "FITS", "REASON"], rows, indent="  "))
    others = len(nodes) - len(shared)
    if others:
        lines.append(
            f"  {others} other node(s) are not labelled {NODE_MODE_LABEL}={NODE_MODE_SHARED}"
        )
    if decision.feasible:
        lines.append(
            f"  {decision.ranked[0]} fits now; the scheduler retries when nodes or groups "
            "change (if it stays Pending, check that the manager is running)."
        )
    return "\n".join(lines)


# --- sdg explain POD --------------------------------------------------------------------------


def explain_pod(
    pod: Obj, groups: Iterable[Obj], nodes: Iterable[Obj], pods: Iterable[Obj] = ()
) -> str:
    """Why a pod is not running on its group's node, or that it is, with which env.

    ``pods`` are other pods (those on the group's node are used for the fit check).
    """
    by_group = {group_name(g): g for g in groups}
    by_node = {node_name(n): n for n in nodes}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    name = pod_group(pod)
    group = by_group.get(name) if name else None
    node = spec.get("nodeName")
    scheduler = spec.get("schedulerName") or "default-scheduler"
    phase = status.get("phase") or "Pending"

    if name is None:
        group_text = NONE
    elif group is None:
        group_text = f"{name} (not found)"
    elif is_bound(group):
        group_text = f"{name} (Bound on {group_node(group)})"
    else:
        group_text = f"{name} ({group_phase(group)})"
    info = fields(
        [
            ("Pod", pod_key(pod)),
            ("Group", group_text),
            ("Scheduler", scheduler),
            ("Node", node or NONE),
            ("Phase", phase),
        ]
    )
    verdict = _pod_verdict(pod, name, group, by_node, list(pods))
    env = _env_section(pod, group) if group is not None and is_bound(group) else None
    return _join_sections(info, verdict, env, _conditions_section(pod, ["PodScheduled", "Ready"]))


def _pod_verdict(
    pod: Obj, name: str | None, group: Obj | None, by_node: Mapping[str, Obj], pods: list[Obj]
) -> str:
    spec = pod.get("spec") or {}
    phase = (pod.get("status") or {}).get("phase") or "Pending"
    node = spec.get("nodeName")
    scheduler = spec.get("schedulerName") or "default-scheduler"
    if name is None:
        text = f"Not a SharedDeviceGroup pod: it has no {GROUP_ANNOTATION} annotation."
        if scheduler == SCHEDULER_NAME and not node:
            text += (
                f" It names schedulerName {SCHEDULER_NAME}, which only schedules group pods, "
                f"so it stays Pending: add {GROUP_ANNOTATION}: <group> (recreate the pod) or "
                "use another scheduler."
            )
        return text
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return f"Being deleted{f' from node {node}' if node else ''}."
    if phase in ("Succeeded", "Failed"):
        where = f" on node {node}" if node else ""
        return f"Finished ({phase}){where}; it no longer counts among the pods of group {name}."
    if group is None:
        where = f"It runs on node {node}, but" if node else "It cannot be scheduled:"
        return (
            f"{where} its group {name} does not exist. Create the group, or delete the pod "
            "and recreate it with an existing group."
        )
    if node:
        return _bound_verdict(pod, name, group, node, by_node)
    if scheduler != SCHEDULER_NAME:
        return (
            f"Not scheduled by {SCHEDULER_NAME}: its schedulerName is {scheduler} (the pod "
            f"webhook sets {SCHEDULER_NAME} at creation; was it bypassed?), so another "
            "scheduler may place it on any node. Recreate the pod."
        )
    if not is_bound(group):
        return (
            f"Waiting for its group {name}, which is {group_phase(group)}: "
            f"{_scheduled_message(group)}"
        )
    target = str(group_node(group))
    lines = [f"Not scheduled yet onto {target}, the node of group {name}."]
    cond = find_condition((pod.get("status") or {}).get("conditions"), "PodScheduled")
    if cond and cond.get("status") == "False":
        lines.append(f"Scheduler says: {cond.get('message') or cond.get('reason')}")
    obj = by_node.get(target)
    if obj is None:
        lines.append(f"Node {target} does not exist any more.")
    else:
        on_node = [p for p in pods if (p.get("spec") or {}).get("nodeName") == target]
        reasons = pod_fits_node(pod, obj, on_node) or []
        reasons += [f"node {p}" for p in node_problems(obj) if p.startswith("not Ready")]
        if reasons:
            lines.append(f"Node {target} now: " + "; ".join(reasons))
        elif not (cond and cond.get("status") == "False"):
            lines.append(
                f"Node {target} fits it now; waiting for {SCHEDULER_NAME} (is the manager "
                "running?)."
            )
    return "\n".join(lines)


def _bound_verdict(pod: Obj, name: str, group: Obj, node: str, by_node: Mapping[str, Obj]) -> str:
    phase = (pod.get("status") or {}).get("phase") or "Pending"
    if not is_bound(group):
        return f"Bound to node {node}, but its group {name} is {group_phase(group)}."
    target = group_node(group)
    if node != target:
        return (
            f"Bound to node {node}, but group {name} is bound to {target}: its containers "
            "were given devices of another node. Delete the pod; its replacement lands on "
            f"{target}."
        )
    devices = view_devices(group)
    lines = []
    if phase == "Running":
        lines.append(f"Running on {node}, the node of group {name}, with {_devices_text(devices)}.")
    else:
        waiting = _waiting_reason(pod)
        lines.append(
            f"Bound to {node}, the node of group {name}, with {_devices_text(devices)}; "
            f"phase {phase}" + (f", {waiting}." if waiting else ".")
        )
    obj = by_node.get(node)
    if obj is None:
        lines.append(f"Node {node} does not exist any more.")
    else:
        tolerations = (pod.get("spec") or {}).get("tolerations") or []
        lines += [f"Node {node} is {p}." for p in node_problems(obj) if p.startswith("not Ready")]
        for taint in (obj.get("spec") or {}).get("taints") or ():
            if taint.get("effect") == "NoExecute" and not any(
                tolerates(t, taint) for t in tolerations
            ):
                lines.append(
                    f"Node {node} has taint {taint.get('key')}={taint.get('value', '')}:NoExecute, "
                    "which the pod does not tolerate: it will be evicted."
                )
    return "\n".join(lines)


def view_devices(group: Obj) -> Devices:
    try:
        return selected_devices(group)
    except ValueError:
        return {}


def _env_section(pod: Obj, group: Obj) -> str:
    """The device env of every container against what the group holds."""
    devices = view_devices(group)
    spec = pod.get("spec") or {}
    rows = []
    warnings = []
    unchecked = sorted(r for r in group_resources(group) if env_var_for(r) is None)
    for kind in ("initContainers", "containers"):
        for c in spec.get(kind) or ():
            env = {e.get("name"): e.get("value") for e in c.get("env") or ()}
            for res in sorted(group_resources(group)):
                var = env_var_for(res)
                if var is None:
                    continue
                want = format_ids(devices.get(res, ()))
                got = env.get(var)
                rows.append((c.get("name", ""), var, got if got is not None else NONE))
                if got is None:
                    warnings.append(
                        f"container {c.get('name')}: {var} is unset, the group holds {res} "
                        f"{want} (the pod webhook did not inject it: was it installed and "
                        "reachable when the pod was created?)"
                    )
                elif got != want:
                    warnings.append(
                        f"container {c.get('name')}: {var} is {got}, the group holds {res} {want}"
                    )
    text = (
        "Env:\n" + table(["CONTAINER", "VARIABLE", "VALUE"], rows, indent="  ")
        if rows
        else f"Env: {NONE}"
    )
    if unchecked:
        text += (
            f"\n  ({', '.join(unchecked)}: the variable comes from the manager's --device-env "
            "table; not checked here)"
        )
    if warnings:
        text += "\nWarnings:\n" + "\n".join(f"  {w}" for w in warnings)
    return text

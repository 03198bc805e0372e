"""What ``sdg devices`` and ``sdg explain`` print: pure views of plain API objects.

Every function takes decoded JSON (Nodes, SharedDeviceGroups, claim-record ConfigMaps,
Pods) and returns the text to print, so the exact output is tested on a known state
without a server; ``controllers.cli`` only fetches and prints. The views cross-check the
fenced claim records against group statuses instead of trusting either, because the
moments an operator runs them are the moments the two may disagree.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import Any, Final

from api.conditions import find_condition
from api.constants import (
    CDI_ANNOTATION_FAMILIES,
    CONDITION_READY,
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
    spec_pins,
)
from controllers.inventory import (
    SOURCE_ANNOTATION,
    SOURCE_COUNT,
    SOURCE_SLICE,
    Offer,
    annotation_key,
    node_of_slice,
    node_offers,
)
from controllers.ledger.book import Ledger
from controllers.ledger.tracker import Devices
from controllers.ledger.view import Pod, ResourceClaim, describe
from controllers.pinning import LedgerPins
from controllers.placement import (
    node_device_capacity,
    node_name,
    place,
    unaddressable_devices,
)
from controllers.podfit import pod_fits_node
from webhooks.delivery import (
    Delivery,
    DeliveryChoice,
    Denial,
    by_uuid,
    choose_delivery,
    ids_reason,
)

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
    #: The manager's merge of the same objects, plus the kubelet's and DRA's books.
    ledger: Ledger = field(default_factory=lambda: Ledger.from_objects())

    def held_ids(self, node: str, resource: str) -> set[int]:
        return {i for (n, r, i), hs in self.holders.items() if n == node and r == resource and hs}

    def nodes(self) -> set[str]:
        return {n for (n, _, _), hs in self.holders.items() if hs}

    def resources_on(self, node: str) -> set[str]:
        return {r for (n, r, _), hs in self.holders.items() if n == node and hs}

    def free(self, node: str, resource: str, capacity: int) -> int:
        return capacity - len({i for i in self.held_ids(node, resource) if i < capacity})


def claim_view(
    groups: Iterable[Obj],
    configmaps: Iterable[Obj],
    offers: Mapping[str, Mapping[str, Offer]] | None = None,
    pods: Iterable[Obj] = (),
    claims: Iterable[Obj] = (),
) -> ClaimView:
    """Records and Bound statuses as the manager's ledger reads them (the one reader of
    the record format: a decoy or a record naming another node reads the same here as in
    the manager, and blocks the nodes it names); with the nodes' ``offers``, ``pods`` and
    ResourceClaims, the ledger also knows what the kubelet and DRA gave others."""
    groups = list(groups)
    book = Ledger.from_objects(
        configmaps=configmaps,
        groups=groups,
        offers=offers,
        pods=pods,
        claims=claims,
    )
    view = ClaimView(ledger=book)
    for node, why in sorted(book.broken.items()):
        view.warnings.append(f"node {node}: {why}")
    for node, record in sorted(book.records.items()):
        view.records[node] = {g: dict(d) for g, d in record.claims.items()}
        for claimant, devices in record.claims.items():
            for res, ids in devices.items():
                for i in ids:
                    view.holders[(node, res, i)][claimant].add("record")
    for group in sorted(groups, key=group_name):
        if not is_bound(group):
            continue
        name = group_name(group)
        held = book.statuses.get(name)
        if held is None:
            view.warnings.append(f"group {name}: status.selectedDevices is malformed")
            continue
        node, devices = held
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


#: The ``source`` of a resource in the device map's data, per inventory source.
SOURCE_NAMES: Final = MappingProxyType(
    {SOURCE_COUNT: "allocatable", SOURCE_ANNOTATION: "annotation", SOURCE_SLICE: "resourceslices"}
)


def _source_words(source: str, resource: str) -> str:
    if source == "allocatable":
        return "counted in status.allocatable: IDs are guessed"
    if source == "annotation":
        return f"from node annotation {annotation_key(resource)}"
    return "from DRA ResourceSlices"


def _source_text(offer: Offer) -> str:
    return _source_words(SOURCE_NAMES.get(offer.source, offer.source), offer.resource)


def _physical_uuids(group: Obj, devices: Devices, offers: Mapping[str, Offer]) -> dict[str, Any]:
    """Resource -> the UUIDs of the group's devices (status.physicalDevices, else the
    inventory's), null where unknown."""
    recorded = (group.get("status") or {}).get("physicalDevices") or {}
    out: dict[str, Any] = {}
    for res, ids in sorted(devices.items()):
        offer = offers.get(res)
        known = recorded.get(res) or ",".join((offer.uuids(ids) or []) if offer else [])
        out[res] = known.split(",") if known else None
    return out


def _physical_text(group: Obj, devices: Devices, offers: Mapping[str, Offer]) -> str:
    recorded = (group.get("status") or {}).get("physicalDevices") or {}
    parts = []
    for res, ids in sorted(devices.items()):
        offer = offers.get(res)
        known = recorded.get(res) or ",".join((offer.uuids(ids) or []) if offer else [])
        where = _source_text(offer) if offer else "the node offers none now"
        parts.append(f"{res} {known} ({where})" if known else f"{res} unknown ({where})")
    return "; ".join(parts) or NONE


def inventory_entries(nodes: Iterable[Obj], slices: Iterable[Obj] = ()) -> list[dict[str, Any]]:
    """Per shared node and resource: how many devices, how many unhealthy, which source."""
    by_slices = _slices_of(slices)
    out = []
    for obj in sorted(nodes, key=node_name):
        if not _is_shared(obj):
            continue
        for res, offer in sorted(node_offers(obj, by_slices.get(node_name(obj), ())).items()):
            out.append(
                {
                    "node": node_name(obj),
                    "resource": res,
                    "devices": len(offer.devices),
                    "unhealthy": len(offer.devices) - len(offer.usable()),
                    "source": SOURCE_NAMES.get(offer.source, offer.source),
                    "problem": offer.problem or None,
                }
            )
    return out


def _inventory_line(entry: Mapping[str, Any]) -> str:
    health = f", {entry['unhealthy']} unhealthy" if entry["unhealthy"] else ""
    note = f"; {entry['problem']}" if entry["problem"] else ""
    words = _source_words(entry["source"], entry["resource"])
    count = f"{entry['devices']} device(s){health}"
    return f"{entry['node']} {entry['resource']}: {count}, {words}{note}"


def inventory_lines(nodes: Iterable[Obj], slices: Iterable[Obj] = ()) -> list[str]:
    """One line per shared node and resource: how many devices, from which source."""
    return [_inventory_line(e) for e in inventory_entries(nodes, slices)]


# --- sdg devices ------------------------------------------------------------------------------


def device_map(
    nodes: Iterable[Obj],
    groups: Iterable[Obj],
    configmaps: Iterable[Obj],
    slices: Iterable[Obj] = (),
    pods: Iterable[Obj] = (),
    claims: Iterable[Obj] = (),
) -> dict[str, Any]:
    """The device map as data (``sdg devices -o json``), what every view of it draws.

    ``nodes``: every shared node and any node holding claims, by name, each with its
    ``resources``; each resource with its inventory ``source`` (``allocatable``: a count,
    IDs guessed; ``annotation``; ``resourceslices``; null when the node offers none) and
    its ``devices``: ``id``, ``uuid`` (null when unknown), ``groups`` holding it (none when
    free, two or more on a conflict), ``heldBy`` (who else holds it: a pod the kubelet
    gave it, a ResourceClaim; null), ``state`` (see :func:`devices_view`) and ``pods``
    (the holding group's status.allocatedPods, or the pod holding it; null when free, on
    a conflict or when the group does not exist). Then ``pendingGroups``, ``inventory``
    and ``warnings``. ``pods`` and ``claims`` (every pod, every ResourceClaim) let the
    map show what the kubelet's and DRA's books give outside any group.
    """
    nodes, groups, slices = list(nodes), list(groups), list(slices)
    by_slices = _slices_of(slices)
    by_node = {node_name(n): n for n in nodes}
    by_group = {group_name(g): g for g in groups}
    all_offers = {name: node_offers(obj, by_slices.get(name, ())) for name, obj in by_node.items()}
    view = claim_view(groups, configmaps, all_offers, pods, claims)
    shown = sorted({n for n, obj in by_node.items() if _is_shared(obj)} | view.nodes())

    out_nodes: list[dict[str, Any]] = []
    warnings = list(view.warnings)
    for node in shown:
        obj = by_node.get(node)
        offers = all_offers.get(node, {})
        held_by = view.ledger.view(node).holders
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
        resources = []
        for res in sorted(set(capacity) | view.resources_on(node) | too_many):
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
            devices = []
            for i in sorted(listed_ids | held):
                device = offer.device(i) if offer else None
                holders, state, users = _device_state(view, by_group, node, res, i, usable)
                other = held_by.get((res, i))
                if not holders and isinstance(other, ResourceClaim | Pod):
                    state = "in-use"
                    users = [f"{other.namespace}/{other.name}"] if isinstance(other, Pod) else None
                devices.append(
                    {
                        "id": i,
                        "uuid": (device.uuid if device else "") or None,
                        "groups": holders,
                        "heldBy": describe(other) if state == "in-use" and other else None,
                        "state": state,
                        "pods": users,
                    }
                )
            source = SOURCE_NAMES.get(offer.source, offer.source) if offer else None
            resources.append({"resource": res, "source": source, "devices": devices})
        out_nodes.append(
            {
                "name": node,
                "found": obj is not None,
                "shared": obj is not None and _is_shared(obj),
                "problems": node_problems(obj) if obj else [],
                "resources": resources,
            }
        )
    warnings += _cross_check(view, by_group)
    return {
        "nodes": out_nodes,
        "pendingGroups": sorted(name for name, g in by_group.items() if not is_bound(g)),
        "inventory": inventory_entries(by_node.values(), slices),
        "warnings": warnings,
    }


def _device_state(
    view: ClaimView, by_group: Mapping[str, Obj], node: str, res: str, i: int, usable: set[int]
) -> tuple[list[str], str, list[str] | None]:
    """The groups holding one device ID, its STATE, and the pods of its one group."""
    holders = view.holders.get((node, res, i)) or {}
    holders = {g: s for g, s in holders.items() if s}
    if not holders:
        return [], "free" if i in usable else "unhealthy", None
    if len(holders) > 1:
        return sorted(holders), "conflict", None
    ((group, sources),) = holders.items()
    if i not in usable:
        state = "missing"
    elif sources == {"record", "status"}:
        state = "held"
    elif sources == {"record"}:
        state = "record-only"
    else:
        state = "status-only"
    return [group], state, _allocated_pods(by_group[group]) if group in by_group else None


def _pending_line(data: Mapping[str, Any]) -> str | None:
    pending = data["pendingGroups"]
    if not pending:
        return None
    return "Pending groups (hold no devices; sdg explain GROUP says why): " + ", ".join(pending)


def _warnings_section(warnings: Sequence[str]) -> str | None:
    return "Warnings:\n" + "\n".join(f"  {w}" for w in warnings) if warnings else None


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
    inventory or unhealthy), ``unhealthy`` for a free device the inventory marks so,
    ``in-use`` for one the kubelet gave a pod outside any group or DRA allocated to a
    ResourceClaim (GROUP then names it). A UUID
    column appears when the inventory identifies devices; the Inventory section says, per
    node and resource, where the devices come from (IDs counted from allocatable are
    guessed).
    """
    return render_device_table(device_map(nodes, groups, configmaps, slices))


def render_device_table(data: Mapping[str, Any]) -> str:
    """:func:`devices_view`'s text from :func:`device_map`'s data."""
    rows: list[tuple[str, ...]] = []
    for node in data["nodes"]:
        if not node["resources"]:
            rows.append((node["name"], NONE, "-", "", "-", "-", "-"))
        for r in node["resources"]:
            for d in r["devices"]:
                pods = "-" if d["pods"] is None else _pods_cell(d["pods"])
                group = ",".join(d["groups"]) or d.get("heldBy") or "-"
                cells = (str(d["id"]), d["uuid"] or "", group, d["state"], pods)
                rows.append((node["name"], r["resource"], *cells))
    headers = ["NODE", "RESOURCE", "ID", "UUID", "GROUP", "STATE", "PODS"]
    if not any(r[3] for r in rows):
        # No device is identified: no UUID column (count-only inventories).
        headers.remove("UUID")
        rows = [(*r[:3], *r[4:]) for r in rows]
    inventory = [_inventory_line(e) for e in data["inventory"]]
    return _join_sections(
        table(headers, rows)
        if rows
        else f"No shared nodes: label a node {NODE_MODE_LABEL}={NODE_MODE_SHARED} to offer "
        "its devices.",
        _pending_line(data),
        "Inventory:\n" + "\n".join(f"  {line}" for line in inventory) if inventory else None,
        _warnings_section(data["warnings"]),
    )


# --- sdg get ----------------------------------------------------------------------------------

GROUP_HEADERS: Final = ("NAME", "PHASE", "READY", "NODE", "DEVICES", "PODS", "AGE")


def human_age(seconds: float) -> str:
    """kubectl's AGE (apimachinery's HumanDuration): 90s, 5m3s, 42m, 3h12m, 4d6h, 2y15d."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    m = s // 60
    if m < 10:
        return f"{m}m{s % 60}s" if s % 60 else f"{m}m"
    if m < 180:
        return f"{m}m"
    h = m // 60
    if h < 8:
        return f"{h}h{m % 60}m" if m % 60 else f"{h}h"
    if h < 48:
        return f"{h}h"
    if h < 24 * 8:
        return f"{h // 24}d{h % 24}h" if h % 24 else f"{h // 24}d"
    d = h // 24
    if h < 24 * 365 * 2:
        return f"{d}d"
    if h < 24 * 365 * 8:
        return f"{d // 365}y{d % 365}d" if d % 365 else f"{d // 365}y"
    return f"{d // 365}y"


def _parse_time(text: Any) -> datetime | None:
    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        return None


def group_row(group: Obj, now: datetime) -> tuple[str, ...]:
    """One ``sdg get`` row: the columns of ``kubectl get sdg`` (blank where unset)."""
    status = group.get("status") or {}
    ready = find_condition(status.get("conditions"), CONDITION_READY)
    summary = status.get("deviceSummary")
    if summary is None and status.get("selectedDevices"):
        summary = " ".join(f"{r}={ids}" for r, ids in sorted(status["selectedDevices"].items()))
    created = _parse_time((group.get("metadata") or {}).get("creationTimestamp"))
    count = status.get("podCount")
    return (
        group_name(group),
        str(status.get("phase") or ""),
        str((ready or {}).get("status") or ""),
        str(status.get("nodeName") or ""),
        str(summary or ""),
        "" if count is None else str(count),
        human_age((now - created).total_seconds()) if created else "<unknown>",
    )


def column_widths(
    rows: Iterable[Sequence[str]], headers: Sequence[str] = GROUP_HEADERS
) -> list[int]:
    """The widths :func:`table` gives these columns (a watch keeps them for later rows)."""
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    return widths


def table_line(row: Sequence[str], widths: Sequence[int]) -> str:
    """One row laid out like :func:`table` with ``widths`` (wider cells push on)."""
    return "   ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()


def groups_table(groups: Iterable[Obj], now: datetime) -> str:
    """``sdg get``: one row per group, by name, as ``kubectl get sdg`` prints them."""
    rows = [group_row(g, now) for g in sorted(groups, key=group_name)]
    return table(GROUP_HEADERS, rows) + "\n"


# --- -o json | yaml ---------------------------------------------------------------------------


def without_managed_fields(obj: Obj) -> dict[str, Any]:
    """The object as ``kubectl get -o yaml`` shows it: no metadata.managedFields."""
    out = dict(obj)
    if isinstance(out.get("metadata"), Mapping) and "managedFields" in out["metadata"]:
        out["metadata"] = {k: v for k, v in out["metadata"].items() if k != "managedFields"}
    return out


def object_list(items: Iterable[Obj]) -> dict[str, Any]:
    """kubectl's ``-o json`` of several objects: a v1 List."""
    return {
        "apiVersion": "v1",
        "kind": "List",
        "items": [without_managed_fields(i) for i in items],
        "metadata": {"resourceVersion": ""},
    }


def render_data(data: Any, output: str) -> str:
    """``data`` as ``-o json`` (2-space indent) or ``-o yaml`` (block style, key order kept)."""
    if output == "json":
        return json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    if output == "yaml":
        import yaml

        return str(yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=100))
    raise ValueError(f"unknown output format {output!r}")


# --- sdg devices --grid -----------------------------------------------------------------------

#: Letters of the groups in the grid, given in the order of their names (no ``x``: that
#: marks a missing device); groups beyond these share :data:`MORE_GROUPS`.
GROUP_GLYPHS: Final = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwyz0123456789"
MORE_GROUPS: Final = "+"
#: Glyph and meaning of every cell that is not a group letter, in legend order.
CELL_KEY: Final = MappingProxyType(
    {
        ".": "free",
        "x": "missing or unhealthy",
        "!": "conflict (two groups)",
        "?": "only the claim record or only the status holds it",
        "o": "in use outside any group (a pod the kubelet gave it, a ResourceClaim)",
        "_": "no device with this ID",
    }
)
#: Devices per block of cells (a space between blocks, to count IDs by).
GRID_BLOCK: Final = 8
#: ANSI SGR styles: group backgrounds (red is kept for problems), then the cell states.
GROUP_STYLES: Final = (
    "30;42",
    "30;43",
    "97;44",
    "97;45",
    "30;46",
    "30;102",
    "30;103",
    "30;104",
    "30;105",
    "30;106",
    "30;47",
    "97;100",
)
_STATE_STYLES: Final = MappingProxyType({".": "2", "x": "1;31", "!": "1;97;41", "o": "1", "_": "2"})


def _paint(text: str, style: str | None, color: bool) -> str:
    return f"\033[{style}m{text}\033[0m" if color and style else text


def _wrap_words(words: Sequence[tuple[str, int]], width: int, label: str) -> list[str]:
    """``label`` then ``(text, visible length)`` items two spaces apart, wrapped at
    ``width``; continued lines are indented under the first item."""
    indent = " " * len(label)
    lines: list[str] = []
    line, used = label, len(label)
    for text, size in words:
        if used > len(indent) and used + 2 + size > width:
            lines.append(line)
            line, used = indent, len(indent)
        if used > len(indent):
            line, used = line + "  ", used + 2
        line, used = line + text, used + size
    lines.append(line)
    return lines


def devices_grid(data: Mapping[str, Any], *, width: int = 80, color: bool = False) -> str:
    """The device map as a grid: per node and resource a row of cells, one per device ID
    in ID order, each the letter of the group holding it (coloured by group when ``color``)
    or a mark for free, missing/unhealthy, conflict and one-source devices (the legend
    says which). Rows wrap at ``width`` in blocks of :data:`GRID_BLOCK`; a continued line
    starts with the ID of its first cell. Without ``color``: plain text, no ANSI codes."""
    holding = sorted(
        {
            g
            for n in data["nodes"]
            for r in n["resources"]
            for d in r["devices"]
            if d["state"] == "held"
            for g in d["groups"]
        }
    )
    letters = {
        g: GROUP_GLYPHS[i] if i < len(GROUP_GLYPHS) else MORE_GROUPS for i, g in enumerate(holding)
    }
    styles = {g: GROUP_STYLES[i % len(GROUP_STYLES)] for i, g in enumerate(holding)}

    def cell(d: Mapping[str, Any]) -> tuple[str, str | None]:
        state = d["state"]
        if state in ("free", "unhealthy", "missing", "conflict", "in-use"):
            glyph = {"free": ".", "conflict": "!", "in-use": "o"}.get(state, "x")
            return glyph, _STATE_STYLES[glyph]
        group = d["groups"][0]
        return ("?" if state != "held" else letters[group]), styles.get(group)

    rows: list[tuple[str, str, list[tuple[str, str | None]]]] = []
    for node in data["nodes"]:
        listed = [r for r in node["resources"] if r["devices"]]
        if not node["resources"]:
            rows.append((node["name"], NONE, []))
        for r in listed:
            by_id = {d["id"]: d for d in r["devices"]}
            cells = [
                cell(by_id[i]) if i in by_id else ("_", _STATE_STYLES["_"])
                for i in range(max(by_id) + 1)
            ]
            rows.append((node["name"], r["resource"], cells))
    if not rows:
        return _join_sections(
            f"No shared nodes: label a node {NODE_MODE_LABEL}={NODE_MODE_SHARED} to offer "
            "its devices.",
            _pending_line(data),
        )

    wn = max(len("NODE"), *(len(n) for n, _, _ in rows))
    wr = max(len("RESOURCE"), *(len(r) for _, r, _ in rows))
    prefix = wn + 3 + wr + 3
    per_line = max(1, (width - prefix + 1) // (GRID_BLOCK + 1)) * GRID_BLOCK
    lines = [f"{'NODE':<{wn}}   {'RESOURCE':<{wr}}   DEVICES"]
    used: set[str] = set()
    for node_text, res, cells in rows:
        head = f"{node_text:<{wn}}   {res:<{wr}}   "
        if not cells:
            lines.append(head.rstrip())
        for start in range(0, len(cells), per_line):
            chunk = cells[start : start + per_line]
            used.update(g for g, _ in chunk)
            blocks = []
            for b in range(0, len(chunk), GRID_BLOCK):
                runs: list[tuple[str, str | None]] = []
                for glyph, style in chunk[b : b + GRID_BLOCK]:
                    if runs and runs[-1][1] == style:
                        runs[-1] = (runs[-1][0] + glyph, style)
                    else:
                        runs.append((glyph, style))
                blocks.append("".join(_paint(t, s, color) for t, s in runs))
            lead = head if start == 0 else f"{start}: ".rjust(prefix)
            lines.append(lead + " ".join(blocks))

    groups_key = [
        (_paint(letters[g], styles[g], color) + " " + g, len(g) + 2)
        for g in holding
        if letters[g] != MORE_GROUPS
    ]
    if len(holding) > len(GROUP_GLYPHS):
        rest = len(holding) - len(GROUP_GLYPHS)
        more = f"{MORE_GROUPS} {rest} more groups (sdg devices lists them)"
        groups_key.append((more, len(more)))
    cells_key = [
        (_paint(glyph, _STATE_STYLES.get(glyph), color) + " " + text, len(text) + 2)
        for glyph, text in CELL_KEY.items()
        if glyph in used
    ]
    legend = []
    if groups_key:
        legend += _wrap_words(groups_key, width, "Groups: ")
    if cells_key:
        legend += _wrap_words(cells_key, width, "Cells:  ")
    return _join_sections(
        "\n".join(lines),
        "\n".join(legend),
        _pending_line(data),
        _warnings_section(data["warnings"]),
    )


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


def _env_text(
    resources: Iterable[str],
    devices: Mapping[str, Iterable[int]],
    told: Mapping[str, Sequence[str]] | None = None,
) -> str:
    parts = []
    for res in sorted(resources):
        var = env_var_for(res)
        names = (told or {}).get(res)
        ids = ",".join(names) if names is not None else format_ids(devices.get(res, ()))
        parts.append(f"{var}={ids}" if var else f"{res}: no default env var (--device-env)")
    return ", ".join(parts)


def _told(
    group: Obj, devices: Devices, offers: Mapping[str, Offer], delivery: Delivery
) -> tuple[dict[str, list[str]], dict[str, dict[str, Any]]]:
    """Per resource, the names the pod webhook gives pods (``--device-ids``: UUIDs from
    status.physicalDevices, or the IDs) and why, with whether the IDs are guessed."""
    recorded = (group.get("status") or {}).get("physicalDevices") or {}
    names: dict[str, list[str]] = {}
    facts: dict[str, dict[str, Any]] = {}
    for res, ids in sorted(devices.items()):
        var = env_var_for(res) or ""
        uuids = str(recorded.get(res) or "").split(",") if recorded.get(res) else None
        known = uuids is not None and len(uuids) == len(ids)
        uuid = by_uuid(delivery.device_ids, var, known=known)
        names[res] = list(uuids) if uuid and uuids else [str(i) for i in sorted(ids)]
        offer = offers.get(res)
        guessed = not uuid and offer is not None and offer.guessed
        reason = ids_reason(delivery.device_ids, var, known=known)
        if guessed and offer is not None:
            reason += f"; {_source_text(offer)}"
        facts[res] = {
            "names": names[res],
            "by": "uuid" if uuid else "index",
            "reason": reason,
            "guessed": guessed,
        }
    return names, facts


def _told_text(facts: Mapping[str, Mapping[str, Any]]) -> str:
    return "; ".join(f"{res} {f['reason']}" for res, f in sorted(facts.items())) or NONE


def _delivery_facts(choice: DeliveryChoice | Denial) -> dict[str, Any]:
    if isinstance(choice, Denial):
        return {"mode": None, "reason": choice.message, "verified": False, "settle": None}
    return {
        "mode": choice.mode,
        "reason": choice.reason,
        "verified": choice.verified,
        "settle": choice.settle or None,
    }


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
    return group_explanation(name, groups, nodes, configmaps, pods, slices)[0]


def explain_group_data(
    name: str,
    groups: Iterable[Obj],
    nodes: Iterable[Obj],
    configmaps: Iterable[Obj],
    pods: Iterable[Obj],
    slices: Iterable[Obj] = (),
) -> dict[str, Any]:
    """The facts behind :func:`explain_group` (``sdg explain GROUP -o json``): group,
    phase, node, devices, deviceUUIDs, summary, problems, nodes (Pending: each shared
    node's verdict now), pods (with the note on each) and conditions."""
    return group_explanation(name, groups, nodes, configmaps, pods, slices)[1]


def group_explanation(
    name: str,
    groups: Iterable[Obj],
    nodes: Iterable[Obj],
    configmaps: Iterable[Obj],
    pods: Iterable[Obj],
    slices: Iterable[Obj] = (),
    runtime_classes: Mapping[str, Obj] | None = None,
    delivery: Delivery | None = None,
    holders: bool | None = None,
) -> tuple[str, dict[str, Any]]:
    """:func:`explain_group`'s text and :func:`explain_group_data`'s facts, made together.

    ``delivery`` is the manager's delivery settings (default: its defaults) and
    ``runtime_classes`` the RuntimeClasses known by name: with the group's node they say
    how its pods get their devices (the pod webhook's rule) and by which names.
    ``holders``: whether the manager runs holder pods (None: unknown), which a pinned
    group's verdict per node depends on."""
    delivery = delivery if delivery is not None else Delivery()
    groups, nodes = list(groups), list(nodes)
    configmaps, pods, slices = list(configmaps), list(pods), list(slices)
    by_group = {group_name(g): g for g in groups}
    group = by_group.get(name)
    if group is None:
        known = ", ".join(sorted(by_group)) or NONE
        text = f'SharedDeviceGroup "{name}" not found. Groups: {known}\n'
        return text, {"group": name, "found": False, "groups": sorted(by_group)}
    by_node = {node_name(n): n for n in nodes}
    view = claim_view(groups, configmaps)
    spec = group.get("spec") or {}
    resources = group_resources(group)
    selector = spec.get("nodeSelector") or {}
    meta = group.get("metadata") or {}
    allocated = _allocated_pods(group)

    info = [("Name", name), ("Phase", group_phase(group))]
    problems: list[str] = []
    facts: dict[str, Any] = {"group": name, "found": True, "phase": group_phase(group)}
    facts.update(node=None, devices={}, deviceUUIDs=None)
    if is_bound(group):
        node, devices = view.statuses.get(name, (str(group_node(group)), {}))
        facts.update(node=node, devices={r: sorted(i) for r, i in sorted(devices.items())})
        obj = by_node.get(node)
        offers = node_offers(obj, _slices_of(slices).get(node, ())) if obj is not None else {}
        told, told_facts = _told(group, devices, offers, delivery)
        info += [
            ("Node", node),
            ("Devices", f"{_devices_text(devices)} ({_env_text(resources, devices, told)})"),
        ]
        env_vars = [v for r in sorted(resources) if (v := env_var_for(r)) is not None]
        choice = choose_delivery(obj, runtime_classes or {}, delivery, env_vars, name)
        facts.update(delivery=_delivery_facts(choice), deviceNames=told_facts)
        if obj is None:
            problems.append(f"node {node} does not exist any more; its pods cannot run")
        else:
            problems += [f"node {node} is {p}" for p in node_problems(obj)]
            info.append(("Device UUIDs", _physical_text(group, devices, offers)))
            facts["deviceUUIDs"] = _physical_uuids(group, devices, offers)
            too_many = unaddressable_devices(obj)
            for res, ids in sorted(devices.items()):
                offer = offers.get(res)
                if not ids:
                    continue
                if offer is None and res in too_many:
                    problems.append(
                        f"node {node} {_too_many_text(res, too_many[res])}; the group holds "
                        f"{res} {format_ids(ids)}"
                    )
                elif offer is None:
                    problems.append(
                        f"node {node} offers no {res} now; the group holds {res} {format_ids(ids)}"
                    )
                elif offer.missing(ids):
                    problems.append(
                        f"node {node} no longer offers {', '.join(offer.missing(ids))} "
                        f"({_source_text(offer)}); the group holds {res} {format_ids(ids)}"
                    )
        info.append(("Told by", _told_text(told_facts)))
        if isinstance(choice, Denial):
            info.append(("Delivery", "none"))
            problems.append(choice.message)
        else:
            info.append(("Delivery", choice.describe()))
            if not choice.verified:
                info.append(("To settle it", choice.settle))
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

    facts.update(
        strategy=group_strategy(group),
        resources=dict(sorted(resources.items())),
        nodeSelector=dict(sorted(selector.items())),
        summary=summary.split("\nProblems:\n")[0],
        problems=problems,
        nodes=None,
    )
    nodes_section = None
    pins = spec_pins(spec)
    if pins:
        info.append(("Pinned", _pins_text(pins)))
    facts["pinned"] = {r: list(p) for r, p in sorted(pins.items())} or None
    if not is_bound(group) and resources:
        resolver = None
        if pins:
            by_slices = _slices_of(slices)
            inventory = {n: node_offers(o, by_slices.get(n, ())) for n, o in by_node.items()}
            book = claim_view(groups, configmaps, inventory, pods).ledger
            resolver = LedgerPins(book, name, holders=holders)
        nodes_section, facts["nodes"] = _nodes_now(spec, nodes, view, resolver)

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
    facts["pods"] = [
        {
            "pod": key,
            "phase": None if phase == "-" else phase,
            "node": None if node in ("-", NONE) else node,
            "note": note or None,
        }
        for key, phase, node, note in rows
    ]
    facts["conditions"] = list((group.get("status") or {}).get("conditions") or [])
    text = _join_sections(
        fields(info), summary, nodes_section, pods_section, _conditions_section(group)
    )
    return text, facts


def _pins_text(pins: Mapping[str, Sequence[str]]) -> str:
    """``spec.devices`` for people: ``nvidia.com/gpu=GPU-a,GPU-b``."""
    return ", ".join(f"{r}={','.join(p)}" for r, p in sorted(pins.items()))


def _nodes_now(
    spec: Obj, nodes: Sequence[Obj], view: ClaimView, pins: LedgerPins | None = None
) -> tuple[str, list[dict[str, Any]]]:
    """Each shared node's verdict for the group right now (the scheduler's own filters,
    with ``pins`` for a group's pinned devices), as text and as ``{"node", "fits",
    "reason"}`` facts."""
    free: dict[str, dict[str, int]] = {}
    for node in nodes:
        name = node_name(node)
        free[name] = {
            res: view.free(name, res, cap) for res, cap in node_device_capacity(node).items()
        }
    decision = place(spec, nodes, free, pins=pins)
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
    verdicts = [{"node": n, "fits": fits == "yes", "reason": why} for n, fits, why in rows]
    return "\n".join(lines), verdicts


# --- sdg explain POD --------------------------------------------------------------------------


def explain_pod(
    pod: Obj, groups: Iterable[Obj], nodes: Iterable[Obj], pods: Iterable[Obj] = ()
) -> str:
    """Why a pod is not running on its group's node, or that it is, with which env.

    ``pods`` are other pods (those on the group's node are used for the fit check).
    """
    return pod_explanation(pod, groups, nodes, pods)[0]


def explain_pod_data(
    pod: Obj, groups: Iterable[Obj], nodes: Iterable[Obj], pods: Iterable[Obj] = ()
) -> dict[str, Any]:
    """The facts behind :func:`explain_pod` (``sdg explain pod/NAME -o json``): pod, group
    (its phase and node), scheduler, node, phase, verdict, env (per container: variable,
    value, what the group holds), warnings and conditions."""
    return pod_explanation(pod, groups, nodes, pods)[1]


def pod_explanation(
    pod: Obj, groups: Iterable[Obj], nodes: Iterable[Obj], pods: Iterable[Obj] = ()
) -> tuple[str, dict[str, Any]]:
    """:func:`explain_pod`'s text and :func:`explain_pod_data`'s facts, made together."""
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
    env: str | None = None
    rows: list[dict[str, Any]] = []
    warnings: list[str] = []
    if group is not None and is_bound(group):
        env = _env_section(pod, group)
        rows, warnings, _ = _env_facts(pod, group)
    facts = {
        "pod": pod_key(pod),
        "group": name,
        "groupFound": group is not None,
        "groupPhase": group_phase(group) if group is not None else None,
        "groupNode": group_node(group) if group is not None else None,
        "scheduler": scheduler,
        "node": node,
        "phase": phase,
        "verdict": verdict,
        "env": rows,
        "warnings": warnings,
        "conditions": [
            c for c in status.get("conditions") or () if c.get("type") in ("PodScheduled", "Ready")
        ],
    }
    conditions = _conditions_section(pod, ["PodScheduled", "Ready"])
    return _join_sections(info, verdict, env, conditions), facts


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


def _env_facts(pod: Obj, group: Obj) -> tuple[list[dict[str, Any]], list[str], list[str]]:
    """Per container and device env var: its value and what the group holds; the
    warnings where they differ; the resources without a known variable."""
    devices = view_devices(group)
    spec = pod.get("spec") or {}
    rows = []
    warnings = []
    unchecked = sorted(r for r in group_resources(group) if env_var_for(r) is None)
    # The same devices by UUID (--device-ids), or none under CDI annotations (cdi mode).
    physical = (group.get("status") or {}).get("physicalDevices") or {}
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    by_cdi = any(str(k).startswith(CDI_ANNOTATION_FAMILIES) for k in annotations)
    for kind in ("initContainers", "containers"):
        for c in spec.get(kind) or ():
            env = {e.get("name"): e.get("value") for e in c.get("env") or ()}
            for res in sorted(group_resources(group)):
                var = env_var_for(res)
                if var is None:
                    continue
                want = format_ids(devices.get(res, ()))
                got = env.get(var)
                rows.append(
                    {"container": c.get("name", ""), "variable": var, "value": got, "want": want}
                )
                if got is None and not by_cdi:
                    warnings.append(
                        f"container {c.get('name')}: {var} is unset, the group holds {res} "
                        f"{want} (the pod webhook did not inject it: was it installed and "
                        "reachable when the pod was created?)"
                    )
                elif got != want and got != physical.get(res) and not (by_cdi and not got):
                    warnings.append(
                        f"container {c.get('name')}: {var} is {got}, the group holds {res} {want}"
                    )
    return rows, warnings, unchecked


def _env_section(pod: Obj, group: Obj) -> str:
    """The device env of every container against what the group holds."""
    facts, warnings, unchecked = _env_facts(pod, group)
    rows = [
        (r["container"], r["variable"], NONE if r["value"] is None else r["value"]) for r in facts
    ]
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

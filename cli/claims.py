"""The claim view of ``sdg devices`` and ``sdg explain``: the fenced claim records
cross-checked with group statuses, read through the manager's own ledger, so an operator
sees where the two disagree; and each shared node's inventory."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final

from api.constants import MAX_DEVICES_PER_RESOURCE
from api.nodes import is_shared, node_name
from api.v1alpha1 import (
    group_name,
    group_phase,
    is_bound,
)
from cli.render import NONE, devices_text
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
from sdgruntime.kinds import Obj, spec_of, status_of

# --- the claim view: records cross-checked with group statuses --------------------------------


def allocated_pods(group: Obj | None) -> list[str]:
    return list(status_of(group).get("allocatedPods") or [])


def too_many_text(res: str, count: int) -> str:
    return (
        f"advertises {count} {res}, more than the {MAX_DEVICES_PER_RESOURCE} devices SDG "
        "addresses per node, so it offers none (not a device count)"
    )


def node_problems(node: Obj) -> list[str]:
    """Why a node may not run pods now: not Ready, cordoned (taints are per pod)."""
    problems = []
    for cond in status_of(node).get("conditions") or ():
        if cond.get("type") == "Ready" and cond.get("status") != "True":
            why = cond.get("reason") or f"Ready={cond.get('status')}"
            problems.append(f"not Ready ({why})")
    if spec_of(node).get("unschedulable"):
        problems.append("cordoned (spec.unschedulable)")
    return problems


# --- -o json | yaml ---------------------------------------------------------------------------


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


def cross_check(view: ClaimView, by_group: Mapping[str, Obj]) -> list[str]:
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
            where = "; ".join(f"{n} ({devices_text(d)})" for n, d in places)
            out.append(f"group {name}: claim records on several nodes: {where}")
        if name not in by_group:
            for node, devices in places:
                out.append(
                    f"group {name}: does not exist, but the claim record of node {node} "
                    f"still holds {devices_text(devices)} for it"
                )
            continue
        if status is None:
            for node, devices in places:
                out.append(
                    f"group {name}: {group_phase(by_group[name])}, but the claim record of node "
                    f"{node} holds {devices_text(devices)} for it (binding in progress, or "
                    "its status was lost)"
                )
            continue
        node, devices = status
        if not places:
            out.append(
                f"group {name}: Bound on {node} ({devices_text(devices)}), but no claim record "
                "lists it"
            )
        elif len(places) == 1 and places[0] != (node, devices):
            out.append(
                f"group {name}: status says {node} ({devices_text(devices)}), the claim record "
                f"says {places[0][0]} ({devices_text(places[0][1])})"
            )
    return out


def slices_of(slices: Iterable[Obj]) -> dict[str, list[Obj]]:
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


def source_text(offer: Offer) -> str:
    return _source_words(SOURCE_NAMES.get(offer.source, offer.source), offer.resource)


def physical_uuids(group: Obj, devices: Devices, offers: Mapping[str, Offer]) -> dict[str, Any]:
    """Resource -> the UUIDs of the group's devices (status.physicalDevices, else the
    inventory's), null where unknown."""
    recorded = status_of(group).get("physicalDevices") or {}
    out: dict[str, Any] = {}
    for res, ids in sorted(devices.items()):
        offer = offers.get(res)
        known = recorded.get(res) or ",".join((offer.uuids(ids) or []) if offer else [])
        out[res] = known.split(",") if known else None
    return out


def physical_text(group: Obj, devices: Devices, offers: Mapping[str, Offer]) -> str:
    recorded = status_of(group).get("physicalDevices") or {}
    parts = []
    for res, ids in sorted(devices.items()):
        offer = offers.get(res)
        known = recorded.get(res) or ",".join((offer.uuids(ids) or []) if offer else [])
        where = source_text(offer) if offer else "the node offers none now"
        parts.append(f"{res} {known} ({where})" if known else f"{res} unknown ({where})")
    return "; ".join(parts) or NONE


def inventory_entries(nodes: Iterable[Obj], slices: Iterable[Obj] = ()) -> list[dict[str, Any]]:
    """Per shared node and resource: how many devices, how many unhealthy, which source."""
    by_slices = slices_of(slices)
    out = []
    for obj in sorted(nodes, key=node_name):
        if not is_shared(obj):
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


def inventory_line(entry: Mapping[str, Any]) -> str:
    health = f", {entry['unhealthy']} unhealthy" if entry["unhealthy"] else ""
    note = f"; {entry['problem']}" if entry["problem"] else ""
    words = _source_words(entry["source"], entry["resource"])
    count = f"{entry['devices']} device(s){health}"
    return f"{entry['node']} {entry['resource']}: {count}, {words}{note}"


def inventory_lines(nodes: Iterable[Obj], slices: Iterable[Obj] = ()) -> list[str]:
    """One line per shared node and resource: how many devices, from which source."""
    return [inventory_line(e) for e in inventory_entries(nodes, slices)]

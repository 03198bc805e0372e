"""Choose a node for a SharedDeviceGroup: Filter, then Score, as kube-scheduler does.

Pure: takes the group spec, decoded Node objects and free device counts (the
DeviceTracker, or a plain mapping), returns a ``PlacementDecision`` that says which node
won, why every other node was filtered, and every score — enough for the Pending
condition message, the Event and the trace span without recomputing anything.

The caller keeps the tracker's capacities in step with the nodes' ``status.allocatable``
(``node_device_capacity``, which also caps what one node may offer); "lacks the resource"
is judged from the Node itself. Work per node is bounded by the requested resources, never
by a device count.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from api.constants import (
    FILTERING_TAINT_EFFECTS,
    MAX_DEVICES_PER_RESOURCE,
    NODE_MODE_LABEL,
    NODE_MODE_SHARED,
    SHARED_TAINT_KEY,
    SHARED_TAINT_VALUE,
)
from api.validation import is_resource_name
from controllers.quantity import parse_quantity


class FreeCounts(Protocol):
    """Anything that can say how many devices are free (``DeviceTracker`` is one)."""

    def free(self, node: str, resource: str) -> int: ...


class _MappingFree:
    def __init__(self, counts: Mapping[str, Mapping[str, int]]) -> None:
        self._counts = counts

    def free(self, node: str, resource: str) -> int:
        return int(self._counts.get(node, {}).get(resource, 0))


@dataclass(frozen=True)
class PlacementDecision:
    """The outcome of one placement run.

    ``scores`` is higher-is-better (binpack: minus the free devices left after placement;
    spread: plus), ``free_after`` the raw sum behind it. ``ranked`` lists feasible nodes
    best first; ties are broken by node name, so the result is deterministic.
    """

    node: str | None
    strategy: str
    candidates: int
    reasons: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    scores: Mapping[str, int] = field(default_factory=dict)
    free_after: Mapping[str, int] = field(default_factory=dict)
    ranked: tuple[str, ...] = ()

    @property
    def feasible(self) -> int:
        return len(self.ranked)

    def message(self) -> str:
        return pending_message(self)


def node_name(node: Mapping[str, Any]) -> str:
    return str((node.get("metadata") or {}).get("name") or "")


def _is_device_resource(res: str) -> bool:
    """Extended resources are devices; native ones (cpu, ``*kubernetes.io/*``) are not."""
    prefix = res.partition("/")[0]
    return (
        is_resource_name(res)
        and prefix != "kubernetes.io"
        and not prefix.endswith(".kubernetes.io")
    )


def node_device_capacity(node: Mapping[str, Any]) -> dict[str, int]:
    """Device counts a node offers: its extended resources in ``status.allocatable``.

    The one place that decides what a node offers (the tracker is fed from it). Native
    resources (cpu, memory, ``*kubernetes.io/*``) are not devices; a malformed or fractional
    count offers nothing rather than guessing; so does a count above
    ``MAX_DEVICES_PER_RESOURCE``: that is a resource counted in bytes or a typo, not
    devices, and clamping it would hand out IDs of something else. Every per-device loop
    and allocation is bounded by this cap.
    """
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    out: dict[str, int] = {}
    for res, qty in allocatable.items():
        if _is_device_resource(res):
            count = _device_count(qty)
            out[res] = count if count <= MAX_DEVICES_PER_RESOURCE else 0
    return out


def unaddressable_devices(node: Mapping[str, Any]) -> dict[str, int]:
    """Device resources the node advertises more of than SDG addresses, with the count
    advertised (``node_device_capacity`` offers none of them); for explaining."""
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    out: dict[str, int] = {}
    for res, qty in allocatable.items():
        if _is_device_resource(res) and (count := _device_count(qty)) > MAX_DEVICES_PER_RESOURCE:
            out[res] = count
    return out


def too_many_devices_reason(resource: str, count: int) -> str:
    """The filter reason (and ``sdg`` warning) for a count above the per-node cap; reads
    after a node count, kube-scheduler style ("2 advertise ...")."""
    return (
        f"advertise {count} {resource}, more than the {MAX_DEVICES_PER_RESOURCE} devices "
        "SDG addresses per node"
    )


def _device_count(qty: Any) -> int:
    try:
        value = parse_quantity(qty)
    except ValueError:
        return 0
    return int(value) if value.denominator == 1 and value > 0 else 0


def _no_devices_reason(node: Mapping[str, Any], res: str) -> str:
    """Why ``node`` offers no ``res``: it lacks it, or advertises more than the cap."""
    qty = ((node.get("status") or {}).get("allocatable") or {}).get(res)
    if qty is not None and _is_device_resource(res):
        count = _device_count(qty)
        if count > MAX_DEVICES_PER_RESOURCE:
            return too_many_devices_reason(res, count)
    return f"have no {res}"


def is_shared_taint(taint: Mapping[str, Any]) -> bool:
    """The taint that keeps other pods off shared nodes; group pods tolerate it."""
    return taint.get("key") == SHARED_TAINT_KEY and taint.get("value", "") == SHARED_TAINT_VALUE


def is_node_ready(node: Mapping[str, Any]) -> bool:
    """False only when a Ready condition exists and is not True (no conditions: trust taints)."""
    for cond in (node.get("status") or {}).get("conditions") or ():
        if cond.get("type") == "Ready":
            return cond.get("status") == "True"
    return True


#: node name -> resource -> why the resource must not be placed there now (caller's text).
Blocked = Mapping[str, Mapping[str, str]]


def filter_node(
    spec: Mapping[str, Any],
    node: Mapping[str, Any],
    free: FreeCounts,
    blocked: Blocked | None = None,
) -> tuple[str, ...]:
    """Why the group cannot go to ``node`` (empty when it can).

    Filters run in a fixed order and stop at the first that fails, except the device
    filter, which names every short resource (as kube-scheduler's NodeResourcesFit does).
    Groups carry no tolerations except for the shared-node taint (``is_shared_taint``),
    so any other NoSchedule/NoExecute taint filters the node. ``blocked`` names resources
    the caller knows are used outside SDG (node -> resource -> reason); such a resource
    fails with that reason before its free count is looked at.
    """
    wanted = sorted((spec.get("resources") or {}).items())
    node_blocked = blocked.get(node_name(node)) if blocked else None
    return _filter(spec, wanted, node, free, _capacity_of(free), node_blocked)[0]


_NOT_PARSED: Mapping[str, int] = {}  # _filter's, when the tracker knows the capacity


def _capacity_of(free: object) -> Callable[[str, str], int] | None:
    """A tracker already knows each node's capacity (the node informer keeps it current):
    reading it there instead of re-parsing status.allocatable made placement at 1000
    nodes ~3x faster (hack/bench/RESULTS.md). None: parse the Node."""
    known = getattr(free, "capacity", None)
    return known if callable(known) else None


def _filter(
    spec: Mapping[str, Any],
    wanted: list[tuple[str, int]],
    node: Mapping[str, Any],
    free: FreeCounts,
    known_capacity: Callable[[str, str], int] | None,
    node_blocked: Mapping[str, str] | None,
) -> tuple[tuple[str, ...], int]:
    """``filter_node``'s reasons and, when it fits, the free devices left after placement."""
    meta = node.get("metadata") or {}
    labels = meta.get("labels") or {}
    if labels.get(NODE_MODE_LABEL) != NODE_MODE_SHARED:
        return (f"not labelled {NODE_MODE_LABEL}={NODE_MODE_SHARED}",), 0
    selector = spec.get("nodeSelector")
    if selector and any(labels.get(k) != v for k, v in selector.items()):
        return ("didn't match the group's nodeSelector",), 0
    node_spec = node.get("spec") or {}
    if node_spec.get("unschedulable"):
        return ("unschedulable (cordoned)",), 0
    if not is_node_ready(node):
        return ("not Ready",), 0
    for taint in node_spec.get("taints") or ():
        if taint.get("effect") in FILTERING_TAINT_EFFECTS and not is_shared_taint(taint):
            return (
                f"have untolerated taint {{{taint.get('key', '')}: {taint.get('value', '')}}}",
            ), 0
    name = str(meta.get("name") or "")
    parsed = node_device_capacity(node) if known_capacity is None else _NOT_PARSED
    short: list[str] = []
    left = 0
    for res, need in wanted:
        capacity = parsed.get(res, 0) if known_capacity is None else known_capacity(name, res)
        if capacity <= 0:
            short.append(_no_devices_reason(node, res))
            continue
        if node_blocked and res in node_blocked:
            short.append(node_blocked[res])
            continue
        available = free.free(name, res)
        if available < need:
            short.append(f"have {available} free {res} (need {need})")
        left += available - need
    return tuple(short), left


def place(
    spec: Mapping[str, Any],
    nodes: Iterable[Mapping[str, Any]],
    free: FreeCounts | Mapping[str, Mapping[str, int]],
    blocked: Blocked | None = None,
) -> PlacementDecision:
    """Filter and score every node for a group spec; pick the best (or none).

    binpack scores a node by the fewest free devices left after placement (summed over
    the requested resources), spread by the most. ``blocked`` is as for ``filter_node``.
    Raises ValueError for a spec without resources (the CRD forbids it; a caller must not
    bind such a group).
    """
    resources = spec.get("resources") or {}
    if not resources:
        raise ValueError("group spec requests no resources")
    strategy = spec.get("schedulingStrategy") or "binpack"
    if strategy not in ("binpack", "spread"):
        raise ValueError(f"unknown schedulingStrategy {strategy!r}")
    counts: FreeCounts = free if hasattr(free, "free") else _MappingFree(free)
    wanted = sorted(resources.items())
    known_capacity = _capacity_of(counts)
    sign = -1 if strategy == "binpack" else 1
    reasons: dict[str, tuple[str, ...]] = {}
    scores: dict[str, int] = {}
    free_after: dict[str, int] = {}
    candidates = 0
    for node in nodes:
        candidates += 1
        name = node_name(node)
        node_blocked = blocked.get(name) if blocked else None
        why, left = _filter(spec, wanted, node, counts, known_capacity, node_blocked)
        if why:
            reasons[name] = why
            continue
        free_after[name] = left
        scores[name] = sign * left
    ranked = tuple(sorted(scores, key=lambda n: (-scores[n], n)))
    return PlacementDecision(
        node=ranked[0] if ranked else None,
        strategy=strategy,
        candidates=candidates,
        reasons=reasons,
        scores=scores,
        free_after=free_after,
        ranked=ranked,
    )


def pending_message(decision: PlacementDecision) -> str:
    """kube-scheduler style: ``0/5 nodes are available: 3 not labelled ..., 2 have ....``

    Identical reasons are grouped with counts, largest group first, then by text; a node
    with several short resources counts once per reason, as in kube-scheduler.
    """
    head = f"{decision.feasible}/{decision.candidates} nodes are available"
    if decision.candidates == 0:
        return (
            f"{head}: no nodes exist; label a node {NODE_MODE_LABEL}={NODE_MODE_SHARED} "
            "to offer its devices."
        )
    tally = Counter(r for why in decision.reasons.values() for r in why)
    if not tally:
        return f"{head}."
    parts = sorted(tally.items(), key=lambda kv: (-kv[1], kv[0]))
    return f"{head}: " + ", ".join(f"{n} {text}" for text, n in parts) + "."

"""Choose a node for a SharedDeviceGroup: Filter, then Score, as kube-scheduler does.

Pure: takes the group spec, decoded Node objects and free device counts (the
DeviceTracker, or a plain mapping), returns a ``PlacementDecision`` that says which node
won, why every other node was filtered, and every score — enough for the Pending
condition message, the Event and the trace span without recomputing anything.

The caller keeps the tracker's capacities in step with the nodes' ``status.allocatable``
(``node_device_capacity``); "lacks the resource" is judged from the Node itself.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from api.constants import FILTERING_TAINT_EFFECTS, NODE_MODE_LABEL, NODE_MODE_SHARED
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


def node_device_capacity(node: Mapping[str, Any]) -> dict[str, int]:
    """Device counts a node offers: its extended resources in ``status.allocatable``.

    Native resources (cpu, memory, ``*kubernetes.io/*``) are not devices; a malformed or
    fractional count offers nothing rather than guessing.
    """
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    out: dict[str, int] = {}
    for res, qty in allocatable.items():
        prefix = res.partition("/")[0]
        if (
            not is_resource_name(res)
            or prefix == "kubernetes.io"
            or prefix.endswith(".kubernetes.io")
        ):
            continue
        out[res] = _device_count(qty)
    return out


def _device_count(qty: Any) -> int:
    try:
        value = parse_quantity(qty)
    except ValueError:
        return 0
    return int(value) if value.denominator == 1 and value > 0 else 0


def is_node_ready(node: Mapping[str, Any]) -> bool:
    """False only when a Ready condition exists and is not True (no conditions: trust taints)."""
    for cond in (node.get("status") or {}).get("conditions") or ():
        if cond.get("type") == "Ready":
            return cond.get("status") == "True"
    return True


def _capacity_reader(free: object, node: Mapping[str, Any], name: str) -> Callable[[str], int]:
    """Device capacity of ``node`` per resource. A tracker already knows it (the node
    informer keeps it current): reading it there instead of re-parsing status.allocatable
    made placement at 1000 nodes ~3x faster (hack/bench/RESULTS.md)."""
    known = getattr(free, "capacity", None)
    if callable(known):
        return lambda res: int(known(name, res))
    parsed = node_device_capacity(node)
    return lambda res: parsed.get(res, 0)


def filter_node(
    spec: Mapping[str, Any], node: Mapping[str, Any], free: FreeCounts
) -> tuple[str, ...]:
    """Why the group cannot go to ``node`` (empty when it can).

    Filters run in a fixed order and stop at the first that fails, except the device
    filter, which names every short resource (as kube-scheduler's NodeResourcesFit does).
    Groups carry no tolerations, so any NoSchedule/NoExecute taint filters the node.
    """
    meta = node.get("metadata") or {}
    labels = meta.get("labels") or {}
    if labels.get(NODE_MODE_LABEL) != NODE_MODE_SHARED:
        return (f"not labelled {NODE_MODE_LABEL}={NODE_MODE_SHARED}",)
    selector = spec.get("nodeSelector") or {}
    if any(labels.get(k) != v for k, v in selector.items()):
        return ("didn't match the group's nodeSelector",)
    if (node.get("spec") or {}).get("unschedulable"):
        return ("unschedulable (cordoned)",)
    if not is_node_ready(node):
        return ("not Ready",)
    for taint in (node.get("spec") or {}).get("taints") or ():
        if taint.get("effect") in FILTERING_TAINT_EFFECTS:
            return (f"have untolerated taint {{{taint.get('key', '')}: {taint.get('value', '')}}}",)
    name = node_name(node)
    capacity = _capacity_reader(free, node, name)
    short: list[str] = []
    for res, need in sorted((spec.get("resources") or {}).items()):
        if capacity(res) <= 0:
            short.append(f"have no {res}")
            continue
        available = free.free(name, res)
        if available < need:
            short.append(f"have {available} free {res} (need {need})")
    return tuple(short)


def place(
    spec: Mapping[str, Any],
    nodes: Iterable[Mapping[str, Any]],
    free: FreeCounts | Mapping[str, Mapping[str, int]],
) -> PlacementDecision:
    """Filter and score every node for a group spec; pick the best (or none).

    binpack scores a node by the fewest free devices left after placement (summed over
    the requested resources), spread by the most. Raises ValueError for a spec without
    resources (the CRD forbids it; a caller must not bind such a group).
    """
    resources = spec.get("resources") or {}
    if not resources:
        raise ValueError("group spec requests no resources")
    strategy = spec.get("schedulingStrategy") or "binpack"
    if strategy not in ("binpack", "spread"):
        raise ValueError(f"unknown schedulingStrategy {strategy!r}")
    counts: FreeCounts = free if hasattr(free, "free") else _MappingFree(free)  # type: ignore[arg-type]
    reasons: dict[str, tuple[str, ...]] = {}
    scores: dict[str, int] = {}
    free_after: dict[str, int] = {}
    candidates = 0
    for node in nodes:
        candidates += 1
        name = node_name(node)
        why = filter_node(spec, node, counts)
        if why:
            reasons[name] = why
            continue
        left = sum(counts.free(name, res) - need for res, need in resources.items())
        free_after[name] = left
        scores[name] = -left if strategy == "binpack" else left
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

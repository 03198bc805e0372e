"""Choose a node for a SharedDeviceGroup: Filter, then Score, as kube-scheduler does.

Pure: takes the group spec, decoded Nodes and free device counts, returns a
``PlacementDecision`` (the winner, why every other node was filtered, every score): enough
for the Pending message, the Event and the span without recomputing anything. The caller
keeps the tracker's capacities in step with ``status.allocatable``
(``node_device_capacity``) and owns the ``NodeMemo`` that keeps what a Node alone decides
under its resourceVersion. Work per node is bounded by the requested resources, never by a
device count (docs/design.md, "Inside the controllers").
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from itertools import chain
from types import MappingProxyType
from typing import Any, Final, Protocol

from api.constants import (
    FILTERING_TAINT_EFFECTS,
    MAX_DEVICES_PER_RESOURCE,
    NODE_MODE_LABEL,
    NODE_MODE_SHARED,
    SHARED_TAINT_KEY,
    SHARED_TAINT_VALUE,
)
from api.nodes import has_shared_label
from api.v1alpha1 import spec_pins
from api.validation import is_resource_name
from controllers.ledger.tracker import DeviceTracker
from controllers.quantity import parse_quantity
from sdgruntime.kinds import status_of


class FreeCounts(Protocol):
    """Anything that can say how many devices are free (``DeviceTracker`` is one)."""

    def free(self, node: str, resource: str) -> int: ...


#: resource -> the pinned IDs or UUIDs of ``spec.devices``.
Pins = Mapping[str, tuple[str, ...]]


class PinResolver(Protocol):
    """Which IDs a node gives a group's pinned devices (``controllers.pinning``)."""

    def resolve(
        self, node: str, resource: str, pins: tuple[str, ...]
    ) -> tuple[tuple[int, ...], tuple[str, ...]]:
        """``(ids, ())`` when every pinned device is on ``node`` and free, else
        ``((), reasons)``: one filter reason per pin that is held, missing or unhealthy."""
        ...


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
    #: For a group with ``spec.devices``: per feasible node, the IDs its pins name there
    #: (what the reservation must take, never the lowest free).
    pinned: Mapping[str, Mapping[str, tuple[int, ...]]] = field(default_factory=dict)

    @property
    def feasible(self) -> int:
        return len(self.ranked)

    def message(self) -> str:
        return pending_message(self)


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
    allocatable = status_of(node).get("allocatable") or {}
    out: dict[str, int] = {}
    for res, qty in allocatable.items():
        if _is_device_resource(res):
            count = _device_count(qty)
            out[res] = count if count <= MAX_DEVICES_PER_RESOURCE else 0
    return out


def unaddressable_devices(node: Mapping[str, Any]) -> dict[str, int]:
    """Device resources the node advertises more of than SDG addresses, with the count
    advertised (``node_device_capacity`` offers none of them); for explaining."""
    allocatable = status_of(node).get("allocatable") or {}
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
    qty = (status_of(node).get("allocatable") or {}).get(res)
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
    for cond in status_of(node).get("conditions") or ():
        if cond.get("type") == "Ready":
            return cond.get("status") == "True"
    return True


#: node name -> resource -> why the resource must not be placed there now (caller's text).
Blocked = Mapping[str, Mapping[str, str]]

_NOT_SHARED: Final = (f"not labelled {NODE_MODE_LABEL}={NODE_MODE_SHARED}",)
_SELECTOR_MISS: Final = ("didn't match the group's nodeSelector",)
_CORDONED: Final = ("unschedulable (cordoned)",)
_NOT_READY: Final = ("not Ready",)
_EMPTY: Final[Mapping[str, Any]] = MappingProxyType({})


class _NodeFacts:
    """What the filters read from one Node that depends on the Node alone.

    Computed once per Node version (``_facts``) so a placement over a fleet does a few
    dict lookups per node instead of walking labels, conditions, taints and allocatable
    again for every group. The reason tuples are shared between decisions, so a filtered
    node costs no string building either. Only the device filter, which reads the
    tracker's changing free counts, runs every time.
    """

    __slots__ = (
        "_capacity",
        "_no_devices",
        "labels",
        "name",
        "node",
        "unfit",
        "unshared",
        "version",
    )

    def __init__(self, node: Mapping[str, Any], version: object) -> None:
        meta = node.get("metadata") or _EMPTY
        labels = meta.get("labels") or _EMPTY
        self.node = node
        self.version = version
        self.name = str(meta.get("name") or "")
        self.labels: Mapping[str, Any] = labels
        #: The first filter: not a shared node (then nothing else is looked at).
        self.unshared: tuple[str, ...] | None = None if has_shared_label(labels) else _NOT_SHARED
        #: The filters after the nodeSelector: cordon, Ready, taints (None: all pass).
        self.unfit: tuple[str, ...] | None = None if self.unshared else _static_unfit(node)
        self._capacity: dict[str, int] | None = None
        self._no_devices: dict[str, tuple[str, ...]] = {}

    def capacity(self) -> Mapping[str, int]:
        """``node_device_capacity``, parsed on first use (only without a tracker)."""
        if self._capacity is None:
            self._capacity = node_device_capacity(self.node)
        return self._capacity

    def no_devices(self, res: str) -> tuple[str, ...]:
        """``_no_devices_reason`` for ``res``, built once per node version."""
        why = self._no_devices.get(res)
        if why is None:
            why = self._no_devices[res] = (_no_devices_reason(self.node, res),)
        return why


def _static_unfit(node: Mapping[str, Any]) -> tuple[str, ...] | None:
    """Cordon, then Ready, then the first untolerated NoSchedule/NoExecute taint."""
    node_spec = node.get("spec") or _EMPTY
    if node_spec.get("unschedulable"):
        return _CORDONED
    if not is_node_ready(node):
        return _NOT_READY
    for taint in node_spec.get("taints") or ():
        if taint.get("effect") in FILTERING_TAINT_EFFECTS and not is_shared_taint(taint):
            return (f"have untolerated taint {{{taint.get('key', '')}: {taint.get('value', '')}}}",)
    return None


class NodeMemo:
    """Node name -> its facts at the version last seen; a new version or a new object
    replaces the entry. Owned by whoever places groups repeatedly over one fleet (the
    group scheduler holds one); ``place`` without one evaluates every node afresh.
    Bounded: ``place`` prunes names it was not given once the memo outgrows the fleet."""

    __slots__ = ("entries",)

    def __init__(self) -> None:
        self.entries: dict[str, _NodeFacts] = {}

    def __len__(self) -> int:
        return len(self.entries)

    def facts(self, node: Mapping[str, Any]) -> _NodeFacts:
        """The node's facts, from the memo when this very object at this resourceVersion
        was seen before.

        A resourceVersion names one content of an object (the API server's guarantee; the
        informer cache replaces a stored Node on update, never edits it), and the identity
        check keeps a copy someone edited without a new version from reusing old facts.
        A Node without a resourceVersion (hand-built, tests) is never memoised.
        """
        meta = node.get("metadata") or _EMPTY
        name = meta.get("name")
        version = meta.get("resourceVersion")
        entries = self.entries
        facts = entries.get(name) if type(name) is str else None
        if facts is not None and facts.node is node and facts.version == version:
            return facts
        facts = _NodeFacts(node, version)
        if version and type(name) is str:
            entries[name] = facts
        return facts

    def prune(self, seen: int, *names: Iterable[str]) -> None:
        """Forget nodes not in the last fleet once the memo holds many more than it
        (deleted nodes, other callers' lists): the memo stays within about the fleet's
        size, and the pass over it runs only when it has outgrown that."""
        entries = self.entries
        if len(entries) > seen + seen // 4 + 64:
            keep = {n: f for n in chain(*names) if (f := entries.get(n)) is not None}
            entries.clear()
            entries.update(keep)

    def clear(self) -> None:
        """Forget every memoised node (never needed for correctness)."""
        self.entries.clear()


def filter_node(
    spec: Mapping[str, Any],
    node: Mapping[str, Any],
    free: FreeCounts,
    blocked: Blocked | None = None,
    pins: PinResolver | None = None,
    memo: NodeMemo | None = None,
) -> tuple[str, ...]:
    """Why the group cannot go to ``node`` (empty when it can).

    Filters run in a fixed order and stop at the first that fails, except the device
    filter, which names every short resource (as kube-scheduler's NodeResourcesFit does).
    Groups carry no tolerations except for the shared-node taint (``is_shared_taint``),
    so any other NoSchedule/NoExecute taint filters the node. ``blocked`` names resources
    the caller knows are used outside SDG (node -> resource -> reason); such a resource
    fails with that reason before its free count is looked at. A resource the spec pins
    (``spec.devices``) fits only where ``pins`` finds every pinned device free.
    """
    pinned = _pins_of(spec, pins)
    facts = memo.facts(node) if memo is not None else _NodeFacts(node, None)
    selector = tuple((spec.get("nodeSelector") or _EMPTY).items())
    why = _static_reasons(facts, selector)
    if why is not None:
        return why
    wanted = sorted((spec.get("resources") or _EMPTY).items())
    node_blocked = blocked.get(facts.name) if blocked else None
    return _devices(
        facts, node, facts.name, wanted, free, _capacity_of(free), node_blocked, pinned, pins
    )[0]


def _pins_of(spec: Mapping[str, Any], pins: PinResolver | None) -> Pins:
    """The spec's pinned devices; a pinned spec without a resolver is a caller's bug (it
    would be placed as if nothing were pinned)."""
    pinned = spec_pins(spec)
    if pinned and pins is None:
        raise ValueError("a group with spec.devices is placed only with a PinResolver")
    return pinned


def _no_devices(facts: _NodeFacts | None, node: Mapping[str, Any], res: str) -> tuple[str, ...]:
    """Why the node offers no ``res``: memoised with its facts, or built (rare path)."""
    return facts.no_devices(res) if facts is not None else (_no_devices_reason(node, res),)


def _static_reasons(
    facts: _NodeFacts, selector: tuple[tuple[str, Any], ...]
) -> tuple[str, ...] | None:
    """The filters before the device filter, in order (None: all pass)."""
    if facts.unshared is not None:
        return facts.unshared
    if selector:
        labels = facts.labels
        for key, value in selector:
            if labels.get(key) != value:
                return _SELECTOR_MISS
    return facts.unfit


def _capacity_of(free: object) -> Callable[[str, str], int] | None:
    """A tracker already knows each node's capacity (the node informer keeps it current),
    so placement need not re-parse status.allocatable per node. None: parse the Node."""
    known = getattr(free, "capacity", None)
    return known if callable(known) else None


def _node_capacity(
    facts: _NodeFacts | None,
    node: Mapping[str, Any],
    name: str,
    res: str,
    known_capacity: Callable[[str, str], int] | None,
) -> int:
    """A node's count of ``res``: from the tracker when it knows, else the memoised facts,
    else parsed from the Node (unversioned Nodes are never memoised)."""
    if known_capacity is not None:
        return known_capacity(name, res)
    if facts is not None:
        return facts.capacity().get(res, 0)
    return node_device_capacity(node).get(res, 0)


def _devices(
    facts: _NodeFacts | None,
    node: Mapping[str, Any],
    name: str,
    wanted: list[tuple[str, int]],
    free: FreeCounts,
    known_capacity: Callable[[str, str], int] | None,
    node_blocked: Mapping[str, str] | None,
    pinned: Pins | None = None,
    pins: PinResolver | None = None,
    chosen: dict[str, tuple[int, ...]] | None = None,
) -> tuple[tuple[str, ...], int]:
    """The device filter's reasons (every short resource) and, when the node fits, the
    free devices left after placement, summed over the requested resources. A pinned
    resource fits only where ``pins`` resolves every pin; its IDs go into ``chosen``."""
    short: list[str] = []
    left = 0
    for res, need in wanted:
        capacity = _node_capacity(facts, node, name, res, known_capacity)
        if capacity <= 0:
            short.extend(_no_devices(facts, node, res))
            continue
        if node_blocked and res in node_blocked:
            short.append(node_blocked[res])
            continue
        wanted_pins = pinned.get(res) if pinned else None
        if wanted_pins is not None and pins is not None:
            if len(wanted_pins) != need:  # the CRD refuses such a spec
                short.append(f"cannot give {len(wanted_pins)} pinned {res} for a request of {need}")
                continue
            ids, why = pins.resolve(name, res, wanted_pins)
            if why:
                short.extend(why)
                continue
            if chosen is not None:
                chosen[res] = ids
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
    pins: PinResolver | None = None,
    memo: NodeMemo | None = None,
) -> PlacementDecision:
    """Filter and score every node for a group spec; pick the best (or none).

    binpack scores a node by the fewest free devices left after placement (summed over
    the requested resources), spread by the most. ``blocked`` is as for ``filter_node``.
    Raises ValueError for a spec without resources (the CRD forbids it; a caller must not
    bind such a group). A spec with ``spec.devices`` needs ``pins`` (``filter_node``);
    ``PlacementDecision.pinned`` then says which IDs each feasible node gives the pins.

    The same filters as ``filter_node``, written out in one loop because this runs over
    the whole fleet for every Pending group (hack/bench/bench_placement.py): per node, a
    memo lookup (``NodeMemo.facts``, inline) and, for the common one-resource request, the
    tracker's free count read inline, with no per-node list, tuple or string unless the
    node is short. tests/unit/test_placement_memo.py checks it decides as a plain
    filter-every-node reference does, on random fleets edited between calls.
    """
    resources = spec.get("resources") or {}
    if not resources:
        raise ValueError("group spec requests no resources")
    strategy = spec.get("schedulingStrategy") or "binpack"
    if strategy not in ("binpack", "spread"):
        raise ValueError(f"unknown schedulingStrategy {strategy!r}")
    counts: FreeCounts = free if hasattr(free, "free") else _MappingFree(free)
    pinned = _pins_of(spec, pins)
    pinned_ids: dict[str, Mapping[str, tuple[int, ...]]] = {}
    wanted = sorted(resources.items())
    known_capacity = _capacity_of(counts)
    selector = tuple((spec.get("nodeSelector") or _EMPTY).items())
    blocked_of = blocked.get if blocked else None
    free_of = counts.free
    ((res, need),) = wanted[:1]
    single = len(wanted) == 1 and not pinned
    # A DeviceTracker never counts more free than capacity, so a node with enough free
    # devices has the resource: its capacity need not be read first.
    trusted: DeviceTracker | None = (
        counts
        if type(counts) is DeviceTracker  # exactly: a subclass may count otherwise
        and single
        and type(need) is int
        and need > 0
        and blocked_of is None
        else None
    )
    short: dict[int, tuple[str, ...]] = {}  # one-resource reasons, shared per free count
    node_memo = memo if memo is not None else NodeMemo()
    memo_of = node_memo.entries
    reasons: dict[str, tuple[str, ...]] = {}
    free_after: dict[str, int] = {}
    candidates = 0
    facts: _NodeFacts | None
    for node in nodes:
        candidates += 1
        meta = node.get("metadata") or _EMPTY
        name = meta.get("name")
        version = meta.get("resourceVersion")
        if version and type(name) is str:  # NodeMemo.facts, inline
            facts = memo_of.get(name)
            if facts is None or facts.node is not node or facts.version != version:
                facts = memo_of[name] = _NodeFacts(node, version)
            labels = facts.labels
            why = facts.unshared
        else:  # not memoised: the same filters read straight from the Node
            facts = None
            name = str(name or "")
            labels = meta.get("labels") or _EMPTY
            why = None if has_shared_label(labels) else _NOT_SHARED
        if why is None:
            for key, value in selector:
                if labels.get(key) != value:
                    why = _SELECTOR_MISS
                    break
            else:
                why = facts.unfit if facts is not None else _static_unfit(node)
        if why is not None:
            reasons[name] = why
            continue
        if not single:
            node_blocked = blocked_of(name) if blocked_of is not None else None
            chosen: dict[str, tuple[int, ...]] | None = {} if pinned else None
            why, left = _devices(
                facts,
                node,
                name,
                wanted,
                counts,
                known_capacity,
                node_blocked,
                pinned,
                pins,
                chosen,
            )
            if why:
                reasons[name] = why
            else:
                free_after[name] = left
                if chosen:
                    pinned_ids[name] = chosen
            continue
        if trusted is not None:
            available = free_of(name, res)
            if available >= need:
                free_after[name] = available - need
                continue
            if trusted.capacity(name, res) <= 0:
                reasons[name] = _no_devices(facts, node, res)
                continue
        else:
            capacity = _node_capacity(facts, node, name, res, known_capacity)
            if capacity <= 0:
                reasons[name] = _no_devices(facts, node, res)
                continue
            if blocked_of is not None:
                node_blocked = blocked_of(name)
                if node_blocked and res in node_blocked:
                    reasons[name] = (node_blocked[res],)
                    continue
            available = free_of(name, res)
            if available >= need:
                free_after[name] = available - need
                continue
        why = short.get(available)
        if why is None:
            why = short[available] = (f"have {available} free {res} (need {need})",)
        reasons[name] = why
    node_memo.prune(candidates, reasons, free_after)
    if strategy == "binpack":
        scores = {name: -left for name, left in free_after.items()}
    else:
        scores = dict(free_after)
    # Best score first, ties by name: sort by name, then stably by score.
    ranked = sorted(scores)
    ranked.sort(key=scores.__getitem__, reverse=True)
    return PlacementDecision(
        node=ranked[0] if ranked else None,
        strategy=strategy,
        candidates=candidates,
        reasons=reasons,
        scores=scores,
        free_after=free_after,
        ranked=tuple(ranked),
        pinned=pinned_ids,
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

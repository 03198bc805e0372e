"""What wakes SDG's reconcilers: event predicates and cache lookups from an event to the
requests it concerns. Shared by the controllers' wiring (each beside its reconciler)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from api.constants import DEVICES_ANNOTATION, MAX_ALLOCATED_PODS, PHASE_BOUND, SDG_KIND
from api.pods import POD_GROUP_INDEX, is_active, pod_group
from api.v1alpha1 import group_phase, is_bound, selected_devices
from controllers.grouppods import odd_pod
from controllers.inventory import ANNOTATION_PREFIX
from controllers.ledger.records import record_holdings
from sdgruntime import errors
from sdgruntime.cache import Cache, CacheNotSynced
from sdgruntime.kinds import PODS, Obj, meta_of, spec_of, status_of
from sdgruntime.predicate import Funcs
from sdgruntime.reconcile import Request


def _pod_facts(pod: Obj) -> tuple[Any, ...]:
    meta, status = meta_of(pod), status_of(pod)
    return (
        pod_group(pod),
        spec_of(pod).get("nodeName"),
        status.get("phase"),
        meta.get("deletionTimestamp"),
    )


#: Pod updates that matter to a group (its pods' membership, node, phase, deletion);
#: status-only churn (conditions, container statuses) does not reconcile the group.
pod_moved = Funcs(update=lambda old, new: _pod_facts(old) != _pod_facts(new))


def _group_pod_facts(pod: Obj) -> tuple[Any, ...]:
    """All the group scheduler reads of a pod: its group, its node, whether it is active
    (terminating pods still count) and the devices it was given (the annotation; the env
    it falls back to cannot change)."""
    annotations = meta_of(pod).get("annotations") or {}
    return (
        pod_group(pod),
        spec_of(pod).get("nodeName"),
        is_active(pod),
        annotations.get(DEVICES_ANNOTATION),
    )


#: Pod updates that can change a group scheduler decision: Pending -> Running, conditions
#: and a deletion that has not ended yet change nothing it reads (``pod_moved`` wakes the
#: status controller on phase and deletion too).
pod_matters_to_group = Funcs(update=lambda old, new: _group_pod_facts(old) != _group_pod_facts(new))

#: What the status controller writes to a group (from the pod cache): the group scheduler
#: has its own pod watch for that, so these writes need not wake it again.
_POD_LIST_FIELDS = ("allocatedPods", "allocatedPodCounts", "podCount")


def _beyond_pod_list(group: Obj) -> tuple[Any, ...]:
    meta = {
        k: v for k, v in meta_of(group).items() if k not in ("resourceVersion", "managedFields")
    }
    status = {k: v for k, v in status_of(group).items() if k not in _POD_LIST_FIELDS}
    rest = {k: v for k, v in group.items() if k not in ("metadata", "status")}
    return meta, status, rest


#: Group updates beyond the pod list: a status write of the status controller (one for
#: every pod that joins or leaves) does not reconcile the group scheduler once more.
group_changed = Funcs(update=lambda old, new: _beyond_pod_list(old) != _beyond_pod_list(new))

only_deletes = Funcs(create=lambda _o: False, update=lambda _o, _n: False)


def _frees(old: Obj, new: Obj) -> bool:
    (node_a, named_a, held_a), (node_b, named_b, held_b) = map(record_holdings, (old, new))
    if (node_a, named_a) != (node_b, named_b) or (held_a is None) != (held_b is None):
        return True  # another node's record now, or readable again (or no longer)
    return held_a is not None and held_b is not None and bool(held_a - held_b)


#: Claim record events after which a Pending group may fit: a device given back, a record
#: repaired, renamed or deleted. A record created or a claim added frees nothing, and a
#: burst of binds writes one record per bind: waking every Pending group on each of those
#: writes would make the burst quadratic.
record_frees_devices = Funcs(create=lambda _cm: False, update=_frees)


def _takes(old: Obj | None, new: Obj) -> bool:
    held_a = record_holdings(old)[2] if old is not None else frozenset()
    held_b = record_holdings(new)[2]
    return held_b is not None and bool(held_b - (held_a or frozenset()))


#: Claim record events that take devices: nothing fits better after them, but a Pending
#: group's message counts the free devices, so it is judged once more (after a delay that
#: folds a burst of binds into one pass: see ``PENDING_RECHECK_SECONDS``).
record_takes_devices = Funcs(
    create=lambda cm: _takes(None, cm), update=_takes, delete=lambda _cm: False
)


def _node_facts(node: Obj) -> tuple[Any, ...]:
    meta, spec, status = meta_of(node), spec_of(node), status_of(node)
    ready = next(
        (c.get("status") for c in status.get("conditions") or [] if c.get("type") == "Ready"), None
    )
    inventory = {
        k: v for k, v in (meta.get("annotations") or {}).items() if k.startswith(ANNOTATION_PREFIX)
    }
    return (
        meta.get("labels"),
        inventory,
        spec.get("taints"),
        spec.get("unschedulable"),
        status.get("allocatable"),
        ready,
    )


#: Node updates that can change placement or health (the device inventory annotations
#: included); heartbeats (condition timestamps,
#: images, addresses) do not re-run placement for every Pending group.
node_changed = Funcs(update=lambda old, new: _node_facts(old) != _node_facts(new))


# --- from an object to the requests it concerns ----------------------------------------
#: Cache indexes of groups (``index_groups``): by ``status.nodeName``, and the unbound ones.
GROUP_NODE_INDEX = "group-node"
GROUP_UNBOUND_INDEX = "unbound"
_UNBOUND = "unbound"


def _group_node(group: Obj) -> list[str]:
    node = status_of(group).get("nodeName")
    return [node] if isinstance(node, str) and node else []


def _group_unbound(group: Obj) -> list[str]:
    return [] if group_phase(group) == PHASE_BOUND else [_UNBOUND]


def index_groups(cache: Cache) -> None:
    """The indexes ``pending_groups`` and ``groups_bound_on`` read: every claim record
    write wakes the Pending groups and the groups of its node, and a scan of every group
    per write would make a burst of binds quadratic. Idempotent: each scheduler asks."""
    have = cache.informer(SDG_KIND).store.indexers
    if GROUP_NODE_INDEX not in have:
        cache.add_index(SDG_KIND, GROUP_NODE_INDEX, _group_node)
    if GROUP_UNBOUND_INDEX not in have:
        cache.add_index(SDG_KIND, GROUP_UNBOUND_INDEX, _group_unbound)


def pending_groups(cache: Cache) -> Iterator[Request]:
    """Groups not Bound (needs ``index_groups``)."""
    for g in cache.list(SDG_KIND, index=GROUP_UNBOUND_INDEX, value=_UNBOUND, copy=False):
        yield Request(g["metadata"]["name"])


def groups_bound_on(cache: Cache, nodes: Iterable[str | None]) -> Iterator[Request]:
    """Groups whose status names any of ``nodes`` (needs ``index_groups``)."""
    for node in {n for n in nodes if n}:
        for g in cache.list(SDG_KIND, index=GROUP_NODE_INDEX, value=node, copy=False):
            yield Request(g["metadata"]["name"])


def group_of_pod(pod: Obj) -> list[Request]:
    group = pod_group(pod)
    return [Request(group)] if group else []


def group_reading_pod(cache: Cache, env_table: Mapping[str, str]) -> Callable[[Obj], list[Request]]:
    """``group_of_pod`` for the group scheduler: a pod event wakes its group only where
    the scheduler's answer may change, so a create or a bind costs no reconcile.

    A bound group's reconcile (``survey``) reads of its pods only which are odd (bound
    elsewhere or given other devices: DevicesConflict) and how many are active, which
    decides only ``PodsListed`` beyond ``MAX_ALLOCATED_PODS``. So a pod wakes a bound group
    when it is odd (on an update, before or after: an odd pod gone clears the conflict) or
    the count is at the limit. A group that is not Bound reads only its pods that have a
    node (those left from an earlier binding keep it Pending until they go), so any event
    of such a pod wakes it. A terminating group's
    finalizer waits for every active pod, and a group the cache does not hold (or has not
    synced) or whose devices do not parse is looked at as before. The pod cache is updated
    before its handlers run, so the count includes the event's own pod."""

    def wake(pod: Obj) -> list[Request]:
        group = pod_group(pod)
        if not group:
            return []
        try:
            obj = cache.get(SDG_KIND, group, copy=False)
        except (errors.NotFound, CacheNotSynced):
            return [Request(group)]
        if meta_of(obj).get("deletionTimestamp"):
            return [Request(group)]
        if not is_bound(obj):
            return [Request(group)] if spec_of(pod).get("nodeName") else []
        count = cache.count(PODS, index=POD_GROUP_INDEX, value=group)
        if count >= MAX_ALLOCATED_PODS or _disputes(pod, obj):
            return [Request(group)]
        return []

    def _disputes(pod: Obj, group: Obj) -> bool:
        if not spec_of(pod).get("nodeName") or not is_active(pod):
            return False
        try:
            devices = selected_devices(group)
        except ValueError:
            return True  # the reconcile reports the malformed status
        resources = spec_of(group).get("resources") or {}
        node = status_of(group)["nodeName"]
        return odd_pod(pod, node, devices, resources, env_table) is not None

    return wake


def pods_of_group(cache: Cache, name: str) -> Sequence[Obj]:
    return cache.list(PODS, index=POD_GROUP_INDEX, value=name, copy=False)

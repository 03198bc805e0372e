"""What wakes SDG's reconcilers: event predicates and cache lookups from an event to the
requests it concerns. Shared by the controllers' wiring (each beside its reconciler)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from api.constants import PHASE_BOUND, SDG_KIND
from api.pods import POD_GROUP_INDEX, pod_group
from controllers.inventory import ANNOTATION_PREFIX
from sdgruntime.cache import Cache
from sdgruntime.kinds import PODS
from sdgruntime.predicate import Funcs
from sdgruntime.reconcile import Request

Obj = Mapping[str, Any]


def _pod_facts(pod: Obj) -> tuple[Any, ...]:
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    return (
        pod_group(pod),
        (pod.get("spec") or {}).get("nodeName"),
        status.get("phase"),
        meta.get("deletionTimestamp"),
    )


#: Pod updates that matter to a group (its pods' membership, node, phase, deletion);
#: status-only churn (conditions, container statuses) does not reconcile the group.
pod_moved = Funcs(update=lambda old, new: _pod_facts(old) != _pod_facts(new))

only_deletes = Funcs(create=lambda _o: False, update=lambda _o, _n: False)


def _node_facts(node: Obj) -> tuple[Any, ...]:
    meta, spec, status = (
        node.get("metadata") or {},
        node.get("spec") or {},
        node.get("status") or {},
    )
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
def pending_groups(cache: Cache) -> Iterator[Request]:
    for g in cache.list(SDG_KIND, copy=False):
        if (g.get("status") or {}).get("phase") != PHASE_BOUND:
            yield Request(g["metadata"]["name"])


def groups_on(cache: Cache, nodes: Iterable[str | None]) -> Iterator[Request]:
    """Groups bound to any of ``nodes``."""
    wanted = {n for n in nodes if n}
    if not wanted:
        return
    for g in cache.list(SDG_KIND, copy=False):
        if (g.get("status") or {}).get("nodeName") in wanted:
            yield Request(g["metadata"]["name"])


def group_of_pod(pod: Obj) -> list[Request]:
    group = pod_group(pod)
    return [Request(group)] if group else []


def pods_of_group(cache: Cache, name: str) -> Sequence[Obj]:
    return cache.list(PODS, index=POD_GROUP_INDEX, value=name, copy=False)

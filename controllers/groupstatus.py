"""A SharedDeviceGroup's status as pure builders: from what is known, the status to write.

One home for what each condition says, so the group scheduler and recovery cannot word
(or decide) the same condition two ways. Nothing here reads the API or the cache.

``Ready`` is the summary a user waits on; it is False with a *conflict* reason
(``CONFLICT_REASONS``) while the group's devices are disputed, and then no new pod joins
the group (webhook) or is bound (pod scheduler).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from api.conditions import find_condition, set_condition
from api.constants import (
    CONDITION_NODE_HEALTHY,
    CONDITION_PODS_LISTED,
    CONDITION_READY,
    CONDITION_SCHEDULED,
    CONFLICT_REASONS,
    MAX_ALLOCATED_PODS,
    PHASE_BOUND,
    PHASE_PENDING,
    REASON_BOUND,
    REASON_DEVICES_MISSING,
    REASON_NODE_NOT_FOUND,
    REASON_NODE_NOT_READY,
    REASON_NODE_READY,
    REASON_NODE_UNSCHEDULABLE,
    REASON_NOT_BOUND,
    REASON_NOT_READY,
    REASON_READY,
    REASON_TRUNCATED,
    REASON_UNSCHEDULABLE,
)
from api.v1alpha1 import format_ids
from controllers.inventory import Offer, count_offer
from controllers.placement import is_node_ready, node_device_capacity
from sdgruntime.kinds import Obj, meta_of, spec_of, status_of

Devices = Mapping[str, Sequence[int]]


#: A problem that makes Ready False: (reason, message).
Problem = tuple[str, str]


def describe(devices: Devices) -> str:
    """``nvidia.com/gpu 0,1, amd.com/gpu 2`` (sorted by resource)."""
    return ", ".join(f"{r} {format_ids(i)}" for r, i in sorted(devices.items()))


def listed(items: Sequence[str], limit: int = 5) -> str:
    """The first ``limit`` items and how many more: messages stay short for any input."""
    more = f" and {len(items) - limit} more" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more


def node_health(
    node: Obj | None, name: str, devices: Devices, offers: Mapping[str, Offer] | None = None
) -> tuple[bool, str, str]:
    """(healthy, reason, message) of the NodeHealthy condition of a group bound to ``name``.

    ``offers`` is the node's inventory (``controllers.inventory``; from the node's
    allocatable count when not given): a held device that is gone or unhealthy is named;
    with a count-only inventory the lost device cannot be known, and the message says so.
    """
    if node is None:
        return False, REASON_NODE_NOT_FOUND, f"node {name} no longer exists"
    if not is_node_ready(node):
        return False, REASON_NODE_NOT_READY, f"node {name} is not Ready"
    if spec_of(node).get("unschedulable"):
        return (
            False,
            REASON_NODE_UNSCHEDULABLE,
            f"node {name} is cordoned: new pods of the group cannot be bound there",
        )
    if offers is None:
        offers = {r: count_offer(r, n) for r, n in node_device_capacity(node).items() if n}
    missing: list[str] = []
    guessed = False
    for res, ids in sorted(devices.items()):
        offer = offers.get(res)
        if offer is None:
            missing.append(f"{res} {format_ids(ids)} (the node offers no {res})")
            continue
        lost = offer.missing(ids)
        missing.extend(lost)
        guessed = guessed or (bool(lost) and offer.guessed)
    if missing:
        unknown = (
            " (its devices are only counted, so which one was lost cannot be known: the "
            "highest IDs are flagged; publish device UUIDs with a DRA driver or the "
            "deviceshare.io/devices.* node annotation to know)"
            if guessed
            else ""
        )
        return (
            False,
            REASON_DEVICES_MISSING,
            f"node {name} no longer offers {listed(missing)}{unknown}; the group does not "
            "move: delete and recreate it to place it elsewhere",
        )
    return True, REASON_NODE_READY, f"node {name} is Ready and offers the selected devices"


def _renumbered(recorded: Any, now: Mapping[str, str], devices: Devices) -> list[str]:
    """Of a Bound group's devices, those whose UUID at their ID is not the one its status
    recorded (a node annotation that dropped a dead GPU, a driver that renumbered)."""
    if not isinstance(recorded, Mapping):
        return []
    out = []
    for res, text in sorted(now.items()):
        was = recorded.get(res)
        if not isinstance(was, str) or was == text:
            continue
        ids = sorted(devices.get(res, ()))
        for i, old, new in zip(ids, was.split(",", len(ids)), text.split(","), strict=False):
            if old != new:
                out.append(f"{res} {i} was {old}, is {new}")
    return out


def device_summary(devices: Devices) -> str:
    """``nvidia.com/gpu=0,1 amd.com/gpu=2``: the DEVICES column of ``kubectl get sdg``."""
    return " ".join(f"{r}={format_ids(i)}" for r, i in sorted(devices.items()))


def physical_devices(devices: Devices, offers: Mapping[str, Offer] | None) -> dict[str, str]:
    """Resource -> the UUIDs of ``devices`` (in ID order), where every one is known."""
    out: dict[str, str] = {}
    for res, ids in sorted(devices.items()):
        offer = (offers or {}).get(res)
        uuids = offer.uuids(sorted(ids)) if offer else None
        if uuids:
            out[res] = ",".join(uuids)
    return out


def conflict_of(group: Obj) -> Problem | None:
    """The group's conflict (Ready=False with a conflict reason), if it has one."""
    cond = find_condition(status_of(group).get("conditions"), CONDITION_READY)
    if cond and cond.get("status") == "False" and cond.get("reason") in CONFLICT_REASONS:
        return str(cond.get("reason")), str(cond.get("message") or "")
    return None


def _ready(
    conds: list[dict[str, Any]], healthy: bool, gen: int | None, problem: Problem | None
) -> list[dict[str, Any]]:
    if problem is not None:
        reason, message = problem
        return set_condition(
            conds, CONDITION_READY, "False", reason, message, observed_generation=gen
        )
    scheduled = find_condition(conds, CONDITION_SCHEDULED)
    ok = healthy and scheduled is not None and scheduled.get("status") == "True"
    return set_condition(
        conds,
        CONDITION_READY,
        "True" if ok else "False",
        REASON_READY if ok else REASON_NOT_READY,
        "the group is bound and its node offers its devices"
        if ok
        else "the group is not bound to a healthy node",
        observed_generation=gen,
    )


def _pods_listed(conds: list[dict[str, Any]], count: int, gen: int | None) -> list[dict[str, Any]]:
    if count <= MAX_ALLOCATED_PODS:
        return [c for c in conds if c.get("type") != CONDITION_PODS_LISTED]
    return set_condition(
        conds,
        CONDITION_PODS_LISTED,
        "False",
        REASON_TRUNCATED,
        f"status.allocatedPods lists the first {MAX_ALLOCATED_PODS} of {count} pods "
        "(podCount is exact); kubectl get pods -A lists them all",
        observed_generation=gen,
    )


def bound_status(
    group: Obj,
    node: str,
    devices: Devices,
    node_obj: Obj | None,
    *,
    problem: Problem | None = None,
    pod_count: int = 0,
    newly_bound: bool = False,
    offers: Mapping[str, Offer] | None = None,
) -> dict[str, Any]:
    """The status of a group bound to ``node`` with ``devices``.

    ``newly_bound`` also sets phase, node, devices and the Scheduled condition (the bind
    itself); otherwise only health, Ready and PodsListed are brought up to date.
    ``problem`` (a conflict) makes Ready False with its reason. ``offers`` (the node's
    inventory) judges device health and gives ``physicalDevices``, the UUIDs, where known
    (kept once recorded: they say what the pods got, even after a device is lost).
    """
    status = dict(status_of(group))
    gen = meta_of(group).get("generation")
    conds = list(status.get("conditions") or [])
    if newly_bound:
        status.setdefault("podCount", 0)
        status.update(
            phase=PHASE_BOUND,
            nodeName=node,
            selectedDevices={r: format_ids(i) for r, i in sorted(devices.items())},
        )
        conds = set_condition(
            conds,
            CONDITION_SCHEDULED,
            "True",
            REASON_BOUND,
            f"bound to node {node} with {describe(devices)}",
            observed_generation=gen,
        )
    status["deviceSummary"] = device_summary(devices)
    uuids = physical_devices(devices, offers)
    recorded = None if newly_bound else status.get("physicalDevices")
    if uuids and (newly_bound or not status.get("physicalDevices")):
        status["physicalDevices"] = uuids
    elif newly_bound:
        status.pop("physicalDevices", None)
    healthy, reason, message = node_health(node_obj, node, devices, offers)
    renumbered = _renumbered(recorded, uuids, devices)
    if healthy and renumbered:
        healthy, reason = False, REASON_DEVICES_MISSING
        message = (
            f"node {node} numbers its devices otherwise now: {listed(renumbered)}; the "
            "group keeps its very devices (by UUID) and nobody else gets them, but pods "
            "told IDs may now see others: delete and recreate the group"
        )
    conds = set_condition(
        conds,
        CONDITION_NODE_HEALTHY,
        "True" if healthy else "False",
        reason,
        message,
        observed_generation=gen,
    )
    conds = _ready(conds, healthy, gen, problem)
    conds = _pods_listed(conds, pod_count, gen)
    status["conditions"] = conds
    status["observedGeneration"] = gen
    return status


def pending_status(
    group: Obj,
    message: str,
    problem: Problem | None = None,
    reason: str = REASON_UNSCHEDULABLE,
) -> dict[str, Any]:
    """The status of a group not placed yet (``message`` says why, per node; ``reason``
    is the Scheduled condition's)."""
    status = dict(status_of(group))
    gen = meta_of(group).get("generation")
    conds = set_condition(
        status.get("conditions"),
        CONDITION_SCHEDULED,
        "False",
        reason,
        message,
        observed_generation=gen,
    )
    conds = set_condition(
        conds,
        CONDITION_NODE_HEALTHY,
        "Unknown",
        REASON_NOT_BOUND,
        "the group is not bound to a node",
        observed_generation=gen,
    )
    conds = _ready(conds, False, gen, problem)
    return {
        "podCount": 0,
        **status,
        "phase": PHASE_PENDING,
        "conditions": conds,
        "observedGeneration": gen,
    }


def with_ready_problem(group: Obj, problem: Problem) -> dict[str, Any]:
    """The group's status with Ready=False for ``problem`` (everything else kept)."""
    status = dict(status_of(group))
    gen = meta_of(group).get("generation")
    reason, message = problem
    status["conditions"] = set_condition(
        status.get("conditions"), CONDITION_READY, "False", reason, message, observed_generation=gen
    )
    return status

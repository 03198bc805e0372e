"""``sdg explain``: why a group is Pending or where it is bound, and why a pod is not
running on its group's node, as text or as the facts behind it (``-o json|yaml``)."""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from api.conditions import find_condition
from api.constants import (
    CDI_ANNOTATION_FAMILIES,
    CONDITION_SCHEDULED,
    FINALIZER,
    GROUP_ANNOTATION,
    NODE_MODE_LABEL,
    NODE_MODE_SHARED,
    SCHEDULER_NAME,
)
from api.envvars import env_var_for
from api.nodes import is_shared, node_name
from api.pods import is_active, is_finished, pod_group, pod_key, pod_phase, tolerates
from api.v1alpha1 import (
    format_ids,
    group_name,
    group_node,
    group_phase,
    group_pod_count,
    group_resources,
    group_strategy,
    is_bound,
    pod_counts,
    pods_truncated,
    selected_devices,
    spec_pins,
)
from cli.claims import (
    ClaimView,
    allocated_pods,
    claim_view,
    node_problems,
    physical_text,
    physical_uuids,
    slices_of,
    source_text,
    too_many_text,
)
from cli.doctor.collect import manager_config
from cli.doctor.facts import DEPLOYMENTS, MANAGER_DEPLOYMENT
from cli.doctor.judge import delivery_settings
from cli.kube import (
    CliError,
    Write,
    claim_records,
    context_namespace,
    get_or_none,
    list_groups,
    list_objects,
    resource_slices,
)
from cli.render import (
    NONE,
    devices_text,
    fields,
    join_sections,
    render_data,
    table,
)
from controllers.inventory import (
    Offer,
    node_offers,
)
from controllers.ledger.tracker import Devices
from controllers.pinning import LedgerPins
from controllers.placement import (
    node_device_capacity,
    place,
    unaddressable_devices,
)
from controllers.podfit import pod_fits_node
from sdgruntime import errors
from sdgruntime.client import Client
from sdgruntime.kinds import NODES, PODS, RUNTIMECLASSES, Obj, meta_of, spec_of, status_of
from webhooks.delivery import (
    Delivery,
    DeliveryChoice,
    Denial,
    by_uuid,
    choose_delivery,
    ids_reason,
)

_GROUP_TYPES = frozenset({"sdg", "shareddevicegroup", "shareddevicegroups", "group"})
_POD_TYPES = frozenset({"pod", "pods", "po"})


# --- sdg explain GROUP ------------------------------------------------------------------------


def _conditions_section(obj: Obj, kinds: Sequence[str] | None = None) -> str:
    conds = [
        c for c in status_of(obj).get("conditions") or () if kinds is None or c.get("type") in kinds
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
    recorded = status_of(group).get("physicalDevices") or {}
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
            reason += f"; {source_text(offer)}"
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
    cond = find_condition(status_of(group).get("conditions"), CONDITION_SCHEDULED)
    msg = ((cond or {}).get("message") or "").strip()
    return msg or "not scheduled yet: no Scheduled condition (is the manager running?)"


def _waiting_reason(pod: Obj) -> str:
    status = status_of(pod)
    for key in ("initContainerStatuses", "containerStatuses"):
        for cs in status.get(key) or ():
            waiting = (cs.get("state") or {}).get("waiting")
            if waiting and waiting.get("reason"):
                return f"container {cs.get('name')}: {waiting['reason']}" + (
                    f" ({waiting['message']})" if waiting.get("message") else ""
                )
    return ""


def _pod_note(pod: Obj, group: Obj, allocated: set[str] | None, listed_until: str | None) -> str:
    """``allocated`` None: the group's status counts pods per namespace, names none."""
    spec = spec_of(pod)
    node = spec.get("nodeName")
    if meta_of(pod).get("deletionTimestamp"):
        return "terminating"
    if not node:
        cond = find_condition(status_of(pod).get("conditions"), "PodScheduled")
        if cond and cond.get("status") == "False":
            return f"not scheduled: {cond.get('message') or cond.get('reason')}"
        return "waiting for deviceshare-scheduler"
    if is_bound(group) and node != group_node(group):
        return f"on {node}, not on the group's node {group_node(group)}"
    key = pod_key(pod)
    if (
        allocated is not None
        and is_active(pod)
        and key not in allocated
        and (listed_until is None or key < listed_until)
    ):
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
    spec = spec_of(group)
    resources = group_resources(group)
    selector = spec.get("nodeSelector") or {}
    meta = meta_of(group)
    allocated = allocated_pods(group)

    info = [("Name", name), ("Phase", group_phase(group))]
    problems: list[str] = []
    facts: dict[str, Any] = {"group": name, "found": True, "phase": group_phase(group)}
    facts.update(node=None, devices={}, deviceUUIDs=None)
    if is_bound(group):
        node, devices = view.statuses.get(name, (str(group_node(group)), {}))
        facts.update(node=node, devices={r: sorted(i) for r, i in sorted(devices.items())})
        obj = by_node.get(node)
        offers = node_offers(obj, slices_of(slices).get(node, ())) if obj is not None else {}
        told, told_facts = _told(group, devices, offers, delivery)
        info += [
            ("Node", node),
            ("Devices", f"{devices_text(devices)} ({_env_text(resources, devices, told)})"),
        ]
        env_vars = [v for r in sorted(resources) if (v := env_var_for(r)) is not None]
        choice = choose_delivery(obj, runtime_classes or {}, delivery, env_vars, name)
        facts.update(delivery=_delivery_facts(choice), deviceNames=told_facts)
        if obj is None:
            problems.append(f"node {node} does not exist any more; its pods cannot run")
        else:
            problems += [f"node {node} is {p}" for p in node_problems(obj)]
            info.append(("Device UUIDs", physical_text(group, devices, offers)))
            facts["deviceUUIDs"] = physical_uuids(group, devices, offers)
            too_many = unaddressable_devices(obj)
            for res, ids in sorted(devices.items()):
                offer = offers.get(res)
                if not ids:
                    continue
                if offer is None and res in too_many:
                    problems.append(
                        f"node {node} {too_many_text(res, too_many[res])}; the group holds "
                        f"{res} {format_ids(ids)}"
                    )
                elif offer is None:
                    problems.append(
                        f"node {node} offers no {res} now; the group holds {res} {format_ids(ids)}"
                    )
                elif offer.missing(ids):
                    problems.append(
                        f"node {node} no longer offers {', '.join(offer.missing(ids))} "
                        f"({source_text(offer)}); the group holds {res} {format_ids(ids)}"
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
                f"the claim record of node {node} says {devices_text(recorded)}, "
                f"the status says {devices_text(devices)}"
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
        summary = f"Bound to node {node} with {devices_text(devices)}; {pod_count} pod(s) use it."
    else:
        summary = f"Pending: {_scheduled_message(group)}"
    counts = pod_counts(group)
    if counts is not None:
        per_ns = ", ".join(f"{ns} {n}" for ns, n in sorted(counts.items())) or NONE
        summary += f"\nstatus.allocatedPodCounts (pods per namespace): {per_ns}."
    elif pods_truncated(group):
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
            by_slices = slices_of(slices)
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
            pod_phase(p),
            spec_of(p).get("nodeName") or NONE,
            _pod_note(p, group, None if counts is not None else allocated_set, listed_until),
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
    facts["conditions"] = list(status_of(group).get("conditions") or [])
    text = join_sections(
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
    shared = [n for n in nodes if is_shared(n)]
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
    spec = spec_of(pod)
    status = status_of(pod)
    name = pod_group(pod)
    group = by_group.get(name) if name else None
    node = spec.get("nodeName")
    scheduler = spec.get("schedulerName") or "default-scheduler"
    phase = pod_phase(pod)

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
    return join_sections(info, verdict, env, conditions), facts


def _pod_verdict(
    pod: Obj, name: str | None, group: Obj | None, by_node: Mapping[str, Obj], pods: list[Obj]
) -> str:
    spec = spec_of(pod)
    phase = pod_phase(pod)
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
    if meta_of(pod).get("deletionTimestamp"):
        return f"Being deleted{f' from node {node}' if node else ''}."
    if is_finished(pod):
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
    cond = find_condition(status_of(pod).get("conditions"), "PodScheduled")
    if cond and cond.get("status") == "False":
        lines.append(f"Scheduler says: {cond.get('message') or cond.get('reason')}")
    obj = by_node.get(target)
    if obj is None:
        lines.append(f"Node {target} does not exist any more.")
    else:
        on_node = [p for p in pods if spec_of(p).get("nodeName") == target]
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
    phase = pod_phase(pod)
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
        lines.append(f"Running on {node}, the node of group {name}, with {devices_text(devices)}.")
    else:
        waiting = _waiting_reason(pod)
        lines.append(
            f"Bound to {node}, the node of group {name}, with {devices_text(devices)}; "
            f"phase {phase}" + (f", {waiting}." if waiting else ".")
        )
    obj = by_node.get(node)
    if obj is None:
        lines.append(f"Node {node} does not exist any more.")
    else:
        tolerations = spec_of(pod).get("tolerations") or []
        lines += [f"Node {node} is {p}." for p in node_problems(obj) if p.startswith("not Ready")]
        for taint in spec_of(obj).get("taints") or ():
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
    spec = spec_of(pod)
    rows = []
    warnings = []
    unchecked = sorted(r for r in group_resources(group) if env_var_for(r) is None)
    # The same devices by UUID (--device-ids), or none under CDI annotations (cdi mode).
    physical = status_of(group).get("physicalDevices") or {}
    annotations = meta_of(pod).get("annotations") or {}
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


# --- sdg explain ------------------------------------------------------------------------------


async def run(client: Client, args: argparse.Namespace, write: Write) -> int:
    text, facts = await _explanation(client, args)
    write(render_data(facts, args.output) if args.output else text)
    return 0


async def _explanation(client: Client, args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    kind, _, name = args.target.rpartition("/")
    kind = kind.lower()
    if kind and kind not in _GROUP_TYPES | _POD_TYPES:
        raise CliError(f"unknown type {kind!r}: use sdg/NAME or pod/NAME")
    as_pod = kind in _POD_TYPES or (not kind and args.namespace is not None)
    groups = await list_groups(client)
    names = sorted(g["metadata"]["name"] for g in groups)
    if not as_pod and (kind or name in names):
        if name not in names:
            raise CliError(
                f'SharedDeviceGroup "{name}" not found; groups: {", ".join(names) or "<none>"}'
            )
        nodes = await list_objects(client, NODES)
        records = await claim_records(client, args.claims_namespace)
        pods = await list_objects(client, PODS)
        slices = await resource_slices(client) or []
        delivery, runtime_classes, holders = await _delivery_settings(client, args.claims_namespace)
        return group_explanation(
            name, groups, nodes, records, pods, slices, runtime_classes, delivery, holders
        )
    namespace = args.namespace or context_namespace(args.kubeconfig, args.context)
    pod = await get_or_none(client, PODS, name, namespace)
    if pod is None:
        if as_pod:
            raise CliError(f'pod "{name}" not found in namespace {namespace}')
        raise CliError(
            f'no SharedDeviceGroup "{name}", and no pod "{name}" in namespace {namespace}'
        )
    nodes = await list_objects(client, NODES)
    target = _group_node(groups, pod)
    others = (
        await list_objects(client, PODS, field_selector=f"spec.nodeName={target}") if target else []
    )
    return pod_explanation(pod, groups, nodes, others)


async def _delivery_settings(
    client: Client, namespace: str
) -> tuple[Delivery, dict[str, dict[str, Any]], bool | None]:
    """The manager's delivery settings, from its Deployment's flags as ``sdg doctor``
    reads them (its defaults where it cannot be read), its RuntimeClass by name, and
    whether it runs holder pods (None: no Deployment says)."""
    try:
        deployment = await get_or_none(client, DEPLOYMENTS, MANAGER_DEPLOYMENT, namespace)
    except errors.Forbidden:
        deployment = None
    config = manager_config(deployment, namespace)
    settings = delivery_settings(config)
    holders = config.holders != "off" if isinstance(deployment, Mapping) else None
    try:
        rc = await get_or_none(client, RUNTIMECLASSES, settings.runtime_class_name)
    except errors.Forbidden:
        rc = None
    return settings, ({settings.runtime_class_name: rc} if rc is not None else {}), holders


def _group_node(groups: Sequence[dict[str, Any]], pod: dict[str, Any]) -> str | None:
    name = pod_group(pod)
    for g in groups:
        if g["metadata"]["name"] == name:
            return status_of(g).get("nodeName") or None
    return None

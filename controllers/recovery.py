"""Start-up recovery: make claim records, group statuses and pods agree before placing.

Order matters: the fenced records are read first (they win), then bound groups' statuses
are written back into records that lost them, then groups that lost their status are
restored from the env our webhook injected into their bound pods. (Bound pods whose env
disagrees with their group are reported by the GroupScheduler on every reconcile.)
Whatever disagrees is reported on the group (condition + Warning Event), never settled
by a second allocation.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from api.constants import CONDITION_READY, PHASE_BOUND, SDG_KIND
from api.pods import devices_from_env, pod_key
from api.v1alpha1 import parse_ids

if TYPE_CHECKING:
    from controllers.groupscheduler import GroupScheduler

log = logging.getLogger(__name__)


async def recover(gs: GroupScheduler) -> None:
    groups = {g["metadata"]["name"]: g for g in gs.cache.list(SDG_KIND)}
    # 1. Records of groups that no longer exist hold devices for nobody.
    for node, record in list(gs.claims.records.items()):
        for name in list(record.claims):
            if name not in groups:
                log.warning("recovery: releasing devices of deleted group %s on %s", name, node)
                await gs.claims.write(node, name, None)
    # 2. Bound groups whose record lost them get it back (or a conflict condition).
    for name, group in groups.items():
        status = group.get("status") or {}
        if status.get("phase") != PHASE_BOUND or not status.get("nodeName"):
            continue
        try:
            devices = {r: parse_ids(i) for r, i in (status.get("selectedDevices") or {}).items()}
        except ValueError:
            continue
        where = gs.claims.claim_of(name)
        if where == (status["nodeName"], devices):
            continue
        problem = await gs._restore_record(name, status["nodeName"], devices, where)
        if problem:
            await _report(gs, group, problem)
    # 3. Groups that lost their status: their bound pods say where and what they got.
    for name, group in groups.items():
        status = group.get("status") or {}
        if status.get("phase") == PHASE_BOUND or gs.claims.claim_of(name) is not None:
            continue
        resources = (group.get("spec") or {}).get("resources") or {}
        seen: dict[tuple[str, str], list[str]] = {}
        for pod in gs.bound_pods(name):
            node = pod["spec"]["nodeName"]
            devices = devices_from_env(pod, resources, gs.env_table)
            if devices is None:
                continue
            key = (node, repr(sorted(devices.items())))
            seen.setdefault(key, []).append(pod_key(pod))
            seen_devices = devices
        if not seen:
            continue
        if len(seen) > 1:
            await _report(
                gs,
                group,
                f"its running pods disagree on node/devices ({sorted(seen)}); "
                "delete the pods or the group to resolve",
            )
            continue
        ((node, _),) = seen
        others = gs.claims.held_by_others(name, node, seen_devices)
        if others:
            await _report(
                gs, group, f"its pods on {node} use devices now held by {', '.join(others)}"
            )
            continue
        log.warning("recovery: restoring group %s to %s %s from its pods", name, node, seen_devices)
        await gs.claims.write(node, name, seen_devices)


async def _report(gs: GroupScheduler, group: dict[str, Any], problem: str) -> None:
    log.error("recovery: group %s: %s", group["metadata"]["name"], problem)
    await gs._set_conditions(group, (CONDITION_READY, "False", "RecoveryConflict", problem))
    gs.recorder.emit(group, "Warning", "RecoveryConflict", problem)

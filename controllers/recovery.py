"""Start-up recovery: make claim records, group statuses and pods agree before placing.

Order matters: the fenced records first (they win), then Bound groups' statuses written
back into records that lost them, then groups that lost their status restored from the env
our webhook injected into their bound pods. Whatever disagrees is reported on the group
(condition + Warning Event), never settled by a second allocation. Group by group: a group
whose record cannot be written gets ``Ready=False, reason RecoveryFailed`` and is retried
by its own reconcile, while the others go on (docs/design.md, "Inside the controllers").
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from api.constants import REASON_RECOVERY_CONFLICT, REASON_RECOVERY_FAILED, SDG_KIND
from api.pods import delivered_devices, pod_key
from api.v1alpha1 import is_bound, selected_devices
from controllers.groupstatus import Problem, describe, with_ready_problem
from controllers.groupwriter import GroupWriter
from controllers.ledger.book import Ledger
from controllers.ledger.release import ClaimReleaser, bound_pods
from controllers.ledger.tracker import Devices
from controllers.ledger.writer import ClaimRecordBroken
from sdgruntime import errors
from sdgruntime.cache import Cache
from sdgruntime.events import EventRecorder
from sdgruntime.kinds import MutableObj, spec_of

log = logging.getLogger(__name__)


class Recovery:
    """Runs the start-up pass once, and retries, per group, what could not be written."""

    def __init__(
        self,
        cache: Cache,
        claims: Ledger,
        writer: GroupWriter,
        releaser: ClaimReleaser,
        recorder: EventRecorder,
        env_table: Mapping[str, str],
    ) -> None:
        self.cache = cache
        self.claims = claims
        self.writer = writer
        self.releaser = releaser
        self.recorder = recorder
        self.env_table = env_table
        #: Groups whose recovery could not be written yet -> why.
        self.failed: dict[str, str] = {}

    async def run(self) -> None:
        """The start-up pass (caches are synced: controllers start after sync)."""
        groups = {g["metadata"]["name"]: g for g in self.cache.list(SDG_KIND)}
        # 1. Claims of groups that no longer exist (or were recreated) hold devices for
        #    nobody: released after a live read. A failure is retried by the reconcile of
        #    that name (the record's watch event enqueues every name it holds).
        for name in sorted({n for r in self.claims.records.values() for n in r.claims}):
            group = groups.get(name)
            uid = (group or {}).get("metadata", {}).get("uid")
            if group is not None and all(
                self.claims.uid_of(node, name) in ("", uid)
                for node in self.claims.nodes_claiming(name)
            ):
                continue
            try:
                await self.releaser.release_stale(name)
            except (errors.ApiError, ClaimRecordBroken) as err:
                log.error("recovery: cannot release stale claims of %s yet: %s", name, err)
        # 2 and 3, group by group.
        for group in groups.values():
            await self.recover_group(group)

    async def recover_group(self, group: MutableObj) -> bool:
        """Recover one group; False when a write failed (reported, to be retried)."""
        name = group["metadata"]["name"]
        try:
            problem = await self._recover(group)
        except (errors.ApiError, ClaimRecordBroken) as err:
            if isinstance(err, errors.NotFound):
                self.failed.pop(name, None)
                return True
            why = f"recovery could not write the claim record yet ({err}); retrying"
            self.failed[name] = why
            log.error("recovery: group %s: %s", name, why)
            await self._report(group, (REASON_RECOVERY_FAILED, why))
            return False
        if self.failed.pop(name, None) is not None:
            self.claims.unreserve(name)
        if problem is not None:
            await self._report(group, (REASON_RECOVERY_CONFLICT, problem))
        return True

    async def _recover(self, group: MutableObj) -> str | None:
        if is_bound(group):
            return await self._restore_bound(group)
        if self.claims.claim_of(group["metadata"]["name"]) is None:
            return await self._restore_from_pods(group)
        return None

    async def _restore_bound(self, group: MutableObj) -> str | None:
        """A bound group whose record lost it gets it back (or a conflict is reported)."""
        name, uid = group["metadata"]["name"], group["metadata"].get("uid", "")
        node = group["status"]["nodeName"]
        try:
            devices = selected_devices(group)
        except ValueError:
            return None  # reported as InvalidStatus by the group scheduler
        if self.claims.claim_of(name) == (node, devices) and self.claims.uid_of(node, name) == uid:
            return None
        return await restore_record(self.claims, group, node, devices)

    async def _restore_from_pods(self, group: MutableObj) -> str | None:
        """A group that lost its status: its bound pods say where and what they got."""
        name = group["metadata"]["name"]
        resources = spec_of(group).get("resources") or {}
        seen: dict[tuple[str, str], list[str]] = {}
        found: dict[tuple[str, str], Devices] = {}
        for pod in bound_pods(self.cache, name):
            node = pod["spec"]["nodeName"]
            devices = delivered_devices(pod, resources, self.env_table)
            if devices is None:
                continue
            key = (node, describe(devices))
            seen.setdefault(key, []).append(pod_key(pod))
            found[key] = devices
        if not seen:
            return None
        if len(seen) > 1:
            return (
                f"its running pods disagree on node/devices ({sorted(seen)}); "
                "delete the pods or the group to resolve"
            )
        ((key, devices),) = found.items()
        node = key[0]
        others = self.claims.held_by_others(name, node, devices)
        if others:
            return f"its pods on {node} use devices now held by {', '.join(others)}"
        log.warning("recovery: restoring group %s to %s %s from its pods", name, node, devices)
        self.claims.hold(name, node, devices)
        await self.claims.writer.claim_for(node, group, devices)
        self.claims.unreserve(name)
        return None

    async def _report(self, group: MutableObj, problem: Problem) -> None:
        """Ready=False on the group and a Warning Event; a failing status write is logged
        (the group's retry reports again)."""
        log.error("recovery: group %s: %s", group["metadata"]["name"], problem[1])
        try:
            await self.writer.status(group, with_ready_problem(group, problem))
        except errors.ApiError as err:
            log.error("recovery: cannot report on %s: %s", group["metadata"]["name"], err)
        self.recorder.emit(group, "Warning", problem[0], problem[1])


async def restore_record(
    claims: Ledger, group: MutableObj, node: str, devices: Devices
) -> str | None:
    """Write a bound group's status into ``node``'s record; returns a problem instead when
    a record or another bound status gives those devices to someone else. (A claim of the
    group left on another node is the releaser's to judge, on a live read.)"""
    others = claims.held_by_others(group["metadata"]["name"], node, devices)
    if others:
        return (
            f"status says node {node} devices {describe(devices)}, but {', '.join(others)} "
            "hold(s) them too; delete and recreate this group"
        )
    await claims.writer.claim_for(node, group, devices)
    return None

"""The group scheduler: binds each Pending SharedDeviceGroup to one node and device IDs.

Decision flow for one group (one span per decision):
Filter + Score (pure, ``controllers.placement``) -> claim the IDs in the node's fenced
record (``controllers.claims``) -> write the group's status. A claim that lands but whose
status write loses to another manager is released again; a claim found in the records for
a still-Pending group is adopted (it is the first half of an interrupted bind).

Deletion: the finalizer holds the group while any active pod references it; only then
are its devices released from the record and the finalizer removed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

import anyio
from opentelemetry import trace

from api.conditions import find_condition, set_condition
from api.constants import (
    CONDITION_NODE_HEALTHY,
    CONDITION_READY,
    CONDITION_SCHEDULED,
    DEFAULT_ENV_TABLE,
    FINALIZER,
    PHASE_BOUND,
    PHASE_PENDING,
    REASON_BOUND,
    REASON_DEVICES_MISSING,
    REASON_NODE_NOT_FOUND,
    REASON_NODE_NOT_READY,
    REASON_NODE_READY,
    REASON_NOT_BOUND,
    REASON_NOT_READY,
    REASON_READY,
    REASON_UNSCHEDULABLE,
    SDG_KIND,
)
from api.pods import POD_GROUP_INDEX, devices_from_env, is_active, pod_key
from api.v1alpha1 import format_ids, selected_devices
from controllers import metrics as sdg_metrics
from controllers.claims import ClaimBook
from controllers.claims import resource_version as _rv
from controllers.placement import is_node_ready, node_device_capacity, place
from controllers.tracker import Devices
from sdgruntime import errors
from sdgruntime.cache import Cache
from sdgruntime.client import Client
from sdgruntime.events import EventRecorder
from sdgruntime.kinds import NODES, PODS
from sdgruntime.reconcile import Request, Result

log = logging.getLogger(__name__)
TRACER_NAME = "deviceshare.io/group-scheduler"

REASON_CLAIM_CONFLICT = "ClaimConflict"
REASON_DEVICES_CONFLICT = "DevicesConflict"
REASON_NODE_UNSCHEDULABLE = "NodeUnschedulable"


class GroupScheduler:
    """Reconciler for SharedDeviceGroups: placement, fenced claims, finalizer, health."""

    def __init__(
        self,
        client: Client,
        cache: Cache,
        claims: ClaimBook,
        recorder: EventRecorder,
        env_table: Mapping[str, str] = DEFAULT_ENV_TABLE,
        tracer_provider: trace.TracerProvider | None = None,
    ) -> None:
        self.tracer = (tracer_provider or trace.get_tracer_provider()).get_tracer(TRACER_NAME)
        self.env_table = env_table
        self.client = client
        self.cache = cache
        self.claims = claims
        self.recorder = recorder
        self._recovered = False
        #: group -> resourceVersion of our last write, until the cache shows it.
        self._written: dict[str, int] = {}
        self._recover_lock = anyio.Lock()

    async def reconcile(self, request: Request) -> Result | None:
        try:
            return await self._reconcile(request)
        except errors.Conflict:
            # Someone wrote first (our own status controller, another manager): re-read
            # and decide again, with backoff; a conflict is not a failure.
            return Result(requeue=True)

    async def _reconcile(self, request: Request) -> Result | None:
        await self._recover_once()
        try:
            group = self.cache.get(SDG_KIND, request.name)
        except errors.NotFound:
            self._written.pop(request.name, None)
            await self._release_orphan(request.name)
            return None
        meta = group["metadata"]
        expected = self._written.get(request.name)
        if expected is not None:
            if _rv(group) < expected:
                # The cache has not caught up with our own write yet; its watch event
                # will bring the newer object and another reconcile. Acting on the stale
                # copy would only earn a 409.
                return None
            del self._written[request.name]
        if meta.get("deletionTimestamp"):
            return await self._finalize(group)
        if FINALIZER not in (meta.get("finalizers") or []):
            group = await self._add_finalizer(group)
        status = group.get("status") or {}
        if status.get("phase") == PHASE_BOUND and status.get("nodeName"):
            return await self._check_bound(group)
        return await self._schedule(group)

    # --- scheduling ------------------------------------------------------------------
    async def _schedule(self, group: dict[str, Any]) -> Result | None:
        name = group["metadata"]["name"]
        spec = group.get("spec") or {}
        started = time.perf_counter()
        with self.tracer.start_as_current_span("schedule group") as span:
            span.set_attribute("sdg.group", name)
            existing = self.claims.claim_of(name)
            if existing is not None:
                node, devices = existing
                want = {r: int(n) for r, n in (spec.get("resources") or {}).items()}
                if {r: len(i) for r, i in devices.items()} == want:
                    # The first half of an interrupted bind (ours or another manager's).
                    span.set_attribute("sdg.result", "adopted")
                    span.set_attribute("sdg.node", node)
                    return await self._bind_status(group, node, devices, started)
                # Claimed for an older spec (edited while Pending): give it back, re-place.
                for claimed_on in self.claims.nodes_claiming(name):
                    await self.claims.write(claimed_on, name, None)
            stranded = self._running_pods(name)
            if stranded:
                # Pods of this group run with devices nobody records (recovery could not
                # restore them): placing the group afresh would hand those devices out
                # twice, to the pods and to whoever gets them next.
                span.set_attribute("sdg.result", "blocked")
                await self._set_pending(
                    group,
                    f"{len(stranded)} pod(s) of this group still run from an earlier binding "
                    f"that could not be restored ({', '.join(stranded[:5])}); delete them "
                    "and the group is placed again",
                )
                return None
            nodes = self.cache.list(NODES, copy=False)
            decision = place(spec, nodes, self.claims.tracker)
            span.set_attribute("sdg.candidates", decision.candidates)
            for node_name, why in sorted(decision.reasons.items())[:50]:
                span.set_attribute(f"sdg.filter.{node_name}", "; ".join(why))
            for node_name, score in sorted(decision.scores.items())[:50]:
                span.set_attribute(f"sdg.score.{node_name}", score)
            if decision.node is None:
                message = decision.message()
                span.set_attribute("sdg.result", "unschedulable")
                sdg_metrics.SCHEDULING_ATTEMPTS.labels("group", "unschedulable").inc()
                sdg_metrics.DECISION_LATENCY.labels("group").observe(time.perf_counter() - started)
                await self._set_pending(group, message)
                return None
            devices = self.claims.reserve(name, decision.node, spec["resources"])
            span.set_attribute("sdg.node", decision.node)
            span.set_attribute(
                "sdg.devices", ";".join(f"{r}={format_ids(i)}" for r, i in devices.items())
            )
            try:
                await self.claims.write(decision.node, name, devices)
            except errors.Conflict:
                # Someone wrote the record first; the view is refreshed: decide again.
                span.set_attribute("sdg.result", "conflict")
                sdg_metrics.SCHEDULING_ATTEMPTS.labels("group", "conflict").inc()
                return Result(requeue=True)
            finally:
                self.claims.unreserve(name)
            span.set_attribute("sdg.result", "bound")
            return await self._bind_status(group, decision.node, devices, started)

    async def _bind_status(
        self, group: dict[str, Any], node: str, devices: Devices, started: float
    ) -> Result | None:
        name = group["metadata"]["name"]
        status = dict(group.get("status") or {})
        gen = group["metadata"].get("generation")
        text = ", ".join(f"{r} {format_ids(i)}" for r, i in sorted(devices.items()))
        status.setdefault("podCount", 0)
        status.update(
            phase=PHASE_BOUND,
            nodeName=node,
            selectedDevices={r: format_ids(i) for r, i in sorted(devices.items())},
            observedGeneration=gen,
        )
        conds = set_condition(
            status.get("conditions"),
            CONDITION_SCHEDULED,
            "True",
            REASON_BOUND,
            f"bound to node {node} with {text}",
            observed_generation=gen,
        )
        node_obj = self._node(node)
        healthy, reason, message = _node_health(node_obj, node, devices)
        conds = set_condition(
            conds,
            CONDITION_NODE_HEALTHY,
            "True" if healthy else "False",
            reason,
            message,
            observed_generation=gen,
        )
        conds = _ready(conds, healthy, gen)
        status["conditions"] = conds
        try:
            await self._write_status(group, status)
        except errors.Conflict:
            return await self._after_status_conflict(name, node, devices)
        except errors.NotFound:
            await self._release_orphan(name)
            return None
        sdg_metrics.SCHEDULING_ATTEMPTS.labels("group", "bound").inc()
        sdg_metrics.DECISION_LATENCY.labels("group").observe(time.perf_counter() - started)
        self.recorder.emit(group, "Normal", "Scheduled", f"Bound to node {node}: {text}")
        return None

    async def _after_status_conflict(self, name: str, node: str, devices: Devices) -> Result:
        """Someone else changed the group while we bound it: if it is now bound elsewhere,
        our claim is surplus and is given back; otherwise try again from a fresh read."""
        try:
            fresh = await self.client.get(SDG_KIND, name)
        except errors.NotFound:
            await self._release_orphan(name)
            return Result()
        st = fresh.get("status") or {}
        if st.get("phase") == PHASE_BOUND and (
            st.get("nodeName") != node
            or (st.get("selectedDevices") or {}) != {r: format_ids(i) for r, i in devices.items()}
        ):
            await self.claims.write(node, name, None)
        return Result(requeue=True)

    async def _set_pending(self, group: dict[str, Any], message: str) -> None:
        status = dict(group.get("status") or {})
        gen = group["metadata"].get("generation")
        old = find_condition(status.get("conditions"), CONDITION_SCHEDULED)
        conds = set_condition(
            status.get("conditions"),
            CONDITION_SCHEDULED,
            "False",
            REASON_UNSCHEDULABLE,
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
        conds = _ready(conds, False, gen)
        new = {
            "podCount": 0,
            **status,
            "phase": PHASE_PENDING,
            "conditions": conds,
            "observedGeneration": gen,
        }
        if new == status:
            return
        await self._write_status(group, new)
        if old is None or old.get("message") != message:
            self.recorder.emit(group, "Warning", "FailedScheduling", message)

    # --- bound groups ----------------------------------------------------------------
    async def _check_bound(self, group: dict[str, Any]) -> Result | None:
        """A bound group never moves; keep its record and its NodeHealthy condition true."""
        name = group["metadata"]["name"]
        status = group["status"]
        node = status["nodeName"]
        try:
            devices = selected_devices(group)
        except ValueError as err:
            problem = f"status.selectedDevices is malformed ({err}); delete and recreate the group"
            await self._set_conditions(group, (CONDITION_READY, "False", "InvalidStatus", problem))
            return None
        for stale in self.claims.nodes_claiming(name):
            if stale != node:
                # A claim left on another node (a bind that lost to another manager, or
                # an interrupted move of the record): the status is what the pods got.
                await self.claims.write(stale, name, None)
        where = self.claims.claim_of(name)
        if where is None or where != (node, devices):
            problem = await self._restore_record(name, node, devices, where)
            if problem:
                await self._set_conditions(
                    group, (CONDITION_READY, "False", REASON_CLAIM_CONFLICT, problem)
                )
                self.recorder.emit(group, "Warning", REASON_CLAIM_CONFLICT, problem)
                return None
        healthy, reason, message = _node_health(self._node(node), node, devices)
        gen = group["metadata"].get("generation")
        conds = set_condition(
            status.get("conditions"),
            CONDITION_NODE_HEALTHY,
            "True" if healthy else "False",
            reason,
            message,
            observed_generation=gen,
        )
        conds = _ready(conds, healthy, gen, self._pods_disagree(group, node, devices))
        if conds != status.get("conditions") or status.get("observedGeneration") != gen:
            new = {**status, "conditions": conds, "observedGeneration": gen}
            try:
                await self._write_status(group, new)
            except errors.Conflict:
                return Result(requeue=True)
            if not healthy:
                self.recorder.emit(group, "Warning", reason, message)
        return None

    async def _restore_record(
        self, name: str, node: str, devices: Devices, where: tuple[str, Devices] | None
    ) -> str | None:
        """Make the records agree with a bound group's status; returns a problem, if any.

        Checks before it writes: a record that gives the devices to someone else is a
        conflict to report, and the group's other claim is left as it is.
        """
        others = self.claims.held_by_others(name, node, devices)
        if others:
            return (
                f"status says node {node} devices {devices}, but {', '.join(others)} "
                "hold(s) them too; delete and recreate this group"
            )
        if where is not None and where[0] != node:
            await self.claims.write(where[0], name, None)
        await self.claims.write(node, name, devices)
        return None

    async def _set_conditions(
        self, group: dict[str, Any], *conds_in: tuple[str, str, str, str]
    ) -> None:
        status = dict(group.get("status") or {})
        gen = group["metadata"].get("generation")
        conds = status.get("conditions")
        for type_, st, reason, message in conds_in:
            conds = set_condition(conds, type_, st, reason, message, observed_generation=gen)  # type: ignore[arg-type]
        if conds != status.get("conditions"):
            status["conditions"] = conds
            await self._write_status(group, status)

    # --- writes that remember what they wrote ---------------------------------------------
    async def _write_status(self, group: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
        written = await self.client.update_status(SDG_KIND, {**group, "status": status})
        self._written[group["metadata"]["name"]] = _rv(written)
        return written

    async def _patch(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        written = await self.client.patch(SDG_KIND, name, patch)
        self._written[name] = _rv(written)
        return written

    # --- finalizer and release -------------------------------------------------------
    async def _add_finalizer(self, group: dict[str, Any]) -> dict[str, Any]:
        meta = group["metadata"]
        finalizers = [*(meta.get("finalizers") or []), FINALIZER]
        patch = _finalizers_patch(meta, finalizers)
        return await self._patch(meta["name"], patch)

    async def _finalize(self, group: dict[str, Any]) -> Result | None:
        meta = group["metadata"]
        name = meta["name"]
        if FINALIZER not in (meta.get("finalizers") or []):
            return None
        users = [
            pod_key(p)
            for p in self.cache.list(PODS, index=POD_GROUP_INDEX, value=name, copy=False)
            if is_active(p)
        ]
        if users:
            # Pod events re-trigger this group; nothing to do until they are gone.
            return None
        for node in self.claims.nodes_claiming(name):
            await self.claims.write(node, name, None)
        finalizers = [f for f in meta["finalizers"] if f != FINALIZER]
        patch = _finalizers_patch(meta, finalizers)
        try:
            await self._patch(name, patch)
        except errors.NotFound:
            return None
        return None

    async def _release_orphan(self, name: str) -> None:
        """Claims of a group that no longer exists (its finalizer was removed by hand).

        Only once the API server confirms it is gone: a cache that lags (or another
        manager's brand-new group) must not lose its claim.
        """
        nodes = self.claims.nodes_claiming(name)
        if not nodes:
            return
        try:
            await self.client.get(SDG_KIND, name)
            return
        except errors.NotFound:
            pass
        for node in nodes:
            await self.claims.write(node, name, None)

    # --- recovery --------------------------------------------------------------------
    async def _recover_once(self) -> None:
        if self._recovered:
            return
        async with self._recover_lock:
            if not self._recovered:
                await self.recover()
                self._recovered = True

    async def recover(self) -> None:
        """Before the first placement: make the records, group statuses and pods agree.

        Caches are synced (controllers start after sync), so the records are mirrored.
        A bound group missing from the records is restored from its status; a group that
        lost its status but whose pods are bound and carry injected device env is restored
        from those pods (the spec's "recover by inspecting running pods"); conflicts are
        reported as conditions, never resolved by a second allocation.
        """
        from controllers.recovery import recover

        await recover(self)

    def bound_pods(self, name: str) -> list[dict[str, Any]]:
        """Active pods of the group that are already bound to a node (cache, read-only)."""
        return [
            p
            for p in self.cache.list(PODS, index=POD_GROUP_INDEX, value=name, copy=False)
            if is_active(p) and (p.get("spec") or {}).get("nodeName")
        ]

    def _running_pods(self, name: str) -> list[str]:
        return sorted(pod_key(p) for p in self.bound_pods(name))

    def _pods_disagree(self, group: dict[str, Any], node: str, devices: Devices) -> str | None:
        """Cross-check the env our webhook injected into the group's running pods: a pod
        on another node or with other device IDs is reported, never "fixed" by moving
        devices (it may be using them right now)."""
        resources = (group.get("spec") or {}).get("resources") or {}
        odd = []
        name = group["metadata"]["name"]
        for pod in self.bound_pods(name):
            where = pod["spec"]["nodeName"]
            seen = devices_from_env(pod, resources, self.env_table)
            if where != node or (seen is not None and seen != devices):
                odd.append(f"{pod_key(pod)} on {where} with {seen}")
        if not odd:
            return None
        return (
            f"pods run with other devices than the group holds ({node} {devices}): "
            f"{'; '.join(sorted(odd)[:5])}; delete those pods to resolve"
        )

    def _node(self, name: str) -> dict[str, Any] | None:
        try:
            return self.cache.get(NODES, name)
        except errors.NotFound:
            return None


def _finalizers_patch(meta: Mapping[str, Any], finalizers: list[str]) -> dict[str, Any]:
    """A merge patch of the finalizer list, conditional on the version we read."""
    return {"metadata": {"finalizers": finalizers, "resourceVersion": meta["resourceVersion"]}}


def _node_health(
    node: Mapping[str, Any] | None, name: str, devices: Devices
) -> tuple[bool, str, str]:
    if node is None:
        return False, REASON_NODE_NOT_FOUND, f"node {name} no longer exists"
    if not is_node_ready(node):
        return False, REASON_NODE_NOT_READY, f"node {name} is not Ready"
    if (node.get("spec") or {}).get("unschedulable"):
        return (
            False,
            REASON_NODE_UNSCHEDULABLE,
            f"node {name} is cordoned: new pods of the group cannot be bound there",
        )
    capacity = node_device_capacity(node)
    short = [
        f"{res} {max(ids)}"
        for res, ids in sorted(devices.items())
        if ids and max(ids) >= capacity.get(res, 0)
    ]
    if short:
        return (
            False,
            REASON_DEVICES_MISSING,
            f"node {name} no longer offers the selected devices ({', '.join(short)}); "
            "the group does not move: delete and recreate it to place it elsewhere",
        )
    return True, REASON_NODE_READY, f"node {name} is Ready and offers the selected devices"


def _ready(
    conds: list[dict[str, Any]], healthy: bool, gen: int | None, problem: str | None = None
) -> list[dict[str, Any]]:
    if problem:
        return set_condition(
            conds,
            CONDITION_READY,
            "False",
            REASON_DEVICES_CONFLICT,
            problem,
            observed_generation=gen,
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

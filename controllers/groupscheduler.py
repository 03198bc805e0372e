"""The group scheduler: binds each Pending SharedDeviceGroup to one node and device IDs.

One decision (one span): Filter + Score (pure, ``controllers.placement``), claim the IDs in
the node's fenced record (``controllers.ledger``), write the group's status
(``controllers.groupwriter``). A claim found for a still-Pending group is adopted only when
it is that group's (same UID), for its current spec, on a node that still fits; any other
is given back after a live read (``controllers.ledger.release``). Bound groups never move.
On deletion the finalizer holds the group while any active pod references it; only then
are its devices released. Why: docs/design.md, "Ownership that holds against every client".
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import anyio
from opentelemetry import trace

from api.conditions import find_condition
from api.constants import (
    CONDITION_NODE_HEALTHY,
    CONDITION_READY,
    CONDITION_SCHEDULED,
    DEFAULT_ENV_TABLE,
    FINALIZER,
    PHASE_BOUND,
    REASON_CLAIM_CONFLICT,
    REASON_DEVICES_CONFLICT,
    REASON_HOLDER_LOST,
    REASON_INVALID_STATUS,
    REASON_NOT_READY,
    REASON_RECORD_MALFORMED,
    REASON_UNSCHEDULABLE,
    REASON_WAITING_FOR_HOLDER,
    SDG_KIND,
)
from api.pods import POD_GROUP_INDEX, is_active, pod_key
from api.v1alpha1 import format_ids, group_phase, is_bound, selected_devices, spec_pins
from controllers import metrics as sdg_metrics
from controllers.draclaims import (
    RESOURCECLAIMS,
    DeviceRef,
    DraPublisher,
    GroupClaimConflict,
    allocation_changed,
    claim_for,
    claim_pools,
    group_claim_name,
    is_group_claim,
)
from controllers.foreign import ForeignDevices, foreign_changed, foreign_facts, foreign_frees
from controllers.grouppods import survey
from controllers.groupstatus import (
    Problem,
    bound_status,
    describe,
    listed,
    pending_status,
    with_ready_problem,
)
from controllers.groupwriter import GroupWriter
from controllers.holders import (
    Given,
    Holders,
    Refused,
    holder_changed,
    holder_for,
    holder_name,
    is_holder,
    owner_uid,
    read_holder,
    requested,
)
from controllers.inventory import DEVICETAINTRULES, RESOURCESLICES, SOURCE_SLICE, node_of_slice
from controllers.ledger.book import Ledger
from controllers.ledger.records import nodes_named_by
from controllers.ledger.release import ClaimReleaser, bound_pods
from controllers.ledger.tracker import Devices, DeviceTracker, InsufficientDevices
from controllers.pinning import LedgerPins, claim_matches_pins
from controllers.placement import NodeMemo, filter_node, place
from controllers.recovery import Recovery, restore_record
from controllers.watches import (
    group_changed,
    group_reading_pod,
    groups_bound_on,
    index_groups,
    node_changed,
    only_deletes,
    pending_groups,
    pod_matters_to_group,
    pods_of_group,
    record_frees_devices,
    record_takes_devices,
)
from sdgruntime import errors
from sdgruntime.cache import Cache
from sdgruntime.client import Client
from sdgruntime.controllerutil import contains_finalizer
from sdgruntime.events import EventRecorder
from sdgruntime.handler import EnqueueRequestsFromMapFunc as MapTo
from sdgruntime.kinds import CONFIGMAPS, NODES, PODS, MutableObj, meta_of, spec_of, status_of
from sdgruntime.manager import Manager
from sdgruntime.reconcile import Request, Result
from sdgruntime.tracing import start_span, tracer_for

log = logging.getLogger(__name__)
TRACER_NAME = "deviceshare.io/group-scheduler"

#: How long a holder pod the kubelet refused is kept (its reason shown) before the group
#: is placed again.
HOLDER_RETRY_SECONDS = 10.0
#: How long a new holder pod is waited for before the group's status says it waits (most
#: are given their devices well within it: one status write and Event less per group).
HOLDER_QUIET_SECONDS = 3.0
#: The longest wait between two tries of start-up recovery.
RECOVERY_RETRY_MAX = 30.0
#: How soon a Pending group is judged again after another bind took devices: its message
#: says how many are free. One pass per interval however many binds come.
PENDING_RECHECK_SECONDS = 3.0


class PendingRecheck:
    """Pending groups judged once more after devices were taken (their messages count the
    free devices): after every ``poke``, within ``delay`` seconds, one pass queues every
    group Pending then. Pokes while a pass waits join it, so a burst of binds costs one
    pass, not one queue add per Pending group per bind (quadratic in a burst of groups)."""

    def __init__(
        self,
        delay: float,
        pending: Callable[[], Iterable[Request]],
        sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
    ) -> None:
        self.delay = delay
        self._pending = pending
        self._sleep = sleep
        self._poked = False
        self._wake: anyio.Event | None = None

    def poke(self) -> None:
        """Devices were taken: a pass is due (sync, for event handlers)."""
        self._poked = True
        if self._wake is not None:
            self._wake.set()

    async def run(self, enqueue: Callable[[Request], None]) -> None:
        """Make the passes, each request through ``enqueue``, until cancelled."""
        while True:
            if not self._poked:
                self._wake = anyio.Event()
                await self._wake.wait()
            await self._sleep(self.delay)
            self._poked = False  # a poke from here on is after this pass's reads
            for request in self._pending():
                enqueue(request)


class _FreeWithOwnClaim:
    """Free counts as if ``devices`` (the group's own claim) were given back: whether a
    node still fits a group that already holds devices there."""

    def __init__(self, tracker: DeviceTracker, devices: Devices) -> None:
        self.tracker = tracker
        self.devices = devices

    def free(self, node: str, resource: str) -> int:
        return self.tracker.free(node, resource) + len(self.devices.get(resource, ()))

    def capacity(self, node: str, resource: str) -> int:
        return self.tracker.capacity(node, resource)


class GroupScheduler:
    """Reconciler for SharedDeviceGroups: placement, fenced claims, finalizer, health."""

    def __init__(
        self,
        client: Client,
        cache: Cache,
        claims: Ledger,
        recorder: EventRecorder,
        env_table: Mapping[str, str] = DEFAULT_ENV_TABLE,
        tracer_provider: trace.TracerProvider | None = None,
        foreign: ForeignDevices | None = None,
        holders: Holders | None = None,
        dra: DraPublisher | None = None,
    ) -> None:
        self.tracer = tracer_for(tracer_provider, TRACER_NAME)
        self.env_table = env_table
        self.cache = cache
        self.claims = claims
        self.recorder = recorder
        self.foreign = foreign or ForeignDevices(env_table)
        self.writer = GroupWriter(client)
        self.holders = holders or Holders(client, cache, claims.namespace, enabled=False)
        #: Enters groups Bound on ResourceSlice devices in DRA's books (None: not served).
        self.dra = dra
        self.releaser = ClaimReleaser(claims, cache, client, self.writer.fence)
        self.recovery = Recovery(cache, claims, self.writer, self.releaser, recorder, env_table)
        #: Set once start-up recovery has run (:meth:`recover`, a leader-only runnable):
        #: no group is placed before records, statuses and pods agree.
        self.recovered = anyio.Event()
        #: What each cached Node alone decides, kept across placements (placement.NodeMemo).
        self.node_memo = NodeMemo()
        #: Group -> (UID of its holder pod the kubelet refused, when SDG saw that); one per
        #: group at most, dropped when the holder is replaced or the group is gone.
        self._refused: dict[str, tuple[str, float]] = {}
        #: Group -> when its holder pod was made (or first seen waiting): a holder is
        #: waited for quietly at first. One per group, dropped at bind or deletion.
        self._holder_since: dict[str, float] = {}

    async def reconcile(self, request: Request) -> Result | None:
        try:
            return await self._reconcile(request)
        except errors.Conflict:
            # Someone wrote first (our own status controller, another manager): re-read
            # and decide again, with backoff; a conflict is not a failure.
            return Result(requeue=True)

    async def _reconcile(self, request: Request) -> Result | None:
        await self.recovered.wait()
        name = request.name
        try:
            group = self.cache.get(SDG_KIND, name)
        except errors.NotFound:
            # Gone (or not cached yet): its claims are released only if a live read agrees.
            self.writer.forget(name)
            self.claims.unreserve(name)
            self._refused.pop(name, None)
            self._holder_since.pop(name, None)
            await self.releaser.release_stale(name)
            await self._drop_orphan_holder(name)
            await self._drop_orphan_claim(name)
            return None
        if self.writer.behind(group):
            # The cache has not caught up with our own write yet; its watch event will
            # bring the newer object and another reconcile.
            return None
        if name in self.recovery.failed:
            await self.recovery.recover_group(group)
            return Result(requeue=True)  # decide again on the object recovery wrote
        meta = group["metadata"]
        if meta.get("deletionTimestamp"):
            return await self._finalize(group)
        group = await self.writer.add_finalizer(group, FINALIZER)
        if is_bound(group):
            return await self._check_bound(group)
        return await self._schedule(group)

    async def recover(self) -> None:
        """Start-up recovery, once per leadership, before any group is reconciled; a
        failure (the API server away) is retried with backoff up to RECOVERY_RETRY_MAX
        seconds, the group workers waiting meanwhile. Then it idles until cancelled."""
        delay = 0.5
        while True:
            try:
                await self.recovery.run()
                break
            except Exception as err:  # retried: nothing may be placed before it succeeds
                log.warning("start-up recovery failed, retrying in %.1f s: %s", delay, err)
                await anyio.sleep(delay)
                delay = min(delay * 2, RECOVERY_RETRY_MAX)
        self.recovered.set()
        await anyio.sleep_forever()

    # --- scheduling ------------------------------------------------------------------
    async def _schedule(self, group: MutableObj) -> Result | None:
        meta = group["metadata"]
        name, uid = meta["name"], meta.get("uid", "")
        spec = spec_of(group)
        resources = spec.get("resources") or {}
        started = time.perf_counter()
        with start_span(self.tracer, "schedule group") as span:
            span.set_attribute("sdg.group", name)
            existing = self.claims.claim_of(name)
            if existing is not None:
                node, devices = existing
                if self._adoptable(group, node, devices):
                    # The first half of an interrupted bind (ours or another manager's),
                    # renewed with this group version first: a release of it decided
                    # meanwhile (on the claim as it was) then fails instead of freeing
                    # the devices this status write is about to give the group.
                    span.set_attribute("sdg.result", "adopted")
                    span.set_attribute("sdg.node", node)
                    try:
                        await self.claims.writer.claim_for(node, group, devices)
                    except errors.Conflict:
                        span.set_attribute("sdg.result", "conflict")
                        return Result(requeue=True)
                    return await self._bind_status(group, node, devices, started)
                # Another group's claim under this name, one for an older spec, or on a
                # node that no longer fits: given back if a live read agrees.
                live = await self.releaser.release_stale(name)
                if live is None or live["metadata"].get("uid") != uid:
                    return None  # gone or recreated: its own events follow
                if group_phase(live) == PHASE_BOUND:
                    return Result(requeue=True)  # our cache is behind: decide on the new copy
                group = dict(live)  # the fenced copy: our writes below are conditional on it
            stranded = sorted(pod_key(p) for p in bound_pods(self.cache, name))
            if stranded:
                # Pods of this group run with devices nobody records (recovery could not
                # restore them): placing the group afresh would hand those devices out
                # twice, to the pods and to whoever gets them next.
                span.set_attribute("sdg.result", "blocked")
                await self._set_pending(
                    group,
                    f"{len(stranded)} pod(s) of this group still run from an earlier binding "
                    f"that could not be restored ({listed(stranded)}); delete them "
                    "and the group is placed again",
                )
                return None
            holder = self.holders.of(name)
            if holder is not None:
                # Placed already: the kubelet decides which devices its holder gets.
                span.set_attribute("sdg.result", "holder")
                return await self._await_holder(group, holder, started)
            # From here to reserve() nothing awaits: with several group workers this is
            # the one serialised step (one reconcile runs at a time between awaits), so no
            # two decisions see the same devices free. The writes after it overlap; the
            # claim book serialises those per node.
            nodes = self.cache.list(NODES, copy=False)
            decision = place(
                spec,
                nodes,
                self.claims.tracker,
                blocked=self._blocked(resources),
                pins=self._pins(name),
                memo=self.node_memo,
            )
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
            devices = self.claims.reserve(
                name, decision.node, resources, decision.pinned.get(decision.node)
            )
            span.set_attribute("sdg.node", decision.node)
            wanted = self.holders.needed(resources, self.claims.offers.get(decision.node))
            if wanted:
                # The reservation stays until the kubelet has given the holder its devices.
                span.set_attribute("sdg.result", "holder created")
                return await self._create_holder(group, decision.node, wanted)
            span.set_attribute(
                "sdg.devices", ";".join(f"{r}={format_ids(i)}" for r, i in devices.items())
            )
            try:
                await self.claims.writer.write(
                    decision.node,
                    name,
                    devices,
                    expect=None,
                    uid=uid,
                    version=str(group["metadata"].get("resourceVersion") or ""),
                )
            except errors.Conflict:
                # Someone wrote the record first; the view is refreshed: decide again.
                span.set_attribute("sdg.result", "conflict")
                sdg_metrics.SCHEDULING_ATTEMPTS.labels("group", "conflict").inc()
                return Result(requeue=True)
            finally:
                self.claims.unreserve(name)
            span.set_attribute("sdg.result", "bound")
            return await self._bind_status(group, decision.node, devices, started)

    # --- holder pods (device-plugin nodes) --------------------------------------------
    async def _create_holder(
        self, group: MutableObj, node: str, wanted: Mapping[str, int]
    ) -> Result | None:
        name = group["metadata"]["name"]
        try:
            await self.holders.create(group, node, wanted)
        except errors.ApiError as err:
            self.claims.unreserve(name)
            await self._set_pending(
                group,
                f"node {node} fits, but SDG cannot create the holder pod that enters the "
                f"group's devices in the kubelet's books: {err}",
            )
            return Result(requeue=True)
        # No status yet: the kubelet usually answers within a second, and the holder's
        # own events bring the group back. Only a holder still waiting after
        # HOLDER_QUIET_SECONDS is written down (``_await_holder``).
        self._holder_since[name] = time.monotonic()
        return Result(requeue_after=HOLDER_QUIET_SECONDS)

    async def _await_holder(
        self, group: MutableObj, holder: Mapping[str, Any], started: float
    ) -> Result | None:
        """A Pending group whose holder pod exists: bind it on the devices the kubelet gave
        the holder, once it says which; replace a holder that is not this group's."""
        meta, spec = group["metadata"], spec_of(group)
        name, uid = meta["name"], meta.get("uid", "")
        resources = spec.get("resources") or {}
        node = str(spec_of(holder).get("nodeName") or "")
        holder_uid = str(meta_of(holder).get("uid") or "")
        offers = self.claims.offers.get(node)
        wanted = self.holders.needed(resources, offers) if node else {}
        if meta_of(holder).get("deletionTimestamp"):
            return None  # its deletion event places the group again
        pinned = any(r in wanted for r in spec_pins(spec))
        if owner_uid(holder) != uid or not wanted or requested(holder) != wanted or pinned:
            # An earlier group's holder, or one for an older spec (now pinning devices the
            # kubelet would pick) or a node that no longer offers the devices: replaced
            # (the deletion's event places the group again).
            self.claims.unreserve(name)
            await self.holders.delete(holder)
            return None
        state = read_holder(holder, offers or {})
        if isinstance(state, Refused):
            # Kept for a while (the group says why meanwhile), then replaced: a node the
            # kubelet keeps refusing is not tried at the kubelet's speed.
            self.claims.unreserve(name)
            seen_uid, refused_at = self._refused.get(name, ("", 0.0))
            if seen_uid != holder_uid:
                refused_at = time.monotonic()
                self._refused[name] = (holder_uid, refused_at)
            wait = HOLDER_RETRY_SECONDS - (time.monotonic() - refused_at)
            if wait > 0:
                await self._set_pending(
                    group, f"{state.why}; placing the group again in {HOLDER_RETRY_SECONDS:.0f}s"
                )
                return Result(requeue_after=wait)
            self._refused.pop(name, None)
            await self.holders.delete(holder)
            return None
        if not isinstance(state, Given):
            if name not in self.claims.reserved:
                # A restart lost the reservation: hold the count again (the kubelet has
                # them counted already; this keeps SDG from offering them meanwhile).
                with contextlib.suppress(InsufficientDevices):
                    self.claims.reserve(name, node, wanted)
            since = self._holder_since.setdefault(name, time.monotonic())
            quiet = HOLDER_QUIET_SECONDS - (time.monotonic() - since)
            if quiet > 0:
                return Result(requeue_after=quiet)
            await self._set_pending(
                group,
                f"placed on node {node}; {state.why}",
                reason=REASON_WAITING_FOR_HOLDER,
            )
            return None
        self._holder_since.pop(name, None)
        self.claims.unreserve(name)
        devices: Devices = {r: list(i) for r, i in state.devices.items()}
        others = self.claims.held_by_others(name, node, devices)
        if others:
            await self._set_pending(
                group,
                f"the kubelet gave holder pod {self.holders.namespace}/{holder_name(name)} "
                f"{describe(devices)}, which SDG's records give to {listed(others)} (bound "
                "without a holder); the group is placed when they are released",
            )
            return None
        rest = {r: int(n) for r, n in resources.items() if r not in devices}
        try:
            if rest:
                devices.update(self.claims.reserve(name, node, rest))
        except InsufficientDevices as err:
            await self._set_pending(group, f"node {node}: {err}")
            return Result(requeue=True)
        try:
            await self.claims.writer.write(
                node,
                name,
                devices,
                expect=self.claims.claim(node, name),
                uid=uid,
                version=str(meta.get("resourceVersion") or ""),
            )
        except errors.Conflict:
            return Result(requeue=True)
        finally:
            self.claims.unreserve(name)
        return await self._bind_status(group, node, devices, started)

    def _holder_problem(self, group: MutableObj, node: str, devices: Devices) -> Problem | None:
        """Why a Bound group's devices are not (or no longer) in the kubelet's books, if
        they are not: its holder pod is gone, refused, or holds other devices."""
        name = group["metadata"]["name"]
        resources = spec_of(group).get("resources") or {}
        offers = self.claims.offers.get(node)
        wanted = self.holders.needed(resources, offers)
        if not wanted:
            return None
        key = f"{self.holders.namespace}/{holder_name(name)}"
        holder = self.holders.of(name)
        if holder is None or owner_uid(holder) != group["metadata"].get("uid"):
            return (
                REASON_HOLDER_LOST,
                f"holder pod {key} is gone: the kubelet no longer counts the group's devices, "
                "so plain pods may be given them; SDG creates it again, and if the kubelet "
                "gives it other devices, delete and recreate the group",
            )
        state = read_holder(holder, offers or {})
        if isinstance(state, Given):
            held = {r: sorted(devices.get(r, [])) for r in wanted}
            if state.devices == held:
                return None
            return (
                REASON_HOLDER_LOST,
                f"holder pod {key} holds {describe(state.devices)} but the group holds "
                f"{describe(held)}: plain pods may be given the group's devices; delete and "
                "recreate the group",
            )
        return (REASON_HOLDER_LOST, f"{state.why}: the kubelet does not count the group's devices")

    async def _keep_holder(self, group: MutableObj, node: str) -> None:
        """A Bound group on device-plugin resources without its holder: create it again."""
        name = group["metadata"]["name"]
        resources = spec_of(group).get("resources") or {}
        wanted = self.holders.needed(resources, self.claims.offers.get(node))
        if wanted and self.holders.of(name) is None:
            try:
                await self.holders.create(group, node, wanted)
            except errors.ApiError as err:
                log.warning("cannot create the holder pod of group %s again: %s", name, err)

    def _slice_refs(self, node: str, devices: Devices) -> list[DeviceRef]:
        """Of ``devices`` on ``node``, those a DRA driver publishes, as DRA names them."""
        offers = self.claims.offers.get(node) or {}
        refs = []
        for res, ids in sorted(devices.items()):
            offer = offers.get(res)
            if offer is None or offer.source != SOURCE_SLICE:
                continue
            for i in ids:
                d = offer.device(i)
                if d is not None and d.driver:
                    refs.append(DeviceRef(d.driver, d.pool, d.name))
        return refs

    async def _dra_problem(self, group: MutableObj, node: str, devices: Devices) -> Problem | None:
        """A Bound group's entry in DRA's books: made again if it went missing; a claim
        that holds one of its devices too is reported."""
        refs = self._slice_refs(node, devices)
        if not refs or self.dra is None or self.dra.allocations is None:
            return None
        name = group["metadata"]["name"]
        mirror = self.dra.allocations
        if set(mirror.devices_of(self.dra.namespace, group_claim_name(name))) != set(refs):
            try:
                await self.dra.ensure(group, node, refs)
            except (GroupClaimConflict, errors.ApiError) as err:
                if isinstance(err, errors.Conflict):
                    raise
                return (
                    REASON_CLAIM_CONFLICT,
                    f"the group's devices are not in DRA's books ({err}): kube-scheduler may "
                    "give them to a pod's ResourceClaim",
                )
        others = sorted({h for r in refs for h in mirror.held_by(r) if h != name})
        if others:
            return (
                REASON_DEVICES_CONFLICT,
                f"DRA's books give devices of this group to {listed(others)} too; delete "
                "those claims (or their pods) to resolve",
            )
        return None

    async def _drop_orphan_claim(self, name: str) -> None:
        """Group ``name`` is gone from the cache: its ResourceClaim goes too, once a live
        read agrees no group of that name (and UID) exists."""
        if self.dra is None or self.dra.allocations is None:
            return
        if not self.dra.allocations.devices_of(self.dra.namespace, group_claim_name(name)):
            return
        live = await self.writer.live(name)
        uid = live["metadata"].get("uid", "") if live is not None else ""
        await self.dra.remove_unless(name, uid)

    async def _drop_orphan_holder(self, name: str) -> None:
        """Group ``name`` is gone from the cache: delete its holder pod if a live read
        agrees it belongs to no existing group (the garbage collector would, too)."""
        holder = self.holders.of(name)
        if holder is None:
            return
        live = await self.writer.live(name)
        if live is None or live["metadata"].get("uid") != owner_uid(holder):
            await self.holders.delete(holder)

    def _blocked(self, resources: Mapping[str, Any]) -> dict[str, dict[str, str]]:
        """Nodes where placement must not give out a requested resource, and why: pods
        outside any group use it, or the node's claim record is unreadable."""
        blocked = self.foreign.blocked(resources)
        for node in self.claims.broken:
            for res in resources:
                blocked.setdefault(node, {})[res] = (
                    "have a malformed claim record (nothing more is given out there until it "
                    "is repaired; kubectl describe sdg of a group there says which)"
                )
        return blocked

    def _adoptable(self, group: MutableObj, node: str, devices: Devices) -> bool:
        """A claim a Pending group may finish binding with: made by this very group (UID),
        for its current spec, on a node that still fits that spec."""
        meta, spec = group["metadata"], spec_of(group)
        claim_uid = self.claims.uid_of(node, meta["name"])
        if claim_uid and claim_uid != meta.get("uid"):
            return False
        want = {r: int(n) for r, n in (spec.get("resources") or {}).items()}
        if {r: len(i) for r, i in devices.items()} != want:
            return False
        node_obj = self._node(node)
        if node_obj is None:
            return False
        tracker = self.claims.tracker
        offers = self.claims.offers.get(node) or {}
        for res, ids in devices.items():
            offer = offers.get(res)
            if offer is None or not set(ids) <= set(offer.usable()):
                return False  # a device of the claim is gone or unhealthy
        if not claim_matches_pins(spec, devices, offers):
            return False  # a claim for other pinned devices (spec.devices changed)
        blocked = self._blocked(want)
        free = _FreeWithOwnClaim(tracker, devices)
        pins = self._pins(meta["name"])
        return not filter_node(
            spec, node_obj, free, blocked=blocked, pins=pins, memo=self.node_memo
        )

    def _pins(self, group: str) -> LedgerPins:
        """Where ``group``'s pinned devices (``spec.devices``) are free, by the ledger."""
        return LedgerPins(self.claims, group, holders=self.holders.enabled)

    async def _bind_status(
        self, group: MutableObj, node: str, devices: Devices, started: float
    ) -> Result | None:
        name = group["metadata"]["name"]
        refs = self._slice_refs(node, devices)
        if refs and self.dra is not None:
            # In DRA's books before Bound: kube-scheduler gives those devices no claim.
            try:
                await self.dra.ensure(group, node, refs)
            except (GroupClaimConflict, errors.ApiError) as err:
                if isinstance(err, errors.Conflict):
                    raise
                # Not entered: the record's claim is given back and the group placed
                # again (a claim another wrote meanwhile, or a refused write).
                await self.claims.writer.write(
                    node, name, None, expect=self.claims.claim(node, name)
                )
                await self._set_pending(
                    group,
                    f"node {node}: cannot enter the group's devices in DRA's books ({err}); "
                    "placing the group again",
                )
                return Result(requeue=True)
        status = bound_status(
            group,
            node,
            devices,
            self._node(node),
            newly_bound=True,
            offers=self.claims.offers.get(node),
        )
        try:
            await self.writer.status(group, status)
        except errors.Conflict:
            # Someone else changed the group while we bound it: a live read decides
            # whether our claim is surplus (bound elsewhere, recreated) or still ours.
            await self.releaser.release_stale(name, adoptable_on=node)
            return Result(requeue=True)
        except errors.NotFound:
            await self.releaser.release_stale(name)
            return None
        sdg_metrics.SCHEDULING_ATTEMPTS.labels("group", "bound").inc()
        sdg_metrics.DECISION_LATENCY.labels("group").observe(time.perf_counter() - started)
        self.recorder.emit(
            group, "Normal", "Scheduled", f"Bound to node {node}: {describe(devices)}"
        )
        return None

    async def _set_pending(
        self, group: MutableObj, message: str, *, reason: str = REASON_UNSCHEDULABLE
    ) -> None:
        status = pending_status(group, message, reason=reason)
        if status == status_of(group):
            return
        old = find_condition(status_of(group).get("conditions"), CONDITION_SCHEDULED)
        await self.writer.status(group, status)
        if old is None or old.get("message") != message:
            if reason == REASON_WAITING_FOR_HOLDER:
                self.recorder.emit(group, "Normal", reason, message)
            else:
                self.recorder.emit(group, "Warning", "FailedScheduling", message)

    # --- bound groups ----------------------------------------------------------------
    async def _check_bound(self, group: MutableObj) -> Result | None:
        """A bound group never moves; keep its record and its conditions true."""
        meta = group["metadata"]
        name, uid = meta["name"], meta.get("uid", "")
        node = group["status"]["nodeName"]
        try:
            devices = selected_devices(group)
        except ValueError as err:
            problem = f"status.selectedDevices is malformed ({err}); delete and recreate the group"
            await self.writer.status(
                group, with_ready_problem(group, (REASON_INVALID_STATUS, problem))
            )
            return None
        if any(n != node for n in self.claims.nodes_claiming(name)):
            # A claim left on another node (a bind that lost to another manager, an
            # earlier group of this name): the status is what the pods got.
            live = await self.releaser.release_stale(name)
            if live is None or live["metadata"].get("uid") != uid:
                return None
        if self.claims.claim_on(node, name) != devices or self.claims.uid_of(node, name) != uid:
            refused = await restore_record(self.claims, group, node, devices)
            if refused:
                await self._report(group, (REASON_CLAIM_CONFLICT, refused))
                return None
        pods = survey(
            pods_of_group(self.cache, name),
            node,
            devices,
            spec_of(group).get("resources") or {},
            self.env_table,
        )
        await self._keep_holder(group, node)
        conflict = (
            self._devices_disputed(group, node, devices, pods.odd)
            or self._holder_problem(group, node, devices)
            or await self._dra_problem(group, node, devices)
        )
        status = bound_status(
            group,
            node,
            devices,
            self._node(node),
            problem=conflict,
            pod_count=pods.active,
            offers=self.claims.offers.get(node),
        )
        old = status_of(group).get("conditions")
        if await self.writer.status(group, status) is None:
            return None
        for type_ in (CONDITION_NODE_HEALTHY, CONDITION_READY):
            # A Warning for each newly false condition that says something of its own
            # (a Ready that only echoes an unhealthy node is not repeated).
            before = find_condition(old, type_) or {}
            now = find_condition(status["conditions"], type_) or {}
            if (
                now.get("status") == "False"
                and now.get("reason") != REASON_NOT_READY
                and before.get("message") != now.get("message")
            ):
                self.recorder.emit(group, "Warning", str(now["reason"]), str(now["message"]))
        return None

    def _devices_disputed(
        self, group: MutableObj, node: str, devices: Devices, odd: Sequence[str]
    ) -> Problem | None:
        """Why the group's devices are disputed right now, if they are: pods outside any
        group use them, its own pods run with other devices (``odd``, from ``survey``), or
        its record is unreadable."""
        resources = spec_of(group).get("resources") or {}
        foreign = self.foreign.problem(node, resources)
        if foreign is not None:
            return foreign
        if odd:
            return (
                REASON_DEVICES_CONFLICT,
                f"pods run with other devices than the group holds ({node} {devices}): "
                f"{'; '.join(odd[:5])}; delete those pods to resolve",
            )
        broken = self.claims.broken.get(node)
        if broken:
            return (
                REASON_RECORD_MALFORMED,
                f"{broken}. The group keeps its devices, but nothing more is given out on "
                f"node {node} until the record is repaired",
            )
        return None

    async def _report(self, group: MutableObj, problem: Problem) -> None:
        await self.writer.status(group, with_ready_problem(group, problem))
        self.recorder.emit(group, "Warning", problem[0], problem[1])

    # --- finalizer -------------------------------------------------------------------
    async def _finalize(self, group: MutableObj) -> Result | None:
        meta = group["metadata"]
        if not contains_finalizer(group, FINALIZER):
            return None
        name = meta["name"]
        users = [
            p
            for p in self.cache.list(PODS, index=POD_GROUP_INDEX, value=name, copy=False)
            if is_active(p)
        ]
        if users:
            # Pod events re-trigger this group; nothing to do until they are gone.
            return None
        self.claims.unreserve(name)
        self._refused.pop(name, None)
        self._holder_since.pop(name, None)
        holder = self.holders.of(name)
        if holder is not None:
            # Out of the kubelet's books first: if this fails, the finalizer stays.
            await self.holders.delete(holder)
        if self.dra is not None:
            # Out of DRA's books first (this very group's claim, by UID).
            await self.dra.remove(name, str(meta.get("uid") or ""))
        if not await self.releaser.release_deleted(group):
            return None
        try:
            await self.writer.remove_finalizer(group, FINALIZER)
        except errors.NotFound:
            return None
        return None

    def _node(self, name: str) -> MutableObj | None:
        """The cached node, not copied: only read (placement's checks, status builders)."""
        try:
            return self.cache.get(NODES, name, copy=False)
        except errors.NotFound:
            return None


def setup(
    mgr: Manager,
    scheduler: GroupScheduler,
    *,
    workers: int = 1,
    resource_slices: bool = True,
    taint_rules: bool = False,
) -> None:
    """Register the group scheduler with everything that can change a group's decision."""
    cache, claims, table = mgr.cache, scheduler.claims, scheduler.env_table
    holders_ns = scheduler.foreign.holders_namespace
    index_groups(cache)
    # Recovery first, on the leader, after the caches synced: reconciles wait for it.
    mgr.add_runnable(scheduler.recover, leader_only=True)

    def for_node(node: Mapping[str, Any]) -> Iterator[Request]:
        """A node changed: Pending groups may fit now; bound groups re-check health."""
        yield from pending_groups(cache)
        yield from groups_bound_on(cache, [node["metadata"]["name"]])

    def for_record(cm: Mapping[str, Any]) -> Iterator[Request]:
        """A record changed: a claim may await adoption, bound groups on its node re-check
        that it still holds them (written back, or the conflict reported), and groups it
        names may hold a claim on the wrong node. (Pending groups retry when it frees
        devices: ``record_frees_devices``.)"""
        _node, named = nodes_named_by(cm)
        yield from groups_bound_on(cache, named)
        for node in named:
            record = claims.records.get(node)
            yield from (Request(name) for name in (record.claims if record else ()))

    def near_foreign_pod(pod: Mapping[str, Any]) -> Iterator[Request]:
        """Pods outside any group on a node: the groups bound there re-check. (Pending
        groups retry when such a pod may free devices: ``foreign_frees``.)"""
        if foreign_facts(pod, table, holders_ns):
            yield from groups_bound_on(cache, [spec_of(pod).get("nodeName")])

    def holder_of(pod: Mapping[str, Any]) -> Iterator[Request]:
        """A holder pod changed: its group binds, re-checks, or is placed again."""
        group_name = holder_for(pod)
        if group_name and is_holder(pod, scheduler.holders.namespace):
            yield Request(group_name)

    def for_slice(resource_slice: Mapping[str, Any]) -> Iterator[Request]:
        """A node's published devices changed: as for a node."""
        node = node_of_slice(resource_slice)
        if node is not None:
            yield from pending_groups(cache)
            yield from groups_bound_on(cache, [node])

    def for_claim(claim: Mapping[str, Any]) -> Iterator[Request]:
        """A ResourceClaim's allocation changed: a group's own claim re-checks its group;
        another claim frees or takes devices of the nodes its pools are on."""
        dra = scheduler.dra
        if dra is not None and is_group_claim(claim, dra.namespace):
            group_name = claim_for(claim)
            if group_name:
                yield Request(group_name)
            return
        yield from pending_groups(cache)
        nodes = {n for p in claim_pools(claim) for n in claims.nodes_of_pool(p)}
        yield from groups_bound_on(cache, sorted(nodes))

    def for_taint_rule(rule: Mapping[str, Any]) -> Iterator[Request]:
        """A DeviceTaintRule changed: devices it matches may be (un)healthy now."""
        yield from pending_groups(cache)
        selector = spec_of(rule).get("deviceSelector") or {}
        pool = selector.get("pool")
        if selector.get("driver") and pool:
            nodes = claims.nodes_of_pool((str(selector["driver"]), str(pool)))
        else:
            nodes = set(claims.offers)
        yield from groups_bound_on(cache, sorted(nodes))

    recheck = PendingRecheck(PENDING_RECHECK_SECONDS, lambda: pending_groups(cache))

    def recheck_pending(_cm: Mapping[str, Any]) -> Iterator[Request]:
        """Devices were taken: Pending groups re-judge once, delayed (their counts)."""
        recheck.poke()
        return iter(())

    builder = mgr.controller("group-scheduler").for_(SDG_KIND, [group_changed])
    if resource_slices:
        builder = builder.watches(RESOURCESLICES, MapTo(for_slice))
        builder = builder.watches(RESOURCECLAIMS, MapTo(for_claim), [allocation_changed()])
    if taint_rules:
        builder = builder.watches(DEVICETAINTRULES, MapTo(for_taint_rule))
    controller = (
        builder.watches(NODES, MapTo(for_node), [node_changed])
        .watches(CONFIGMAPS, MapTo(for_record))
        .watches(CONFIGMAPS, MapTo(lambda _cm: pending_groups(cache)), [record_frees_devices])
        .watches(CONFIGMAPS, MapTo(recheck_pending), [record_takes_devices])
        # A deleted group's status held its devices until now: Pending groups retry.
        .watches(SDG_KIND, MapTo(lambda _gone: pending_groups(cache)), [only_deletes])
        .watches(PODS, MapTo(group_reading_pod(cache, table)), [pod_matters_to_group])
        .watches(PODS, MapTo(near_foreign_pod), [foreign_changed(table, holders_ns)])
        .watches(
            PODS,
            MapTo(lambda _pod: pending_groups(cache)),
            [foreign_frees(table, scheduler.foreign.counts_node, holders_ns)],
        )
        .watches(PODS, MapTo(holder_of), [holder_changed(scheduler.holders.namespace)])
        .with_options(max_concurrent_reconciles=workers)
        .complete(scheduler)
    )
    mgr.add_runnable(functools.partial(recheck.run, controller.enqueue))

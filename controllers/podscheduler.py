"""The pod scheduler: binds pods of a Bound group to the group's node.

There is no search: a group's pods go where the group is. What a standalone scheduler
still owes is the node's own checks (cordon, taints, nodeSelector/affinity, CPU/memory/
pods, host ports), done in memory against what the node's pods take (``NodeBook``: the
pod cache's plus the pods this process has bound but the cache has not shown yet,
"assumed", as kube-scheduler does). The check and the assumption run with no await
between them; the Binding POST comes after, so binds to one node pipeline with bounded
concurrency (the controller's worker count).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Mapping
from typing import Any

from opentelemetry import trace

from api.conditions import find_condition, rfc3339
from api.constants import DEFAULT_ENV_TABLE, SCHEDULER_NAME, SDG_KIND
from api.pods import delivered_devices, is_finished, pod_group
from api.v1alpha1 import is_bound, selected_devices
from controllers import metrics as sdg_metrics
from controllers.groupstatus import conflict_of
from controllers.nodebook import NodeBook
from controllers.podevents import BurstTeller
from controllers.podfit import pod_fits, share_of
from controllers.watches import (
    group_changed,
    groups_bound_on,
    index_groups,
    node_changed,
    pods_of_group,
)
from sdgruntime import errors
from sdgruntime.cache import Cache
from sdgruntime.client import Client
from sdgruntime.controller import Controller
from sdgruntime.events import EventRecorder
from sdgruntime.handler import EnqueueRequestsFromMapFunc as MapTo
from sdgruntime.kinds import NODES, PODS, meta_of, spec_of, status_of
from sdgruntime.manager import Manager
from sdgruntime.predicate import Funcs
from sdgruntime.reconcile import Request, Result
from sdgruntime.tracing import start_span, tracer_for

log = logging.getLogger(__name__)
TRACER_NAME = "deviceshare.io/pod-scheduler"


def wants_scheduling(pod: Mapping[str, Any], scheduler_name: str = SCHEDULER_NAME) -> bool:
    """Ours to bind: our schedulerName, no node yet, not terminating, not gated, not done."""
    meta, spec = meta_of(pod), spec_of(pod)
    return (
        spec.get("schedulerName") == scheduler_name
        and not spec.get("nodeName")
        and not meta.get("deletionTimestamp")
        and not spec.get("schedulingGates")
        and not is_finished(pod)
    )


class PodScheduler:
    """Reconciler for pods that name our scheduler."""

    def __init__(
        self,
        client: Client,
        cache: Cache,
        recorder: EventRecorder,
        scheduler_name: str = SCHEDULER_NAME,
        tracer_provider: trace.TracerProvider | None = None,
        env_table: Mapping[str, str] = DEFAULT_ENV_TABLE,
    ) -> None:
        self.env_table = env_table
        self.tracer = tracer_for(tracer_provider, TRACER_NAME)
        self.client = client
        self.cache = cache
        self.recorder = recorder
        self.scheduler_name = scheduler_name
        #: What each node's pods take: the cache's (fed by its pod informer from here
        #: on) and the ones this process is binding.
        self.book = NodeBook()
        cache.informer(PODS).add_handler(
            self.book.pod_added, self.book.pod_updated, self.book.pod_deleted
        )
        self._tell = BurstTeller()
        # The metric children, resolved once: reconcile is the hot path.
        self._m_bound = sdg_metrics.SCHEDULING_ATTEMPTS.labels("pod", "bound")
        self._m_unschedulable = sdg_metrics.SCHEDULING_ATTEMPTS.labels("pod", "unschedulable")
        self._m_decision = sdg_metrics.DECISION_LATENCY.labels("pod")

    async def reconcile(self, request: Request) -> Result | None:
        try:
            # Read-only from here on: no deep copy per attempt.
            pod = self.cache.get(PODS, request.name, request.namespace, copy=False)
        except errors.NotFound:
            return None
        if not wants_scheduling(pod, self.scheduler_name):
            return None
        started = time.perf_counter()
        with start_span(self.tracer, "schedule pod") as span:
            key = f"{request.namespace}/{request.name}"
            span.set_attribute("sdg.pod", key)
            group_name = pod_group(pod)
            span.set_attribute("sdg.group", group_name or "")
            problem, node = self._group_node(group_name)
            if node is None:
                return await self._unschedulable(pod, problem, span, started)
            stale = self._stale_devices(pod, group_name or "")
            if stale:
                return await self._unschedulable(pod, stale, span, started)
            span.set_attribute("sdg.candidates", 1)
            node_name = node["metadata"]["name"]
            # No await from the fit check to the assume: no other worker runs between them
            # (one event loop), so two pods never both take a node's last room.
            share = share_of(pod)
            reasons = pod_fits(pod, node, self.book.usage(node_name, but=key), share)
            if not reasons:
                self.book.assume(key, node_name, share)
            if reasons:
                span.set_attribute(f"sdg.filter.{node_name}", "; ".join(reasons))
                msg = f"0/1 nodes are available: group node {node_name}: " + "; ".join(reasons)
                return await self._unschedulable(pod, msg, span, started)
            span.set_attribute("sdg.node", node_name)
            bind_started = time.perf_counter()
            try:
                await self.client.bind(
                    request.namespace or "",
                    request.name,
                    node_name,
                    pod_uid=pod["metadata"].get("uid"),
                )
            except errors.Conflict:
                # Already bound (by us earlier, or by someone else): nothing to do.
                span.set_attribute("sdg.result", "already-bound")
                return None
            except BaseException:
                self.book.forget(key)
                raise
            finally:
                sdg_metrics.BIND_LATENCY.observe(time.perf_counter() - bind_started)
            span.set_attribute("sdg.result", "bound")
            self._m_bound.inc()
            self._m_decision.observe(time.perf_counter() - started)
            if self._tell.tell(group_name or ""):
                self.recorder.emit(
                    pod, "Normal", "Scheduled", f"Successfully assigned {key} to {node_name}"
                )
        return None

    def _group_node(self, group_name: str | None) -> tuple[str, dict[str, Any] | None]:
        if not group_name:
            return (
                f"pod names schedulerName {self.scheduler_name} but has no "
                "deviceshare.io/group annotation; add it or use another scheduler",
                None,
            )
        try:
            group = self.cache.get(SDG_KIND, group_name, copy=False)
        except errors.NotFound:
            return f"SharedDeviceGroup {group_name!r} not found", None
        if meta_of(group).get("deletionTimestamp"):
            return (
                f"SharedDeviceGroup {group_name!r} is being deleted; its pods are not bound. "
                "Delete this pod (or recreate the group and then the pod)",
                None,
            )
        conflict = conflict_of(group)
        if conflict is not None:
            reason, message = conflict
            return (
                f"SharedDeviceGroup {group_name!r} is not Ready ({reason}: {message}); no pod "
                "is bound into it until that is resolved",
                None,
            )
        status = status_of(group)
        if not is_bound(group):
            cond = find_condition(status.get("conditions"), "Scheduled") or {}
            why = cond.get("message") or "not scheduled yet"
            return f"SharedDeviceGroup {group_name!r} is Pending: {why}", None
        try:
            return "", self.cache.get(NODES, status["nodeName"], copy=False)
        except errors.NotFound:
            return (
                f"node {status['nodeName']} of SharedDeviceGroup {group_name!r} no longer "
                "exists; the group does not move: delete and recreate it",
                None,
            )

    def _stale_devices(self, pod: dict[str, Any], group_name: str) -> str:
        """The devices the webhook injected must still be the group's: a group deleted and
        recreated between the pod's admission and its binding may hold other IDs now."""
        group = self.cache.get(SDG_KIND, group_name, copy=False)
        resources = spec_of(group).get("resources") or {}
        injected = delivered_devices(pod, resources, self.env_table)
        try:
            holds = selected_devices(group)
        except ValueError:
            return f"SharedDeviceGroup {group_name!r} has a malformed status.selectedDevices"
        if injected is not None and injected != holds:
            return (
                f"the pod was admitted with devices {injected}, but SharedDeviceGroup "
                f"{group_name!r} now holds {holds} (it was recreated?); delete and recreate "
                "the pod"
            )
        return ""

    async def _unschedulable(
        self, pod: dict[str, Any], message: str, span: trace.Span, started: float
    ) -> Result:
        span.set_attribute("sdg.result", "unschedulable")
        span.set_attribute("sdg.reason", message)
        self._m_unschedulable.inc()
        self._m_decision.observe(time.perf_counter() - started)
        meta = pod["metadata"]
        current = find_condition(status_of(pod).get("conditions"), "PodScheduled")
        if not current or current.get("status") != "False" or current.get("message") != message:
            patch = {
                "status": {
                    "conditions": [
                        {
                            "type": "PodScheduled",
                            "status": "False",
                            "reason": "Unschedulable",
                            "message": message,
                            "lastTransitionTime": rfc3339(),
                        }
                    ]
                }
            }
            try:
                await self.client.patch(
                    PODS,
                    meta["name"],
                    patch,
                    meta["namespace"],
                    patch_type="strategic",
                    subresource="status",
                )
            except errors.NotFound:
                return Result()
            self.recorder.emit(pod, "Warning", "FailedScheduling", message)
        # Rate-limited retry: the node may free up; node/group/pod events also re-trigger.
        return Result(requeue=True)


def setup(mgr: Manager, scheduler: PodScheduler, *, workers: int = 8) -> Controller:
    """Register the pod scheduler: its own pods, and what can let a pending one fit."""
    cache, name = mgr.cache, scheduler.scheduler_name
    index_groups(cache)

    def pending_pods_of(group: Mapping[str, Any]) -> Iterator[Request]:
        for pod in pods_of_group(cache, group["metadata"]["name"]):
            if wants_scheduling(pod, name):
                yield Request(pod["metadata"]["name"], pod["metadata"]["namespace"])

    def groups_bound_to(node: str | None) -> Iterator[Mapping[str, Any]]:
        for request in groups_bound_on(cache, [node]):
            with contextlib.suppress(errors.NotFound):
                yield cache.get(SDG_KIND, request.name, copy=False)

    def pending_pods_on_node(node: Mapping[str, Any]) -> Iterator[Request]:
        for group in groups_bound_to(node["metadata"]["name"]):
            yield from pending_pods_of(group)

    def after_pod_left(pod: Mapping[str, Any]) -> Iterator[Request]:
        """A pod on a node ended or went away: its CPU/memory/ports are free again."""
        node = spec_of(pod).get("nodeName")
        if node and (pod["metadata"].get("deletionTimestamp") or is_finished(pod)):
            for group in groups_bound_to(node):
                yield from pending_pods_of(group)

    ours = Funcs(
        create=lambda p: wants_scheduling(p, name),
        update=lambda _old, new: wants_scheduling(new, name),
        delete=lambda _obj: False,
    )
    return (
        mgr.controller("pod-scheduler")
        .for_(PODS, predicates=[ours])
        # Its status controller's writes (the pod list) change nothing a pod's fit reads.
        .watches(SDG_KIND, MapTo(pending_pods_of), [group_changed])
        .watches(NODES, MapTo(pending_pods_on_node), [node_changed])
        .watches(PODS, MapTo(after_pod_left))
        .with_options(max_concurrent_reconciles=workers)
        .complete(scheduler)
    )

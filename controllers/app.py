"""Wires SDG onto one sdgruntime Manager: the only module that knows both the
controllers and the webhooks.

Controllers (leader only): ``group-scheduler`` (placement, fenced claims, finalizer,
recovery), ``group-status`` (allocatedPods), ``pod-scheduler`` (bindings).
Webhooks (every replica): pod mutation and group validation.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from opentelemetry import trace

from api.constants import PHASE_BOUND, SDG_KIND
from api.pods import POD_GROUP_INDEX, POD_NODE_INDEX, index_by_group, index_by_node, pod_group
from controllers import metrics as sdg_metrics
from controllers.claims import RECORD_LABEL, RECORD_LABEL_VALUE, ClaimBook
from controllers.foreign import ForeignDevices, ForeignPodReporter, device_use, is_shared
from controllers.groupscheduler import GroupScheduler
from controllers.placement import node_device_capacity
from controllers.podscheduler import PodScheduler, wants_scheduling
from controllers.settings import Settings
from controllers.statuscontroller import StatusController
from sdgruntime import errors
from sdgruntime.cache import CacheNotSynced, KindOptions
from sdgruntime.client import Client
from sdgruntime.handler import EnqueueRequestsFromMapFunc
from sdgruntime.kinds import CONFIGMAPS, NODES, PODS
from sdgruntime.manager import Manager, ManagerOptions
from sdgruntime.predicate import Funcs
from sdgruntime.reconcile import Request
from sdgruntime.webhook import WebhookServer
from webhooks.groupvalidator import GroupValidator
from webhooks.podmutator import PodMutator

POD_WEBHOOK_PATH = "/mutate-v1-pod"
GROUP_WEBHOOK_PATH = "/validate-deviceshare-io-v1alpha1-shareddevicegroup"

Obj = dict[str, Any]


def manager_options(settings: Settings, **overrides: Any) -> ManagerOptions:
    ns = settings.namespace
    values: dict[str, Any] = {
        "kubeconfig": settings.kubeconfig,
        "metrics_bind_address": settings.metrics_bind_address,
        "health_probe_bind_address": settings.health_probe_bind_address,
        "webhook_host": settings.webhook_host,
        "webhook_port": settings.webhook_port,
        "webhook_cert_dir": settings.webhook_cert_dir,
        "leader_election": settings.leader_elect,
        "leader_election_id": settings.leader_election_id,
        "leader_election_namespace": settings.leader_election_namespace or ns,
        "leader_election_release_on_cancel": True,
        # The claim records are the only ConfigMaps we read: only those are cached.
        "cache_by_kind": {
            CONFIGMAPS: KindOptions(namespace=ns, label_selector={RECORD_LABEL: RECORD_LABEL_VALUE})
        },
    }
    values.update(overrides)
    return ManagerOptions(**values)


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


def _foreign_facts(pod: Obj, env_table: Any) -> tuple[Any, ...]:
    use = device_use(pod, env_table)
    return (use.node, use.resources, use.env_vars) if use else ()


def _node_facts(node: Obj) -> tuple[Any, ...]:
    meta, spec, status = (
        node.get("metadata") or {},
        node.get("spec") or {},
        node.get("status") or {},
    )
    ready = next(
        (c.get("status") for c in status.get("conditions") or [] if c.get("type") == "Ready"), None
    )
    return (
        meta.get("labels"),
        spec.get("taints"),
        spec.get("unschedulable"),
        status.get("allocatable"),
        ready,
    )


#: Node updates that can change placement or health; heartbeats (condition timestamps,
#: images, addresses) do not re-run placement for every Pending group.
node_changed = Funcs(update=lambda old, new: _node_facts(old) != _node_facts(new))


class SDG:
    """The assembled system; ``manager.run()`` (or ``run_until_cancelled``) runs it."""

    def __init__(
        self,
        settings: Settings,
        *,
        client: Client | None = None,
        webhook_server: WebhookServer | None = None,
        tracer_provider: trace.TracerProvider | None = None,
        **option_overrides: Any,
    ) -> None:
        self.settings = settings
        self.env_table = settings.env_table()
        self.manager = mgr = Manager(
            client,
            options=manager_options(settings, **option_overrides),
            webhook_server=webhook_server,
            tracer_provider=tracer_provider,
        )
        cache = mgr.cache
        cache.add_index(PODS, POD_GROUP_INDEX, index_by_group)
        cache.add_index(PODS, POD_NODE_INDEX, index_by_node)
        self._gauged: dict[str, set[str]] = {}
        self._foreign_gauged: set[str] = set()
        self.claims = ClaimBook(mgr.client, settings.namespace, on_change=self._count_devices)
        self.foreign = ForeignDevices(self.env_table, on_change=self._count_foreign)
        self._feed_claims()
        self._feed_capacity()
        self._feed_foreign()
        cache.informer(SDG_KIND).add_handler(
            on_add=self._group_added,
            on_update=self._group_updated,
            on_delete=self._group_deleted,
        )

        recorder = mgr.event_recorder("deviceshare-scheduler")
        table = self.env_table
        #: Pods outside any group that use devices, and changes to that.
        foreign = Funcs(
            create=lambda p: bool(_foreign_facts(p, table)),
            update=lambda o, n: _foreign_facts(o, table) != _foreign_facts(n, table),
            delete=lambda p: bool(_foreign_facts(p, table)),
        )
        self.group_scheduler = GroupScheduler(
            mgr.client,
            cache,
            self.claims,
            recorder,
            env_table=self.env_table,
            tracer_provider=tracer_provider,
            foreign=self.foreign,
        )
        (
            mgr.controller("group-scheduler")
            .for_(SDG_KIND)
            .watches(NODES, EnqueueRequestsFromMapFunc(self._groups_for_node), [node_changed])
            .watches(CONFIGMAPS, EnqueueRequestsFromMapFunc(self._groups_for_record))
            # A deleted group's status held its devices until now: Pending groups retry.
            .watches(
                SDG_KIND,
                EnqueueRequestsFromMapFunc(lambda _gone: self._pending_groups()),
                [only_deletes],
            )
            .watches(PODS, EnqueueRequestsFromMapFunc(self._group_of_pod), [pod_moved])
            # Pods outside any group that use devices: groups on their node re-check,
            # Pending groups retry when they go.
            .watches(PODS, EnqueueRequestsFromMapFunc(self._groups_near_foreign_pod), [foreign])
            .with_options(max_concurrent_reconciles=settings.group_workers)
            .complete(self.group_scheduler)
        )
        (
            mgr.controller("foreign-device-pods")
            .for_(PODS, predicates=[foreign])
            .complete(ForeignPodReporter(cache, recorder, self.env_table))
        )
        self.status_controller = StatusController(
            mgr.client, cache, mgr.event_recorder("deviceshare-controller")
        )
        (
            mgr.controller("group-status")
            .for_(SDG_KIND)
            .watches(PODS, EnqueueRequestsFromMapFunc(self._group_of_pod), [pod_moved])
            .with_options(max_concurrent_reconciles=2)
            .complete(self.status_controller)
        )
        self.pod_scheduler = PodScheduler(
            mgr.client,
            cache,
            recorder,
            scheduler_name=settings.scheduler_name,
            tracer_provider=tracer_provider,
            env_table=self.env_table,
        )
        ours = Funcs(
            create=self._ours,
            update=lambda _old, new: self._ours(new),
            delete=lambda _obj: False,
        )
        (
            mgr.controller("pod-scheduler")
            .for_(PODS, predicates=[ours])
            .watches(SDG_KIND, EnqueueRequestsFromMapFunc(self._pending_pods_of_group))
            .watches(NODES, EnqueueRequestsFromMapFunc(self._pending_pods_on_node), [node_changed])
            .watches(PODS, EnqueueRequestsFromMapFunc(self._pending_pods_after_pod_left))
            .with_options(max_concurrent_reconciles=settings.pod_workers)
            .complete(self.pod_scheduler)
        )

        server = mgr.webhook_server
        server.register(
            POD_WEBHOOK_PATH,
            PodMutator(cache, mgr.client, self.env_table, scheduler_name=settings.scheduler_name),
        )
        server.register(GROUP_WEBHOOK_PATH, GroupValidator(cache, self.env_table))

    # --- informer feeds (cheap, synchronous) -----------------------------------------
    def _feed_claims(self) -> None:
        self.manager.cache.informer(CONFIGMAPS).add_handler(
            on_add=self.claims.observe,
            on_update=lambda _old, cm: self.claims.observe(cm),
            on_delete=self.claims.forget,
        )

    def _feed_capacity(self) -> None:
        def upsert(node: Obj) -> None:
            self.claims.set_capacity(node["metadata"]["name"], node_device_capacity(node))
            self._count_foreign(node["metadata"]["name"])  # its shared label may have changed

        def delete(node: Obj) -> None:
            self.claims.remove_node(node["metadata"]["name"])

        self.manager.cache.informer(NODES).add_handler(
            on_add=upsert, on_update=lambda _o, n: upsert(n), on_delete=delete
        )

    def _feed_foreign(self) -> None:
        self.manager.cache.informer(PODS).add_handler(
            on_add=self.foreign.observe,
            on_update=lambda _old, pod: self.foreign.observe(pod),
            on_delete=self.foreign.forget,
        )

    def _count_foreign(self, node: str) -> None:
        """``sdg_foreign_device_pods{node}``, for shared nodes only (elsewhere the device
        plugin's pods are the norm)."""
        try:
            shared = is_shared(self.manager.cache.get(NODES, node, copy=False))
        except (errors.NotFound, CacheNotSynced):
            shared = False
        count = self.foreign.counts(node) if shared else 0
        if count:
            sdg_metrics.FOREIGN_DEVICE_PODS.labels(node).set(count)
            self._foreign_gauged.add(node)
        elif node in self._foreign_gauged:
            self._foreign_gauged.discard(node)
            sdg_metrics.FOREIGN_DEVICE_PODS.remove(node)

    def _count_devices(self, node: str) -> None:
        tracker = self.claims.tracker
        capacities = tracker.capacities(node)
        for res in self._gauged.pop(node, set()) - set(capacities):
            # The node (or one of its resources) is gone: drop its series.
            sdg_metrics.DEVICES_FREE.remove(node, res)
            sdg_metrics.DEVICES_ALLOCATED.remove(node, res)
        for res, total in capacities.items():
            free = tracker.free(node, res)
            sdg_metrics.DEVICES_FREE.labels(node, res).set(free)
            sdg_metrics.DEVICES_ALLOCATED.labels(node, res).set(total - free)
        if capacities:
            self._gauged[node] = set(capacities)

    def _group_added(self, group: Obj) -> None:
        self.claims.observe_group(group)
        self._count_phase(group, +1)

    def _group_updated(self, old: Obj, new: Obj) -> None:
        self.claims.observe_group(new)
        self._count_phase(old, -1)
        self._count_phase(new, +1)

    def _group_deleted(self, group: Obj) -> None:
        self.claims.forget_group(group)
        self._count_phase(group, -1)

    def _count_phase(self, group: Obj, delta: int) -> None:
        """Keep ``sdg_groups{phase}`` exact per event, without recounting every group."""
        phase = (group.get("status") or {}).get("phase") or "Pending"
        sdg_metrics.GROUPS_BY_PHASE.labels(phase).inc(delta)

    # --- event mapping ---------------------------------------------------------------
    def _groups(self) -> list[Obj]:
        return self.manager.cache.list(SDG_KIND, copy=False)

    def _pending_groups(self) -> Iterable[Request]:
        for g in self._groups():
            if (g.get("status") or {}).get("phase") != PHASE_BOUND:
                yield Request(g["metadata"]["name"])

    def _groups_for_node(self, node: Obj) -> Iterable[Request]:
        """A node changed: Pending groups may fit now; bound groups re-check health."""
        name = node["metadata"]["name"]
        yield from self._pending_groups()
        for g in self._groups():
            if (g.get("status") or {}).get("nodeName") == name:
                yield Request(g["metadata"]["name"])

    def _groups_for_record(self, cm: Obj) -> Iterable[Request]:
        """A claim record changed: devices may be free now, a claim may await adoption,
        and bound groups on that node re-check that the record still holds them (a record
        deleted or edited by hand is written back, or the conflict reported)."""
        yield from self._pending_groups()
        node = (cm.get("data") or {}).get("node")
        for g in self._groups():
            if (g.get("status") or {}).get("nodeName") == node:
                yield Request(g["metadata"]["name"])
        record = self.claims.records.get(node or "")
        for name in record.claims if record else ():
            yield Request(name)  # groups named there: a claim left on the wrong node

    def _groups_near_foreign_pod(self, pod: Obj) -> Iterable[Request]:
        node = (pod.get("spec") or {}).get("nodeName")
        if not node or not _foreign_facts(pod, self.env_table):
            return
        yield from self._pending_groups()
        for g in self._groups():
            if (g.get("status") or {}).get("nodeName") == node:
                yield Request(g["metadata"]["name"])

    @staticmethod
    def _group_of_pod(pod: Obj) -> Iterable[Request]:
        group = pod_group(pod)
        return [Request(group)] if group else []

    def _ours(self, pod: Obj) -> bool:
        return wants_scheduling(pod, self.settings.scheduler_name)

    def _pending_pods_of_group(self, group: Obj) -> Iterable[Request]:
        name = group["metadata"]["name"]
        for pod in self.manager.cache.list(PODS, index=POD_GROUP_INDEX, value=name, copy=False):
            if self._ours(pod):
                yield Request(pod["metadata"]["name"], pod["metadata"]["namespace"])

    def _pending_pods_on_node(self, node: Obj) -> Iterable[Request]:
        name = node["metadata"]["name"]
        for g in self._groups():
            if (g.get("status") or {}).get("nodeName") == name:
                yield from self._pending_pods_of_group(g)

    def _pending_pods_after_pod_left(self, pod: Obj) -> Iterable[Request]:
        """A pod on a node ended or went away: its CPU/memory/ports are free again."""
        node = (pod.get("spec") or {}).get("nodeName")
        phase = (pod.get("status") or {}).get("phase")
        if not node or not (
            pod["metadata"].get("deletionTimestamp") or phase in ("Succeeded", "Failed")
        ):
            return
        for g in self._groups():
            if (g.get("status") or {}).get("nodeName") == node:
                yield from self._pending_pods_of_group(g)

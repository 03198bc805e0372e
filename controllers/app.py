"""Wires SDG onto one sdgruntime Manager: the only module that knows both the
controllers and the webhooks.

Controllers (leader only), each registered by the ``setup`` beside its reconciler:
``group-scheduler`` (placement, fenced claims, finalizer, recovery), ``group-status``
(allocatedPods), ``pod-scheduler`` (bindings), ``foreign-device-pods`` (Warning Events on
pods that use devices outside any group). Webhooks (every replica): pod mutation and
group validation. What stays here is what they share: the caches' indexes and the
synchronous informer feeds (claim records, node capacity, bound statuses, foreign device
users) into the in-memory views placement reads, and the device metrics.
"""

from __future__ import annotations

from typing import Any

from opentelemetry import trace

from api.constants import SDG_KIND
from api.envvars import device_env_vars, env_var_for
from api.nodes import is_shared
from api.pods import (
    POD_GROUP_INDEX,
    POD_NODE_INDEX,
    cached_node,
    index_by_group,
    index_by_node,
    pod_key,
    pod_transform,
)
from api.v1alpha1 import group_phase
from controllers import foreign, groupscheduler, podscheduler, statuscontroller
from controllers import metrics as sdg_metrics
from controllers.draclaims import RESOURCECLAIMS, DraAllocations, DraPublisher, cached_claim
from controllers.foreign import ForeignDevices, ForeignPodReporter
from controllers.groupscheduler import GroupScheduler
from controllers.holders import Holders, kubelet_hold
from controllers.inventory import (
    DEVICETAINTRULES,
    RESOURCESLICES,
    SOURCE_SLICE,
    Inventory,
    Offer,
)
from controllers.ledger.book import Ledger
from controllers.ledger.records import RECORD_LABEL, RECORD_LABEL_VALUE
from controllers.ledger.view import Group
from controllers.podscheduler import PodScheduler
from controllers.settings import Settings
from controllers.statuscontroller import StatusController
from sdgruntime import errors
from sdgruntime.cache import (
    CacheNotSynced,
    KindOptions,
    ReflectorOptions,
    drop_managed_fields,
    intern_strings,
)
from sdgruntime.client import Client
from sdgruntime.kinds import CONFIGMAPS, NODES, PODS, RUNTIMECLASSES, MutableObj
from sdgruntime.manager import Manager, ManagerOptions
from sdgruntime.webhook import WebhookServer
from webhooks.bindingvalidator import BindingValidator
from webhooks.groupdefaulter import GroupDefaulter
from webhooks.groupvalidator import GroupValidator
from webhooks.podmutator import PodMutator

POD_WEBHOOK_PATH = "/mutate-v1-pod"
GROUP_WEBHOOK_PATH = "/validate-deviceshare-io-v1alpha1-shareddevicegroup"
GROUP_DEFAULTER_PATH = "/mutate-deviceshare-io-v1alpha1-shareddevicegroup"
BINDING_WEBHOOK_PATH = "/validate-v1-binding"


def manager_options(settings: Settings, **overrides: Any) -> ManagerOptions:
    ns = settings.namespace
    values: dict[str, Any] = {
        "kubeconfig": settings.kubeconfig,
        "metrics_bind_address": settings.metrics_bind_address,
        "metrics_secure": settings.metrics_secure,
        "metrics_cert_dir": settings.metrics_cert_dir,
        "health_probe_bind_address": settings.health_probe_bind_address,
        "webhook_host": settings.webhook_host,
        "webhook_port": settings.webhook_port,
        "webhook_cert_dir": settings.webhook_cert_dir,
        "leader_election": settings.leader_elect,
        "leader_election_id": settings.leader_election_id,
        "leader_election_namespace": settings.leader_election_namespace or ns,
        "leader_election_release_on_cancel": True,
        "event_qps": settings.event_qps,
        "event_burst": settings.event_burst,
        "cache_by_kind": {
            # The claim records are the only ConfigMaps we read: only those are cached.
            CONFIGMAPS: KindOptions(
                namespace=ns, label_selector={RECORD_LABEL: RECORD_LABEL_VALUE}
            ),
            # Every pod and node is cached, but only the fields SDG reads (api.pods); pods
            # are listed as a stream, one at a time (a page of 500 large pods is GBs).
            PODS: KindOptions(
                transform=pod_transform(device_env_vars(settings.env_table())),
                reflector=ReflectorOptions(watch_list=True),
            ),
            NODES: KindOptions(transform=cached_node),
            SDG_KIND: KindOptions(transform=lambda g: intern_strings(drop_managed_fields(g))),
            # Every ResourceClaim, but only who it is and what its allocation holds.
            RESOURCECLAIMS: KindOptions(transform=cached_claim),
        },
    }
    values.update(overrides)
    return ManagerOptions(**values)


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
        #: Node -> the sdg_device_holder label sets it exposes (``_count_devices``).
        self._holder_series: dict[str, set[tuple[str, str, str, str, str]]] = {}
        #: Pod key -> the node whose kubelet gave it devices (``_feed_kubelet_holds``).
        self._kubelet_node_of: dict[str, str] = {}
        table = self.env_table
        self.claims = Ledger(
            mgr.client,
            settings.namespace,
            on_change=self._count_devices,
            family=lambda resource: env_var_for(resource, table),
        )
        self.inventory = Inventory(settings.dra_driver_table())
        self.foreign = ForeignDevices(
            self.env_table,
            on_change=self._count_foreign,
            holders_namespace=settings.namespace,
            kubelet_counts=self._kubelet_counts,
            claims_counted=settings.resource_slices != "off",
            shared_only=True,
        )
        self.dra = DraAllocations(settings.namespace) if settings.resource_slices != "off" else None
        if self.dra is not None:
            self.claims.set_dra(self.dra)
        self._feed_claims()
        self._feed_inventory()
        self._feed_foreign()
        if settings.holders == "auto":
            self._feed_kubelet_holds()
        cache.informer(SDG_KIND).add_handler(
            on_add=self._group_added,
            on_update=self._group_updated,
            on_delete=self._group_deleted,
        )

        recorder = mgr.event_recorder("deviceshare-scheduler")
        self.group_scheduler = GroupScheduler(
            mgr.client,
            cache,
            self.claims,
            recorder,
            env_table=self.env_table,
            tracer_provider=tracer_provider,
            foreign=self.foreign,
            holders=Holders(
                mgr.client,
                cache,
                settings.namespace,
                enabled=settings.holders == "auto",
                image=settings.holder_image,
                priority_class=settings.holder_priority_class,
            ),
            dra=(
                DraPublisher(mgr.client, settings.namespace, allocations=self.dra)
                if self.dra is not None
                else None
            ),
        )
        runs = settings.runs
        if runs("group-scheduler"):
            groupscheduler.setup(
                mgr,
                self.group_scheduler,
                workers=settings.group_workers,
                resource_slices=settings.resource_slices != "off",
                taint_rules=settings.resource_slices != "off"
                and settings.device_taint_rules != "off",
            )
        self.pod_scheduler = PodScheduler(
            mgr.client,
            cache,
            recorder,
            scheduler_name=settings.scheduler_name,
            tracer_provider=tracer_provider,
            env_table=self.env_table,
        )
        binds_waiting = None
        if runs("pod-scheduler"):
            pods = podscheduler.setup(mgr, self.pod_scheduler, workers=settings.pod_workers)

            def binds_waiting() -> bool:
                """Pods wait in the pod scheduler's queue: status writes wait for them."""
                return len(pods.queue) > 0

        self.status_controller = StatusController(
            mgr.client,
            cache,
            mgr.event_recorder("deviceshare-controller"),
            batch_period=settings.status_batch_period,
            allocated_pods=settings.allocated_pods,
            busy=binds_waiting if settings.status_hold > 0 else None,
            hold=settings.status_hold,
        )
        if runs("status"):
            statuscontroller.setup(mgr, self.status_controller, workers=settings.status_workers)
        if runs("foreign-reporter"):
            foreign.setup(
                mgr,
                ForeignPodReporter(
                    cache,
                    recorder,
                    self.env_table,
                    settings.namespace,
                    self._kubelet_counts,
                    claims_counted=settings.resource_slices != "off",
                ),
            )

        #: None in a process that runs no webhooks (``--controllers``).
        self.pod_mutator: PodMutator | None = None
        if runs("webhooks"):  # else no webhook server, client pool or mutator at all
            # The webhooks' live reads (cache misses) go on a pool of their own: forged
            # reviews never make leader election or the controllers wait for a connection.
            self.pod_mutator = PodMutator(
                cache,
                mgr.webhook_client,
                self.env_table,
                scheduler_name=settings.scheduler_name,
                delivery=settings.delivery_settings(),
                recorder=mgr.event_recorder("deviceshare-webhook"),
            )
            # The pod webhook chooses each node's delivery from its labels and runtime
            # handlers and the RuntimeClass --runtime-class-name (a handful, cluster-wide).
            cache.informer(RUNTIMECLASSES)
            server = mgr.webhook_server
            server.register(POD_WEBHOOK_PATH, self.pod_mutator)
            server.register(GROUP_WEBHOOK_PATH, GroupValidator(cache, self.env_table))
            server.register(GROUP_DEFAULTER_PATH, GroupDefaulter())
            server.register(BINDING_WEBHOOK_PATH, BindingValidator(cache, mgr.webhook_client))
        #: Every recorder above: an object's Event aggregation keys go when it is deleted.
        self.recorders = [
            mgr.event_recorder(name)
            for name in ("deviceshare-scheduler", "deviceshare-controller", "deviceshare-webhook")
        ]
        for kind in (PODS, NODES):
            cache.informer(kind).add_handler(on_delete=self._forget_events)

    def _forget_events(self, obj: MutableObj) -> None:
        for recorder in self.recorders:
            recorder.forget(obj)

    # --- informer feeds (cheap, synchronous) -----------------------------------------
    def _feed_claims(self) -> None:
        self.manager.cache.informer(CONFIGMAPS).add_handler(
            on_add=self.claims.observe,
            on_update=lambda _old, cm: self.claims.observe(cm),
            on_delete=self.claims.forget,
        )

    def _feed_inventory(self) -> None:
        """Nodes (and their ResourceSlices) -> what each offers -> the claim book."""
        inventory, informers = self.inventory, self.manager.cache

        def offers_changed(node: str, offers: dict[str, Offer]) -> None:
            if inventory.knows(node):
                self.claims.set_offers(node, offers)
            else:
                self.claims.remove_node(node)

        def node_upserted(node: MutableObj) -> None:
            inventory.observe_node(node)
            name = node["metadata"]["name"]
            # Its shared label may have changed: the foreign mirror takes or drops its pods.
            self.foreign.set_shared(name, is_shared(node), lambda: self._pods_on(name))
            self._count_foreign(name)

        def node_deleted(node: MutableObj) -> None:
            inventory.forget_node(node)
            self.foreign.set_shared(node["metadata"]["name"], False, list)

        inventory.on_change = offers_changed
        informers.informer(NODES).add_handler(
            on_add=node_upserted,
            on_update=lambda _o, n: node_upserted(n),
            on_delete=node_deleted,
        )
        if self.settings.resource_slices != "off":
            informers.informer(RESOURCESLICES).add_handler(
                on_add=inventory.observe_slice,
                on_update=lambda _o, s: inventory.observe_slice(s),
                on_delete=inventory.forget_slice,
            )
            if self.settings.device_taint_rules != "off":
                informers.informer(DEVICETAINTRULES).add_handler(
                    on_add=inventory.observe_taint_rule,
                    on_update=lambda _o, r: inventory.observe_taint_rule(r),
                    on_delete=inventory.forget_taint_rule,
                )
            # DRA's books, served beside the slices (resource.k8s.io/v1): every claim's
            # allocation, in every namespace.
            assert self.dra is not None
            informers.informer(RESOURCECLAIMS).add_handler(
                on_add=self.dra.observe,
                on_update=lambda _o, c: self.dra.observe(c),  # type: ignore[union-attr]
                on_delete=self.dra.forget,
            )

    def _feed_foreign(self) -> None:
        self.manager.cache.informer(PODS).add_handler(
            on_add=self.foreign.observe,
            on_update=lambda _old, pod: self.foreign.observe(pod),
            on_delete=self.foreign.forget,
        )

    def _pods_on(self, node: str) -> list[MutableObj]:
        """The cached pods bound to ``node`` (read only; before the pod cache has synced,
        those seen so far: the rest arrive as events)."""
        store = self.manager.cache.informer(PODS).store
        return store.by_index(POD_NODE_INDEX, node, copy=False)

    def _kubelet_counts(self, node: str, resource: str) -> bool:
        """Whether ``node``'s kubelet counts ``resource`` for the groups too: holder pods
        are on and the node's device plugin provides it (not a DRA driver)."""
        if self.settings.holders != "auto":
            return False
        offer = (self.claims.offers.get(node) or {}).get(resource)
        return offer is not None and offer.source != SOURCE_SLICE

    def _feed_kubelet_holds(self) -> None:
        """Pods outside any group that a device plugin gave devices -> the claim book
        (the kubelet's own books, read from the pods' status)."""
        namespace, node_of = self.settings.namespace, self._kubelet_node_of

        def observe(pod: MutableObj) -> None:
            key = pod_key(pod)
            found = kubelet_hold(pod, namespace)
            old = node_of.pop(key, None)
            if old is not None and (found is None or found[0] != old):
                self.claims.set_kubelet_hold(old, key, None)
            if found is not None:
                node_of[key] = found[0]
                self.claims.set_kubelet_hold(found[0], key, found[1])

        def forget(pod: MutableObj) -> None:
            key = pod_key(pod)
            old = node_of.pop(key, None)
            if old is not None:
                self.claims.set_kubelet_hold(old, key, None)

        self.manager.cache.informer(PODS).add_handler(
            on_add=observe, on_update=lambda _old, pod: observe(pod), on_delete=forget
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
            sdg_metrics.DEVICES_MISSING.remove(node, res)
        # O(devices held on this node): it runs on every change of the node's claims.
        held: dict[str, set[int]] = {}
        offers = self.claims.offers.get(node) or {}
        series: set[tuple[str, str, str, str, str]] = set()
        for (res, i), holder in self.claims.view(node).holders.items():
            if isinstance(holder, Group):
                held.setdefault(res, set()).add(i)
                device = offers[res].device(i) if res in offers else None
                series.add((node, res, str(i), (device.uuid if device else "") or "", holder.name))
        # One series per device a group holds (bounded by the node's device cap), for
        # joining DCGM's per-GPU metrics on the UUID; a device given back drops its series.
        old = self._holder_series.pop(node, set())
        for gone in old - series:
            sdg_metrics.DEVICE_HOLDER.remove(*gone)
        for labels in series - old:  # a series kept is 1 already: no write per mirror
            sdg_metrics.DEVICE_HOLDER.labels(*labels).set(1)
        if series:
            self._holder_series[node] = series
        for res, total in capacities.items():
            free = tracker.free(node, res)
            sdg_metrics.DEVICES_FREE.labels(node, res).set(free)
            sdg_metrics.DEVICES_ALLOCATED.labels(node, res).set(total - free)
            offer = offers.get(res)
            usable = set(offer.usable()) if offer else set()
            sdg_metrics.DEVICES_MISSING.labels(node, res).set(len(held.get(res, set()) - usable))
        if capacities:
            self._gauged[node] = set(capacities)

    def _group_added(self, group: MutableObj) -> None:
        self.claims.observe_group(group)
        self._count_phase(group, +1)

    def _group_updated(self, old: MutableObj, new: MutableObj) -> None:
        self.claims.observe_group(new)
        self._count_phase(old, -1)
        self._count_phase(new, +1)

    def _group_deleted(self, group: MutableObj) -> None:
        self.claims.forget_group(group)
        self._count_phase(group, -1)
        if self.pod_mutator is not None:
            self.pod_mutator.forget_group(group)
        self._forget_events(group)

    def _count_phase(self, group: MutableObj, delta: int) -> None:
        """Keep ``sdg_groups{phase}`` exact per event, without recounting every group."""
        sdg_metrics.GROUPS_BY_PHASE.labels(group_phase(group)).inc(delta)

"""Devices used outside the books: pods that use vendor devices without being in a group.

Such a pod sees devices SDG did not hand out, and SDG cannot know which. Invariant: on
a node where one runs, no new group gets that resource (a wrong view may hand out less,
never twice); groups already bound there are reported (``Ready=False``, reason
``ForeignDevicePods``) and the pod gets a Warning Event (:class:`ForeignPodReporter`).
:func:`device_use` (pure) says what a pod uses; :class:`ForeignDevices` mirrors the pod
cache, fed synchronously by the pod informer, so placement reads it in memory.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from api.constants import (
    CDI_ANNOTATION_FAMILIES,
    DEVICE_NODE_ANNOTATION_FAMILIES,
    GROUP_ANNOTATION,
    MOUNT_ANNOTATION_FAMILIES,
    NODE_MODE_LABEL,
    NODE_MODE_SHARED,
    REASON_FOREIGN_DEVICE_PODS,
)
from api.envvars import (
    NO_DEVICE_VALUES,
    device_env_vars,
    env_var_for,
    env_vars_reached,
    names_no_device,
)
from api.nodes import is_shared
from api.pods import is_active, pod_key
from controllers.groupstatus import listed
from controllers.holders import is_holder
from sdgruntime import errors
from sdgruntime.cache import Cache
from sdgruntime.events import EventRecorder
from sdgruntime.kinds import NODES, PODS, Obj, meta_of, spec_of
from sdgruntime.manager import Manager
from sdgruntime.predicate import Funcs
from sdgruntime.reconcile import Request, Result

log = logging.getLogger(__name__)


__all__ = ["NO_DEVICE_VALUES", "DeviceUse", "ForeignDevices", "ForeignPodReporter", "device_use"]

_CONTAINER_KINDS = ("initContainers", "containers", "ephemeralContainers")
#: A CDI device name's kind (``nvidia.com/gpu`` in ``nvidia.com/gpu=0``).
_CDI_DEVICE = re.compile(r"([a-z0-9][-a-z0-9.]*/[A-Za-z0-9][-A-Za-z0-9_.]*)=")
_MAX_CDI_TEXT = 64 * 1024  # annotations total at most 256 KiB; read a bounded prefix
#: The device-injector families that hand a container devices SDG cannot name.
_RAW_FAMILIES = DEVICE_NODE_ANNOTATION_FAMILIES + MOUNT_ANNOTATION_FAMILIES
#: Per kind of finding, at most this many are kept (and shown) per pod.
_MAX_SHOWN = 8


@dataclass(frozen=True, slots=True)
class DeviceUse:
    """What one pod outside any group uses on its node."""

    pod: str  # namespace/name
    node: str
    #: Device resources it requests (limits or requests) or names in CDI annotations.
    resources: frozenset[str]
    #: Device env vars it sets itself (the resource is whatever the env table maps to it).
    env_vars: frozenset[str] = frozenset()
    #: (device env var, where from: ``configMap NAME``/``secret NAME``) that a
    #: container's ``envFrom`` may set.
    env_from: frozenset[tuple[str, str]] = frozenset()
    #: Raw device-node and mount annotations of NRI's device-injector (any resource).
    injected: frozenset[str] = frozenset()
    #: Its DRA claims (``spec.resourceClaims[].name``; any resource).
    claims: frozenset[str] = frozenset()
    #: Of ``resources``, those it asks for in requests/limits: what a kubelet's device
    #: manager gives it (and counts), as opposed to what CDI annotations name.
    requested: frozenset[str] = frozenset()

    def affects(
        self,
        resource: str,
        env_table: Mapping[str, str],
        *,
        kubelet_counted: bool = False,
        claims_counted: bool = False,
    ) -> bool:
        """Whether this pod may see devices of ``resource``. ``kubelet_counted``: the node's
        kubelet counts ``resource`` for the groups too (their holder pods), so asking the
        device plugin for it reaches only devices no group holds. ``claims_counted``: SDG
        reads DRA's books (every claim's allocation), so a DRA claim reaches only devices
        no group holds."""
        resources = self.resources
        if kubelet_counted and resource in self.requested:
            resources = resources - {resource}
        if resource in resources or self.injected or (self.claims and not claims_counted):
            return True
        var = env_var_for(resource, env_table)
        if var is None:
            return False
        if var in self.env_vars or any(v == var for v, _src in self.env_from):
            return True
        return any(var in env_vars_reached(r, env_table) for r in resources)

    def beyond_kubelet(self, counted: Callable[[str], bool], claims_counted: bool = False) -> bool:
        """Whether it may see devices other than those the cluster's books give it
        (``counted`` says which resources the kubelet counts for the groups too;
        ``claims_counted`` that DRA's allocations are read)."""
        return bool(
            self.env_vars
            or self.env_from
            or self.injected
            or (self.claims and not claims_counted)
            or any(not (r in self.requested and counted(r)) for r in self.resources)
        )

    def how(self) -> str:
        parts = [f"requests {r}" for r in sorted(self.resources)]
        parts += [f"sets {v}" for v in sorted(self.env_vars)]
        parts += [f"may set {v} through envFrom {src}" for v, src in sorted(self.env_from)]
        parts += [f"sets device-injector annotation {k}" for k in sorted(self.injected)]
        if self.claims:
            parts.append(f"claims DRA devices ({', '.join(sorted(self.claims))})")
        return ", ".join(parts)


def _in_families(key: str, families: tuple[str, ...]) -> bool:
    return any(key == f or key.startswith(f + "/") for f in families)


def _env_from_vars(container: Obj, device_vars: frozenset[str]) -> set[tuple[str, str]]:
    """The device env vars a container's ``envFrom`` may set, with their source.

    The rule (safe, yet quiet for the envFrom most pods have): an ``envFrom`` entry may set
    device var V when its ``prefix`` (often none) is a proper start of V, so some key of
    the ConfigMap or Secret would become V, and the container does not set V in ``env``
    itself, which wins over ``envFrom`` (the kubelet's makeEnvironmentVariables,
    pkg/kubelet/kubelet_pods.go, v1.37.2). SDG cannot read the ConfigMap, so that counts:
    a ConfigMap with ``NVIDIA_VISIBLE_DEVICES=all`` reaches every GPU. A pod that means no
    device says so in ``env`` (``NVIDIA_VISIBLE_DEVICES: ""``) or uses a prefix
    (``APP_``), and is not counted. Only pods on shared nodes matter (reported, block
    placement), and those are meant to be SDG's alone.
    """
    entries = container.get("envFrom") or ()
    if not entries:
        return set()
    own = {e.get("name") for e in container.get("env") or () if isinstance(e, Mapping)}
    out: set[tuple[str, str]] = set()
    for entry in entries:
        if not isinstance(entry, Mapping):
            continue
        prefix = str(entry.get("prefix") or "")
        source = "?"
        for key, what in (("configMapRef", "configMap"), ("secretRef", "secret")):
            ref = entry.get(key)
            if isinstance(ref, Mapping):
                source = f"{what} {ref.get('name', '')}"
        for var in device_vars:
            if var not in own and len(prefix) < len(var) and var.startswith(prefix):
                out.add((var, source))
    return out


def device_use(
    pod: Obj, env_table: Mapping[str, str], holders_namespace: str | None = None
) -> DeviceUse | None:
    """The devices a pod outside any group uses on its node, or None.

    None for pods in a group (the annotation, even empty: the webhook judged those), SDG's
    own holder pods (in ``holders_namespace``: they hold a group's devices), pods not
    bound to a node yet, finished pods, and pods that use no device. What counts:

    - a request or limit of a device resource: one the env table maps, or another name in
      a vendor's domain (``nvidia.com/mig-1g.10gb``, ``nvidia.com/gpu.shared``,
      ``amd.com/*``; ``api.envvars.env_vars_reached``);
    - a device env var set by hand (``all``, IDs, UUIDs; ``valueFrom`` too, it may say
      anything; empty, ``void`` and ``none`` name no device);
    - ``envFrom`` that may set a device env var (the rule is in ``_env_from_vars``);
    - CDI device annotations of NRI's device-injector naming a vendor's devices, and its
      raw device-node and mount annotations (``devices.*``, ``mounts.*``), for every
      resource: ``/dev/nvidia3`` or a mount of ``/dev`` reaches GPUs SDG cannot name;
    - DRA claims (``spec.resourceClaims``), for every resource: the claim's device class is
      not on the pod, so any of them may be a GPU of the node.
    """
    meta, spec = meta_of(pod), spec_of(pod)
    if GROUP_ANNOTATION in (meta.get("annotations") or {}) or is_holder(pod, holders_namespace):
        return None
    node = spec.get("nodeName")
    if not node or not isinstance(node, str) or not is_active(pod):
        return None
    device_vars = device_env_vars(env_table)
    resources: set[str] = set()
    asked: set[str] = set()
    env_vars: set[str] = set()
    env_from: set[tuple[str, str]] = set()
    injected: set[str] = set()

    def requested(section_owner: Obj) -> None:
        for section in ("limits", "requests"):
            for res in (section_owner.get("resources") or {}).get(section) or {}:
                if env_vars_reached(res, env_table):
                    resources.add(res)
                    asked.add(res)

    requested(spec)
    for key, value in (meta.get("annotations") or {}).items():
        if not isinstance(value, str):
            continue
        # CDI device annotations (NRI's device-injector) name devices as <kind>=<id>.
        if _in_families(key, CDI_ANNOTATION_FAMILIES):
            for kind in _CDI_DEVICE.findall(value[:_MAX_CDI_TEXT]):
                if env_vars_reached(kind, env_table):
                    resources.add(kind)
        # Raw device nodes and mounts: whatever they name, SDG cannot tell which GPU.
        elif _in_families(key, _RAW_FAMILIES) and value.strip() not in ("", "[]"):
            injected.add(key)
    for kind in _CONTAINER_KINDS:
        for container in spec.get(kind) or ():
            requested(container)
            for entry in container.get("env") or ():
                name = entry.get("name")
                if name not in device_vars:
                    continue
                # valueFrom (a ConfigMap, a field) may say anything: count it as a use.
                if entry.get("valueFrom") or not names_no_device(entry.get("value")):
                    env_vars.add(name)
            env_from |= _env_from_vars(container, device_vars)
    pod_claims = spec.get("resourceClaims")
    claims = {
        str(c.get("name", ""))
        for c in (pod_claims[:_MAX_SHOWN] if isinstance(pod_claims, list) else ())
        if isinstance(c, Mapping)
    }
    if not (resources or env_vars or env_from or injected or claims):
        return None
    return DeviceUse(
        pod_key(pod),
        node,
        frozenset(resources),
        frozenset(env_vars),
        frozenset(sorted(env_from)[:_MAX_SHOWN]),
        frozenset(sorted(injected)[:_MAX_SHOWN]),
        frozenset(claims),
        frozenset(asked),
    )


def foreign_facts(
    pod: Obj, env_table: Mapping[str, str], holders_namespace: str | None = None
) -> tuple[Any, ...]:
    """What a pod outside any group uses on its node (empty: nothing)."""
    use = device_use(pod, env_table, holders_namespace)
    if use is None:
        return ()
    return (use.node, use.resources, use.env_vars, use.env_from, use.injected, use.claims)


def foreign_changed(env_table: Mapping[str, str], holders_namespace: str | None = None) -> Funcs:
    """Pods outside any group that use devices: their creation, deletion and changes."""

    def facts(pod: Obj) -> tuple[Any, ...]:
        return foreign_facts(pod, env_table, holders_namespace)

    return Funcs(
        create=lambda p: bool(facts(p)),
        update=lambda o, n: facts(o) != facts(n),
        delete=lambda p: bool(facts(p)),
    )


def foreign_frees(
    env_table: Mapping[str, str],
    counts: Callable[[str], bool],
    holders_namespace: str | None = None,
) -> Funcs:
    """Changes of pods outside any group that may give devices back on a node that
    ``counts`` (a shared node): the pod is deleted, ends, or stops using some device.
    A pod starting to use devices only takes (placement reads the mirror then)."""

    def freed(old: Obj, new: Obj | None) -> bool:
        before = foreign_facts(old, env_table, holders_namespace)
        if not before or not counts(before[0]):
            return False
        after = foreign_facts(new, env_table, holders_namespace) if new is not None else ()
        if not after or after[0] != before[0]:
            return True
        # Still there: it frees only if it stopped some use (every use only adds devices).
        return any(not b <= a for b, a in zip(before[1:], after[1:], strict=True))

    return Funcs(create=lambda _p: False, update=freed, delete=lambda p: freed(p, None))


class ForeignDevices:
    """Per node, the pods outside any group that use devices (a mirror of the pod cache).

    Bounded by the number of such pods; entries go when the pods end or are deleted.
    With ``shared_only``, only pods on nodes marked shared (``set_shared``) are kept:
    elsewhere device-plugin pods are the norm, and no group is placed there.
    """

    def __init__(
        self,
        env_table: Mapping[str, str],
        on_change: Callable[[str], None] | None = None,
        holders_namespace: str | None = None,
        kubelet_counts: Callable[[str, str], bool] | None = None,
        claims_counted: bool = False,
        shared_only: bool = False,
    ) -> None:
        self.env_table = env_table
        self.holders_namespace = holders_namespace
        #: The nodes whose pods are kept (``set_shared``); None: every node's.
        self._shared: set[str] | None = set() if shared_only else None
        #: DRA's allocations are read (``controllers.draclaims``): pods' claims are booked.
        self.claims_counted = claims_counted
        #: (node, resource) -> whether that node's kubelet counts the resource for the
        #: groups too (their holder pods): then asking the device plugin for it is no
        #: foreign use (``DeviceUse.affects``).
        self.kubelet_counts = kubelet_counts or (lambda _node, _res: False)
        #: Called with a node's name when its foreign pods change (metrics).
        self.on_change = on_change
        self._by_node: dict[str, dict[str, DeviceUse]] = {}
        self._node_of: dict[str, str] = {}

    def counts_node(self, node: str) -> bool:
        """Whether pods on ``node`` are kept (it is shared, or every node counts)."""
        return self._shared is None or node in self._shared

    def set_shared(self, node: str, shared: bool, pods: Callable[[], Iterable[Obj]]) -> None:
        """``node`` is (now) shared or not: its pods come in, read again through ``pods``
        (the pod cache's pods on the node), or go. No-op without ``shared_only``."""
        if self._shared is None or shared == (node in self._shared):
            return
        if shared:
            self._shared.add(node)
            for pod in pods():
                self.observe(pod)
            return
        self._shared.discard(node)
        dropped = self._by_node.pop(node, {})
        for key in dropped:
            del self._node_of[key]
        if dropped:
            self._changed(node)

    def observe(self, pod: Obj) -> None:
        key = pod_key(pod)
        use = device_use(pod, self.env_table, self.holders_namespace)
        if use is not None and not self.counts_node(use.node):
            use = None
        old_node = self._node_of.get(key)
        old = self._by_node.get(old_node, {}).get(key) if old_node else None
        if use == old:
            return
        if old_node is not None:
            self._drop(key, old_node)
        if use is not None:
            self._by_node.setdefault(use.node, {})[key] = use
            self._node_of[key] = use.node
        for node in {n for n in (old_node, use.node if use else None) if n}:
            self._changed(node)

    def forget(self, pod: Obj) -> None:
        key = pod_key(pod)
        node = self._node_of.get(key)
        if node is not None:
            self._drop(key, node)
            self._changed(node)

    def _drop(self, key: str, node: str) -> None:
        del self._node_of[key]
        pods = self._by_node[node]
        del pods[key]
        if not pods:
            del self._by_node[node]

    def _changed(self, node: str) -> None:
        if self.on_change is not None:
            self.on_change(node)

    # --- reading ---------------------------------------------------------------------
    def size(self) -> int:
        """Pods kept. (No ``__len__``: an empty mirror must not be falsy.)"""
        return len(self._node_of)

    def on(self, node: str) -> list[DeviceUse]:
        """The node's foreign device users, sorted by pod."""
        return sorted(self._by_node.get(node, {}).values(), key=lambda u: u.pod)

    def _affects(self, use: DeviceUse, node: str, resource: str) -> bool:
        counted = resource in use.requested and self.kubelet_counts(node, resource)
        return use.affects(
            resource, self.env_table, kubelet_counted=counted, claims_counted=self.claims_counted
        )

    def affecting(self, node: str, resources: Iterable[str]) -> list[DeviceUse]:
        wanted = list(resources)
        return [u for u in self.on(node) if any(self._affects(u, node, r) for r in wanted)]

    def blocked(self, resources: Iterable[str]) -> dict[str, dict[str, str]]:
        """For placement: node -> resource -> why, for every node where a requested
        resource is used outside the books (O(nodes with such pods))."""
        wanted = sorted(resources)
        out: dict[str, dict[str, str]] = {}
        for node, pods in self._by_node.items():
            for res in wanted:
                if any(self._affects(u, node, res) for u in pods.values()):
                    out.setdefault(node, {})[res] = (
                        f"have {res} in use by pods outside any group "
                        "(sdg explain lists them; keep shared nodes tainted)"
                    )
        return out

    def problem(self, node: str, resources: Iterable[str]) -> tuple[str, str] | None:
        """The ForeignDevicePods message for a group bound to ``node``, if any."""
        users = self.affecting(node, resources)
        if not users:
            return None
        pods = [f"{u.pod} ({u.how()})" for u in users]
        return (
            REASON_FOREIGN_DEVICE_PODS,
            f"pods outside any group use the devices of node {node}: {listed(pods)}; SDG "
            "cannot know which devices they see, so no new pod joins this group. Delete "
            "those pods or move them off the node; keep shared nodes exclusive with "
            f"kubectl taint node {node} {NODE_MODE_LABEL}={NODE_MODE_SHARED}:NoSchedule",
        )

    def counts(self, node: str) -> int:
        """Pods on ``node`` that may see devices the books do not say they have."""
        return sum(
            1
            for u in self._by_node.get(node, {}).values()
            if u.beyond_kubelet(lambda r: self.kubelet_counts(node, r), self.claims_counted)
        )


class ForeignPodReporter:
    """Reconciler for pods that use devices outside any group on a shared node: one
    Warning Event per pod, saying what to do."""

    def __init__(
        self,
        cache: Cache,
        recorder: EventRecorder,
        env_table: Mapping[str, str],
        holders_namespace: str | None = None,
        kubelet_counts: Callable[[str, str], bool] | None = None,
        claims_counted: bool = False,
    ):
        self.cache = cache
        self.recorder = recorder
        self.env_table = env_table
        self.holders_namespace = holders_namespace
        #: As ``ForeignDevices.kubelet_counts``: uses the kubelet counts are not warned of.
        self.kubelet_counts = kubelet_counts or (lambda _node, _res: False)
        self.claims_counted = claims_counted
        #: pod key -> UID of the pod already warned (bounded: dropped when the pod goes).
        self._warned: dict[str, str] = {}

    async def reconcile(self, request: Request) -> Result | None:
        key = f"{request.namespace}/{request.name}"
        try:
            pod = self.cache.get(PODS, request.name, request.namespace, copy=False)
        except errors.NotFound:
            self._warned.pop(key, None)
            return None
        use = device_use(pod, self.env_table, self.holders_namespace)
        uid = str(meta_of(pod).get("uid") or "")
        if use is None:
            self._warned.pop(key, None)
            return None
        try:
            node = self.cache.get(NODES, use.node, copy=False)
        except errors.NotFound:
            node = None
        if not is_shared(node) or self._warned.get(key) == uid:
            return None
        if not use.beyond_kubelet(lambda r: self.kubelet_counts(use.node, r), self.claims_counted):
            return None  # the kubelet gave it devices no group holds
        self._warned[key] = uid
        self.recorder.emit(
            pod,
            "Warning",
            "ForeignDevicePod",
            f"this pod {use.how()} on shared node {use.node} without a SharedDeviceGroup: "
            "SDG cannot know which devices it sees, so it hands out no more of them there "
            "and flags the groups bound to the node. Join a group (annotation "
            f"{GROUP_ANNOTATION}) or run it on a node without {NODE_MODE_LABEL}={NODE_MODE_SHARED}",
        )
        log.warning("pod %s uses devices outside any group on node %s", key, use.node)
        return None


def setup(mgr: Manager, reporter: ForeignPodReporter) -> None:
    """Register the reporter: woken by pods outside any group that use devices."""
    (
        mgr.controller("foreign-device-pods")
        .for_(PODS, predicates=[foreign_changed(reporter.env_table, reporter.holders_namespace)])
        .complete(reporter)
    )

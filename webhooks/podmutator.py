"""Mutating webhook for pods of a SharedDeviceGroup: give them the group's devices.

Pod CREATE, and UPDATE of ``pods/ephemeralcontainers`` (``kubectl debug``) of a group's
pod. It only reads: the group and its node from the shared cache (live reads through
``client`` when the cache has not seen them, briefly waiting for a group still being
bound) and the RuntimeClass of ``--runtime-class-name``; they choose how the devices are
given. The decisions are pure (``webhooks.injection``, ``webhooks.delivery``). When
nothing confirms the chosen delivery it warns on the group once. How it reads, and why:
docs/design.md, "Inside the controllers".
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Mapping
from typing import Any

import anyio

from api.constants import (
    CONDITION_SCHEDULED,
    DEFAULT_ENV_TABLE,
    PHASE_BOUND,
    REASON_DELIVERY_UNVERIFIED,
    REASON_WAITING_FOR_HOLDER,
    SCHEDULER_NAME,
    SDG_KIND,
)
from sdgruntime import errors
from sdgruntime.cache import Cache, CacheNotSynced
from sdgruntime.client import Client
from sdgruntime.events import EventRecorder
from sdgruntime.jsoncodec import dumps
from sdgruntime.kinds import NODES, RUNTIMECLASSES, meta_of, status_of
from sdgruntime.lru import LRU
from sdgruntime.webhook import AdmissionRequest, AdmissionResponse, allowed, denied, patch_ops
from webhooks.injection import (
    Delivery,
    Denial,
    Patch,
    build_ephemeral_injection,
    build_injection,
    check_annotation,
    group_annotation,
)

log = logging.getLogger(__name__)

#: How long a pod CREATE waits for a group that has not been scheduled yet.
BINDING_WAIT = 2.0
_POLL = 0.05
#: Groups remembered as warned about their unverified delivery (oldest forgotten first;
#: a deleted group is forgotten at once, ``forget_group``).
MAX_WARNED_GROUPS = 10_000
#: How long a group the API server said does not exist is not asked for again (the cache
#: is still consulted first: a group created meanwhile is found as soon as it is cached).
MISSING_TTL = 1.0
#: Names remembered as missing (oldest forgotten first).
MAX_MISSING = 4096
#: Decisions remembered (the least recently used forgotten first): the pods of a Deployment
#: or Job differ only in their names, so all but the first reuse one patch (~70 us each).
MAX_DECISIONS = 1024
#: ... and at most this many bytes of their JSON patches: a pod of thousands of containers
#: has a patch as large, and a flood of such shapes must not hold 1024 of them.
MAX_DECISION_BYTES = 4 << 20
#: Groups' ``group_part`` remembered by UID, name and resourceVersion, the least recently
#: used forgotten first: a group is re-encoded when it changes, not on every review.
MAX_GROUP_PARTS = 1024
#: What tells two pods of one template apart and never changes the decision (a test holds
#: ``build_injection`` to that), and the group's pod counts, rewritten as pods come.
_POD_IDENTITY = frozenset(
    ("name", "generateName", "uid", "creationTimestamp", "resourceVersion", "managedFields")
)
_GROUP_WRITES = frozenset(("resourceVersion", "managedFields", "generation"))
#: A decided patch and the response that carries it (the same response answers every
#: review of that decision: its patch is encoded once).
_Decision = tuple[Patch, AdmissionResponse]
_GROUP_COUNTS = frozenset(("allocatedPods", "podCount", "allocatedPodCounts"))


def _without(obj: Mapping[str, Any], meta: frozenset[str], status: frozenset[str]) -> Any:
    """``obj`` without those metadata and status fields (a shallow copy where it differs).
    Decoded JSON is plain dicts: ``isinstance(.., dict)``, not ``Mapping``'s slower check."""
    out = dict(obj)
    part = obj.get("metadata")
    if isinstance(part, dict):
        out["metadata"] = {k: v for k, v in part.items() if k not in meta}
    part = obj.get("status")
    if status and isinstance(part, dict):
        out["status"] = {k: v for k, v in part.items() if k not in status}
    return out


def _version(obj: Mapping[str, Any] | None) -> Any:
    """What identifies this state of a cached object: its resourceVersion, else itself."""
    if obj is None:
        return None
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping) or not meta.get("resourceVersion"):
        return obj
    return [meta.get("name"), meta["resourceVersion"]]


def group_part(group: Mapping[str, Any]) -> bytes:
    """The digest of what ``build_injection`` reads of ``group``: all but its writes'
    bookkeeping and its pod counts (which change with every status write)."""
    return hashlib.sha256(dumps(_without(group, _GROUP_WRITES, _GROUP_COUNTS))).digest()


def decision_key(
    pod: Mapping[str, Any],
    group: bytes,
    node: Mapping[str, Any] | None,
    runtime_classes: Mapping[str, Mapping[str, Any]] | None,
) -> bytes:
    """A digest of everything ``build_injection`` decides a pod CREATE from, but the pod's
    identity and the group's pod counts; ``group`` is the group's ``group_part``.
    SHA-256: no collision can be crafted (OpenSSL's, twice as fast here as BLAKE2b's
    reference C in CPython builds without libb2)."""
    digest = hashlib.sha256(group)
    digest.update(
        dumps(
            [
                _without(pod, _POD_IDENTITY, frozenset()),
                _version(node),
                sorted((name, _version(rc)) for name, rc in (runtime_classes or {}).items()),
            ]
        )
    )
    return digest.digest()


def _warn_key(group: Mapping[str, Any]) -> str:
    meta = meta_of(group)
    return str(meta.get("uid") or meta.get("name") or "")


def _still_binding(group: Mapping[str, Any]) -> bool:
    """Neither Bound nor judged unschedulable yet: the scheduler has not decided, or has
    placed the group and waits for the kubelet to give its holder pod the devices."""
    status = status_of(group)
    if status.get("phase") == PHASE_BOUND:
        return False
    return all(
        c.get("reason") == REASON_WAITING_FOR_HOLDER
        for c in status.get("conditions") or ()
        if c.get("type") == CONDITION_SCHEDULED
    )


class PodMutator:
    """``/mutate-v1-pod``: the group's devices into every container as the node's runtime
    takes them (device env into ephemeral ones too), our schedulerName, the shared-node
    toleration. ``delivery`` is the manager's delivery settings (``Settings.delivery_settings``)."""

    def __init__(
        self,
        cache: Cache,
        client: Client,
        env_table: Mapping[str, str] = DEFAULT_ENV_TABLE,
        binding_wait: float = BINDING_WAIT,
        scheduler_name: str = SCHEDULER_NAME,
        delivery: Delivery | None = None,
        recorder: EventRecorder | None = None,
    ) -> None:
        self.scheduler_name = scheduler_name
        self.cache = cache
        self.client = client
        self.env_table = env_table
        self.binding_wait = binding_wait
        self.delivery = delivery if delivery is not None else Delivery()
        self.recorder = recorder
        #: UIDs of the groups whose unverified delivery has had its Warning Event.
        self._warned: LRU[str, None] = LRU(MAX_WARNED_GROUPS)
        #: Group name -> until when a live GET is not repeated for it (it was missing).
        self._missing: LRU[str, float] = LRU(MAX_MISSING)
        #: ``decision_key`` -> the patch it gave and its response, weighed by the encoded
        #: patch's size in bytes (denials are decided afresh: they are rare and name what
        #: the pod did).
        self._decisions: LRU[bytes, _Decision] = LRU(MAX_DECISIONS, MAX_DECISION_BYTES)
        self._group_parts: LRU[tuple[Any, Any, Any], bytes] = LRU(MAX_GROUP_PARTS)

    async def mutate(self, request: AdmissionRequest) -> AdmissionResponse:
        pod = request.object or {}
        if request.kind.get("kind") != "Pod":
            return allowed()
        if request.operation == "UPDATE" and request.sub_resource == "ephemeralcontainers":
            return await self._ephemeral(pod, request.old_object or {})
        if request.operation != "CREATE" or request.sub_resource:
            return allowed()
        bad = check_annotation(pod, self.scheduler_name)
        if bad is not None:
            return denied(bad.message)
        name = group_annotation(pod)
        group = await self._group(name) if name else None
        node = await self._node(group) if group is not None else None
        classes = self._runtime_classes() if node is not None else None
        key = None
        if group is not None:
            key = decision_key(pod, self._group_part(group), node, classes)
        decision = self._decisions.get(key) if key is not None else None
        if decision is None:
            decided = build_injection(
                pod,
                group,
                self.env_table,
                self.scheduler_name,
                delivery=self.delivery,
                node=node,
                runtime_classes=classes,
            )
            if isinstance(decided, Denial):
                return denied(decided.message)
            decision = self._remember(key, decided)
        result, response = decision
        if group is not None and not request.dry_run:
            self._warn_unverified(group, result)
        return response

    def _group_part(self, group: Mapping[str, Any]) -> bytes:
        """``group_part(group)``, remembered per version (a version is never rewritten)."""
        meta = group.get("metadata")
        if not isinstance(meta, dict) or not meta.get("resourceVersion"):
            return group_part(group)
        which = (meta.get("uid"), meta.get("name"), meta["resourceVersion"])
        part = self._group_parts.get(which)
        if part is None:
            part = group_part(group)
            self._group_parts.put(which, part)
        return part

    def _remember(self, key: bytes | None, patch: Patch) -> _Decision:
        """``patch`` and its response (which encodes the patch once, for every review it
        answers), kept under ``key`` within both bounds (the oldest go first); one larger
        than the byte bound alone is not kept."""
        response = patch_ops(patch.operations, warnings=patch.warnings)
        if key is not None:
            size = len(response.encoded_patch()) + sum(map(len, patch.warnings))
            self._decisions.put(key, (patch, response), size)
        return patch, response

    def _runtime_classes(self) -> dict[str, Mapping[str, Any]]:
        """The RuntimeClass ``--runtime-class-name``, by name, if the cache holds it (a
        cache not synced yet says nothing: the choice falls back to unverified env)."""
        name = self.delivery.runtime_class_name
        try:
            found = self.cache.find(RUNTIMECLASSES, name, copy=False)
        except CacheNotSynced:
            return {}
        return {name: found} if found is not None else {}

    def forget_group(self, group: Mapping[str, Any]) -> None:
        """The group was deleted: forget that it was warned about (the informer's delete
        handler calls this; a new group of the same name has a new UID anyway)."""
        self._warned.pop(_warn_key(group))

    def _warn_unverified(self, group: Mapping[str, Any], patch: Patch) -> None:
        """One Warning Event per group whose pods get a delivery nothing confirms."""
        choice = patch.delivery
        if choice is None or choice.verified or self.recorder is None:
            return
        uid = _warn_key(group)
        if uid in self._warned:
            return
        self._warned.put(uid, None)
        self.recorder.emit(
            group,
            "Warning",
            REASON_DELIVERY_UNVERIFIED,
            f"pods get their devices by {choice.mode}, unverified: {choice.reason}. To "
            f"settle it: {choice.settle}",
            action="AdmitPod",
        )

    async def _ephemeral(
        self, pod: Mapping[str, Any], old_pod: Mapping[str, Any]
    ) -> AdmissionResponse:
        name = group_annotation(pod)
        if not name:
            return allowed()  # not a group's pod: its debug containers are not ours
        # A member's group is Bound already: no waiting for the scheduler here.
        group = await self._lookup(name)
        result = build_ephemeral_injection(pod, old_pod, group, self.env_table)
        if isinstance(result, Denial):
            return denied(result.message)
        return patch_ops(result.operations, warnings=result.warnings)

    async def _group(self, name: str) -> dict[str, Any] | None:
        group = await self._lookup(name)
        deadline = time.monotonic() + self.binding_wait
        while group is not None and _still_binding(group) and time.monotonic() < deadline:
            await anyio.sleep(_POLL)
            try:
                group = self.cache.get(SDG_KIND, name, copy=False)
            except (errors.NotFound, CacheNotSynced):
                continue  # seen live, not cached yet: keep what the live read said
        return group

    async def _node(self, group: Mapping[str, Any]) -> dict[str, Any] | None:
        """The bound group's node (None when not bound or gone): its label may override
        the delivery mode. The cache first, like groups; the API server when it cannot say."""
        name = status_of(group).get("nodeName")
        if not name or status_of(group).get("phase") != PHASE_BOUND:
            return None
        try:
            return self.cache.get(NODES, name, copy=False)
        except (errors.NotFound, CacheNotSynced):
            pass  # a node added a moment ago, or the cache has not synced: ask
        try:
            return await self.client.get(NODES, name)
        except errors.NotFound:
            return None

    async def _lookup(self, name: str) -> dict[str, Any] | None:
        try:
            return self.cache.get(SDG_KIND, name, copy=False)
        except (errors.NotFound, CacheNotSynced):
            pass  # not cached (yet), or the cache has not synced: ask the API server
        now = time.monotonic()
        if (self._missing.peek(name) or 0.0) > now:
            return None
        try:
            return await self.client.get(SDG_KIND, name)
        except errors.NotFound:
            self._missing.put(name, now + MISSING_TTL)
            return None

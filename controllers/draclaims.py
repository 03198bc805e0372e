"""DRA's books: a group Bound on ResourceSlice devices is entered as an allocated
ResourceClaim, and every ResourceClaim allocation is read back.

kube-scheduler's DRA allocator hands out every slice device no ResourceClaim has allocated,
and SDG hands out devices it holds no record of; each must see the other's holdings.
:class:`DraPublisher` writes one claim per group, :class:`DraAllocations` mirrors every
claim's allocation as holders. The books are not fenced against each other. Why this
shape holds against kube-scheduler and kube-controller-manager, and which rights it needs:
docs/design.md, "The cluster's books".
"""

from __future__ import annotations

import copy
import hashlib
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final

from api.constants import FINALIZER, GROUP, KIND, PLURAL, VERSION
from controllers.holders import ROLE_LABEL
from sdgruntime import errors
from sdgruntime.client import Client
from sdgruntime.kinds import Kind, Obj, meta_of, spec_of, status_of
from sdgruntime.predicate import Funcs

log = logging.getLogger(__name__)

#: DRA's claims (resource.k8s.io/v1, GA in Kubernetes 1.34).
RESOURCECLAIMS: Final = Kind(
    "resource.k8s.io", "v1", "ResourceClaim", "resourceclaims", namespaced=True
)


#: ``AllocationResultsMaxSize`` (k8s.io/api resource/v1 types.go:2205): the API server
#: stores at most this many results in one allocation, so a group of more devices cannot
#: be entered as one claim.
MAX_RESULTS: Final = 32
#: ``deviceshare.io/role`` of SDG's group claims (in the manager's namespace only).
ROLE_GROUP_CLAIM: Final = "group-claim"
#: Annotation naming the group a group claim holds devices for.
CLAIM_FOR_ANNOTATION: Final = "deviceshare.io/claim-for"
#: SDG's finalizer on its claims (the same name as on groups: SDG releases it).
CLAIM_FINALIZER: Final = FINALIZER
#: The ``status.reservedFor`` entry's resource (a group is the claim's consumer).
CONSUMER_RESOURCE: Final = PLURAL
#: How a claim that is not a group's is named as a holder (``holder_of``).
CLAIM_HOLDER_PREFIX: Final = "ResourceClaim "
_PREFIX = "sdg-group."
_MAX_NAME = 253  # ResourceClaim names are DNS subdomains
_ATTEMPTS = 5  # re-reads after a 409 before giving up


@dataclass(frozen=True, slots=True, order=True)
class DeviceRef:
    """One DRA device: ``<driver>/<pool>/<device>``, as allocation results name it."""

    driver: str
    pool: str
    device: str

    def __str__(self) -> str:
        return f"{self.driver}/{self.pool}/{self.device}"


class GroupClaimConflict(Exception):
    """A group's claim cannot be written as asked: its name is taken by another group
    (or another incarnation of it), or it already names other devices or another node.
    SDG never re-points a claim; the caller must remove it first."""


class DevicesHeldElsewhere(GroupClaimConflict):
    """DRA's books already give some of the devices to another claim."""


def allocated_devices(claim: Obj) -> list[DeviceRef]:
    """The devices ``claim``'s allocation holds, as kube-scheduler counts them: every
    result except admin-access ones (which take nothing from anyone), each once, at most
    :data:`MAX_RESULTS` (the API server stores no more). Malformed results are skipped."""
    out: list[DeviceRef] = []
    seen: set[DeviceRef] = set()
    for result in allocated_results(claim):
        if result.get("adminAccess") is True:
            continue
        driver, pool, device = (result.get(k) for k in ("driver", "pool", "device"))
        if not (
            isinstance(driver, str) and isinstance(pool, str) and isinstance(device, str)
        ) or not (driver and pool and device):
            continue
        ref = DeviceRef(driver, pool, device)
        if ref not in seen:
            seen.add(ref)
            out.append(ref)
    return out


_KEPT_CLAIM_METADATA = (
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "labels",
    "annotations",
    "ownerReferences",
    "deletionTimestamp",
)


def cached_claim(claim: dict[str, Any]) -> dict[str, Any]:
    """The manager's cache transform for ResourceClaims: who it is and which devices its
    allocation holds (not its spec's selectors, nor the devices' config and status)."""
    meta = meta_of(claim)
    out: dict[str, Any] = {k: claim[k] for k in ("apiVersion", "kind") if k in claim}
    out["metadata"] = {k: meta[k] for k in _KEPT_CLAIM_METADATA if k in meta}
    results = [
        {k: r[k] for k in ("request", "driver", "pool", "device", "adminAccess") if k in r}
        for r in allocated_results(claim)
    ]
    if results:
        out["status"] = {"allocation": {"devices": {"results": results}}}
    return out


def allocated_results(claim: Obj) -> list[Mapping[str, Any]]:
    """``status.allocation.devices.results`` when well-formed (at most :data:`MAX_RESULTS`)."""
    status = status_of(claim)
    allocation = status.get("allocation") if isinstance(status, Mapping) else None
    devices = allocation.get("devices") if isinstance(allocation, Mapping) else None
    results = devices.get("results") if isinstance(devices, Mapping) else None
    if not isinstance(results, list):
        return []
    return [r for r in results[:MAX_RESULTS] if isinstance(r, Mapping)]


def claim_pools(claim: Obj) -> set[tuple[str, str]]:
    """The ``(driver, pool)`` pairs a claim's allocation takes devices from."""
    return {(r.driver, r.pool) for r in allocated_devices(claim)}


def allocation_changed() -> Funcs:
    """ResourceClaims whose allocated devices appear, change or go."""
    return Funcs(
        create=lambda c: bool(allocated_devices(c)),
        update=lambda o, n: allocated_devices(o) != allocated_devices(n),
        delete=lambda c: bool(allocated_devices(c)),
    )


def group_claim_name(group: str) -> str:
    """The ResourceClaim name of group ``group``: ``sdg-group.<group>``, a DNS subdomain
    for any group name (one too long is cut and ends in a hash of the whole name)."""
    name = _PREFIX + group
    if len(name) <= _MAX_NAME:
        return name
    digest = hashlib.sha256(group.encode()).hexdigest()[:12]
    return f"{name[: _MAX_NAME - 13].rstrip('.-')}-{digest}"


def is_group_claim(claim: Obj, namespace: str | None) -> bool:
    """Whether ``claim`` is one of SDG's group claims: labelled so *in the manager's
    namespace* (only SDG writes there; the label elsewhere proves nothing)."""
    if not namespace:
        return False
    meta = meta_of(claim)
    return (
        meta.get("namespace") == namespace
        and (meta.get("labels") or {}).get(ROLE_LABEL) == ROLE_GROUP_CLAIM
    )


def claim_for(claim: Obj) -> str | None:
    """The group a group claim says it holds devices for (its annotation), if any."""
    value = (meta_of(claim).get("annotations") or {}).get(CLAIM_FOR_ANNOTATION)
    return value if isinstance(value, str) and value else None


def owner_uid(claim: Obj) -> str:
    """The UID of the group that owns a claim ("" if none does)."""
    for ref in meta_of(claim).get("ownerReferences") or ():
        if ref.get("kind") == KIND and str(ref.get("apiVersion", "")).startswith(GROUP + "/"):
            return str(ref.get("uid") or "")
    return ""


def holder_of(claim: Obj, namespace: str | None) -> str:
    """Who holds ``claim``'s devices: the group, for SDG's group claims, else
    ``ResourceClaim <ns>/<name>``."""
    if is_group_claim(claim, namespace):
        group = claim_for(claim)
        if group:
            return group
    meta = meta_of(claim)
    return f"{CLAIM_HOLDER_PREFIX}{meta.get('namespace', '')}/{meta.get('name', '')}"


def _group_identity(group: Obj) -> tuple[str, str]:
    meta = meta_of(group)
    name, uid = str(meta.get("name") or ""), str(meta.get("uid") or "")
    if not name or not uid:
        raise ValueError("a group claim needs the group's name and uid (a stored group)")
    return name, uid


def _checked(devices: Iterable[DeviceRef]) -> list[DeviceRef]:
    out = list(devices)
    if not out:
        raise ValueError("a group claim needs at least one device")
    if len(out) > MAX_RESULTS:
        raise ValueError(
            f"{len(out)} devices: one ResourceClaim allocates at most {MAX_RESULTS} "
            "(AllocationResultsMaxSize)"
        )
    if len(set(out)) != len(out):
        raise ValueError("a device is listed twice")
    return out


def _requests(devices: Sequence[DeviceRef]) -> list[tuple[str, str, list[DeviceRef]]]:
    """One request per driver (sorted), named ``devices-<i>``: (name, driver, devices)."""
    by_driver: dict[str, list[DeviceRef]] = {}
    for ref in devices:
        by_driver.setdefault(ref.driver, []).append(ref)
    return [
        (f"devices-{i}", driver, refs) for i, (driver, refs) in enumerate(sorted(by_driver.items()))
    ]


def node_selector(node: str) -> dict[str, Any]:
    """An allocation's node pin, as kube-scheduler's allocator writes it for node-local
    devices (dynamic-resource-allocation structured/internal/stable/allocator_stable.go:1470)."""
    return {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
        ]
    }


def consumer(group: Obj) -> dict[str, str]:
    """The group as a ``status.reservedFor`` entry."""
    name, uid = _group_identity(group)
    return {"apiGroup": GROUP, "resource": CONSUMER_RESOURCE, "name": name, "uid": uid}


def build_group_claim(
    group: Obj,
    node: str,
    devices: Iterable[DeviceRef],
    namespace: str,
    device_class: str | Mapping[str, str],
) -> dict[str, Any]:
    """The group's ResourceClaim, status included (the API server drops the status on
    create: write :func:`group_claim_status` to ``/status`` after). ``device_class`` is the
    DeviceClass asked for, or one per driver."""
    name, uid = _group_identity(group)
    refs = _checked(devices)
    requests = []
    for request, driver, of_driver in _requests(refs):
        cls = device_class if isinstance(device_class, str) else device_class.get(driver, driver)
        requests.append(
            {"name": request, "exactly": {"deviceClassName": cls, "count": len(of_driver)}}
        )
    return {
        "apiVersion": RESOURCECLAIMS.api_version,
        "kind": RESOURCECLAIMS.kind,
        "metadata": {
            "name": group_claim_name(name),
            "namespace": namespace,
            "labels": {ROLE_LABEL: ROLE_GROUP_CLAIM},
            "annotations": {CLAIM_FOR_ANNOTATION: name},
            "finalizers": [CLAIM_FINALIZER],
            "ownerReferences": [
                {
                    "apiVersion": f"{GROUP}/{VERSION}",
                    "kind": KIND,
                    "name": name,
                    "uid": uid,
                    "controller": True,
                }
            ],
        },
        "spec": {"devices": {"requests": requests}},
        "status": group_claim_status(group, node, refs),
    }


def group_claim_status(group: Obj, node: str, devices: Iterable[DeviceRef]) -> dict[str, Any]:
    """The claim's status: allocated to exactly ``devices`` on ``node``, reserved for the
    group."""
    refs = _checked(devices)
    results = [
        {"request": request, "driver": ref.driver, "pool": ref.pool, "device": ref.device}
        for request, _, of_driver in _requests(refs)
        for ref in of_driver
    ]
    return {
        "allocation": {"devices": {"results": results}, "nodeSelector": node_selector(node)},
        "reservedFor": [consumer(group)],
    }


def _allocated_node(claim: Obj) -> str | None:
    """The node an allocation is pinned to by ``matchFields metadata.name`` (else None)."""
    allocation = status_of(claim).get("allocation") or {}
    terms = (allocation.get("nodeSelector") or {}).get("nodeSelectorTerms") or []
    if len(terms) != 1 or terms[0].get("matchExpressions"):
        return None
    fields = terms[0].get("matchFields") or []
    if len(fields) != 1:
        return None
    field = fields[0]
    values = field.get("values") or []
    if field.get("key") == "metadata.name" and field.get("operator") == "In" and len(values) == 1:
        return str(values[0])
    return None


def _asked(claim: Obj) -> list[tuple[str, int]]:
    """(request name, count) of a claim's ``exactly`` requests; the DeviceClass is not
    compared (renaming a class must not wedge every group)."""
    out = []
    for r in (spec_of(claim).get("devices") or {}).get("requests") or ():
        exactly = r.get("exactly")
        if not isinstance(exactly, Mapping):
            out.append((str(r.get("name")), -1))  # firstAvailable: never what SDG asks
            continue
        mode = exactly.get("allocationMode") or "ExactCount"
        count = (exactly.get("count") or 1) if mode == "ExactCount" else -1
        out.append((str(r.get("name")), int(count)))
    return out


class DraAllocations:
    """Who holds each allocated DRA device, mirrored from every ResourceClaim.

    Feed it synchronously from a ResourceClaim informer over all namespaces:
    ``on_add=observe``, ``on_update=lambda _o, c: observe(c)``, ``on_delete=forget``.
    ``namespace`` is the manager's: only labelled claims there count as groups' claims.
    ``on_change(pools)`` gets the ``(driver, pool)`` pairs whose holders changed. Holds one
    entry per allocated claim (at most :data:`MAX_RESULTS` devices each); a claim's entries
    go when it is deallocated or deleted.
    """

    def __init__(
        self,
        namespace: str | None,
        on_change: Callable[[frozenset[tuple[str, str]]], None] | None = None,
    ) -> None:
        self.namespace = namespace
        self.on_change = on_change
        #: (namespace, name) -> (holder, devices)
        self._claims: dict[tuple[str, str], tuple[str, tuple[DeviceRef, ...]]] = {}
        #: (driver, pool) -> device -> claim key -> holder
        self._pools: dict[tuple[str, str], dict[str, dict[tuple[str, str], str]]] = {}

    def __len__(self) -> int:
        """How many claims hold devices."""
        return len(self._claims)

    def observe(self, claim: Obj) -> None:
        meta = meta_of(claim)
        key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        refs = tuple(allocated_devices(claim))
        entry = (holder_of(claim, self.namespace), refs) if refs else None
        self._set(key, entry)

    def forget(self, claim: Obj) -> None:
        meta = meta_of(claim)
        self._set((str(meta.get("namespace") or ""), str(meta.get("name") or "")), None)

    def _set(self, key: tuple[str, str], entry: tuple[str, tuple[DeviceRef, ...]] | None) -> None:
        old = self._claims.get(key)
        if old == entry:
            return
        changed: set[tuple[str, str]] = set()
        if old is not None:
            del self._claims[key]
            for ref in old[1]:
                pool = (ref.driver, ref.pool)
                devices = self._pools[pool]
                holders = devices[ref.device]
                holders.pop(key, None)
                if not holders:
                    del devices[ref.device]
                if not devices:
                    del self._pools[pool]
                changed.add(pool)
        if entry is not None:
            self._claims[key] = entry
            holder, refs = entry
            for ref in refs:
                pool = (ref.driver, ref.pool)
                self._pools.setdefault(pool, {}).setdefault(ref.device, {})[key] = holder
                changed.add(pool)
        if changed and self.on_change is not None:
            self.on_change(frozenset(changed))

    def holders(self, driver: str, pool: str) -> Mapping[str, tuple[str, ...]]:
        """Device name -> its holders (sorted; more than one only if two claims were given
        one device: a race between the books, or consumable capacity)."""
        devices = self._pools.get((driver, pool), {})
        return MappingProxyType({d: tuple(sorted(set(h.values()))) for d, h in devices.items()})

    def held_by(self, ref: DeviceRef) -> tuple[str, ...]:
        """The holders of one device (empty if no claim has it)."""
        holders = self._pools.get((ref.driver, ref.pool), {}).get(ref.device, {})
        return tuple(sorted(set(holders.values())))

    def devices_of(self, namespace: str, name: str) -> tuple[DeviceRef, ...]:
        """The devices claim ``namespace/name`` holds (empty if none or unknown)."""
        entry = self._claims.get((namespace, name))
        return entry[1] if entry is not None else ()

    def pools(self) -> frozenset[tuple[str, str]]:
        """Every ``(driver, pool)`` with an allocated device."""
        return frozenset(self._pools)


class DraPublisher:
    """Writes groups into DRA's books: one allocated ResourceClaim per group in
    ``namespace`` (the manager's).

    ``device_classes`` maps a driver to the DeviceClass its claims ask for (default: the
    class named after the driver, as NVIDIA's and AMD's charts install them). With
    ``allocations`` (the mirror), :meth:`ensure` refuses devices another claim holds.
    """

    def __init__(
        self,
        client: Client,
        namespace: str,
        *,
        device_classes: Mapping[str, str] | None = None,
        allocations: DraAllocations | None = None,
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.device_classes = dict(device_classes or {})
        self.allocations = allocations

    def _where(self, name: str) -> str:
        return f"ResourceClaim {self.namespace}/{name}"

    async def ensure(self, group: Obj, node: str, devices: Iterable[DeviceRef]) -> dict[str, Any]:
        """Make the group's claim exist, allocated to exactly ``devices`` on ``node`` and
        reserved for the group; returns it. Idempotent. Raises
        :class:`GroupClaimConflict` if a claim of that name is another group's (or another
        incarnation's) or already names other devices or another node, and
        :class:`DevicesHeldElsewhere` if the mirror shows another claim holding one."""
        group_name, uid = _group_identity(group)
        refs = _checked(devices)
        want = build_group_claim(group, node, refs, self.namespace, self.device_classes)
        name = want["metadata"]["name"]
        if self.allocations is not None:
            taken = {
                str(ref): others
                for ref in refs
                if (others := [h for h in self.allocations.held_by(ref) if h != group_name])
            }
            if taken:
                held = "; ".join(f"{d} by {', '.join(h)}" for d, h in sorted(taken.items()))
                raise DevicesHeldElsewhere(
                    f"group {group_name}: DRA's books give {held}; not entered as {name}"
                )
        for _ in range(_ATTEMPTS):
            claim = await self._get_or_create(name, want)
            self._check(claim, group_name, uid, node, refs, want)
            status = status_of(claim)
            meta = meta_of(claim)
            ours = consumer(group)
            reserved = list(status.get("reservedFor") or [])
            has_entry = any(r.get("uid") == uid for r in reserved)
            if status.get("allocation") and has_entry:
                return await self._keep_finalizer(claim)
            if meta.get("deletionTimestamp"):
                if status.get("allocation"):
                    return claim  # still allocated, so still counted; remove() ends it
                raise GroupClaimConflict(
                    f"{self._where(name)} is being deleted: remove() it, then ensure() again"
                )
            body = copy.deepcopy(dict(claim))
            new_status = dict(status_of(body))
            if not new_status.get("allocation"):
                new_status["allocation"] = want["status"]["allocation"]
            new_status["reservedFor"] = [*reserved, ours] if not has_entry else reserved
            body["status"] = new_status
            try:
                claim = await self.client.update_status(RESOURCECLAIMS, body)
            except errors.Conflict:
                continue
            except errors.NotFound:
                continue
            return await self._keep_finalizer(claim)
        raise GroupClaimConflict(f"{self._where(name)} kept changing while it was written")

    async def _get_or_create(self, name: str, want: Mapping[str, Any]) -> dict[str, Any]:
        try:
            return await self.client.get(RESOURCECLAIMS, name, self.namespace)
        except errors.NotFound:
            pass
        body = {k: v for k, v in want.items() if k != "status"}
        try:
            return await self.client.create(RESOURCECLAIMS, body, self.namespace)
        except errors.AlreadyExists:
            return await self.client.get(RESOURCECLAIMS, name, self.namespace)

    def _check(
        self,
        claim: Obj,
        group: str,
        uid: str,
        node: str,
        refs: Sequence[DeviceRef],
        want: Obj,
    ) -> None:
        where = self._where(str(meta_of(claim).get("name")))
        if not is_group_claim(claim, self.namespace):
            raise GroupClaimConflict(f"{where} exists and is not SDG's group claim")
        other, other_uid = claim_for(claim), owner_uid(claim)
        if other != group or other_uid != uid:
            raise GroupClaimConflict(
                f"{where} holds devices for group {other} (uid {other_uid or '?'}), "
                f"not for group {group} (uid {uid}): remove it first"
            )
        if _asked(claim) != _asked(want):
            raise GroupClaimConflict(
                f"{where} asks for {_asked(claim)}, not {_asked(want)}: remove it first"
            )
        if not status_of(claim).get("allocation"):
            return
        held = allocated_devices(claim)
        pinned = _allocated_node(claim)
        if set(held) != set(refs) or pinned != node:
            names = ", ".join(map(str, sorted(held))) or "no devices"
            raise GroupClaimConflict(
                f"{where} is allocated {names} on node {pinned or '?'}, not "
                f"{', '.join(map(str, sorted(refs)))} on {node}: SDG never re-points a "
                "claim; remove it first"
            )

    async def _keep_finalizer(self, claim: dict[str, Any]) -> dict[str, Any]:
        meta = meta_of(claim)
        finalizers = list(meta.get("finalizers") or [])
        if CLAIM_FINALIZER in finalizers or meta.get("deletionTimestamp"):
            return claim
        body = copy.deepcopy(claim)
        body["metadata"]["finalizers"] = [*finalizers, CLAIM_FINALIZER]
        try:
            return await self.client.update(RESOURCECLAIMS, body)
        except (errors.Conflict, errors.NotFound):
            return claim  # the next ensure() adds it; the allocation is what counts

    async def remove_unless(self, group_name: str, live_uid: str) -> bool:
        """Remove group ``group_name``'s claim unless it belongs to the group that exists
        now (``live_uid``, "" if none does): an orphan left by a group that is gone."""
        name = group_claim_name(group_name)
        try:
            claim = await self.client.get(RESOURCECLAIMS, name, self.namespace)
        except errors.NotFound:
            return False
        uid = owner_uid(claim)
        if not is_group_claim(claim, self.namespace) or (live_uid and uid == live_uid):
            return False
        return await self.remove(group_name, uid)

    async def remove(self, group_name: str, uid: str) -> bool:
        """Delete the claim of group ``group_name`` with UID ``uid`` (SDG's finalizer first),
        so its devices go back to DRA. True if there was one; False if it is already gone
        or belongs to another incarnation of the group (left alone)."""
        name = group_claim_name(group_name)
        for _ in range(_ATTEMPTS):
            try:
                claim = await self.client.get(RESOURCECLAIMS, name, self.namespace)
            except errors.NotFound:
                return False
            if (
                not is_group_claim(claim, self.namespace)
                or claim_for(claim) != group_name
                or owner_uid(claim) != uid
            ):
                log.info(
                    "%s is not group %s's (uid %s): left alone", self._where(name), group_name, uid
                )
                return False
            meta = claim["metadata"]
            try:
                if CLAIM_FINALIZER in (meta.get("finalizers") or ()):
                    body = copy.deepcopy(claim)
                    body["metadata"]["finalizers"] = [
                        f for f in meta["finalizers"] if f != CLAIM_FINALIZER
                    ]
                    claim = await self.client.update(RESOURCECLAIMS, body)
                    meta = claim["metadata"]
                await self.client.delete(
                    RESOURCECLAIMS,
                    name,
                    self.namespace,
                    uid=str(meta["uid"]),
                    resource_version=str(meta["resourceVersion"]),
                )
            except errors.NotFound:
                return True
            except errors.Conflict:
                continue
            return True
        raise GroupClaimConflict(f"{self._where(name)} kept changing while it was removed")

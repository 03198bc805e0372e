"""The fenced, authoritative record of which group holds which device IDs on each node.

One ConfigMap per node (``controllers.ledger.records``) holds that node's claims. Every change
is a conditional write (the ConfigMap's resourceVersion), so two managers with different
views (a stale leader after failover, a forced split brain) get 409 Conflict instead of
both succeeding: a per-group status write alone would not fence, since two writers could
bind two different groups to the same device on the same node.

``Ledger`` mirrors, per node, everything that says a device is taken into one
``DeviceTracker`` that placement reads in memory: the records (fed by the ConfigMap
informer and by our own writes, newest resourceVersion wins), the statuses of bound groups
(a second source: a record deleted or damaged by hand must not free devices that running
pods use), and tentative reservations of decisions in flight. Sources that disagree block
the disputed IDs for everyone (holder ``!conflict:...``); a malformed record blocks its
whole node. So a view that is wrong can only make SDG hand out less, never twice; and the
write itself re-checks the record it fences on.

Writes of one node's record are serialised, and the changes that queue up behind a write
go together in the next one (``controllers.ledger.coalesce``): group reconciles run concurrently,
and binds onto one node must neither 409 each other nor pay one round trip each.

Every change is also conditional on the claim it changes: the caller says which claim of
that group it saw (``expect``), and a record whose claim of the group differs fails that
change with 409. The resourceVersion alone does not say enough once writes are
coalesced and two managers race: a bind decided on a view without the group's claim
must not silently replace the claim another manager just wrote for the same group (its
status may already be Bound on those devices). Each claim also records the
resourceVersion of the group it was decided on (``data.versions``): a bind that adopts
a claim renews it with its own version, so giving back a claim that a bind in flight
has just renewed fails instead of freeing devices that group is about to be Bound on
(``controllers.ledger.release``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from api.constants import SDG_KIND
from api.v1alpha1 import parse_ids
from controllers.draclaims import CLAIM_HOLDER_PREFIX, DeviceRef, DraAllocations
from controllers.holders import KubeletHold, sdg_id
from controllers.inventory import SOURCE_SLICE, Offer, count_offer
from controllers.ledger.coalesce import Abandoned, Coalescer
from controllers.ledger.records import (
    DATA_NODE,
    RECORD_LABEL,
    RECORD_LABEL_VALUE,
    RECORD_PREFIX,
    Claim,
    Record,
    decode_record,
    describe_claim,
    nodes_named_by,
    record_data,
    record_name,
    resource_version,
)
from controllers.ledger.tracker import Devices, DeviceTracker, InsufficientDevices
from sdgruntime import errors
from sdgruntime.client import Client
from sdgruntime.kinds import CONFIGMAPS

log = logging.getLogger(__name__)


#: How many resource sets ``Ledger._siblings`` remembers (a fleet has a handful).
_SIBLING_MEMO_SIZE = 64


class ClaimRecordBroken(Exception):
    """A node's claim record cannot be parsed: nothing on that node is given out until a
    human repairs (or deletes) the ConfigMap."""


class Ledger:
    """Mirror of the per-node claim records (and of bound groups' statuses), and the only
    writer of the records."""

    def __init__(
        self,
        client: Client,
        namespace: str,
        tracker: DeviceTracker | None = None,
        on_change: Callable[[str], None] | None = None,
        family: Callable[[str], str | None] | None = None,
    ) -> None:
        #: Resource -> its physical device family (the device env var): resources of one
        #: family on a node share one ID space (``_siblings``).
        self.family = family
        #: Called with a node's name whenever its mirrored holdings change (metrics).
        self.on_change = on_change
        #: A book of listed objects (``from_objects``): it never writes, and logs quietly.
        self.read_only = False
        self.client = client
        self.namespace = namespace
        #: Per node, every held ID under a holder name ``<group>@<node>`` (or a blocker).
        self.tracker = tracker or DeviceTracker()
        self.records: dict[str, Record] = {}
        #: group -> nodes whose record names it (an index of ``records``: every reconcile
        #: asks where a group is claimed; a scan of every node's record would be O(nodes)).
        self._claimed: dict[str, set[str]] = {}
        #: Per node, the malformed ConfigMaps that name it: ConfigMap name -> why.
        self._malformed: dict[str, dict[str, str]] = {}
        #: ConfigMap name -> (resourceVersion, nodes it named) as last observed.
        self._seen: dict[str, tuple[int, set[str]]] = {}
        #: Bound groups' statuses: group -> (node, devices).
        self.statuses: dict[str, tuple[str, Devices]] = {}
        #: Of those, the UUIDs their status records (``physicalDevices``): a device is
        #: known by its UUID wherever the inventory has one, so a renumbered node still
        #: keeps each group's very devices from everyone else.
        self.status_uuids: dict[str, dict[str, tuple[str, ...]]] = {}
        #: node -> groups whose status is bound there (an index of ``statuses``: mirroring
        #: one node must not walk every bound group of the cluster).
        self._status_on: dict[str, set[str]] = {}
        #: node -> the holder keys ``_mirror`` last put into the tracker for it (the book is
        #: the only writer of its tracker's holdings).
        self._mirrored: dict[str, list[str]] = {}
        #: Decisions in flight (reserved, record write pending): group -> (node, devices).
        self.reserved: dict[str, tuple[str, Devices]] = {}
        #: Per node, the devices each resource offers (its inventory).
        self.offers: dict[str, dict[str, Offer]] = {}
        #: Per node, disputed IDs: "<res> <id>: held by a, b" (for conditions and logs).
        self.conflicts: dict[str, list[str]] = {}
        #: Record writes, serialised and coalesced per node.
        self._commits: Coalescer[str, _Change] = Coalescer(self._flush)
        #: Per node, pods outside any group the kubelet gave device-plugin devices (its own
        #: books): pod key -> what it asks for and the plugin IDs the kubelet reported.
        self._kubelet_held: dict[str, dict[str, KubeletHold]] = {}
        #: DRA's books: every allocated ResourceClaim's devices (``set_dra``), and which
        #: nodes' offers list devices of each (driver, pool).
        self.dra: DraAllocations | None = None
        self._pool_nodes: dict[tuple[str, str], set[str]] = {}
        self._node_pools: dict[str, set[tuple[str, str]]] = {}
        #: Nodes whose genuine record was seen deleted and not written since (bounded by
        #: the nodes): their next record write is a create on nothing to fence.
        self._deleted_records: set[str] = set()
        #: ``_siblings`` per set of resource names (``family`` is pure).
        self._sibling_memo: dict[frozenset[str], dict[str, list[str]]] = {}

    def _complain(self, message: str, *args: object) -> None:
        """Log what is wrong in the books (an error in the manager; a read-only book, the
        CLI's, shows it in its own output instead)."""
        log.log(logging.DEBUG if self.read_only else logging.ERROR, message, *args)

    @classmethod
    def from_objects(
        cls,
        *,
        configmaps: Iterable[Mapping[str, Any]] = (),
        groups: Iterable[Mapping[str, Any]] = (),
        namespace: str = "",
    ) -> Ledger:
        """A read-only book of listed objects (the CLI's view, tests): what the manager's
        book would hold after its informers delivered them. It has no client: it cannot
        write."""
        configmaps = list(configmaps)
        if not namespace and configmaps:
            namespace = str((configmaps[0].get("metadata") or {}).get("namespace") or "")
        book = cls(None, namespace)  # type: ignore[arg-type]  # never writes
        book.read_only = True
        for cm in configmaps:
            book.observe(cm)
        for group in groups:
            book.observe_group(group)
        return book

    # --- mirroring: records ------------------------------------------------------------
    @property
    def broken(self) -> dict[str, str]:
        """Nodes whose record is malformed (or disputed by a decoy) -> why; nothing on
        such a node is given out until a human repairs or deletes the ConfigMap."""
        return {n: "; ".join(sorted(why.values())) for n, why in self._malformed.items() if why}

    def observe(self, cm: Mapping[str, Any]) -> str | None:
        """Take a ConfigMap seen by the informer or returned by a write; returns its node
        (when it is a genuine record) after the view changed. An older resourceVersion
        than the one held is ignored, so a late informer event cannot undo our own newer
        write."""
        name = str((cm.get("metadata") or {}).get("name") or "")
        version = resource_version(cm)
        seen = self._seen.get(name)
        if seen is not None and version <= seen[0]:
            return None
        node, named = nodes_named_by(cm)
        touched = self._drop_observation(name) | named
        self._seen[name] = (version, named)
        ref = f"claim record {self.namespace}/{name}" if self.namespace else f"claim record {name}"
        if node is None:
            why = (
                f"ConfigMap {self.namespace}/{name} is labelled "
                f"{RECORD_LABEL}={RECORD_LABEL_VALUE} but is not the record of the node it "
                f"names (records are named {RECORD_PREFIX}<node> and name that node in "
                f"data.{DATA_NODE}); delete it"
            )
            self._complain("%s", why)
            for n in named:
                self._malformed.setdefault(n, {})[name] = why
            for n in touched:
                self._mirror(n)
            return None
        try:
            claims, uids, versions = decode_record(cm)
        except ValueError as err:
            self._complain("%s is malformed: %s", ref, err)
            self._malformed.setdefault(node, {})[name] = f"{ref}: {err}"
            claims, uids, versions = {}, {}, {}
        self._set_record(node, Record(node, claims, dict(cm), uids, versions))
        for n in touched:
            self._mirror(n)
        return node

    def forget(self, cm: Mapping[str, Any]) -> str | None:
        """The ConfigMap was deleted (by a human): a genuine record's claims are gone from
        the view (bound groups' statuses still hold their devices until the records are
        restored); a decoy's blocks are lifted."""
        name = str((cm.get("metadata") or {}).get("name") or "")
        if name not in self._seen:
            return None
        touched = self._drop_observation(name)
        del self._seen[name]
        gone = None
        for node in list(touched):
            record = self.records.get(node)
            if record is not None and record.obj is not None and record_name(node) == name:
                self._set_record(node, None)
                self._deleted_records.add(node)
                gone = node
        for node in touched:
            self._mirror(node)
        return gone

    def _set_record(self, node: str, record: Record | None) -> None:
        """Replace (None: drop) ``node``'s record, keeping the group index in step."""
        old = self.records.pop(node, None)
        for group in old.claims if old else ():
            nodes = self._claimed[group]
            nodes.discard(node)
            if not nodes:
                del self._claimed[group]
        if record is not None:
            self.records[node] = record
            for group in record.claims:
                self._claimed.setdefault(group, set()).add(node)

    def _drop_observation(self, name: str) -> set[str]:
        """Forget what ConfigMap ``name`` said about its nodes; returns those nodes."""
        _version, nodes = self._seen.get(name, (0, set()))
        for node in nodes:
            why = self._malformed.get(node)
            if why is not None:
                why.pop(name, None)
                if not why:
                    del self._malformed[node]
        return set(nodes)

    # --- mirroring: bound groups' statuses, capacity, reservations --------------------
    def observe_group(self, group: Mapping[str, Any]) -> None:
        """A group as the informer saw it: a Bound status holds its devices."""
        name = (group.get("metadata") or {}).get("name", "")
        status = group.get("status") or {}
        held: tuple[str, Devices] | None = None
        uuids: dict[str, tuple[str, ...]] = {}
        if status.get("phase") == "Bound" and status.get("nodeName"):
            try:
                devices = {
                    r: parse_ids(i) for r, i in (status.get("selectedDevices") or {}).items()
                }
            except ValueError:
                devices = {}
            if devices:
                held = (status["nodeName"], devices)
                uuids = _physical(status.get("physicalDevices"), devices)
        old = self.statuses.get(name)
        if held == old and uuids == self.status_uuids.get(name, {}):
            return
        if uuids:
            self.status_uuids[name] = uuids
        else:
            self.status_uuids.pop(name, None)
        self._set_status(name, held)
        for node in _nodes_of(old, held):
            self._mirror(node)

    def forget_group(self, group: Mapping[str, Any]) -> None:
        """The group object is gone: its status no longer holds anything."""
        name = (group.get("metadata") or {}).get("name", "")
        old = self.statuses.get(name)
        self.status_uuids.pop(name, None)
        if old is not None:
            self._set_status(name, None)
            self._mirror(old[0])

    def _set_status(self, name: str, held: tuple[str, Devices] | None) -> None:
        """Replace (None: drop) what ``name``'s status holds, keeping the node index."""
        old = self.statuses.pop(name, None)
        if old is not None:
            on = self._status_on[old[0]]
            on.discard(name)
            if not on:
                del self._status_on[old[0]]
        if held is not None:
            self.statuses[name] = held
            self._status_on.setdefault(held[0], set()).add(name)

    def set_capacity(self, node: str, capacities: Mapping[str, int]) -> None:
        """IDs ``0..N-1`` of each resource (a count-only inventory)."""
        self.set_offers(node, {r: count_offer(r, n) for r, n in capacities.items() if n})

    def _index_pools(self, node: str, offers: Mapping[str, Offer] | None) -> None:
        """Keep ``_pool_nodes`` (and its inverse) current for ``node``'s offers."""
        now = {(d.driver, d.pool) for o in (offers or {}).values() for d in o.devices if d.driver}
        old = self._node_pools.pop(node, set())
        for pool in old - now:
            nodes = self._pool_nodes.get(pool, set())
            nodes.discard(node)
            if not nodes:
                self._pool_nodes.pop(pool, None)
        for pool in now:
            self._pool_nodes.setdefault(pool, set()).add(node)
        if now:
            self._node_pools[node] = now

    def set_offers(self, node: str, offers: Mapping[str, Offer]) -> None:
        """The devices ``node`` offers (``controllers.inventory``): IDs below the highest
        that are missing or unhealthy are never handed out (held by ``!unavailable``)."""
        self.offers[node] = dict(offers)
        self._index_pools(node, offers)
        self.tracker.set_node_capacity(node, {r: o.capacity for r, o in offers.items()})
        self._mirror(node)

    def _siblings(self, resources: Iterable[str]) -> dict[str, list[str]]:
        """Resource -> the others of ``resources`` that name the same physical devices
        (``family``: the same device env var); only resources with such siblings."""
        if self.family is None:
            return {}
        key = frozenset(resources)
        known = self._sibling_memo.get(key)
        if known is not None:
            return known
        by_family: dict[str, list[str]] = {}
        for res in sorted(key):
            fam = self.family(res)
            if fam:
                by_family.setdefault(fam, []).append(res)
        found = {
            r: [o for o in members if o != r]
            for members in by_family.values()
            if len(members) > 1
            for r in members
        }
        if len(self._sibling_memo) >= _SIBLING_MEMO_SIZE:
            # Bounded: the resource sets of a fleet are few; anything else starts over.
            self._sibling_memo.clear()
        self._sibling_memo[key] = found
        return found

    def nodes_of_pool(self, pool: tuple[str, str]) -> set[str]:
        """The nodes whose offers list devices of ``pool`` (driver, pool name)."""
        return set(self._pool_nodes.get(pool, ()))

    def set_dra(self, allocations: DraAllocations) -> None:
        """Read DRA's allocations: a slice device any ResourceClaim but the group's own
        holds is nobody else's (``!claim:<ns>/<name>``)."""
        self.dra = allocations
        allocations.on_change = self._pools_changed

    def _pools_changed(self, pools: frozenset[tuple[str, str]]) -> None:
        nodes = {n for p in pools for n in self._pool_nodes.get(p, ())}
        for node in sorted(nodes):
            self._mirror(node)

    def set_kubelet_hold(self, node: str, pod: str, hold: KubeletHold | None) -> None:
        """Pod ``pod`` (namespace/name) on ``node`` holds ``hold`` in the kubelet's books
        (None: nothing any more). Its devices are nobody else's: on a device-plugin node
        the kubelet never gives them to a holder, and SDG shows who has them."""
        held = self._kubelet_held.get(node, {})
        if held.get(pod) == hold:
            return
        if hold is None:
            held.pop(pod, None)
            if not held:
                self._kubelet_held.pop(node, None)
        else:
            self._kubelet_held.setdefault(node, {})[pod] = hold
        self._mirror(node)

    def remove_node(self, node: str) -> None:
        self.offers.pop(node, None)
        self._index_pools(node, None)
        self.tracker.remove_node(node)
        self._mirror(node)

    def reserve(self, group: str, node: str, request: Mapping[str, int]) -> Devices:
        """Pick the lowest free IDs on ``node`` for a decision in flight and hold them until
        ``unreserve`` (after the record write succeeded or failed)."""
        picked: Devices = {}
        for res in sorted(request):
            free = self.tracker.lowest_free(node, res, request[res])
            if len(free) < request[res]:
                raise InsufficientDevices(node, res, len(free), request[res])
            picked[res] = free
        self._set_reserved(group, (node, picked))
        return picked

    def hold(self, group: str, node: str, devices: Devices) -> None:
        """Hold ``devices`` for ``group`` in memory only (a restore whose record write
        failed): nobody else is given them until ``unreserve``."""
        self._set_reserved(group, (node, {r: list(i) for r, i in devices.items()}))

    def unreserve(self, group: str) -> None:
        self._set_reserved(group, None)

    def _set_reserved(self, group: str, held: tuple[str, Devices] | None) -> None:
        """Replace ``group``'s decision in flight; every node it left or entered is
        mirrored again (a reservation moved to another node frees the first)."""
        old = self.reserved.pop(group, None)
        if held is not None:
            self.reserved[group] = held
        for node in sorted(_nodes_of(old, held)):
            self._mirror(node)

    def _mirror(self, node: str) -> None:
        """Rebuild ``node``'s holdings in the tracker from every source (module doc)."""
        owners: dict[tuple[str, int], set[str]] = {}
        #: The same, from the records and bound statuses only (not decisions in flight).
        durable: dict[tuple[str, int], set[str]] = {}

        def hold(group: str, devices: Mapping[str, list[int]], *, lasting: bool) -> None:
            for res, ids in devices.items():
                for i in ids:
                    owners.setdefault((res, i), set()).add(group)
                    if lasting:
                        durable.setdefault((res, i), set()).add(group)

        record = self.records.get(node)
        for group, devices in (record.claims if record else {}).items():
            hold(group, devices, lasting=True)
        offers = self.offers.get(node) or {}
        for group in self._status_on.get(node, ()):
            hold(group, self.statuses[group][1], lasting=True)
            for res, uuids in self.status_uuids.get(group, {}).items():
                # The same devices by UUID, where the node now numbers them otherwise.
                by_uuid = _ids_of(offers.get(res), uuids)
                if by_uuid:
                    hold(group, {res: by_uuid}, lasting=True)
        for group, (where, devices) in self.reserved.items():
            if where == node:
                hold(group, devices, lasting=False)
        if self.dra is not None:
            # DRA's books: a claim's devices are its own; a group's claim is its record's
            # twin (a group claim naming other devices is the group's conflict to report).
            for res, published in offers.items():
                for d in published.devices:
                    if not d.driver:
                        continue
                    for holder in self.dra.held_by(DeviceRef(d.driver, d.pool, d.name)):
                        if holder.startswith(CLAIM_HOLDER_PREFIX):
                            claim = holder.removeprefix(CLAIM_HOLDER_PREFIX)
                            hold(f"!claim:{claim}", {res: [d.id]}, lasting=False)
        caps = self.tracker.capacities(node)
        # Resources held but not offered now count too: a record's Ascend910 IDs still
        # block Ascend910-2c while the node lists only the latter.
        siblings = self._siblings({*caps, *(r for r, _ in owners)})
        unreported: list[tuple[str, str, int]] = []
        for pod, kept in sorted(self._kubelet_held.get(node, {}).items()):
            # Devices the kubelet reported, by SDG's IDs, first: every pod's, before any
            # count is placed on the IDs left.
            for res, n in kept.wants.items():
                offer = offers.get(res)
                if offer is None or offer.source == SOURCE_SLICE:
                    continue
                ids = [i for d in kept.given.get(res, ()) if (i := sdg_id(offer, d)) is not None]
                hold(f"!pod:{pod}", {res: ids}, lasting=False)
                if len(ids) < n:
                    unreported.append((pod, res, n - len(ids)))
        _link_siblings(owners, siblings, caps)
        for pod, res, missing in unreported:
            # Devices the kubelet has not reported yet are counted on the lowest IDs
            # nobody holds under any name (placement counts them; which ones the
            # kubelet picks is its own business on such a node).
            family = (res, *siblings.get(res, ()))
            ids = [i for i in offers[res].usable() if all((r, i) not in owners for r in family)][
                :missing
            ]
            hold(f"!pod:{pod}", {res: ids}, lasting=False)
        if unreported:
            _link_siblings(owners, siblings, caps)
        holders: dict[str, dict[str, list[int]]] = {}
        disputes: list[str] = []
        for (res, i), groups in sorted(owners.items()):
            if len(groups) == 1:
                holder = next(iter(groups))
            else:
                holder = "!conflict:" + ",".join(sorted(groups))
                if len(durable.get((res, i), ())) > 1:
                    # Only the records and statuses count as claimed twice: a decision
                    # in flight that overlaps a record another manager just wrote loses
                    # its fenced write (blocked meanwhile all the same).
                    disputes.append(f"{res} {i}: held by {', '.join(sorted(groups))}")
            holders.setdefault(holder, {}).setdefault(res, []).append(i)
        if node in self._malformed:
            # Nothing on a node with an unreadable record is free: block every ID.
            for res in self.tracker.capacities(node):
                taken = {i for d in holders.values() for i in d.get(res, [])}
                rest = [i for i in range(self.tracker.capacity(node, res)) if i not in taken]
                if rest:
                    holders.setdefault("!malformed-record", {})[res] = rest
        taken_by = {(res, i) for d in holders.values() for res, ids in d.items() for i in ids}
        for res, offer in (self.offers.get(node) or {}).items():
            # Holes and unhealthy devices below the highest ID: nobody gets them (a group
            # that holds one keeps it, and is told it is missing).
            usable = set(offer.usable())
            rest = [
                i for i in range(offer.capacity) if i not in usable and (res, i) not in taken_by
            ]
            if rest:
                holders.setdefault("!unavailable", {})[res] = rest
        for key in self._mirrored.pop(node, ()):
            self.tracker.release(key)
        keys = []
        for holder, devices in sorted(holders.items()):
            # Holder keys are per node: a group claimed on two nodes (a stale record)
            # still blocks both sets of IDs.
            keys.append(f"{holder}@{node}")
            self.tracker.add_claim(keys[-1], node, devices)
        if keys:
            self._mirrored[node] = keys
        if disputes:
            self.conflicts[node] = disputes
            self._complain("node %s: devices claimed twice: %s", node, "; ".join(disputes))
        else:
            self.conflicts.pop(node, None)
        if self.on_change is not None:
            self.on_change(node)

    # --- reading ---------------------------------------------------------------------
    def claim_of(self, group: str) -> tuple[str, Devices] | None:
        """Where ``group`` holds devices according to the records (None: nowhere; the
        first node by name when stale records name it on several)."""
        nodes = self.nodes_claiming(group)
        return (nodes[0], self.records[nodes[0]].claims[group]) if nodes else None

    def claim_on(self, node: str, group: str) -> Devices | None:
        """``group``'s claim in ``node``'s record (None: the record names it not)."""
        record = self.records.get(node)
        return record.claims.get(group) if record else None

    def claim(self, node: str, group: str) -> Claim | None:
        """``group``'s whole claim in ``node``'s record as seen now: what a change of it
        is conditional on (``write``'s ``expect``)."""
        record = self.records.get(node)
        return record.claim(group) if record else None

    def nodes_claiming(self, group: str) -> list[str]:
        return sorted(self._claimed.get(group, ()))

    def uid_of(self, node: str, group: str) -> str:
        """The UID recorded with ``group``'s claim on ``node`` ("" when none was)."""
        record = self.records.get(node)
        return record.uids.get(group, "") if record else ""

    def held_by_others(self, group: str, node: str, devices: Mapping[str, list[int]]) -> list[str]:
        """Who else (records or bound statuses) holds any of ``devices`` on ``node``."""
        others: set[str] = set()
        record = self.records.get(node)
        sources: list[Iterable[tuple[str, Devices]]] = [(record.claims if record else {}).items()]
        sources.append((g, self.statuses[g][1]) for g in self._status_on.get(node, ()))
        for items in sources:
            for other, held in items:
                if other == group:
                    continue
                if _overlaps(held, devices):
                    others.add(other)
        if node in self._malformed:
            others.add(f"(malformed record of node {node})")
        return sorted(others)

    # --- fenced writes ---------------------------------------------------------------
    async def write(
        self,
        node: str,
        group: str,
        devices: Devices | None,
        *,
        expect: Claim | None,
        uid: str = "",
        version: str = "",
    ) -> None:
        """Set (or, with ``devices=None``, remove) ``group``'s claim in ``node``'s record,
        recording ``uid`` (the claiming group's) and ``version`` (the resourceVersion of
        the group object it was decided on) with it.

        Conditional twice: on the record's resourceVersion (or on its absence, for a
        create), and on ``group``'s claim in it being ``expect`` (what the caller decided
        on, from ``claim``; None: no claim of the group there). Removing a claim that is
        already gone succeeds. Raises ``errors.Conflict`` after refreshing the view when
        either differs: the caller re-decides from the fresh view; it never retries
        blindly. Removing a claim is the caller's decision to make on a live read of the
        group (``controllers.ledger.release``); this method only fences the write.

        Writes to one node are serialised, and changes that arrive while one is in flight
        go together in the next (``controllers.ledger.coalesce``): concurrent binds onto one node
        cost one write, not a 409 each. Each caller still gets its own outcome: a change
        that overlaps a claim already recorded fails alone; a failed write (409, or any
        error) fails every change it carried, so each caller gives back what it reserved.
        """
        try:
            await self._commits.submit(node, _Change(group, devices, uid, version, expect))
        except Abandoned as err:
            raise errors.TransportError(
                f"claim record of node {node}: the write was cancelled ({err})"
            ) from err

    async def claim_for(self, node: str, group: Mapping[str, Any], devices: Devices) -> None:
        """Set ``group``'s claim on ``node`` to ``devices``, conditional on its claim there
        as seen now, stamped with the group object's UID and resourceVersion: adopting a
        claim (renewing it), or restoring one from a status or from pods."""
        meta = group.get("metadata") or {}
        name = str(meta.get("name") or "")
        await self.write(
            node,
            name,
            devices,
            expect=self.claim(node, name),
            uid=str(meta.get("uid") or ""),
            version=str(meta.get("resourceVersion") or ""),
        )

    async def _flush(self, node: str, changes: list[_Change]) -> list[BaseException | None]:
        """One conditional write of ``node``'s record with every change that fits it; one
        outcome per change."""
        if node in self._malformed:
            broken = ClaimRecordBroken(self.broken[node])
            return [broken] * len(changes)
        record = self.records.get(node) or Record(node)
        claims, uids = dict(record.claims), dict(record.uids)
        versions = dict(record.versions)
        outcomes: list[BaseException | None] = []
        # Bound statuses hold devices too (a record deleted by hand must not free them):
        # known ones always; on re-creating a record that was deleted (nothing to fence
        # on), read live, so a view that lags another manager's bind cannot create a
        # record that overlaps it. (A node's first record needs no such read: a bind
        # writes the record before the status, so no group is Bound there without one.)
        bound = {g: self.statuses[g][1] for g in self._status_on.get(node, ())}
        if record.obj is None and node in self._deleted_records and any(c.devices for c in changes):
            try:
                bound.update(await self._bound_live(node))
            except errors.ApiError as err:
                return [err] * len(changes)
        for change in changes:
            group, devices = change.group, change.devices
            if devices is None and group not in claims:
                outcomes.append(None)  # given back already
                continue
            now = Record(node, claims, None, uids, versions).claim(group)
            if now != change.expect:
                # The group's claim is not the one the caller decided on: another manager
                # (or a bind of the same group elsewhere) wrote it meanwhile.
                why = (
                    f"node {node}: the claim of {group} is {describe_claim(now)}, "
                    f"not {describe_claim(change.expect)} as when decided"
                )
                outcomes.append(errors.Conflict(why, code=409))
                continue
            overlap = sorted(
                {
                    g
                    for source in (claims, bound)
                    for g, held in source.items()
                    if g != group and _overlaps(held, devices or {})
                }
            )
            if overlap:
                # The record we fence on already gives some of these IDs to another
                # group: our view was wrong. Never write a device twice.
                why = f"node {node}: {devices} overlap the claims of {overlap}"
                outcomes.append(errors.Conflict(why, code=409))
                continue
            claims.pop(group, None)
            uids.pop(group, None)
            versions.pop(group, None)
            if devices is not None:
                claims[group] = devices
                if change.uid:
                    uids[group] = change.uid
                if change.version:
                    versions[group] = change.version
            outcomes.append(None)
        if claims != record.claims or uids != record.uids or versions != record.versions:
            try:
                self.observe(await self._put(node, record, claims, uids, versions))
                self._deleted_records.discard(node)
            except (errors.Conflict, errors.AlreadyExists) as err:
                await self.refresh(node)
                conflict = errors.Conflict(
                    f"claim record of node {node} changed concurrently; re-deciding", code=409
                )
                conflict.__cause__ = err
                return [conflict if o is None else o for o in outcomes]
            except Exception as err:
                return [err if o is None else o for o in outcomes]
        if any(o is not None for o in outcomes):
            await self.refresh(node)
        return outcomes

    async def _bound_live(self, node: str) -> dict[str, Devices]:
        """Groups Bound on ``node`` as the API server says now -> their devices."""
        groups, _ = await self.client.list_all(SDG_KIND)
        out: dict[str, Devices] = {}
        for g in groups:
            status = g.get("status") or {}
            if status.get("phase") != "Bound" or status.get("nodeName") != node:
                continue
            try:
                devices = {
                    r: parse_ids(i) for r, i in (status.get("selectedDevices") or {}).items()
                }
            except ValueError:
                continue
            out[str((g.get("metadata") or {}).get("name") or "")] = devices
        return out

    async def _put(
        self,
        node: str,
        record: Record,
        claims: dict[str, Devices],
        uids: dict[str, str],
        versions: dict[str, str],
    ) -> dict[str, Any]:
        """Create or update ``node``'s record as ``claims``/``uids``/``versions``,
        conditionally."""
        body = record_data(node, claims, uids, versions)
        if record.obj is None:
            cm = {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {
                    "name": record_name(node),
                    "namespace": self.namespace,
                    "labels": {RECORD_LABEL: RECORD_LABEL_VALUE},
                },
                "data": body,
            }
            return await self.client.create(CONFIGMAPS, cm, self.namespace)
        return await self.client.update(CONFIGMAPS, {**record.obj, "data": body})

    async def refresh(self, node: str) -> None:
        """Read a node's record from the API server by its name (after a conflict)."""
        name = record_name(node)
        try:
            cm = await self.client.get(CONFIGMAPS, name, self.namespace)
        except errors.NotFound:
            self.forget({"metadata": {"name": name}})
            if node in self.records:  # known only from our own writes so far
                self._set_record(node, None)
                self._mirror(node)
            return
        self.observe(cm)


@dataclass(frozen=True)
class _Change:
    """One caller's change to a node's record: ``devices`` None removes the claim;
    ``expect`` is the group's claim it was decided on."""

    group: str
    devices: Devices | None
    uid: str
    version: str
    expect: Claim | None


def _physical(text: Any, devices: Devices) -> dict[str, tuple[str, ...]]:
    """``status.physicalDevices`` (resource -> "uuid,uuid") as tuples, for the resources
    whose every device it names (bounded by the group's own device count)."""
    out: dict[str, tuple[str, ...]] = {}
    if not isinstance(text, Mapping):
        return out
    for res, ids in devices.items():
        value = text.get(res)
        if isinstance(value, str):
            uuids = tuple(u for u in value.split(",", len(ids))[: len(ids)] if u)
            if len(uuids) == len(ids):
                out[res] = uuids
    return out


def _ids_of(offer: Offer | None, uuids: Iterable[str]) -> list[int]:
    """The IDs ``offer`` now gives the devices of ``uuids`` (those it still lists)."""
    if offer is None:
        return []
    wanted = set(uuids)
    return [d.id for d in offer.devices if d.uuid and d.uuid in wanted]


def _link_siblings(
    owners: dict[tuple[str, int], set[str]],
    siblings: Mapping[str, list[str]],
    capacity: Mapping[str, int],
) -> None:
    """One physical device, two resource names (the same device env var, e.g.
    huawei.com/Ascend910 and huawei.com/Ascend910-2c): ID i of one is ID i of the other,
    so whoever holds it under one name blocks it under the others (idempotent)."""
    if not siblings:
        return
    for (res, i), groups in list(owners.items()):
        for other in siblings.get(res, ()):
            if i < capacity.get(other, 0):
                owners.setdefault((other, i), set()).update(
                    f"!same-device:{g}" for g in groups if not g.startswith("!same-device:")
                )


def _overlaps(held: Mapping[str, list[int]], devices: Mapping[str, list[int]]) -> bool:
    """Whether two claims on one node share any device ID."""
    return any(set(held.get(res, ())) & set(ids) for res, ids in devices.items())


def _nodes_of(*held: tuple[str, Devices] | None) -> set[str]:
    return {h[0] for h in held if h is not None}

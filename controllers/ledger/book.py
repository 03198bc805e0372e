"""The ledger's book: every source of "device D of resource R on node N is taken", merged.

``Ledger`` mirrors, per node, the fenced claim records, Bound groups' statuses, decisions in
flight, DRA's allocations and the devices the kubelet gave pods into one ``DeviceTracker``
that placement reads.
Sources that disagree block the disputed IDs for everyone, and a malformed record blocks
its node, so a wrong view can only make SDG hand out less, never twice (docs/design.md,
"Inside the controllers"). ``view`` reads the same merge as typed holders;
``from_objects`` builds a book of listed objects (the CLI, tests) that cannot write.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from api.constants import DEFAULT_ENV_TABLE
from api.envvars import env_var_for
from api.pods import pod_key as pod_key_of
from api.v1alpha1 import is_bound, parse_ids
from controllers.draclaims import CLAIM_HOLDER_PREFIX, DeviceRef, DraAllocations
from controllers.holders import KubeletHold, kubelet_hold, sdg_id
from controllers.inventory import SOURCE_SLICE, Offer, count_offer
from controllers.ledger.records import (
    DATA_NODE,
    RECORD_LABEL,
    RECORD_LABEL_VALUE,
    RECORD_PREFIX,
    Claim,
    Record,
    decode_record,
    nodes_named_by,
    record_name,
    resource_version,
)
from controllers.ledger.tracker import Devices, DeviceTracker, InsufficientDevices, overlaps
from controllers.ledger.view import (
    Holder,
    Malformed,
    NodeView,
    ResourceClaim,
    SameDevice,
    Unavailable,
    conflict,
    key,
    parse,
)
from controllers.ledger.view import Pod as KubeletPod
from controllers.ledger.writer import RecordWriter
from sdgruntime.client import Client
from sdgruntime.kinds import meta_of, status_of

log = logging.getLogger(__name__)


#: How many resource sets ``Ledger._siblings`` remembers (a fleet has a handful).
_SIBLING_MEMO_SIZE = 64


class Ledger:
    """Mirror of the per-node claim records (and of bound groups' statuses), and the only
    writer of the records."""

    def __init__(
        self,
        client: Client | None,
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
        #: A book of listed objects (``from_objects``, no client): it logs quietly.
        self.read_only = client is None
        self.namespace = namespace
        #: The one writer of the records (it cannot write without a client).
        self.writer = RecordWriter(self, client, namespace)
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
        offers: Mapping[str, Mapping[str, Offer]] | None = None,
        pods: Iterable[Mapping[str, Any]] = (),
        claims: Iterable[Mapping[str, Any]] = (),
        namespace: str = "",
        env_table: Mapping[str, str] = DEFAULT_ENV_TABLE,
    ) -> Ledger:
        """A read-only book of listed objects (the CLI's view, tests): what the manager's
        book would hold after its informers delivered them (records, groups, the nodes'
        ``offers``, the pods the kubelet gave devices, ResourceClaims). It has no client:
        it cannot write. ``namespace`` is the manager's (the records', holders', group
        claims'); by default the records'. ``env_table`` groups resources into device
        families as the manager's ``--device-env`` does."""
        configmaps = list(configmaps)
        if not namespace and configmaps:
            namespace = str(meta_of(configmaps[0]).get("namespace") or "")
        book = cls(None, namespace, family=lambda resource: env_var_for(resource, env_table))
        claims = list(claims)
        if claims:
            dra = DraAllocations(namespace or None)
            for claim in claims:
                dra.observe(claim)
            book.set_dra(dra)
        for node, offered in (offers or {}).items():
            book.set_offers(node, offered)
        for cm in configmaps:
            book.observe(cm)
        for group in groups:
            book.observe_group(group)
        for pod in pods:
            if (held := kubelet_hold(pod, namespace or None)) is not None:
                node, hold = held
                book.set_kubelet_hold(node, pod_key_of(pod), hold)
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
        name = str(meta_of(cm).get("name") or "")
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
        name = str(meta_of(cm).get("name") or "")
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
        name = meta_of(group).get("name", "")
        status = status_of(group)
        held: tuple[str, Devices] | None = None
        uuids: dict[str, tuple[str, ...]] = {}
        if is_bound(group):
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
        name = meta_of(group).get("name", "")
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
        that are missing or unhealthy are never handed out (held by ``view.Unavailable``)."""
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

    def reserve(
        self,
        group: str,
        node: str,
        request: Mapping[str, int],
        pinned: Mapping[str, Iterable[int]] | None = None,
    ) -> Devices:
        """Pick the lowest free IDs on ``node`` for a decision in flight and hold them until
        ``unreserve`` (after the record write succeeded or failed); a resource in
        ``pinned`` (``spec.devices``, resolved by placement) takes exactly those IDs, or
        raises ``InsufficientDevices`` when one of them is not free."""
        picked: Devices = {}
        for res in sorted(request):
            if pinned is not None and res in pinned:
                ids = sorted(pinned[res])
                free_pins = [i for i in ids if self._free_for(group, node, res, i)]
                if len(free_pins) != len(ids) or len(ids) != request[res]:
                    raise InsufficientDevices(node, res, len(free_pins), request[res])
                picked[res] = ids
                continue
            free = self.tracker.lowest_free(node, res, request[res])
            if len(free) < request[res]:
                raise InsufficientDevices(node, res, len(free), request[res])
            picked[res] = free
        self._set_reserved(group, (node, picked))
        return picked

    def _free_for(self, group: str, node: str, res: str, device: int) -> bool:
        """Whether ``device`` is below capacity and held by nobody but ``group``."""
        holder = self.tracker.holder(node, res, device)
        return device < self.tracker.capacity(node, res) and holder in (None, f"{group}@{node}")

    def holder(self, node: str, res: str, device: int) -> Holder | None:
        """Who holds ``device`` of ``res`` on ``node`` in the merge (None: free), typed as
        ``view`` gives it."""
        name = self.tracker.holder(node, res, device)
        return None if name is None else parse(name.removesuffix(f"@{node}"))

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
                            ns, _, claim = holder.removeprefix(CLAIM_HOLDER_PREFIX).partition("/")
                            hold(key(ResourceClaim(ns, claim)), {res: [d.id]}, lasting=False)
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
                hold(pod_key(pod), {res: ids}, lasting=False)
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
            hold(pod_key(pod), {res: ids}, lasting=False)
        if unreported:
            _link_siblings(owners, siblings, caps)
        holders: dict[str, dict[str, list[int]]] = {}
        disputes: list[str] = []
        for (res, i), groups in sorted(owners.items()):
            if len(groups) == 1:
                holder = next(iter(groups))
            else:
                holder = conflict(groups)
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
                    holders.setdefault(key(Malformed()), {})[res] = rest
        taken_by = {(res, i) for d in holders.values() for res, ids in d.items() for i in ids}
        for res, offer in (self.offers.get(node) or {}).items():
            # Holes and unhealthy devices below the highest ID: nobody gets them (a group
            # that holds one keeps it, and is told it is missing).
            usable = set(offer.usable())
            rest = [
                i for i in range(offer.capacity) if i not in usable and (res, i) not in taken_by
            ]
            if rest:
                holders.setdefault(key(Unavailable()), {})[res] = rest
        for old in self._mirrored.pop(node, ()):
            self.tracker.release(old)
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

    # --- the read model -------------------------------------------------------------
    def view(self, node: str) -> NodeView:
        """``node``'s devices as typed holders (the same merge placement reads)."""
        suffix = f"@{node}"
        return NodeView(
            node,
            self.tracker.capacities(node),
            {
                (res, i): parse(name.removesuffix(suffix))
                for res, ids in self.tracker.holders_on(node).items()
                for i, name in ids.items()
            },
            self.broken.get(node),
        )

    # --- what the writer reads and returns -------------------------------------------
    def bound_on(self, node: str) -> dict[str, Devices]:
        """Groups whose Bound status (as the informer saw it) is on ``node`` -> devices."""
        return {g: self.statuses[g][1] for g in self._status_on.get(node, ())}

    def was_deleted(self, node: str) -> bool:
        """Whether ``node``'s genuine record was seen deleted and not written since."""
        return node in self._deleted_records

    def written(self, node: str, cm: Mapping[str, Any]) -> None:
        """The writer's own write of ``node``'s record returned ``cm``."""
        self.observe(cm)
        self._deleted_records.discard(node)

    def record_gone(self, node: str) -> None:
        """A live read found no record of ``node``."""
        self.forget({"metadata": {"name": record_name(node)}})
        if node in self.records:  # known only from our own writes so far
            self._set_record(node, None)
            self._mirror(node)

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
                if overlaps(held, devices):
                    others.add(other)
        if node in self._malformed:
            others.add(f"(malformed record of node {node})")
        return sorted(others)


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
                    key(SameDevice(h)) for h in map(parse, groups) if not isinstance(h, SameDevice)
                )


def _nodes_of(*held: tuple[str, Devices] | None) -> set[str]:
    return {h[0] for h in held if h is not None}


def pod_key(pod: str) -> str:
    """The holder name of pod ``namespace/name`` in the kubelet's books."""
    namespace, _, name = pod.partition("/")
    return key(KubeletPod(namespace, name))

"""The claim book's merged view, under random sequences of every feed production gives it.

A ``Ledger`` (read-only: no client) on three nodes and three resources, two of which
(``huawei.com/Ascend910`` and ``-2c``) name one physical device family, is fed at random
what the manager's informers and reconcilers feed it: claim records (genuine, malformed,
decoys, records naming another node, late events), Bound group statuses (with and
without the UUIDs of their devices), reservations and holds of decisions in flight, the
nodes' inventories (holes, unhealthy devices, renumbered UUIDs, ResourceSlice devices),
pods the kubelet gave device-plugin devices, and DRA allocations. After every step the
tracker placement reads is checked against a small model of the truth written out here,
independently of the book's own code.

The windows the machine once found are pinned, each by a minimal example, at the end of
the file.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from typing import Any

from hypothesis import Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from controllers.draclaims import CLAIM_FOR_ANNOTATION, ROLE_GROUP_CLAIM, DraAllocations
from controllers.holders import ROLE_LABEL, KubeletHold
from controllers.inventory import SOURCE_ANNOTATION, SOURCE_COUNT, SOURCE_SLICE, Device, Offer
from controllers.ledger.book import Ledger
from controllers.ledger.tracker import InsufficientDevices
from tests.factories import record

GPU = "nvidia.com/gpu"
ASC = "huawei.com/Ascend910"
ASC2C = "huawei.com/Ascend910-2c"
RESOURCES = (GPU, ASC, ASC2C)
#: The device env var of each resource: ASC and ASC2C are one ID space on a node.
FAMILY = {
    GPU: "NVIDIA_VISIBLE_DEVICES",
    ASC: "ASCEND_VISIBLE_DEVICES",
    ASC2C: "ASCEND_VISIBLE_DEVICES",
}
SHORT = {GPU: "gpu", ASC: "npu", ASC2C: "npu2c"}
DRIVER = {GPU: "gpu.example.com", ASC: "npu.example.com", ASC2C: "npu.example.com"}
NODES = ("n0", "n1", "n2")
GROUPS = ("g0", "g1", "g2", "g3")
PODS = ("default/p0", "default/p1", "default/p2")
CLAIM_NAMES = ("c0", "c1", "c2")
DECOYS = ("decoy-a", "decoy-b")
#: Device IDs drawn for records and statuses: some beyond every capacity (at most 4).
MAX_ID = 5
#: Physical devices per node and resource: ``uuid``/``dev`` index ``j`` in 0..4.
PHYSICAL = 5


def record_name(node: str) -> str:
    return f"sdg-claims.{node}"


def uuid(node: str, res: str, j: int) -> str:
    return f"{node}-{SHORT[res]}-uuid-{j}"


def book_family(resource: str) -> str | None:
    return FAMILY.get(resource)


# --- the model ------------------------------------------------------------------------


@dataclass(frozen=True)
class Dev:
    """One device an offer lists: its ID now, which physical device it is, its health."""

    id: int
    j: int
    healthy: bool


@dataclass(frozen=True)
class ModelOffer:
    source: str
    devices: tuple[Dev, ...]

    @property
    def capacity(self) -> int:
        return max((d.id for d in self.devices), default=-1) + 1

    def usable(self) -> set[int]:
        return {d.id for d in self.devices if d.healthy}

    @property
    def has_uuids(self) -> bool:
        return self.source != SOURCE_COUNT  # a count-only inventory knows no UUIDs


@dataclass
class SeenConfigMap:
    """A claim-record ConfigMap as last observed: its version, the nodes it names, and,
    when it is a node's genuine record, that node (and whether it parses)."""

    version: int
    named: set[str]
    genuine: str | None
    malformed: bool


@dataclass
class Model:
    offers: dict[str, dict[str, ModelOffer]] = field(default_factory=dict)
    configmaps: dict[str, SeenConfigMap] = field(default_factory=dict)
    #: node -> the claims its genuine record gives (a malformed one: none).
    records: dict[str, dict[str, dict[str, set[int]]]] = field(default_factory=dict)
    #: group -> (node, devices, UUIDs per resource the status names for every device).
    statuses: dict[str, tuple[str, dict[str, set[int]], dict[str, tuple[str, ...]]]] = field(
        default_factory=dict
    )
    reserved: dict[str, tuple[str, dict[str, set[int]]]] = field(default_factory=dict)
    kubelet: dict[str, dict[str, KubeletHold]] = field(default_factory=dict)
    #: (namespace, name) -> (is a group's claim, devices as (driver, pool, device)).
    dra: dict[tuple[str, str], tuple[bool, set[tuple[str, str, str]]]] = field(default_factory=dict)

    def capacity(self, node: str, res: str) -> int:
        offer = self.offers.get(node, {}).get(res)
        return offer.capacity if offer else 0

    def broken(self) -> set[str]:
        out: set[str] = set()
        for seen in self.configmaps.values():
            if seen.genuine is None:
                out |= seen.named
            elif seen.malformed:
                out.add(seen.genuine)
        return out

    def plugin_id(self, node: str, res: str, given: str) -> int | None:
        """SDG's ID of the device the kubelet reported as ``given`` (a UUID or an index)."""
        offer = self.offers[node][res]
        for d in offer.devices:
            if offer.has_uuids and uuid(node, res, d.j) == given:
                return d.id
        if given.isdigit() and any(d.id == int(given) for d in offer.devices):
            return int(given)
        return None

    def kubelet_counts(self, node: str, res: str) -> list[tuple[str, set[int], int]]:
        """(pod, device IDs it was reported to hold, how many more it holds unreported)
        of each pod on ``node`` holding ``res`` in the kubelet's books."""
        offer = self.offers.get(node, {}).get(res)
        if offer is None or offer.source == SOURCE_SLICE:
            return []  # the kubelet does not hand out ResourceSlice devices
        out = []
        for pod, hold in sorted(self.kubelet.get(node, {}).items()):
            if res not in hold.wants:
                continue
            ids = {
                i
                for g in hold.given.get(res, ())
                if (i := self.plugin_id(node, res, g)) is not None
            }
            out.append((pod, ids, max(0, hold.wants[res] - len(ids))))
        return out

    def holds(self, node: str) -> dict[str, dict[int, set[str]]]:
        """Who holds which device ID of each resource on ``node``, from every source but
        the kubelet's unreported counts and the family links (any ID, even past the
        capacity)."""
        out: dict[str, dict[int, set[str]]] = {}

        def add(holder: str, res: str, ids: set[int]) -> None:
            for i in ids:
                out.setdefault(res, {}).setdefault(i, set()).add(holder)

        for group, devices in self.records.get(node, {}).items():
            for res, ids in devices.items():
                add(f"record:{group}", res, ids)
        offers = self.offers.get(node, {})
        for group, (where, devices, uuids) in self.statuses.items():
            if where != node:
                continue
            for res, ids in devices.items():
                add(f"status:{group}", res, ids)
            for res, names in uuids.items():
                offer = offers.get(res)
                if offer is not None and offer.has_uuids:
                    by_uuid = {d.id for d in offer.devices if uuid(node, res, d.j) in names}
                    add(f"status-uuid:{group}", res, by_uuid)
        for group, (where, devices) in self.reserved.items():
            if where == node:
                for res, ids in devices.items():
                    add(f"reserved:{group}", res, ids)
        for (ns, name), (is_group, refs) in self.dra.items():
            if is_group:
                continue  # a group's own claim is its record's twin
            for res, offer in offers.items():
                if offer.source != SOURCE_SLICE:
                    continue
                held = {d.id for d in offer.devices if (DRIVER[res], node, f"dev-{d.j}") in refs}
                add(f"claim:{ns}/{name}", res, held)
        for res in RESOURCES:
            for pod, ids, _more in self.kubelet_counts(node, res):
                add(f"pod:{pod}", res, ids)
        return out

    def family(self, res: str) -> list[str]:
        """``res`` and every resource naming the same physical devices."""
        return [o for o in RESOURCES if FAMILY[o] == FAMILY[res]]

    def unreported_fill(self, node: str) -> dict[str, set[int]]:
        """Where the devices the kubelet gave without saying which are counted: pod by
        pod (by name), each on the lowest usable IDs of its resource that nobody holds
        under any name of its family, once every reported device is known."""
        holds = self.holds(node)
        taken = {(r, i) for r, ids in holds.items() for i in ids}
        out: dict[str, set[int]] = {}
        for pod, hold in sorted(self.kubelet.get(node, {}).items()):
            for res in hold.wants:
                more = next((m for p, _ids, m in self.kubelet_counts(node, res) if p == pod), 0)
                if not more:
                    continue
                family = self.family(res)
                free = sorted(
                    i
                    for i in self.offers[node][res].usable()
                    if all((o, i) not in taken for o in family)
                )
                for i in free[:more]:
                    taken.add((res, i))
                    out.setdefault(res, set()).add(i)
        return out

    def siblings(self, node: str, res: str) -> list[str]:
        """The other resources of ``res``'s family that ``node`` offers."""
        return [
            o
            for o in RESOURCES
            if o != res and FAMILY[o] == FAMILY[res] and self.capacity(node, o) > 0
        ]


# --- strategies -----------------------------------------------------------------------

#: Mostly IDs a node of up to 4 devices has; sometimes some past its capacity.
id_sets = st.sets(st.integers(0, 3), min_size=1, max_size=3) | st.sets(
    st.integers(0, MAX_ID), min_size=1, max_size=3
)
device_maps = st.dictionaries(st.sampled_from(RESOURCES), id_sets, min_size=1, max_size=2)
claim_maps = st.dictionaries(st.sampled_from(GROUPS), device_maps, max_size=3)
requests = st.dictionaries(
    st.sampled_from(RESOURCES), st.integers(1, 2), min_size=1, max_size=1
) | (st.dictionaries(st.sampled_from(RESOURCES), st.integers(1, 2), min_size=2, max_size=2))


@st.composite
def model_offers(draw: st.DrawFn) -> ModelOffer:
    """IDs 0..cap-1 with holes below the highest, some unhealthy, each a physical device
    (``j``) drawn anew: an offer drawn again for a node renumbers its devices."""
    cap = draw(st.integers(1, 4))
    ids = [i for i in range(cap - 1) if draw(st.integers(0, 3))] + [cap - 1]
    js = draw(st.permutations(range(PHYSICAL)))
    devices = tuple(Dev(i, js[k], healthy=bool(draw(st.integers(0, 3)))) for k, i in enumerate(ids))
    return ModelOffer(draw(st.sampled_from((SOURCE_ANNOTATION, SOURCE_SLICE))), devices)


inventories = st.dictionaries(st.sampled_from(RESOURCES), model_offers(), max_size=3)


def real_offer(node: str, res: str, offer: ModelOffer) -> Offer:
    slice_ = offer.source == SOURCE_SLICE
    return Offer(
        res,
        offer.source,
        tuple(
            Device(
                d.id,
                uuid=uuid(node, res, d.j),
                healthy=d.healthy,
                name=f"dev-{d.j}" if slice_ else "",
                driver=DRIVER[res] if slice_ else "",
                pool=node if slice_ else "",
            )
            for d in offer.devices
        ),
    )


def configmap(name: str, version: int, node: str | None, claims: str) -> dict[str, Any]:
    """The record ``name`` at ``version``, saying it is ``node``'s (or no node's)."""
    return record(node, claims, name=name, rv=version)


def encode(claims: dict[str, dict[str, set[int]]]) -> str:
    return json.dumps(
        {g: {r: ",".join(map(str, sorted(i))) for r, i in d.items()} for g, d in claims.items()}
    )


MALFORMED = ("{", '{"g0": {"nvidia.com/gpu": "1,1"}}', '{"g0": {}}', "[]")


def snapshot(book: Ledger) -> dict[str, Any]:
    """Everything placement can read from the tracker."""
    t = book.tracker
    return {
        n: (
            {r: t.free(n, r) for r in RESOURCES},
            {r: dict(ids) for r, ids in t.holders_on(n).items()},
        )
        for n in NODES
    }


# --- the machine ----------------------------------------------------------------------


class ClaimBookMachine(RuleBasedStateMachine):
    """Every feed of the book as a rule, the model kept in step; invariants after each."""

    def __init__(self) -> None:
        super().__init__()
        self.book = Ledger(None, "ns", family=book_family)  # reads only
        self.book.read_only = True  # quiet: every malformed record would log an error
        self.dra = DraAllocations("ns")
        self.book.set_dra(self.dra)
        self.model = Model()
        self.versions = 0

    # --- inventory ------------------------------------------------------------------
    @initialize(
        offers=st.tuples(
            *(
                st.dictionaries(st.sampled_from(RESOURCES), model_offers(), min_size=2)
                for _ in NODES
            )
        )
    )
    def inventory(self, offers: tuple[dict[str, ModelOffer], ...]) -> None:
        for node, offer in zip(NODES, offers, strict=True):
            self._set_offers(node, offer)

    @rule(node=st.sampled_from(NODES), offers=inventories)
    def set_offers(self, node: str, offers: dict[str, ModelOffer]) -> None:
        self._set_offers(node, offers)

    def _set_offers(self, node: str, offers: dict[str, ModelOffer]) -> None:
        self.book.set_offers(node, {r: real_offer(node, r, o) for r, o in offers.items()})
        self.model.offers[node] = dict(offers)

    @rule(
        node=st.sampled_from(NODES),
        caps=st.dictionaries(st.sampled_from(RESOURCES), st.integers(0, 4), max_size=3),
    )
    def set_capacity(self, node: str, caps: dict[str, int]) -> None:
        self.book.set_capacity(node, caps)
        self.model.offers[node] = {
            r: ModelOffer(SOURCE_COUNT, tuple(Dev(i, i, True) for i in range(n)))
            for r, n in caps.items()
            if n
        }

    @rule(node=st.sampled_from(NODES))
    def remove_node(self, node: str) -> None:
        self.book.remove_node(node)
        self.model.offers[node] = {}

    # --- claim records --------------------------------------------------------------
    @rule(
        node=st.sampled_from(NODES),
        other=st.sampled_from(NODES),
        claims=claim_maps,
        kind=st.sampled_from(
            ("genuine", "genuine", "genuine", "malformed", "decoy", "other", "no-node", "late")
        ),
        decoy=st.sampled_from(DECOYS),
        bad=st.sampled_from(MALFORMED),
    )
    def observe_record(
        self,
        node: str,
        other: str,
        claims: dict[str, dict[str, set[int]]],
        kind: str,
        decoy: str,
        bad: str,
    ) -> None:
        name = decoy if kind == "decoy" else record_name(node)
        seen = self.model.configmaps.get(name)
        if kind == "late" and seen is not None:
            # Informer events no newer than what the book holds: ignored, whatever they say.
            self.book.observe(configmap(name, seen.version - 1, node, bad))
            self.book.observe(configmap(name, seen.version, node, encode(claims)))
            return
        self.versions += 1
        if kind in ("genuine", "late"):
            cm = configmap(name, self.versions, node, encode(claims))
            entry = SeenConfigMap(self.versions, {node}, node, malformed=False)
        elif kind == "malformed":
            cm = configmap(name, self.versions, node, bad)
            entry = SeenConfigMap(self.versions, {node}, node, malformed=True)
            claims = {}
        elif kind == "decoy":
            cm = configmap(name, self.versions, node, encode(claims))
            entry = SeenConfigMap(self.versions, {node}, None, malformed=False)
        elif kind == "other" and other != node:
            # n's record, edited to describe another node.
            cm = configmap(name, self.versions, other, encode(claims))
            entry = SeenConfigMap(self.versions, {node, other}, None, malformed=False)
        else:
            cm = configmap(name, self.versions, None, encode(claims))
            entry = SeenConfigMap(self.versions, {node}, None, malformed=False)
        self.book.observe(cm)
        self.model.configmaps[name] = entry
        if entry.genuine is not None:
            self.model.records[node] = claims

    @rule(name=st.sampled_from((*map(record_name, NODES), *DECOYS)))
    def forget_record(self, name: str) -> None:
        self.book.forget({"metadata": {"name": name}})
        self.model.configmaps.pop(name, None)
        for node in NODES:
            if record_name(node) == name:
                self.model.records.pop(node, None)

    # --- bound statuses -------------------------------------------------------------
    @rule(
        group=st.sampled_from(GROUPS),
        node=st.sampled_from(NODES),
        devices=device_maps,
        phase=st.sampled_from(("Bound", "Bound", "Bound", "Pending")),
        uuids=st.sampled_from(("none", "offer", "offer", "other", "other", "short")),
        data=st.data(),
    )
    def observe_group(
        self,
        group: str,
        node: str,
        devices: dict[str, set[int]],
        phase: str,
        uuids: str,
        data: st.DataObject,
    ) -> None:
        physical: dict[str, str] = {}
        honoured: dict[str, tuple[str, ...]] = {}
        offers = self.model.offers.get(node, {})
        for res, ids in devices.items():
            if uuids == "offer":  # as SDG writes them at bind: the UUIDs of its IDs now
                offer = offers.get(res)
                by_id = {}
                if offer is not None and offer.has_uuids:
                    by_id = {d.id: uuid(node, res, d.j) for d in offer.devices}
                names = [by_id[i] for i in sorted(ids) if i in by_id]
            elif uuids in ("other", "short"):  # devices renumbered since, or a short list
                js = data.draw(st.permutations(range(PHYSICAL)))
                names = [uuid(node, res, j) for j in js[: len(ids) - (uuids == "short")]]
            else:
                continue
            if names:
                physical[res] = ",".join(names)
            if len(names) == len(ids):  # only a status naming every device is trusted
                honoured[res] = tuple(names)
        status: dict[str, Any] = {
            "phase": phase,
            "nodeName": node,
            "selectedDevices": {r: ",".join(map(str, sorted(i))) for r, i in devices.items()},
        }
        if physical:
            status["physicalDevices"] = physical
        self.book.observe_group({"metadata": {"name": group}, "status": status})
        if phase == "Bound":
            self.model.statuses[group] = (node, devices, honoured)
        else:
            self.model.statuses.pop(group, None)

    @rule(group=st.sampled_from(GROUPS))
    def forget_group(self, group: str) -> None:
        self.book.forget_group({"metadata": {"name": group}})
        self.model.statuses.pop(group, None)

    # --- decisions in flight --------------------------------------------------------
    @rule(group=st.sampled_from(GROUPS), node=st.sampled_from(NODES), request=requests)
    def reserve(self, group: str, node: str, request: dict[str, int]) -> None:
        """Reserving again (on this node or another) replaces the group's reservation."""
        t = self.book.tracker
        before = snapshot(self.book)
        lowest = {r: t.lowest_free(node, r, n) for r, n in request.items()}
        held = self.model.holds(node)
        try:
            picked = self.book.reserve(group, node, request)
        except InsufficientDevices:
            assert any(len(lowest[r]) < n for r, n in request.items())
            assert snapshot(self.book) == before, "a refused reserve changed the tracker"
            return
        assert picked == lowest, "reserve gives the lowest free IDs"
        for res, ids in picked.items():
            assert len(ids) == request[res]
            usable = self.model.offers[node][res].usable()
            for i in ids:
                assert before[node][1].get(res, {}).get(i) is None, f"{res} {i} was not free"
                assert i in usable, f"reserve gave {res} {i}, which the node cannot give"
                assert not held.get(res, {}).get(i), f"reserve gave {res} {i} of {held[res][i]}"
                assert t.holder(node, res, i) is not None, f"reserved {res} {i} is still free"
        self.model.reserved[group] = (node, {r: set(i) for r, i in picked.items()})

    @precondition(lambda self: len(self.model.reserved) < len(GROUPS))
    @rule(data=st.data(), node=st.sampled_from(NODES), request=requests)
    def reserve_and_give_back(
        self, data: st.DataObject, node: str, request: dict[str, int]
    ) -> None:
        group = data.draw(st.sampled_from([g for g in GROUPS if g not in self.model.reserved]))
        before = snapshot(self.book)
        with contextlib.suppress(InsufficientDevices):
            self.book.reserve(group, node, request)
        self.book.unreserve(group)
        assert snapshot(self.book) == before, "unreserve did not restore the tracker"

    @rule(group=st.sampled_from(GROUPS), node=st.sampled_from(NODES), devices=device_maps)
    def hold(self, group: str, node: str, devices: dict[str, set[int]]) -> None:
        self.book.hold(group, node, {r: sorted(i) for r, i in devices.items()})
        self.model.reserved[group] = (node, devices)

    @rule(group=st.sampled_from(GROUPS))
    def unreserve(self, group: str) -> None:
        self.book.unreserve(group)
        self.model.reserved.pop(group, None)

    # --- the kubelet's books and DRA's ----------------------------------------------
    @rule(
        node=st.sampled_from(NODES),
        pod=st.sampled_from(PODS),
        wants=requests,
        given=st.sampled_from(("none", "uuid", "uuid", "index", "index")),
        data=st.data(),
    )
    def kubelet_hold(
        self, node: str, pod: str, wants: dict[str, int], given: str, data: st.DataObject
    ) -> None:
        reported: dict[str, tuple[str, ...]] = {}
        for res, n in wants.items():
            if given == "uuid":
                js = data.draw(st.permutations(range(PHYSICAL)))
                reported[res] = tuple(
                    uuid(node, res, j) for j in js[: data.draw(st.integers(1, n))]
                )
            elif given == "index":
                ids = data.draw(st.sets(st.integers(0, MAX_ID), min_size=1, max_size=n))
                reported[res] = tuple(str(i) for i in sorted(ids))
        hold = KubeletHold(dict(wants), reported)
        self.book.set_kubelet_hold(node, pod, hold)
        self.model.kubelet.setdefault(node, {})[pod] = hold

    @rule(node=st.sampled_from(NODES), pod=st.sampled_from(PODS))
    def kubelet_release(self, node: str, pod: str) -> None:
        self.book.set_kubelet_hold(node, pod, None)
        self.model.kubelet.get(node, {}).pop(pod, None)

    @rule(
        name=st.sampled_from(CLAIM_NAMES),
        kind=st.sampled_from(("plain", "plain", "group", "labelled-elsewhere")),
        results=st.lists(
            st.tuples(
                st.sampled_from(RESOURCES),
                st.sampled_from(NODES),
                st.integers(0, PHYSICAL - 1),
                st.integers(0, 5).map(lambda x: x == 0),  # adminAccess: takes nothing
            ),
            max_size=3,
        ),
    )
    def dra_claim(self, name: str, kind: str, results: list[tuple[str, str, int, bool]]) -> None:
        namespace = "ns" if kind == "group" else "default"
        meta: dict[str, Any] = {"name": name, "namespace": namespace}
        if kind != "plain":
            meta["labels"] = {ROLE_LABEL: ROLE_GROUP_CLAIM}
            meta["annotations"] = {CLAIM_FOR_ANNOTATION: "g0"}
        items = [
            {"request": "r", "driver": DRIVER[r], "pool": n, "device": f"dev-{j}"}
            | ({"adminAccess": True} if admin else {})
            for r, n, j, admin in results
        ]
        claim = {"metadata": meta, "status": {"allocation": {"devices": {"results": items}}}}
        self.dra.observe(claim)
        refs = {(DRIVER[r], n, f"dev-{j}") for r, n, j, admin in results if not admin}
        if refs:
            self.model.dra[(namespace, name)] = (kind == "group", refs)
        else:
            self.model.dra.pop((namespace, name), None)

    @rule(name=st.sampled_from(CLAIM_NAMES), namespace=st.sampled_from(("ns", "default")))
    def dra_forget(self, name: str, namespace: str) -> None:
        self.dra.forget({"metadata": {"name": name, "namespace": namespace}})
        self.model.dra.pop((namespace, name), None)

    # --- invariants -----------------------------------------------------------------
    def _not_free(self, node: str, res: str, i: int, why: str) -> None:
        assert self.book.tracker.holder(node, res, i) is not None, (
            f"{res} {i} on {node} is free, but {why}"
        )

    @invariant()
    def one_holder_per_device_and_counts_in_range(self) -> None:
        t = self.book.tracker
        t.check_invariants()
        for node in NODES:
            for res in RESOURCES:
                assert t.capacity(node, res) == self.model.capacity(node, res)
                assert 0 <= t.free(node, res) <= t.capacity(node, res)

    @invariant()
    def records_and_statuses_keep_their_devices(self) -> None:
        for node in NODES:
            for res, ids in self.model.holds(node).items():
                cap = self.model.capacity(node, res)
                for i, holders in ids.items():
                    durable = [h for h in holders if h.startswith(("record:", "status"))]
                    if durable and i < cap:
                        self._not_free(node, res, i, f"{durable} hold it")

    @invariant()
    def nothing_is_free_on_a_broken_node(self) -> None:
        assert set(self.book.broken) == self.model.broken()
        for node in self.model.broken():
            for res in RESOURCES:
                assert self.book.tracker.free(node, res) == 0, f"{res} free on broken {node}"

    @invariant()
    def a_device_held_under_one_name_is_held_under_its_siblings(self) -> None:
        for node in NODES:
            for res, ids in self.model.holds(node).items():
                for other in self.model.siblings(node, res):
                    for i, holders in ids.items():
                        if i < self.model.capacity(node, other):
                            self._not_free(node, other, i, f"{holders} hold it as {res}")

    @invariant()
    def dra_claims_and_kubelet_pods_keep_their_devices(self) -> None:
        for node in NODES:
            for res, ids in self.model.holds(node).items():
                for i, holders in ids.items():
                    foreign = [h for h in holders if h.startswith(("claim:", "pod:"))]
                    if foreign and i < self.model.capacity(node, res):
                        self._not_free(node, res, i, f"{foreign} hold it")

    @invariant()
    def reservations_keep_their_devices(self) -> None:
        for group, (node, devices) in self.model.reserved.items():
            for res, ids in devices.items():
                for i in ids:
                    if i < self.model.capacity(node, res):
                        self._not_free(node, res, i, f"{group} reserved it")

    @invariant()
    def free_counts_are_exact(self) -> None:
        """Neither too many (a device handed out twice) nor too few (a leak) free: the
        usable IDs nobody holds under the resource's name or a sibling's, less those the
        kubelet's unreported counts are put on (``model.unreported_fill``)."""
        broken = self.model.broken()
        for node in NODES:
            if node in broken:
                continue
            holds = self.model.holds(node)
            fill = self.model.unreported_fill(node)
            for res in RESOURCES:
                offer = self.model.offers.get(node, {}).get(res)
                unheld = offer.usable() if offer else set()
                for o in self.model.family(res):
                    unheld -= set(holds.get(o, {})) | fill.get(o, set())
                assert self.book.tracker.free(node, res) == len(unheld), (
                    f"{node} {res}: {self.book.tracker.free(node, res)} free, "
                    f"expected {len(unheld)}"
                )


TestClaimBookMachine = ClaimBookMachine.TestCase
#: No explain phase: on Python < 3.12 it traces every line of a failing example, which
#: takes minutes on a 40-step program (past pytest-timeout) before the failure is shown.
TestClaimBookMachine.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
)


def test_the_model_families_are_the_managers() -> None:
    """The manager's ``family`` is the device env var of its table: the same grouping."""
    from api.constants import DEFAULT_ENV_TABLE
    from api.envvars import env_var_for

    assert {r: env_var_for(r, DEFAULT_ENV_TABLE) for r in RESOURCES} == FAMILY


# --- windows once found: minimal examples ----------------------------------------------------


def family_book() -> Ledger:
    book = Ledger(None, "ns", family=book_family)  # reads only
    book.read_only = True
    return book


def test_a_family_sibling_not_offered_still_holds_its_devices() -> None:
    """A group holds Ascend910 0 by its record; the node's inventory lists only the -2c
    resource now (its Ascend910 offer gone for a while): NPU 0 is still the group's."""
    book = family_book()
    book.set_capacity("n0", {ASC2C: 2})
    book.observe(record("n0", encode({"g0": {ASC: {0}}})))
    assert book.tracker.free("n0", ASC2C) == 1


def test_reserving_on_another_node_frees_the_first() -> None:
    book = family_book()
    book.set_capacity("n0", {GPU: 2})
    book.set_capacity("n1", {GPU: 2})
    book.reserve("g0", "n0", {GPU: 1})
    book.reserve("g0", "n1", {GPU: 1})
    assert book.tracker.free("n0", GPU) == 2


def test_a_pods_unreported_devices_are_not_counted_on_a_siblings_devices() -> None:
    """4 NPUs: a group holds 0,1 as Ascend910; the kubelet gave a pod 2 as -2c without
    saying which. None is free under either name."""
    book = family_book()
    book.set_capacity("n0", {ASC: 4, ASC2C: 4})
    book.observe(record("n0", encode({"g0": {ASC: {0, 1}}})))
    book.set_kubelet_hold("n0", "default/p0", KubeletHold({ASC2C: 2}, {}))
    assert (book.tracker.free("n0", ASC), book.tracker.free("n0", ASC2C)) == (0, 0)


def test_an_unreported_pod_is_not_counted_on_a_reported_device() -> None:
    """The kubelet gave p0 one GPU (not reported yet) and p1 GPU 0: two are in use."""
    book = family_book()
    book.set_capacity("n0", {GPU: 2})
    book.set_kubelet_hold("n0", "default/p0", KubeletHold({GPU: 1}, {}))
    book.set_kubelet_hold("n0", "default/p1", KubeletHold({GPU: 1}, {GPU: ("0",)}))
    assert book.tracker.free("n0", GPU) == 0

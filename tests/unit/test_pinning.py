"""Pinned devices (``spec.devices``): validation, placement on exactly the pinned devices,
and a per-node reason naming the holder or saying the device is missing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from api.constants import KIND, MAX_DEVICES_PER_RESOURCE, MAX_PIN_LENGTH, MAX_PINNED_DEVICES
from api.v1alpha1 import SharedDeviceGroup, spec_pins
from api.validation import PIN, validate_spec
from cli.explain import group_explanation
from controllers.holders import KubeletHold
from controllers.inventory import SOURCE_SLICE, Device, Offer, count_offer, parse_annotation
from controllers.ledger.book import Ledger
from controllers.ledger.tracker import InsufficientDevices
from controllers.pinning import LedgerPins, claim_matches_pins
from controllers.placement import filter_node, place
from sdgruntime.cache import Cache
from sdgruntime.envtest import FakeClient
from sdgruntime.webhook.admission import AdmissionRequest
from tests import factories
from tests.factories import as_client
from webhooks.groupvalidator import GroupValidator

GPU = "nvidia.com/gpu"
NPU = "huawei.com/Ascend910"
CRD = Path(__file__).parents[2] / "config" / "crd" / "deviceshare.io_shareddevicegroups.yaml"


def node(name: str, gpus: int = 4, **annotations: str) -> dict[str, Any]:
    """A Ready shared node offering ``gpus`` GPUs and nothing else."""
    return factories.node(name, {GPU: gpus}, annotations=annotations, allocatable={}, ready="True")


def bound(name: str, node_name: str, ids: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {"resources": {GPU: len(ids.split(","))}},
        "status": {"phase": "Bound", "nodeName": node_name, "selectedDevices": {GPU: ids}},
    }


def pinned(*pins: str, strategy: str = "binpack") -> dict[str, Any]:
    return {
        "resources": {GPU: len(pins)},
        "devices": {GPU: list(pins)},
        "schedulingStrategy": strategy,
    }


UUIDS = [f"GPU-{i:08d}-aaaa-bbbb-cccc-dddddddddddd" for i in range(8)]


def ledger(offers: dict[str, dict[str, Offer]], groups: tuple[dict[str, Any], ...] = ()) -> Ledger:
    return Ledger.from_objects(offers=offers, groups=groups)


# --- validation (the webhook's and the models'; the CRD says the same) ------------------


@pytest.mark.parametrize(
    ("devices", "resources", "expected"),
    [
        ({GPU: ["0"]}, {GPU: 2}, "lists 1 device(s) but spec.resources requests 2"),
        ({GPU: ["0", "0"]}, {GPU: 2}, "Duplicate value: '0'"),
        ({NPU: ["0"]}, {GPU: 1}, "pins a resource spec.resources does not request"),
        ({GPU: ["1024"]}, {GPU: 1}, "device IDs are below 1024"),
        ({GPU: ["GPU x"]}, {GPU: 1}, "must be a device ID (a number) or a UUID"),
        ({GPU: ["G" * (MAX_PIN_LENGTH + 1)]}, {GPU: 1}, "must be a device ID"),
        ({GPU: [str(i) for i in range(65)]}, {GPU: 65}, "Too many: 65: must have at most 64"),
        ({GPU: "0,1"}, {GPU: 2}, "must be a list of device IDs or UUIDs"),
        (["0"], {GPU: 1}, "must map a resource to its device IDs or UUIDs"),
    ],
)
def test_a_bad_pin_is_refused_with_the_reason(
    devices: Any, resources: dict[str, int], expected: str
) -> None:
    errors = validate_spec({"resources": resources, "devices": devices})
    assert any(expected in e for e in errors), errors
    with pytest.raises(ValueError):  # the models refuse it too (CLI, examples)
        SharedDeviceGroup.model_validate(
            {"metadata": {"name": "g"}, "spec": {"resources": resources, "devices": devices}}
        )


def test_good_pins_pass_and_read_back() -> None:
    spec = {"resources": {GPU: 2, NPU: 1}, "devices": {GPU: [UUIDS[0], "3"]}}
    assert validate_spec(spec) == []
    assert spec_pins(spec) == {GPU: (UUIDS[0], "3")}
    assert spec_pins({"resources": {GPU: 1}}) == {}
    model = SharedDeviceGroup.model_validate({"metadata": {"name": "g"}, "spec": spec})
    assert model.to_dict()["spec"]["devices"] == {GPU: [UUIDS[0], "3"]}


def test_the_crd_bounds_pins_as_the_python_side_does() -> None:
    schema = yaml.safe_load(CRD.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    devices = schema["properties"]["spec"]["properties"]["devices"]
    lists = devices["additionalProperties"]
    assert lists["maxItems"] == MAX_PINNED_DEVICES
    assert lists["x-kubernetes-list-type"] == "set"  # duplicates: refused by the API server
    assert lists["items"]["maxLength"] == MAX_PIN_LENGTH
    rules = " ".join(r["rule"] for r in lists["x-kubernetes-validations"])
    assert f"d.matches('^{PIN}$')" in rules
    assert f"int(d) < {MAX_DEVICES_PER_RESOURCE}" in rules
    spec_rules = " ".join(
        r["rule"] for r in schema["properties"]["spec"]["x-kubernetes-validations"]
    )
    assert "size(self.devices[r]) == self.resources[r]" in spec_rules
    root = " ".join(r["rule"] for r in schema["x-kubernetes-validations"])
    assert "self.spec.devices == oldSelf.spec.devices" in root


# --- placement ------------------------------------------------------------------------


def test_a_pinned_group_gets_exactly_its_ids_not_the_lowest_free() -> None:
    nodes = [node("a")]
    book = ledger({"a": {GPU: count_offer(GPU, 4)}})
    d = place(pinned("3", "1"), nodes, book.tracker, pins=LedgerPins(book, "g"))
    assert d.node == "a" and d.pinned == {"a": {GPU: (1, 3)}}
    assert book.reserve("g", "a", {GPU: 2}, d.pinned["a"]) == {GPU: [1, 3]}
    # Reserved now: a second group pinning 3 is told who has it.
    other = place(pinned("3"), nodes, book.tracker, pins=LedgerPins(book, "h"))
    assert other.node is None
    assert other.reasons == {"a": (f"have pinned {GPU} 3 held by group g",)}
    with pytest.raises(InsufficientDevices):
        book.reserve("h", "a", {GPU: 1}, {GPU: [3]})


def test_uuid_pins_choose_the_node_that_has_them_and_say_missing_elsewhere() -> None:
    # Binpack prefers the smaller node "a", but only "b" has the pinned UUIDs (at IDs 2, 0).
    nodes = [node("a", 2), node("b", 4)]
    book = ledger(
        {
            "a": {GPU: parse_annotation(GPU, ",".join(UUIDS[4:6]))},
            "b": {GPU: parse_annotation(GPU, ",".join(UUIDS[:4]))},
        }
    )
    d = place(pinned(UUIDS[2], UUIDS[0]), nodes, book.tracker, pins=LedgerPins(book, "g"))
    assert d.node == "b" and d.pinned == {"b": {GPU: (0, 2)}}
    assert d.reasons["a"] == (
        f"have no pinned {GPU} {UUIDS[2]} (missing from the node's inventory)",
        f"have no pinned {GPU} {UUIDS[0]} (missing from the node's inventory)",
    )


def test_a_held_pin_names_its_holder_group_or_pod_and_stays_pending() -> None:
    nodes = [node("a")]
    book = ledger({"a": {GPU: count_offer(GPU, 4)}}, (bound("train", "a", "0,1"),))
    book.set_kubelet_hold("a", "ml/notebook", KubeletHold({GPU: 1}, {GPU: ("2",)}))
    d = place(pinned("1", "2"), nodes, book.tracker, pins=LedgerPins(book, "g"))
    assert d.node is None
    assert d.reasons["a"] == (
        f"have pinned {GPU} 1 held by group train",
        f"have pinned {GPU} 2 held by pod ml/notebook",
    )
    assert d.message() == (
        f"0/1 nodes are available: 1 have pinned {GPU} 1 held by group train, "
        f"1 have pinned {GPU} 2 held by pod ml/notebook."
    )
    # Device 3 is free: pinning it binds.
    assert place(pinned("3"), nodes, book.tracker, pins=LedgerPins(book, "g")).node == "a"


def test_missing_unhealthy_twice_and_uuids_unknown_each_say_so() -> None:
    offer = parse_annotation(GPU, f"0={UUIDS[0]},1={UUIDS[1]}:unhealthy")
    book = ledger({"a": {GPU: offer}, "c": {GPU: count_offer(GPU, 4)}})
    pins = LedgerPins(book, "g")
    n = node("a", 2)
    assert filter_node(pinned("5"), n, book.tracker, pins=pins) == (
        f"have no pinned {GPU} 5 (missing from the node's inventory)",
    )
    assert filter_node(pinned(UUIDS[1]), n, book.tracker, pins=pins) == (
        f"have pinned {GPU} {UUIDS[1]} unhealthy",
    )
    assert filter_node(pinned("0", UUIDS[0]), n, book.tracker, pins=pins) == (
        f"have pinned {GPU} 0 and {UUIDS[0]} as one device (ID 0): pin each device once",
    )
    assert filter_node(pinned(UUIDS[3]), node("c"), book.tracker, pins=pins) == (
        f"have no pinned {GPU} {UUIDS[3]} (missing: the node's inventory of {GPU} knows no "
        "UUIDs; pin by ID)",
    )


def test_pins_on_holder_nodes_are_refused_unless_the_devices_come_from_slices() -> None:
    slice_offer = Offer(
        GPU, SOURCE_SLICE, tuple(Device(i, UUIDS[i], name=f"gpu-{i}") for i in range(2))
    )
    book = ledger({"plugin": {GPU: count_offer(GPU, 2)}, "dra": {GPU: slice_offer}})
    pins = LedgerPins(book, "g", holders=True)
    d = place(pinned(UUIDS[1]), [node("plugin", 2), node("dra", 2)], book.tracker, pins=pins)
    assert d.node == "dra" and d.pinned == {"dra": {GPU: (1,)}}
    assert d.reasons["plugin"] == (
        f"give {GPU} through holder pods, and the kubelet picks which devices: pinned "
        "devices need a DRA node or the manager's --holders off",
    )


def test_unpinned_resources_of_a_pinned_group_take_the_lowest_free() -> None:
    n = node("a")
    n["status"]["allocatable"][NPU] = "2"
    book = ledger({"a": {GPU: count_offer(GPU, 4), NPU: count_offer(NPU, 2)}})
    spec = {"resources": {GPU: 1, NPU: 1}, "devices": {GPU: ["2"]}}
    d = place(spec, [n], book.tracker, pins=LedgerPins(book, "g"))
    assert d.pinned == {"a": {GPU: (2,)}}
    assert book.reserve("g", "a", spec["resources"], d.pinned["a"]) == {GPU: [2], NPU: [0]}


def test_a_pinned_spec_is_never_placed_as_if_unpinned() -> None:
    book = ledger({"a": {GPU: count_offer(GPU, 4)}})
    with pytest.raises(ValueError, match="PinResolver"):
        place(pinned("1"), [node("a")], book.tracker)
    with pytest.raises(ValueError, match="PinResolver"):
        filter_node(pinned("1"), node("a"), book.tracker)


def test_a_group_adopting_its_own_claim_sees_its_pins_free() -> None:
    book = ledger({"a": {GPU: count_offer(GPU, 4)}}, (bound("g", "a", "1"),))
    assert filter_node(pinned("1"), node("a"), book.tracker, pins=LedgerPins(book, "g")) == ()
    assert filter_node(pinned("1"), node("a"), book.tracker, pins=LedgerPins(book, "h")) == (
        f"have pinned {GPU} 1 held by group g",
    )
    offers = book.offers["a"]
    assert LedgerPins(book, "g").resolve("a", GPU, ("1",)) == ((1,), ())
    assert claim_matches_pins(pinned("1"), {GPU: [1]}, offers)
    assert not claim_matches_pins(pinned("2"), {GPU: [1]}, offers)
    assert not claim_matches_pins(pinned("9"), {GPU: [1]}, offers)
    assert claim_matches_pins({"resources": {GPU: 1}}, {GPU: [1]}, offers)


# --- sdg explain ------------------------------------------------------------------------


def test_explain_shows_the_pins_and_each_nodes_pin_reason() -> None:
    group = {
        "metadata": {"name": "g"},
        "spec": pinned(UUIDS[1]),
        "status": {"phase": "Pending"},
    }
    nodes = [
        node("a", 2, **{"deviceshare.io/devices.nvidia.com_gpu": ",".join(UUIDS[:2])}),
        node("b", 2),
    ]
    text, facts = group_explanation("g", [group, bound("other", "a", "1")], nodes, [], [])
    assert "Pinned:" in text and f"{GPU}={UUIDS[1]}" in text
    verdicts = {v["node"]: v for v in facts["nodes"]}
    assert verdicts["a"]["reason"] == f"have pinned {GPU} {UUIDS[1]} held by group other"
    assert "knows no UUIDs" in verdicts["b"]["reason"]
    assert facts["pinned"] == {GPU: [UUIDS[1]]}


# --- the group webhook (for API servers whose CRD predates the rules) -----------------


@pytest.mark.anyio
async def test_the_group_webhook_refuses_bad_pins_and_a_change_once_bound() -> None:
    validator = GroupValidator(cache=Cache(as_client(FakeClient())))  # read on DELETE only

    def request(operation: str, spec: dict[str, Any], old: dict[str, Any] | None) -> Any:
        return AdmissionRequest.from_dict(
            {
                "uid": "u",
                "operation": operation,
                "kind": {"group": "deviceshare.io", "version": "v1alpha1", "kind": KIND},
                "name": "g",
                "object": {"metadata": {"name": "g"}, "spec": spec},
                "oldObject": old,
            }
        )

    short = await validator.validate(
        request("CREATE", {"resources": {GPU: 2}, "devices": {GPU: ["0"]}}, None)
    )
    assert not short.allowed and "lists 1 device(s) but spec.resources requests 2" in short.message
    was = {
        "metadata": {"name": "g"},
        "spec": pinned("1"),
        "status": {"phase": "Bound", "nodeName": "a"},
    }
    moved = await validator.validate(request("UPDATE", pinned("2"), was))
    assert (
        not moved.allowed and "spec.devices cannot change once the group is Bound" in moved.message
    )
    pending = {**was, "status": {"phase": "Pending"}}
    assert (await validator.validate(request("UPDATE", pinned("2"), pending))).allowed

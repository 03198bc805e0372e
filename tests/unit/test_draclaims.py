"""DRA's books, pure parts: reading allocations, the group claim SDG writes, its name, and
the mirror of every claim's allocated devices."""

from __future__ import annotations

import re
from typing import Any

import pytest

from controllers.draclaims import (
    CLAIM_FINALIZER,
    CLAIM_FOR_ANNOTATION,
    MAX_RESULTS,
    ROLE_GROUP_CLAIM,
    DeviceRef,
    DevicesHeldElsewhere,
    DraAllocations,
    DraPublisher,
    allocated_devices,
    build_group_claim,
    claim_for,
    group_claim_name,
    group_claim_status,
    holder_of,
    is_group_claim,
    owner_uid,
)
from controllers.holders import ROLE_LABEL
from sdgruntime.envtest import FakeClient
from tests import factories
from tests.factories import as_client

DRIVER = "gpu.nvidia.com"
NS = "deviceshare-system"
# metav1's DNS-1123 subdomain (apimachinery validation.IsDNS1123Subdomain), max 253.
SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def ref(device: str, pool: str = "n1", driver: str = DRIVER) -> DeviceRef:
    return DeviceRef(driver, pool, device)


def group(name: str = "train", uid: str = "uid-train") -> dict[str, Any]:
    return factories.group(name, uid=uid)


def claim(
    name: str,
    namespace: str = "apps",
    results: list[Any] | None = None,
    **meta: Any,
) -> dict[str, Any]:
    obj: dict[str, Any] = {"metadata": {"name": name, "namespace": namespace, **meta}}
    if results is not None:
        obj["status"] = {"allocation": {"devices": {"results": results}}}
    return obj


def result(device: str, pool: str = "n1", **extra: Any) -> dict[str, Any]:
    return {"request": "gpu", "driver": DRIVER, "pool": pool, "device": device, **extra}


def test_allocated_devices_are_the_results_as_kube_scheduler_counts_them() -> None:
    c = claim(
        "c",
        results=[
            result("gpu-0"),
            result("gpu-1", adminAccess=True),  # takes nothing from anyone
            result("gpu-2"),
            result("gpu-2"),  # once
            {"request": "gpu", "driver": DRIVER, "pool": "n1"},  # malformed: skipped
            "nonsense",
        ],
    )
    assert allocated_devices(c) == [ref("gpu-0"), ref("gpu-2")]
    assert allocated_devices(claim("unallocated")) == []
    assert allocated_devices({"status": {"allocation": {"devices": {"results": "x"}}}}) == []
    assert str(ref("gpu-3")) == "gpu.nvidia.com/n1/gpu-3"


def test_allocated_devices_read_no_more_than_the_api_stores() -> None:
    many = claim("c", results=[result(f"gpu-{i}") for i in range(MAX_RESULTS + 10)])
    assert MAX_RESULTS == 32  # AllocationResultsMaxSize, k8s.io/api resource/v1
    assert allocated_devices(many) == [ref(f"gpu-{i}") for i in range(MAX_RESULTS)]


def test_group_claim_names_are_valid_resource_claim_names_for_any_group_name() -> None:
    assert group_claim_name("train") == "sdg-group.train"
    longest = "a" * 200 + "." + "b" * 52  # 253 chars, a valid group name
    cut_at_dot = "c" * 229 + "." + "d" * 23  # the cut would end in '.'
    names = {group_claim_name(g) for g in (longest, longest[:-1] + "c", cut_at_dot)}
    assert len(names) == 3  # the hash tells apart names that share the kept prefix
    for name in names:
        assert len(name) <= 253 and SUBDOMAIN.match(name), name
    assert ("sdg-group." + cut_at_dot)[:240].endswith(".")  # the case is the one meant
    assert group_claim_name(longest) == group_claim_name(longest)


def test_the_group_claim_asks_for_the_groups_count_and_is_allocated_to_its_devices() -> None:
    devices = [ref("gpu-5"), ref("gpu-1")]
    obj = build_group_claim(group(), "n1", devices, NS, DRIVER)
    meta = obj["metadata"]
    assert meta["name"] == "sdg-group.train" and meta["namespace"] == NS
    assert meta["labels"] == {ROLE_LABEL: ROLE_GROUP_CLAIM}
    assert meta["annotations"] == {CLAIM_FOR_ANNOTATION: "train"}
    assert meta["finalizers"] == [CLAIM_FINALIZER]
    assert meta["ownerReferences"] == [
        {
            "apiVersion": "deviceshare.io/v1alpha1",
            "kind": "SharedDeviceGroup",
            "name": "train",
            "uid": "uid-train",
            "controller": True,
        }
    ]
    assert obj["spec"] == {
        "devices": {
            "requests": [{"name": "devices-0", "exactly": {"deviceClassName": DRIVER, "count": 2}}]
        }
    }
    assert obj["status"] == group_claim_status(group(), "n1", devices)
    assert obj["status"] == {
        "allocation": {
            "devices": {
                "results": [
                    {"request": "devices-0", "driver": DRIVER, "pool": "n1", "device": "gpu-5"},
                    {"request": "devices-0", "driver": DRIVER, "pool": "n1", "device": "gpu-1"},
                ]
            },
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
                ]
            },
        },
        "reservedFor": [
            {
                "apiGroup": "deviceshare.io",
                "resource": "shareddevicegroups",
                "name": "train",
                "uid": "uid-train",
            }
        ],
    }
    assert allocated_devices(obj) == devices
    assert is_group_claim(obj, NS) and claim_for(obj) == "train" and owner_uid(obj) == "uid-train"


def test_devices_of_two_drivers_get_a_request_each() -> None:
    devices = [ref("gpu-0"), ref("gpu-0", driver="gpu.amd.com"), ref("gpu-1")]
    obj = build_group_claim(group(), "n1", devices, NS, {"gpu.amd.com": "amd"})
    assert obj["spec"]["devices"]["requests"] == [
        {"name": "devices-0", "exactly": {"deviceClassName": "amd", "count": 1}},
        {"name": "devices-1", "exactly": {"deviceClassName": DRIVER, "count": 2}},
    ]
    by_request = {
        (r["request"], r["driver"], r["device"])
        for r in obj["status"]["allocation"]["devices"]["results"]
    }
    assert by_request == {
        ("devices-0", "gpu.amd.com", "gpu-0"),
        ("devices-1", DRIVER, "gpu-0"),
        ("devices-1", DRIVER, "gpu-1"),
    }


@pytest.mark.parametrize(
    ("devices", "why"),
    [
        ([], "at least one"),
        ([ref(f"gpu-{i}") for i in range(MAX_RESULTS + 1)], "at most 32"),
        ([ref("gpu-0"), ref("gpu-0")], "twice"),
    ],
    ids=["none", "too-many", "twice"],
)
def test_a_claim_the_api_would_refuse_is_not_built(devices: list[DeviceRef], why: str) -> None:
    with pytest.raises(ValueError, match=why):
        build_group_claim(group(), "n1", devices, NS, DRIVER)


def test_a_group_claim_needs_a_stored_group() -> None:
    with pytest.raises(ValueError, match="uid"):
        build_group_claim({"metadata": {"name": "new"}}, "n1", [ref("gpu-0")], NS, DRIVER)


def test_only_labelled_claims_in_the_managers_namespace_are_groups_claims() -> None:
    labels = {ROLE_LABEL: ROLE_GROUP_CLAIM}
    annotations = {CLAIM_FOR_ANNOTATION: "train"}
    ours = claim("sdg-group.train", NS, labels=labels, annotations=annotations)
    decoy = claim("sdg-group.train", "apps", labels=labels, annotations=annotations)
    unnamed = claim("sdg-group.x", NS, labels=labels)
    assert holder_of(ours, NS) == "train"
    assert holder_of(decoy, NS) == "ResourceClaim apps/sdg-group.train"
    assert holder_of(unnamed, NS) == "ResourceClaim deviceshare-system/sdg-group.x"
    assert not is_group_claim(ours, None) and holder_of(ours, None).startswith("ResourceClaim")


def test_the_mirror_names_the_holder_of_every_allocated_device() -> None:
    changes: list[frozenset[tuple[str, str]]] = []
    mirror = DraAllocations(NS, on_change=changes.append)
    ours = build_group_claim(group(), "n1", [ref("gpu-1"), ref("gpu-3")], NS, DRIVER)
    plain = claim("four", results=[result("gpu-0"), result("gpu-2"), result("gpu-0", pool="n2")])
    mirror.observe(ours)
    mirror.observe(plain)
    mirror.observe(claim("pending"))  # not allocated: holds nothing
    assert dict(mirror.holders(DRIVER, "n1")) == {
        "gpu-0": ("ResourceClaim apps/four",),
        "gpu-1": ("train",),
        "gpu-2": ("ResourceClaim apps/four",),
        "gpu-3": ("train",),
    }
    assert dict(mirror.holders(DRIVER, "n2")) == {"gpu-0": ("ResourceClaim apps/four",)}
    assert mirror.held_by(ref("gpu-3")) == ("train",) and mirror.held_by(ref("gpu-4")) == ()
    assert mirror.devices_of("apps", "four") == (ref("gpu-0"), ref("gpu-2"), ref("gpu-0", "n2"))
    assert len(mirror) == 2 and mirror.pools() == {(DRIVER, "n1"), (DRIVER, "n2")}
    assert changes == [frozenset({(DRIVER, "n1")}), frozenset({(DRIVER, "n1"), (DRIVER, "n2")})]


def test_the_mirror_follows_allocations_and_entries_go_with_their_claims() -> None:
    changes: list[frozenset[tuple[str, str]]] = []
    mirror = DraAllocations(NS, on_change=changes.append)
    c = claim("c", results=[result("gpu-0")])
    mirror.observe(c)
    mirror.observe(c)  # a resync: nothing changed, nobody told
    assert len(changes) == 1
    mirror.observe(claim("c", results=[result("gpu-1")]))  # re-allocated elsewhere
    assert dict(mirror.holders(DRIVER, "n1")) == {"gpu-1": ("ResourceClaim apps/c",)}
    mirror.observe(claim("c"))  # deallocated (kube-controller-manager cleared it)
    assert dict(mirror.holders(DRIVER, "n1")) == {} and len(mirror) == 0
    mirror.observe(claim("c", results=[result("gpu-2")]))
    mirror.forget(claim("c"))  # deleted: its last state need not say what it held
    assert mirror.pools() == frozenset() and len(mirror) == 0
    mirror.forget(claim("never-seen"))
    assert len(changes) == 5


def test_a_device_two_claims_were_given_shows_both() -> None:
    """The books are not fenced against each other: a race shows, it does not hide."""
    mirror = DraAllocations(NS)
    mirror.observe(build_group_claim(group(), "n1", [ref("gpu-0")], NS, DRIVER))
    mirror.observe(claim("raced", results=[result("gpu-0")]))
    assert mirror.holders(DRIVER, "n1")["gpu-0"] == ("ResourceClaim apps/raced", "train")
    mirror.forget(claim("raced"))
    assert mirror.holders(DRIVER, "n1")["gpu-0"] == ("train",)


@pytest.mark.anyio
async def test_ensure_refuses_devices_the_mirror_shows_held_before_any_write() -> None:
    mirror = DraAllocations(NS)
    mirror.observe(claim("four", results=[result("gpu-2")]))
    mirror.observe(build_group_claim(group("other", "uid-o"), "n1", [ref("gpu-3")], NS, DRIVER))
    mirror.observe(build_group_claim(group(), "n1", [ref("gpu-1")], NS, DRIVER))  # its own
    client = FakeClient()
    publisher = DraPublisher(as_client(client), NS, allocations=mirror)
    with pytest.raises(DevicesHeldElsewhere) as refused:
        await publisher.ensure(group(), "n1", [ref("gpu-1"), ref("gpu-2"), ref("gpu-3")])
    assert client.writes() == []  # refused before any write
    message = str(refused.value)
    assert "gpu.nvidia.com/n1/gpu-2 by ResourceClaim apps/four" in message
    assert "gpu.nvidia.com/n1/gpu-3 by other" in message
    assert "gpu-1" not in message

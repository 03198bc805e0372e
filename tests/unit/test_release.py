"""Giving a Pending group's claim back fences the group first (``ClaimReleaser``): a bind
of it in flight elsewhere, conditional on the version it read, must fail rather than mark
the group Bound on devices that are about to be freed."""

from __future__ import annotations

from typing import Any

import pytest

from controllers.ledger.records import Claim
from controllers.ledger.release import REASON_CLAIM_GIVEN_BACK, ClaimReleaser
from sdgruntime import errors

pytestmark = pytest.mark.anyio

Obj = dict[str, Any]


class Claims:
    def __init__(self, node: str, uid: str) -> None:
        self.node, self.uid = node, uid
        self.version = "3"  # the group version the claim was decided (or renewed) on
        self.log: list[str] = []

    def nodes_claiming(self, name: str) -> list[str]:
        return [self.node]

    def uid_of(self, node: str, name: str) -> str:
        return self.uid

    def claim(self, node: str, name: str) -> Claim:
        return Claim({"nvidia.com/gpu": [0]}, self.uid, self.version)

    async def write(self, node: str, name: str, devices: Any, *, expect: Claim | None) -> None:
        assert devices is None and expect is not None
        self.log.append(f"release {name} on {node} if still at version {expect.version}")


class Writer:
    def __init__(self, live: Obj | None, claims: Claims, fail: Exception | None = None):
        self._live, self.claims, self.fail = live, claims, fail
        self.written: list[Obj] = []
        #: A bind elsewhere renews the claim while the live read is in flight.
        self.renewed_meanwhile = False

    async def live(self, name: str) -> Obj | None:
        if self.renewed_meanwhile:
            self.claims.version = "9"
        return self._live

    async def status(self, group: Obj, status: Obj) -> Obj | None:
        self.claims.log.append(
            f"status of {group['metadata']['name']} at rv {group['metadata']['resourceVersion']}"
        )
        if self.fail is not None:
            raise self.fail
        written = {
            **group,
            "metadata": {**group["metadata"], "resourceVersion": "8"},
            "status": status,
        }
        self.written.append(written)
        return written


class Cache:
    def list(self, *args: Any, **kwargs: Any) -> list[Obj]:
        return []  # no pods of the group run anywhere


def pending(uid: str = "u1") -> Obj:
    return {
        "metadata": {"name": "g", "uid": uid, "resourceVersion": "7"},
        "status": {"phase": "Pending"},
    }


async def test_a_pending_groups_claim_is_released_only_after_its_status_was_bumped() -> None:
    claims = Claims("n1", "u1")
    writer = Writer(pending(), claims)
    releaser = ClaimReleaser(claims, writer, Cache())  # type: ignore[arg-type]
    live = await releaser.release_stale("g")
    assert claims.log == [
        "status of g at rv 7",
        "release g on n1 if still at version 3",
    ]  # the fence first
    assert live is not None and live["metadata"]["resourceVersion"] == "8"
    cond = writer.written[0]["status"]["conditions"][-1]
    assert (cond["type"], cond["status"], cond["reason"]) == (
        "Scheduled",
        "False",
        REASON_CLAIM_GIVEN_BACK,
    )
    assert "n1" in cond["message"]


@pytest.mark.parametrize("failure", [errors.Conflict("first", code=409), errors.NotFound("gone")])
async def test_when_someone_wrote_the_group_first_nothing_is_released(failure: Exception) -> None:
    claims = Claims("n1", "u1")
    releaser = ClaimReleaser(claims, Writer(pending(), claims, fail=failure), Cache())  # type: ignore[arg-type]
    assert await releaser.release_stale("g") is None
    assert claims.log == ["status of g at rv 7"]  # no release


async def test_orphans_and_claims_of_other_incarnations_need_no_fence() -> None:
    for live in (None, pending(uid="u2")):
        claims = Claims("n1", "u1")
        writer = Writer(live, claims)
        await ClaimReleaser(claims, writer, Cache()).release_stale("g")  # type: ignore[arg-type]
        assert claims.log == ["release g on n1 if still at version 3"]


async def test_the_release_is_conditional_on_the_claim_as_judged_before_the_live_read() -> None:
    # A bind in another manager adopts the claim and renews it while our live read is in
    # flight: the release must be conditional on the claim we judged (version 3), so the
    # claim book refuses it rather than freeing devices that bind is about to get.
    claims = Claims("n1", "u1")
    writer = Writer(pending(), claims)
    writer.renewed_meanwhile = True
    await ClaimReleaser(claims, writer, Cache()).release_stale("g")  # type: ignore[arg-type]
    assert claims.log == ["status of g at rv 7", "release g on n1 if still at version 3"]


class PodLister:
    """The API server's pods (a live list by node), unlike the cache, which has none."""

    def __init__(self, pods: list[Obj]) -> None:
        self.pods = pods
        self.asked: list[str | None] = []

    async def list_all(
        self, kind: Any, namespace: str | None, *, field_selector: str, transform: Any
    ) -> tuple[list[Obj], str]:
        self.asked.append(field_selector)
        node = field_selector.removeprefix("spec.nodeName=")
        return [transform(p) for p in self.pods if p["spec"]["nodeName"] == node], "1"


def member(phase: str = "Running") -> Obj:
    return {
        "metadata": {
            "name": "early",
            "namespace": "ml",
            "annotations": {"deviceshare.io/group": "g"},
        },
        "spec": {"nodeName": "n1", "containers": [{"name": "c"}]},
        "status": {"phase": phase},
    }


@pytest.mark.parametrize("phase, kept", [("Running", True), ("Succeeded", False)])
async def test_a_deleted_groups_claims_stay_while_a_live_read_finds_its_pods(
    phase: str, kept: bool
) -> None:
    """A pod created with nodeName set needs no binding: the cache may not have it yet
    when the group's finalizer runs. The node's pods are read live first."""
    claims = Claims("n1", "u1")
    deleting = {"metadata": {"name": "g", "uid": "u1", "deletionTimestamp": "now"}}
    writer = Writer(deleting, claims)
    writer.client = PodLister([member(phase)])  # type: ignore[attr-defined]
    releaser = ClaimReleaser(claims, writer, Cache())  # type: ignore[arg-type]
    assert await releaser.release_deleted(deleting) is (not kept)
    assert writer.client.asked == ["spec.nodeName=n1"]  # type: ignore[attr-defined]
    assert bool(claims.log) is (not kept)

"""Giving a Pending group's claim back fences the group first (``ClaimReleaser``): a bind
of it in flight elsewhere, conditional on the version it read, must fail rather than mark
the group Bound on devices that are about to be freed."""

from __future__ import annotations

from typing import Any

import pytest

from api.constants import REASON_CLAIM_GIVEN_BACK, SDG_KIND
from controllers.groupwriter import GroupWriter
from controllers.ledger.records import Claim
from controllers.ledger.release import ClaimReleaser
from sdgruntime import errors
from sdgruntime.envtest import FakeClient
from tests.factories import as_client

pytestmark = pytest.mark.anyio

Obj = dict[str, Any]


class Claims:
    def __init__(self, node: str, uid: str) -> None:
        self.node, self.uid = node, uid
        self.version = "3"  # the group version the claim was decided (or renewed) on
        self.log: list[str] = []
        self.writer = self

    def nodes_claiming(self, name: str) -> list[str]:
        return [self.node]

    def uid_of(self, node: str, name: str) -> str:
        return self.uid

    def claim(self, node: str, name: str) -> Claim:
        return Claim({"nvidia.com/gpu": [0]}, self.uid, self.version)

    async def write(self, node: str, name: str, devices: Any, *, expect: Claim | None) -> None:
        assert devices is None and expect is not None
        self.log.append(f"release {name} on {node} if still at version {expect.version}")


class Api:
    """The API server as the releaser reads it: the group live, a node's pods live."""

    def __init__(self, live: Obj | None, claims: Claims, pods: tuple[Obj, ...] = ()) -> None:
        self._live, self.claims, self.pods = live, claims, list(pods)
        self.asked: list[str] = []
        #: A bind elsewhere renews the claim while the live read is in flight.
        self.renewed_meanwhile = False

    async def get(self, kind: Any, name: str) -> Obj:
        if self.renewed_meanwhile:
            self.claims.version = "9"
        if self._live is None:
            raise errors.NotFound(name)
        return self._live

    async def list_all(
        self, kind: Any, namespace: str | None, *, field_selector: str, transform: Any
    ) -> tuple[list[Obj], str]:
        self.asked.append(field_selector)
        node = field_selector.removeprefix("spec.nodeName=")
        return [transform(p) for p in self.pods if p["spec"]["nodeName"] == node], "1"


class Fence:
    """``GroupWriter.fence`` as the releaser sees it: bumps the group, or says someone
    wrote it first (None)."""

    def __init__(self, claims: Claims, first: bool = False) -> None:
        self.claims, self.first = claims, first

    async def __call__(self, live: Obj, node: str) -> Obj | None:
        self.claims.log.append(
            f"status of {live['metadata']['name']} at rv {live['metadata']['resourceVersion']}"
        )
        if self.first:
            return None
        return {**live, "metadata": {**live["metadata"], "resourceVersion": "8"}}


def releaser(claims: Claims, api: Api, fence: Fence | None = None) -> ClaimReleaser:
    return ClaimReleaser(claims, Cache(), api, fence or Fence(claims))  # type: ignore[arg-type]


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
    live = await releaser(claims, Api(pending(), claims)).release_stale("g")
    assert claims.log == [
        "status of g at rv 7",
        "release g on n1 if still at version 3",
    ]  # the fence first
    assert live is not None and live["metadata"]["resourceVersion"] == "8"


async def test_when_someone_wrote_the_group_first_nothing_is_released() -> None:
    claims = Claims("n1", "u1")
    fence = Fence(claims, first=True)
    assert await releaser(claims, Api(pending(), claims), fence).release_stale("g") is None
    assert claims.log == ["status of g at rv 7"]  # no release


async def test_orphans_and_claims_of_other_incarnations_need_no_fence() -> None:
    for live in (None, pending(uid="u2")):
        claims = Claims("n1", "u1")
        await releaser(claims, Api(live, claims)).release_stale("g")
        assert claims.log == ["release g on n1 if still at version 3"]


async def test_the_release_is_conditional_on_the_claim_as_judged_before_the_live_read() -> None:
    # A bind in another manager adopts the claim and renews it while our live read is in
    # flight: the release must be conditional on the claim we judged (version 3), so the
    # ledger refuses it rather than freeing devices that bind is about to get.
    claims = Claims("n1", "u1")
    api = Api(pending(), claims)
    api.renewed_meanwhile = True
    await releaser(claims, api).release_stale("g")
    assert claims.log == ["status of g at rv 7", "release g on n1 if still at version 3"]


def groups(*objects: Obj) -> FakeClient:
    """The API server's groups, status a subresource as for the CRD."""
    return FakeClient([(SDG_KIND, o) for o in objects], status_subresource=[SDG_KIND])


async def test_the_fence_says_why_the_group_is_placed_again() -> None:
    client = groups(pending())
    live = client.stored(SDG_KIND, "g")
    rv = live["metadata"]["resourceVersion"]
    fenced = await GroupWriter(as_client(client)).fence(live, "n1")
    assert fenced is not None and int(fenced["metadata"]["resourceVersion"]) > int(rv)
    cond = client.stored(SDG_KIND, "g")["status"]["conditions"][-1]
    assert (cond["type"], cond["status"], cond["reason"]) == (
        "Scheduled",
        "False",
        REASON_CLAIM_GIVEN_BACK,
    )
    assert "n1" in cond["message"] and f"resourceVersion {rv}" in cond["message"]


@pytest.mark.parametrize("race", ["written first", "deleted"])
async def test_a_fence_that_loses_the_race_says_none(race: str) -> None:
    client = groups(pending())
    live = client.stored(SDG_KIND, "g")
    if race == "written first":  # a 409 for the fence's conditional write
        client.add(SDG_KIND, {**live, "status": {"phase": "Bound", "nodeName": "n2"}})
    else:  # a 404
        await client.delete(SDG_KIND, "g")
    assert await GroupWriter(as_client(client)).fence(live, "n1") is None
    assert [a.verb for a in client.writes()][-1] == "update"  # it did try


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
    api = Api(deleting, claims, (member(phase),))
    assert await releaser(claims, api).release_deleted(deleting) is (not kept)
    assert api.asked == ["spec.nodeName=n1"]
    assert bool(claims.log) is (not kept)

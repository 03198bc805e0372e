"""Giving a Pending group's claim back fences the group first (``ClaimReleaser``): a bind
of it in flight elsewhere, conditional on the version it read, must fail rather than mark
the group Bound on devices that are about to be freed."""

from __future__ import annotations

from typing import Any

import pytest

from controllers.release import REASON_CLAIM_GIVEN_BACK, ClaimReleaser
from sdgruntime import errors

pytestmark = pytest.mark.anyio

Obj = dict[str, Any]


class Claims:
    def __init__(self, node: str, uid: str) -> None:
        self.node, self.uid = node, uid
        self.log: list[str] = []

    def nodes_claiming(self, name: str) -> list[str]:
        return [self.node]

    def uid_of(self, node: str, name: str) -> str:
        return self.uid

    async def write(self, node: str, name: str, devices: Any) -> None:
        self.log.append(f"release {name} on {node}")


class Writer:
    def __init__(self, live: Obj | None, claims: Claims, fail: Exception | None = None):
        self._live, self.claims, self.fail = live, claims, fail
        self.written: list[Obj] = []

    async def live(self, name: str) -> Obj | None:
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
    assert claims.log == ["status of g at rv 7", "release g on n1"]  # the fence first
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
        assert claims.log == ["release g on n1"]

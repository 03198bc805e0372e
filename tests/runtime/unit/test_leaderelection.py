"""Leader election rules that need no API server: duration validation and the base of
the first renew deadline (a fake client and a fake monotonic clock)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import anyio
import pytest
from pydantic import ValidationError

from sdgruntime import errors
from sdgruntime.envtest import FakeClient
from sdgruntime.kinds import LEASES, Kind
from sdgruntime.leaderelection import LeaderElectionLost, LeaderElector
from sdgruntime.manager import ManagerOptions
from tests.runtime.helpers import as_client


def elector(
    *, lease_duration: float = 15.0, renew_deadline: float = 10.0, retry_period: float = 2.0
) -> LeaderElector:
    """An elector that is never run: only its duration checks are tested."""
    return LeaderElector(
        as_client(FakeClient()),
        "l",
        "ns",
        lease_duration=lease_duration,
        renew_deadline=renew_deadline,
        retry_period=retry_period,
    )


def test_lease_duration_must_be_whole_seconds_as_the_lease_stores_it() -> None:
    # 10.4 would be written as 10, which does not exceed a renew deadline of 10.3.
    with pytest.raises(ValueError, match="whole number of seconds"):
        elector(lease_duration=10.4, renew_deadline=10.3, retry_period=2)
    with pytest.raises(ValidationError, match="whole number of seconds"):
        ManagerOptions(
            leader_election=True,
            leader_election_id="x",
            lease_duration=10.4,
            renew_deadline=10.3,
        )
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="finite"):
            elector(lease_duration=bad)
        with pytest.raises(ValueError, match="finite"):
            elector(renew_deadline=bad)
    assert elector(lease_duration=11, renew_deadline=10.5, retry_period=2).lease_duration == 11
    ManagerOptions(
        leader_election=True,
        leader_election_id="x",
        leader_election_namespace="ns",
        lease_duration=16.0,
    )


class SlowToAcquire(FakeClient):
    """The lease is absent and creating it takes ``create_takes`` seconds of the clock;
    every renewal fails after ``renew_takes`` seconds (an API server that went away)."""

    def __init__(self, clock: list[float], create_takes: float, renew_takes: float) -> None:
        super().__init__()
        self.clock, self.create_takes, self.renew_takes = clock, create_takes, renew_takes
        self.renewals = 0

    async def get(self, kind: Kind, name: str, namespace: str | None = None) -> dict[str, Any]:
        assert kind == LEASES
        await super().get(kind, name, namespace)  # NotFound until the lease is created
        self.renewals += 1
        self.clock[0] += self.renew_takes
        raise errors.ServerError("etcd unavailable", code=503)

    async def create(
        self, kind: Kind, obj: Mapping[str, Any], namespace: str | None = None, **kw: Any
    ) -> dict[str, Any]:
        self.clock[0] += self.create_takes
        return await super().create(kind, obj, namespace, **kw)


@pytest.mark.anyio
async def test_renew_deadline_counts_from_the_start_of_the_acquiring_attempt() -> None:
    """An acquire that took 9.9 s of a 10 s renew deadline leaves 0.1 s to renew in: others
    started counting the lease when they saw our write, not when our call returned."""
    clock = [100.0]
    client = SlowToAcquire(clock, create_takes=9.9, renew_takes=0.2)
    e = LeaderElector(
        as_client(client),
        "l",
        "ns",
        lease_duration=15,
        renew_deadline=10,
        retry_period=0.01,
        clock=lambda: clock[0],
    )
    events: list[str] = []
    with anyio.fail_after(30), pytest.raises(LeaderElectionLost):
        await e.run(lambda: events.append("started"), lambda: events.append("stopped"))
    assert events == ["started", "stopped"]
    assert client.stored(LEASES, "l", "ns")["spec"]["leaseDurationSeconds"] == 15
    # One renewal (at 109.9, before the deadline at 110), then lost: not ~50 more attempts
    # until a deadline counted from when the create returned (119.9).
    assert client.renewals == 1
    assert clock[0] == pytest.approx(110.1)

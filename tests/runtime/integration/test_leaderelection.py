"""Leader election against the real API server: the Lease record, takeover after expiry,
immediate takeover after a release, loss when another holder appears; and two Managers of
which only the leader reconciles.

Durations are short (lease 3 s, renew 2 s, retry 0.5 s) to keep the tests fast; the
``fail_after`` bounds are generous hang guards, not timing assertions.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import anyio
import pytest

from sdgruntime import errors
from sdgruntime.cache import KindOptions
from sdgruntime.client import Client
from sdgruntime.envtest import FakeClient
from sdgruntime.kinds import CONFIGMAPS, LEASES
from sdgruntime.leaderelection import LeaderElectionLost, LeaderElector
from sdgruntime.manager import Manager, ManagerOptions
from sdgruntime.metrics import REGISTRY
from sdgruntime.reconcile import Request
from tests.runtime.helpers import as_client

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

FAST = {"lease_duration": 3.0, "renew_deadline": 2.0, "retry_period": 0.5}


def lease_name() -> str:
    return f"lease-{uuid.uuid4().hex[:8]}"


async def lease_spec(client: Client, name: str, namespace: str) -> dict[str, Any]:
    return (await client.get(LEASES, name, namespace))["spec"]


async def until(predicate: Callable[[], Any], within: float = 20.0) -> None:
    """Poll ``predicate`` (sync or async) until true; fail after ``within`` s (hang guard)."""
    with anyio.fail_after(within):
        while True:
            value = predicate()
            if hasattr(value, "__await__"):
                value = await value
            if value:
                return
            await anyio.sleep(0.05)


class Candidate:
    """An elector with its own client, run in its own cancel scope."""

    def __init__(self, kubeconfig: str, name: str, namespace: str, **kwargs: Any) -> None:
        self.client = Client.from_kubeconfig(kubeconfig)
        self.elector = LeaderElector(self.client, name, namespace, **{**FAST, **kwargs})
        self.scope = anyio.CancelScope()
        self.events: list[str] = []
        self.error: BaseException | None = None
        self.done = anyio.Event()

    async def run(self) -> None:
        try:
            with self.scope:
                await self.elector.run(
                    lambda: self.events.append("started"), lambda: self.events.append("stopped")
                )
        except LeaderElectionLost as exc:
            self.error = exc
        finally:
            await self.client.aclose()
            self.done.set()


async def test_a_lone_candidate_creates_the_lease_and_keeps_renewing_it(
    kubeconfig: str, client: Client, namespace: str
) -> None:
    name = lease_name()
    a = Candidate(kubeconfig, name, namespace)
    async with anyio.create_task_group() as tg:
        tg.start_soon(a.run)
        await until(lambda: a.events == ["started"])
        spec = await lease_spec(client, name, namespace)
        assert spec["holderIdentity"] == a.elector.identity
        assert spec["leaseDurationSeconds"] == 3
        assert spec["leaseTransitions"] == 0
        assert spec["acquireTime"] and spec["renewTime"]
        assert REGISTRY.get_sample_value("leader_election_master_status", {"name": name}) == 1

        first_renew = spec["renewTime"]

        async def renewed() -> bool:
            s = await lease_spec(client, name, namespace)
            return s["renewTime"] != first_renew and s["acquireTime"] == spec["acquireTime"]

        await until(renewed)
        a.scope.cancel()
    assert a.events == ["started", "stopped"]
    assert REGISTRY.get_sample_value("leader_election_master_status", {"name": name}) == 0
    # without release_on_cancel the record stays until it expires
    assert (await lease_spec(client, name, namespace))["holderIdentity"] == a.elector.identity


async def test_a_standby_takes_over_once_the_leader_stops_renewing(
    kubeconfig: str, client: Client, namespace: str
) -> None:
    name = lease_name()
    a, b = Candidate(kubeconfig, name, namespace), Candidate(kubeconfig, name, namespace)
    async with anyio.create_task_group() as tg:
        tg.start_soon(a.run)
        await until(lambda: a.elector.is_leader)
        tg.start_soon(b.run)
        # b keeps seeing a valid lease while a renews it: wait for two of a's renewals
        seen: set[str] = set()

        async def two_renewals() -> bool:
            seen.add((await lease_spec(client, name, namespace))["renewTime"])
            return len(seen) >= 3

        await until(two_renewals)
        assert not b.elector.is_leader and b.events == []
        assert b.elector.leader == a.elector.identity

        a.scope.cancel()  # a dies without releasing
        await until(lambda: b.elector.is_leader)
        spec = await lease_spec(client, name, namespace)
        assert spec["holderIdentity"] == b.elector.identity
        assert spec["leaseTransitions"] == 1
        b.scope.cancel()


async def test_release_on_cancel_hands_over_without_waiting_for_expiry(
    kubeconfig: str, client: Client, namespace: str
) -> None:
    name = lease_name()
    # A 60 s lease: a takeover within the 15 s guard below is only possible by release.
    slow = {"lease_duration": 60.0, "renew_deadline": 10.0, "retry_period": 0.5}
    a = Candidate(kubeconfig, name, namespace, release_on_cancel=True, **slow)
    b = Candidate(kubeconfig, name, namespace, **slow)
    async with anyio.create_task_group() as tg:
        tg.start_soon(a.run)
        await until(lambda: a.elector.is_leader)
        tg.start_soon(b.run)
        await until(lambda: b.elector.leader == a.elector.identity)
        a.scope.cancel()
        await a.done.wait()
        await until(lambda: b.elector.is_leader, within=15)
        spec = await lease_spec(client, name, namespace)
        assert spec["holderIdentity"] == b.elector.identity
        assert spec["leaseTransitions"] == 1
        b.scope.cancel()


async def test_a_leader_that_sees_another_holder_stops_at_once(
    kubeconfig: str, client: Client, namespace: str
) -> None:
    name = lease_name()
    a = Candidate(kubeconfig, name, namespace)
    async with anyio.create_task_group() as tg:
        tg.start_soon(a.run)
        await until(lambda: a.elector.is_leader)
        # another party takes the lease over (e.g. after a network partition healed)
        while True:
            lease = await client.get(LEASES, name, namespace)
            lease["spec"]["holderIdentity"] = "intruder"
            try:
                await client.update(LEASES, lease)
                break
            except errors.Conflict:
                continue  # a renewed meanwhile; a conditional write either way
        await a.done.wait()
    assert isinstance(a.error, LeaderElectionLost)
    assert a.events == ["started", "stopped"]
    assert (await lease_spec(client, name, namespace))["holderIdentity"] == "intruder"


def test_durations_must_leave_room_to_stop_before_others_take_over() -> None:
    with pytest.raises(ValueError, match="lease_duration"):
        LeaderElector(as_client(FakeClient()), "l", "ns", lease_duration=10, renew_deadline=10)
    with pytest.raises(ValueError, match="retry_period"):
        LeaderElector(as_client(FakeClient()), "l", "ns", renew_deadline=2, retry_period=2)


# --- two managers ------------------------------------------------------------------------------


class Recorder:
    def __init__(self, who: str, log: list[tuple[str, Request]]) -> None:
        self.who, self.log = who, log

    async def reconcile(self, request: Request) -> None:
        self.log.append((self.who, request))


def make_manager(
    kubeconfig: str, namespace: str, lease: str, who: str, log: list[Any], **extra: Any
) -> Manager:
    options = ManagerOptions(
        kubeconfig=kubeconfig,
        metrics_bind_address="0",
        health_probe_bind_address="0",
        leader_election=True,
        leader_election_id=lease,
        leader_election_namespace=namespace,
        leader_election_identity=who,
        cache_by_kind={CONFIGMAPS: KindOptions(namespace=namespace)},
        **{**FAST, **extra},
    )
    mgr = Manager(options=options)
    mgr.controller(f"cm-{lease}-{who}").for_(CONFIGMAPS).complete(Recorder(who, log))
    return mgr


async def run_in_scope(mgr: Manager, scope: anyio.CancelScope, done: anyio.Event) -> None:
    try:
        with scope:
            await mgr.run_until_cancelled()
    finally:
        done.set()


def cm(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {}}


@pytest.mark.parametrize("release", [False, True], ids=["expiry", "release-on-cancel"])
async def test_only_the_leader_manager_reconciles_and_the_standby_takes_over(
    kubeconfig: str, client: Client, namespace: str, release: bool
) -> None:
    lease, log = lease_name(), []
    extra: dict[str, Any] = {"leader_election_release_on_cancel": release}
    if release:  # a long lease: only a release lets the standby in within the guard
        extra |= {"lease_duration": 60.0, "renew_deadline": 10.0}
    else:  # room for a slow renew on a loaded machine: the new leader must keep its lease
        extra |= {"lease_duration": 6.0, "renew_deadline": 4.0}
    a = make_manager(kubeconfig, namespace, lease, "a", log, **extra)
    b = make_manager(kubeconfig, namespace, lease, "b", log, **extra)
    a_scope, a_done = anyio.CancelScope(), anyio.Event()
    b_scope, b_done = anyio.CancelScope(), anyio.Event()
    await client.create(CONFIGMAPS, cm("before"), namespace)
    async with anyio.create_task_group() as tg:
        tg.start_soon(run_in_scope, a, a_scope, a_done)
        with anyio.fail_after(20):
            await a.wait_for_leadership()
        tg.start_soon(run_in_scope, b, b_scope, b_done)
        await until(lambda: b.elector is not None and b.elector.leader == "a")

        await client.create(CONFIGMAPS, cm("while-a-leads"), namespace)
        await until(lambda: ("a", Request("while-a-leads", namespace)) in log)
        assert not b.is_leader
        assert {who for who, _ in log} == {"a"}

        a_scope.cancel()
        await a_done.wait()
        with anyio.fail_after(15 if release else 20):
            await b.wait_for_leadership()
        # the new leader reconciles every object it finds, then new events
        await until(lambda: ("b", Request("while-a-leads", namespace)) in log)
        await client.create(CONFIGMAPS, cm("after"), namespace)
        await until(lambda: ("b", Request("after", namespace)) in log)
        assert ("a", Request("after", namespace)) not in log
        spec = await lease_spec(client, lease, namespace)
        assert spec["holderIdentity"] == "b" and spec["leaseTransitions"] == 1
        b_scope.cancel()

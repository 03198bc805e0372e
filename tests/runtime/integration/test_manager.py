"""The Manager against the real API server: metrics over HTTP after real reconciles,
probes and readiness, graceful shutdown that lets an in-flight reconcile land its write
before the lease is released, lost leadership, runnables, and a cache that cannot sync."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sdgruntime import errors
from sdgruntime.cache import CacheSyncError, KindOptions
from sdgruntime.client import Client
from sdgruntime.envtest import ControlPlane
from sdgruntime.kinds import CONFIGMAPS, LEASES, Kind
from sdgruntime.leaderelection import LeaderElectionLost
from sdgruntime.manager import Manager, ManagerOptions
from sdgruntime.reconcile import Request
from sdgruntime.webhook import AdmissionRequest, AdmissionResponse, allowed

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

FAST = {"lease_duration": 3.0, "renew_deadline": 2.0, "retry_period": 0.5}


def cm(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}}


def only(namespace: str) -> dict[Kind, KindOptions]:
    return {CONFIGMAPS: KindOptions(namespace=namespace)}


async def until(predicate: Callable[[], Any], within: float = 20.0) -> None:
    """Poll until ``predicate()`` is true; a hang guard, not a timing assertion."""
    with anyio.fail_after(within):
        while not predicate():  # noqa: ASYNC110 - polls state of other tasks and the API
            await anyio.sleep(0.02)


async def allow_all(request: AdmissionRequest) -> AdmissionResponse:
    return allowed()


async def noop(request: Request) -> None:
    return None


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(scraped: dict[Any, float], metric: str, /, **labels: str) -> float | None:
    return scraped.get((metric, frozenset(labels.items())))


async def test_metrics_are_served_with_controller_runtime_names(
    kubeconfig: str, client: Client, namespace: str
) -> None:
    ctrl = f"metrics-{uuid.uuid4().hex[:6]}"
    lease = f"lease-{ctrl}"
    mgr = Manager(
        options=ManagerOptions(
            kubeconfig=kubeconfig,
            metrics_bind_address="127.0.0.1:0",
            health_probe_bind_address="0",
            leader_election=True,
            leader_election_id=lease,
            leader_election_namespace=namespace,
            cache_by_kind=only(namespace),
            **FAST,
        )
    )
    done: list[Request] = []

    async def reconcile(request: Request) -> None:
        if not any(r == request for r in done):
            done.append(request)
            raise RuntimeError("fail once")  # so the error series count too
        done.append(request)

    mgr.controller(ctrl).for_(CONFIGMAPS).with_options(max_concurrent_reconciles=3).complete(
        reconcile
    )
    async with anyio.create_task_group() as tg:
        await tg.start(mgr.run_until_cancelled)
        await mgr.wait_for_leadership()
        for i in range(3):
            await client.create(CONFIGMAPS, cm(f"m{i}"), namespace)
        await until(lambda: len(done) >= 6)
        async with httpx.AsyncClient() as http:
            resp = await http.get(f"http://127.0.0.1:{mgr.metrics_port}/metrics")
        tg.cancel_scope.cancel()

    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/plain")
    m = samples(resp.text)
    c = {"controller": ctrl}
    wq = {"controller": ctrl, "name": ctrl}
    assert value(m, "controller_runtime_reconcile_total", **c, result="success") == 3
    assert value(m, "controller_runtime_reconcile_total", **c, result="error") == 3
    assert value(m, "controller_runtime_reconcile_total", **c, result="requeue") == 0
    assert value(m, "controller_runtime_reconcile_total", **c, result="requeue_after") == 0
    assert value(m, "controller_runtime_reconcile_errors_total", **c) == 3
    assert value(m, "controller_runtime_terminal_reconcile_errors_total", **c) == 0
    assert value(m, "controller_runtime_reconcile_time_seconds_count", **c) == 6
    assert value(m, "controller_runtime_max_concurrent_reconciles", **c) == 3
    assert value(m, "controller_runtime_active_workers", **c) == 0
    assert value(m, "workqueue_adds_total", **wq) == 6
    assert value(m, "workqueue_retries_total", **wq) == 3
    assert value(m, "workqueue_depth", **wq) == 0
    assert value(m, "workqueue_queue_duration_seconds_count", **wq) == 6
    assert value(m, "workqueue_work_duration_seconds_count", **wq) == 6
    assert value(m, "workqueue_unfinished_work_seconds", **wq) == 0
    assert value(m, "workqueue_longest_running_processor_seconds", **wq) == 0
    assert value(m, "leader_election_master_status", name=lease) == 1
    assert any(name == "rest_client_requests_total" for name, _ in m)


async def test_probes_report_ready_once_cache_and_webhook_serve(
    client: Client, namespace: str, control_plane: ControlPlane, tmp_path: Path
) -> None:
    cert_dir = control_plane.webhook_cert_dir(tmp_path / "certs")
    mgr = Manager(
        client,
        options=ManagerOptions(
            metrics_bind_address="0",
            health_probe_bind_address="127.0.0.1:0",
            webhook_host="127.0.0.1",
            webhook_port=0,
            webhook_cert_dir=str(cert_dir),
            cache_by_kind=only(namespace),
        ),
    )
    mgr.webhook_server.register("/validate", allow_all)
    mgr.controller("probed").for_(CONFIGMAPS).complete(noop)
    custom = {"ok": True}
    mgr.add_readyz_check("custom", lambda: custom["ok"])
    async with anyio.create_task_group() as tg:
        await tg.start(mgr.run_until_cancelled)
        base = f"http://127.0.0.1:{mgr.health_probe_port}"
        async with httpx.AsyncClient() as http:
            healthz = await http.get(f"{base}/healthz")
            ready = await http.get(f"{base}/readyz?verbose")
            custom["ok"] = False
            not_ready = await http.get(f"{base}/readyz")
        tg.cancel_scope.cancel()
    assert healthz.status_code == 200
    assert ready.status_code == 200, ready.text
    for check in ("cache-sync", "webhook", "custom"):
        assert f"[+]{check} ok" in ready.text
    assert not_ready.status_code == 500 and "[-]custom failed" in not_ready.text


async def test_graceful_shutdown_lets_the_in_flight_reconcile_land_its_write(
    kubeconfig: str, client: Client, namespace: str
) -> None:
    lease = f"lease-{uuid.uuid4().hex[:6]}"
    mgr = Manager(
        options=ManagerOptions(
            kubeconfig=kubeconfig,
            metrics_bind_address="0",
            health_probe_bind_address="0",
            leader_election=True,
            leader_election_id=lease,
            leader_election_namespace=namespace,
            leader_election_release_on_cancel=True,
            cache_by_kind=only(namespace),
            graceful_shutdown_timeout=30,
            **FAST,
        )
    )
    entered, release = anyio.Event(), anyio.Event()
    holder_during_write: list[str] = []

    async def slow(request: Request) -> None:
        entered.set()
        await release.wait()
        # still the leader while finishing: the lease is released only after leader work
        lease_obj = await mgr.client.get(LEASES, lease, namespace)
        holder_during_write.append(lease_obj["spec"]["holderIdentity"])
        await mgr.client.patch(
            CONFIGMAPS, request.name, {"metadata": {"annotations": {"done": "yes"}}}, namespace
        )

    mgr.controller("slow").for_(CONFIGMAPS).complete(slow)
    stop, stopped = anyio.CancelScope(), anyio.Event()

    async def run() -> None:
        with stop:
            await mgr.run_until_cancelled()
        stopped.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        await mgr.wait_for_leadership()
        identity = mgr.elector.identity if mgr.elector else ""
        await client.create(CONFIGMAPS, cm("inflight"), namespace)
        with anyio.fail_after(20):
            await entered.wait()
        stop.cancel()  # shut down while the reconcile is in flight
        await anyio.sleep(0.3)
        assert not stopped.is_set()  # the manager waits for it
        release.set()
        with anyio.fail_after(20):
            await stopped.wait()

    obj = await client.get(CONFIGMAPS, "inflight", namespace)
    assert obj["metadata"]["annotations"]["done"] == "yes"
    assert holder_during_write == [identity]
    assert (await client.get(LEASES, lease, namespace))["spec"].get("holderIdentity") in ("", None)


async def test_losing_the_lease_cancels_leader_work_at_once_and_fails_run(
    kubeconfig: str, client: Client, namespace: str
) -> None:
    lease = f"lease-{uuid.uuid4().hex[:6]}"
    mgr = Manager(
        options=ManagerOptions(
            kubeconfig=kubeconfig,
            metrics_bind_address="0",
            health_probe_bind_address="0",
            leader_election=True,
            leader_election_id=lease,
            leader_election_namespace=namespace,
            cache_by_kind=only(namespace),
            graceful_shutdown_timeout=3600,  # lost leadership must not wait for this
            **FAST,
        )
    )
    entered = anyio.Event()
    outcome: list[str] = []
    everywhere_started = anyio.Event()

    async def stuck(request: Request) -> None:
        entered.set()
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            outcome.append("cancelled")
            raise

    async def everywhere() -> None:
        everywhere_started.set()
        await anyio.sleep_forever()

    mgr.controller("stuck").for_(CONFIGMAPS).complete(stuck)
    mgr.add_runnable(everywhere, leader_only=False)
    raised: list[BaseException] = []

    async def run() -> None:
        try:
            await mgr.run_until_cancelled()
        except Exception as exc:  # run raises the error itself, not a group
            raised.append(exc)

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            await mgr.wait_for_leadership()
            await everywhere_started.wait()
            await client.create(CONFIGMAPS, cm("busy"), namespace)
            await entered.wait()
            while True:  # another replica takes the lease over
                obj = await client.get(LEASES, lease, namespace)
                obj["spec"]["holderIdentity"] = "someone-else"
                try:
                    await client.update(LEASES, obj)
                    break
                except errors.Conflict:
                    continue
    assert [type(e) for e in raised] == [LeaderElectionLost]
    assert outcome == ["cancelled"]


async def test_runnables_run_after_sync_and_leader_only_ones_only_on_the_leader(
    kubeconfig: str, namespace: str
) -> None:
    lease = f"lease-{uuid.uuid4().hex[:6]}"
    ran: list[str] = []

    def make(who: str) -> Manager:
        mgr = Manager(
            options=ManagerOptions(
                kubeconfig=kubeconfig,
                metrics_bind_address="0",
                health_probe_bind_address="0",
                leader_election=True,
                leader_election_id=lease,
                leader_election_namespace=namespace,
                cache_by_kind=only(namespace),
                **FAST,
            )
        )
        mgr.cache.informer(CONFIGMAPS)

        async def leader_only() -> None:
            ran.append(f"{who}:leader")
            await anyio.sleep_forever()

        async def everywhere() -> None:
            assert mgr.cache.informer(CONFIGMAPS).has_synced
            ran.append(f"{who}:everywhere")
            await anyio.sleep_forever()

        mgr.add_runnable(leader_only)
        mgr.add_runnable(everywhere, leader_only=False)
        return mgr

    a, b = make("a"), make("b")
    async with anyio.create_task_group() as tg:
        await tg.start(a.run_until_cancelled)
        await a.wait_for_leadership()
        await tg.start(b.run_until_cancelled)
        await until(lambda: "b:everywhere" in ran)
        await until(lambda: b.elector is not None and b.elector.leader != "")
        tg.cancel_scope.cancel()
    assert sorted(ran) == ["a:everywhere", "a:leader", "b:everywhere"]


async def test_a_cache_that_cannot_sync_fails_run_with_the_cause(
    client: Client, namespace: str
) -> None:
    missing = Kind("nowhere.example.com", "v1", "Missing", "missings", namespaced=False)
    mgr = Manager(
        client,
        options=ManagerOptions(metrics_bind_address="0", health_probe_bind_address="0"),
    )
    mgr.controller("missing").for_(missing).complete(noop)
    with (
        anyio.fail_after(30),
        pytest.raises(CacheSyncError, match=r"missings\.nowhere\.example\.com"),
    ):
        await mgr.run_until_cancelled()


def test_options_validate_leader_election_settings() -> None:
    with pytest.raises(ValueError, match="leader_election_id"):
        ManagerOptions(leader_election=True)
    with pytest.raises(ValueError, match="renew_deadline"):
        ManagerOptions(leader_election=True, leader_election_id="x", renew_deadline=20)
    with pytest.raises(ValueError):
        ManagerOptions(metrics_address=":8080")  # type: ignore[call-arg]  # typo: rejected

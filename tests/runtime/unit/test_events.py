"""EventRecorder bookkeeping that needs no API server: what a stop writes, what it drops
(and counts), and how long it may take, alone and inside the manager."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

import anyio
import anyio.abc
import pytest

from sdgruntime.envtest import FakeClient
from sdgruntime.events import EventRecorder
from sdgruntime.kinds import Kind
from sdgruntime.manager import Manager, ManagerOptions
from sdgruntime.metrics import REGISTRY
from sdgruntime.ratelimiter import BucketRateLimiter
from tests.runtime.helpers import as_client

pytestmark = pytest.mark.anyio

CM = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "ns"}}


class SlowClient(FakeClient):
    """An API server that answers every create after ``delay`` seconds."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay = delay
        self.created: list[dict[str, Any]] = []  # the events as sent

    async def create(
        self, kind: Kind, obj: Mapping[str, Any], namespace: str | None = None, **kw: Any
    ) -> dict[str, Any]:
        await anyio.sleep(self.delay)
        made = await super().create(kind, obj, namespace, **kw)
        self.created.append(dict(obj))  # what was written (the answer may be metadata only)
        return made


class GatedClient(FakeClient):
    """An API server that holds every create until ``open`` is set (never, by default)."""

    def __init__(self) -> None:
        super().__init__()
        self.creates = 0
        self.created: list[dict[str, Any]] = []  # the events as sent
        self.entered = anyio.Event()
        self.open = anyio.Event()

    async def create(
        self, kind: Kind, obj: Mapping[str, Any], namespace: str | None = None, **kw: Any
    ) -> dict[str, Any]:
        self.creates += 1
        self.entered.set()
        await self.open.wait()
        made = await super().create(kind, obj, namespace, **kw)
        self.created.append(dict(obj))  # what was written (the answer may be metadata only)
        return made


def bound(i: int) -> tuple[str, str]:
    return "Scheduled", f"pod-{i} bound to node-a"


async def start_owned(
    tg: anyio.abc.TaskGroup, recorder: EventRecorder
) -> tuple[anyio.CancelScope, anyio.Event]:
    """Run ``recorder`` in ``tg`` under a cancel scope of its own (cancelling it stops the
    recorder alone, so the test goes on to see what the drain did); the event is set once
    ``run`` has returned."""
    owner, stopped = anyio.CancelScope(), anyio.Event()

    async def run(*, task_status: anyio.abc.TaskStatus[None]) -> None:
        with owner:
            await recorder.run(task_status=task_status)
        stopped.set()

    await tg.start(run)
    return owner, stopped


async def test_events_queued_when_the_owner_is_cancelled_are_still_written(
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = SlowClient(delay=0.005)
    recorder = EventRecorder(as_client(client), "test", writers=4)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            await tg.start(recorder.run)
            for i in range(200):
                recorder.emit(CM, "Normal", *bound(i))
            tg.cancel_scope.cancel()  # at once: all 200 queued, 4 of them being written
    assert sorted(e["message"] for e in client.created) == sorted(bound(i)[1] for i in range(200))
    assert recorder.dropped == 0
    assert "dropped" not in caplog.text


async def test_emitting_while_the_recorder_stops_drops_and_never_raises(
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = GatedClient()
    recorder = EventRecorder(as_client(client), "test", writers=1)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            owner, _ = await start_owned(tg, recorder)
            recorder.emit(CM, "Normal", "First", "in flight when the stop begins")
            recorder.emit(CM, "Normal", "Second", "queued when the stop begins")
            await client.entered.wait()
            owner.cancel()
            await anyio.wait_all_tasks_blocked()  # the recorder now drains
            recorder.emit(CM, "Normal", "Late", "emitted during the drain")  # must not raise
            client.open.set()
    assert [e["reason"] for e in client.created] == ["First", "Second"]
    assert recorder.dropped == 1
    assert "dropped event Late" in caplog.text
    recorder.emit(CM, "Normal", "After", "after the stop")  # not running: dropped too
    assert recorder.dropped == 2


async def test_a_hanging_write_holds_the_stop_only_until_the_drain_timeout(
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = GatedClient()  # never answers
    recorder = EventRecorder(as_client(client), "test", writers=1, drain_timeout=0.3)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            await tg.start(recorder.run)
            for i in range(4):
                recorder.emit(CM, "Normal", f"Reason{i}", "message")
            await client.entered.wait()  # the one writer holds the first event
            tg.cancel_scope.cancel()
            stopping = anyio.current_time()
    took = anyio.current_time() - stopping
    assert 0.25 <= took < 1.3  # it waited for the write, but not past the deadline
    assert client.creates == 1
    assert recorder.dropped == 4
    assert caplog.text.count("dropped 4 events at shutdown (3 queued, 1 cut off") == 1


async def test_a_full_buffer_of_slow_writes_stops_by_the_deadline_and_every_event_is_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = SlowClient(delay=0.05)  # 2 writers: ~40 events/s, far fewer than queued
    recorder = EventRecorder(as_client(client), "test", writers=2, buffer=1000, drain_timeout=0.3)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            await tg.start(recorder.run)
            for i in range(1000):
                recorder.emit(CM, "Normal", *bound(i))
            tg.cancel_scope.cancel()
            stopping = anyio.current_time()
    assert anyio.current_time() - stopping < 1.3
    assert 0 < len(client.created) < 1000
    assert len(client.created) + recorder.dropped == 1000
    assert caplog.text.count(f"dropped {recorder.dropped} events at shutdown") == 1


async def test_abort_gives_up_on_the_drain_at_once(caplog: pytest.LogCaptureFixture) -> None:
    client = GatedClient()
    recorder = EventRecorder(as_client(client), "test", writers=1, drain_timeout=3600)
    with anyio.fail_after(10):  # the whole test: a stuck start or drain fails here
        async with anyio.create_task_group() as tg:
            owner, stopped = await start_owned(tg, recorder)
            recorder.emit(CM, "Normal", "First", "in flight")
            recorder.emit(CM, "Normal", "Second", "queued")
            await client.entered.wait()
            owner.cancel()
            await anyio.wait_all_tasks_blocked()  # draining, for up to an hour
            recorder.abort()
            with anyio.fail_after(1):
                await stopped.wait()
    assert recorder.dropped == 2
    assert caplog.text.count("dropped 2 events at shutdown (1 queued, 1 cut off") == 1


def manager(client: FakeClient, graceful_shutdown_timeout: float) -> Manager:
    options = ManagerOptions(
        metrics_bind_address="0",
        health_probe_bind_address="0",
        graceful_shutdown_timeout=graceful_shutdown_timeout,
    )
    return Manager(as_client(client), options=options)  # its cache has no informers: synced


async def stop_while_leader_work_emits(
    mgr: Manager, recorder: EventRecorder, events: int, finishing: float = 0.0
) -> float:
    """Run ``mgr`` with leader work that, once cancelled, takes ``finishing`` seconds
    (shielded: its last binds) and then emits ``events`` Events; stop the manager and
    return how long the stop took."""
    running = anyio.Event()

    async def binder() -> None:
        running.set()
        try:
            await anyio.sleep_forever()
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.sleep(finishing)
            for i in range(events):
                recorder.emit(CM, "Normal", *bound(i))

    mgr.add_runnable(binder)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(mgr.run_until_cancelled)
            await running.wait()
            tg.cancel_scope.cancel()
            stopping = anyio.current_time()
    return anyio.current_time() - stopping


async def test_the_manager_writes_the_events_its_leader_work_emits_while_stopping(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The last binds before a rolling update: emitted as leader work stops, written."""
    client = SlowClient(delay=0.005)
    mgr = manager(client, graceful_shutdown_timeout=30)
    recorder = mgr.event_recorder("test")
    await stop_while_leader_work_emits(mgr, recorder, 200)
    assert sorted(e["message"] for e in client.created) == sorted(bound(i)[1] for i in range(200))
    assert recorder.dropped == 0


async def test_one_deadline_bounds_the_managers_stop_including_the_event_drain(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Leader work that takes most of the graceful timeout leaves the recorder the rest,
    not a timeout of its own: the pod's grace period is one budget."""
    client = GatedClient()  # never answers
    mgr = manager(client, graceful_shutdown_timeout=1.0)
    recorder = mgr.event_recorder("test")
    took = await stop_while_leader_work_emits(mgr, recorder, 20, finishing=0.7)
    assert 0.95 <= took < 1.5  # 0.7 + a drain timeout of its own would be 1.7
    assert client.creates == recorder.writers == 16
    assert recorder.dropped == 20
    assert caplog.text.count("dropped 20 events at shutdown (4 queued, 16 cut off") == 1


class TimedClient(FakeClient):
    """An API server that notes when each create arrives (monotonic seconds)."""

    def __init__(self) -> None:
        super().__init__()
        self.at: list[float] = []
        self.want = 0  # ``reached`` is set once this many creates have arrived
        self.reached = anyio.Event()

    async def create(
        self, kind: Kind, obj: Mapping[str, Any], namespace: str | None = None, **kw: Any
    ) -> dict[str, Any]:
        self.at.append(anyio.current_time())
        if len(self.at) >= self.want:
            self.reached.set()
        return await super().create(kind, obj, namespace, **kw)


async def emit_burst(recorder: EventRecorder, client: TimedClient, n: int) -> list[float]:
    """Emits ``n`` distinct events at once; when each was written, from the emit on."""
    before = len(client.at)
    client.want, client.reached = before + n, anyio.Event()
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            await tg.start(recorder.run)
            start = anyio.current_time()
            for i in range(n):
                recorder.emit(CM, "Warning", *bound(i))
            await client.reached.wait()
            tg.cancel_scope.cancel()
    return sorted(t - start for t in client.at[before:])


async def test_a_burst_of_emits_reaches_the_api_server_at_the_limiters_pace() -> None:
    """The first pods of many groups on unverified nodes warn at once: the writes go out
    at ``qps`` after ``burst`` of them, every one written; unpaced, all go at once."""
    paced = TimedClient()
    limiter: BucketRateLimiter[Any] = BucketRateLimiter(qps=20, burst=5)
    recorder = EventRecorder(as_client(paced), "test", writers=16, limiter=limiter)
    at = await emit_burst(recorder, paced, 15)
    assert len(at) == 15 and recorder.dropped == 0
    assert at[4] < 0.1  # the burst
    for k in range(5, 15):  # then one each 1/qps: the k-th no sooner than (k - 4) / 20 s
        assert at[k] >= (k - 4) / 20 - 0.01, (k, at)
    unpaced = TimedClient()
    assert (await emit_burst(EventRecorder(as_client(unpaced), "test"), unpaced, 15))[-1] < 0.2


async def test_paced_writes_due_within_a_tick_go_out_together() -> None:
    """A process woken once per tick writes every Event due by then (a write after an idle
    gap costs several written in a run), never one before its token; one by one without."""

    def instants(at: list[float]) -> int:
        """Wakes of the writers: writes more than 20 ms apart (one wake's are us apart)."""
        return 1 + sum(1 for a, b in itertools.pairwise(at) if b - a > 0.02)

    ticked = TimedClient()
    limiter: BucketRateLimiter[Any] = BucketRateLimiter(qps=20, burst=5)
    recorder = EventRecorder(as_client(ticked), "test", limiter=limiter, pace_tick=0.25)
    at = await emit_burst(recorder, ticked, 15)
    assert len(at) == 15 and at[4] < 0.1  # the burst
    for k in range(5, 15):  # due at 0.05 .. 0.5 s: never sooner
        assert at[k] >= (k - 4) / 20 - 0.01, (k, at)
    assert at[-1] < 0.5 + 0.25 + 0.1  # at most a tick later
    assert instants(at[5:]) <= 3  # the ten paced writes woke the writers at most 3 times
    one_by_one = TimedClient()
    limiter = BucketRateLimiter(qps=20, burst=5)
    recorder = EventRecorder(as_client(one_by_one), "test", limiter=limiter, pace_tick=0)
    assert instants((await emit_burst(recorder, one_by_one, 15))[5:]) >= 8


async def test_the_managers_recorders_share_one_pace() -> None:
    """``event_qps``/``event_burst`` bound the manager's Event writes in all, whatever
    component writes them."""
    client = TimedClient()
    options = ManagerOptions(
        metrics_bind_address="0", health_probe_bind_address="0", event_qps=20, event_burst=4
    )
    mgr = Manager(as_client(client), options=options)
    a, b = mgr.event_recorder("a"), mgr.event_recorder("b")
    assert a.limiter is b.limiter is not None
    at = await emit_burst(a, client, 4)  # the burst, spent by a
    assert at[-1] < 0.1
    # b's 4 wait for the bucket a emptied (at 20/s: 0.2 s, less what refilled since);
    # with a bucket of its own they would go at once
    assert (await emit_burst(b, client, 4))[-1] >= 0.12


def sample(name: str, component: str) -> float:
    return REGISTRY.get_sample_value(name, {"component": component}) or 0.0


async def test_the_backlog_and_the_drops_are_metrics() -> None:
    """A paced burst shows as queued until the writers take it; what a full buffer
    refuses, and what a stop leaves unwritten, is counted as dropped."""
    client = TimedClient()
    client.want = 6
    limiter: BucketRateLimiter[Any] = BucketRateLimiter(qps=50, burst=1)
    recorder = EventRecorder(
        as_client(client), "metrics-test", buffer=5, writers=1, limiter=limiter
    )
    dropped = sample("sdgruntime_events_dropped_total", "metrics-test")
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            await tg.start(recorder.run)
            for i in range(8):  # one handed to the waiting writer, 5 buffered, 2 refused
                recorder.emit(CM, "Warning", *bound(i))
            assert sample("sdgruntime_events_queued", "metrics-test") == 6
            assert sample("sdgruntime_events_dropped_total", "metrics-test") == dropped + 2
            await client.reached.wait()
            assert sample("sdgruntime_events_queued", "metrics-test") == 0
            gate = GatedClient()  # never answers: what is queued at the stop is lost
            recorder.client = as_client(gate)
            for i in range(3):
                recorder.emit(CM, "Warning", *bound(100 + i))
            recorder.abort()
            tg.cancel_scope.cancel()
    assert sample("sdgruntime_events_queued", "metrics-test") == 0
    assert sample("sdgruntime_events_dropped_total", "metrics-test") == dropped + 2 + 3

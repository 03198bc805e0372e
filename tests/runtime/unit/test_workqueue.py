"""WorkQueue: the guarantees a reconciler relies on (dedup, dirty, one worker per key,
delays, backoff, shutdown) and the workqueue_* metrics."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import AsyncIterator

import anyio
import pytest

from sdgruntime.metrics import REGISTRY
from sdgruntime.ratelimiter import ItemExponentialFailureRateLimiter
from sdgruntime.workqueue import FakeClock, ShutDown, WorkQueue
from tests.runtime.helpers import settle

# A broken queue hangs rather than fails; the timeout turns a hang into a failure.
pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]


async def drain_ready(q: WorkQueue[str]) -> list[str]:
    """Hand out and finish every item that is ready now."""
    out = []
    while len(q):
        item = await q.get()
        q.done(item)
        out.append(item)
    return out


# --- basic queue ------------------------------------------------------------------------------


async def test_fifo_and_dedup_of_queued_items() -> None:
    q: WorkQueue[str] = WorkQueue()
    for item in ["a", "b", "a", "c", "b", "a"]:
        q.add(item)
    assert len(q) == 3
    assert await drain_ready(q) == ["a", "b", "c"]


async def test_item_added_while_processing_is_requeued_on_done() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("a")
    q.add("b")
    assert await q.get() == "a"
    q.add("a")  # dirty: must not be handed to another worker now
    q.add("a")  # still one pending run
    assert len(q) == 1
    assert await q.get() == "b"
    assert len(q) == 0
    q.done("a")
    assert len(q) == 1  # queued behind whatever came first
    assert await q.get() == "a"
    q.done("a")
    q.done("b")
    assert len(q) == 0


async def test_done_without_add_while_processing_does_not_requeue() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("a")
    q.done(await q.get())
    assert len(q) == 0


async def test_done_of_an_item_not_held_is_an_error() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("a")
    with pytest.raises(ValueError):
        q.done("a")  # queued, not handed out
    item = await q.get()
    q.done(item)
    with pytest.raises(ValueError):
        q.done(item)  # twice
    assert len(q) == 0


async def test_get_blocks_until_an_item_is_added() -> None:
    q: WorkQueue[str] = WorkQueue()
    got: list[str] = []

    async def worker() -> None:
        got.append(await q.get())

    async with anyio.create_task_group() as tg:
        tg.start_soon(worker)
        await settle()
        assert got == []
        q.add("a")
    assert got == ["a"]


async def test_cancelled_getter_passes_its_wakeup_on() -> None:
    """A getter woken for an item but cancelled before it runs (asyncio's Task.cancel
    lands then) must not take the wake-up with it: another blocked getter gets the item."""
    q: WorkQueue[str] = WorkQueue()
    first = asyncio.ensure_future(q.get())
    second = asyncio.ensure_future(q.get())
    await settle()
    q.add("a")  # wakes the first getter ...
    first.cancel()  # ... which is cancelled before it runs
    with anyio.fail_after(5):
        assert await second == "a"
    assert first.cancelled()
    assert len(q) == 0


async def test_async_iteration_ends_on_shutdown() -> None:
    q: WorkQueue[str] = WorkQueue()
    seen: list[str] = []

    async def worker(items: AsyncIterator[str]) -> None:
        async for item in items:
            seen.append(item)
            q.done(item)

    async with anyio.create_task_group() as tg:
        tg.start_soon(worker, q)
        q.add("a")
        q.add("b")
        await settle()
        q.shutdown()
    assert seen == ["a", "b"]


async def test_a_key_is_never_held_by_two_workers() -> None:
    """Many workers, many re-adds of few keys: each key is held by at most one worker, and
    every add that found its key not pending yields exactly one more hand-out."""
    q: WorkQueue[int] = WorkQueue()
    rng = random.Random(1234)
    held: set[int] = set()
    pending: set[int] = set()  # added since last handed out: the queue's "dirty" set
    epochs: Counter[int] = Counter()
    handouts: Counter[int] = Counter()
    max_parallel = 0

    async def worker() -> None:
        nonlocal max_parallel
        while True:
            try:
                key = await q.get()
            except ShutDown:
                return
            assert key not in held
            held.add(key)
            pending.discard(key)
            handouts[key] += 1
            max_parallel = max(max_parallel, len(held))
            for _ in range(rng.randrange(4)):
                await anyio.lowlevel.checkpoint()
            held.remove(key)
            q.done(key)

    async with anyio.create_task_group() as tg:
        for _ in range(8):
            tg.start_soon(worker)
        for _ in range(3000):
            key = rng.randrange(6)
            if key not in pending:
                pending.add(key)
                epochs[key] += 1
            q.add(key)
            if rng.random() < 0.5:
                await anyio.lowlevel.checkpoint()
        await settle()  # every worker idle in get(): all work done
        assert len(q) == 0 and not held
        q.shutdown()
    assert handouts == epochs
    assert max_parallel > 1  # the workers really did run side by side


# --- delays and rate limiting ----------------------------------------------------------------


async def test_add_after_orders_by_deadline_and_run_returns_on_shutdown() -> None:
    clock = FakeClock()
    q: WorkQueue[str] = WorkQueue(clock=clock)
    async with anyio.create_task_group() as tg:
        tg.start_soon(q.run)
        await settle()
        q.add_after("slow", 5.0)
        await settle()  # run() sleeps until t=5; the next add must wake it
        q.add_after("fast", 2.0)
        q.add_after("now", 0)
        q.add("plain")
        await settle()
        assert await drain_ready(q) == ["now", "plain"]
        clock.advance(1.999)
        await settle()
        assert len(q) == 0
        clock.advance(0.001)
        assert await q.get() == "fast"  # get waits for run() to move it
        q.done("fast")
        clock.advance(3.0)
        await settle()
        assert await drain_ready(q) == ["slow"]
        q.shutdown()  # run() returns; the task group can end


async def test_add_after_earlier_deadline_replaces_later_one() -> None:
    clock = FakeClock()
    q: WorkQueue[str] = WorkQueue(clock=clock)
    async with anyio.create_task_group() as tg:
        tg.start_soon(q.run)
        await settle()  # run() sleeps, nothing to wait for
        q.add_after("a", 10.0)
        await settle()  # run() sleeps until t=10
        q.add_after("a", 3.0)  # earlier wins and wakes run() to re-plan
        q.add_after("b", 4.0)
        await settle()
        q.add_after("b", 8.0)  # later is ignored
        clock.advance(3.0)
        await settle()
        assert await drain_ready(q) == ["a"]
        clock.advance(1.0)
        await settle()
        assert await drain_ready(q) == ["b"]
        clock.advance(100.0)
        await settle()
        assert len(q) == 0  # neither replaced deadline fires again
        q.shutdown()


async def test_delayed_item_already_queued_is_deduplicated() -> None:
    clock = FakeClock()
    q: WorkQueue[str] = WorkQueue(clock=clock)
    async with anyio.create_task_group() as tg:
        tg.start_soon(q.run)
        q.add_after("a", 1.0)
        q.add("a")
        clock.advance(1.0)
        await settle()
        assert await drain_ready(q) == ["a"]
        q.shutdown()


async def test_non_finite_delays_are_rejected_and_later_items_still_fire() -> None:
    clock = FakeClock()
    q: WorkQueue[str] = WorkQueue("nan-delays", clock=clock)
    async with anyio.create_task_group() as tg:
        tg.start_soon(q.run)
        q.add_after("a", 2.0)
        for bad in (float("nan"), float("inf"), float("-inf")):
            with pytest.raises(ValueError, match="finite"):
                q.add_after("bad", bad)
        q.add_after("b", 1.0)
        clock.advance(1.0)
        await settle()
        assert await drain_ready(q) == ["b"]
        clock.advance(1.0)
        await settle()
        assert await drain_ready(q) == ["a"]
        q.shutdown()
    # A rejected delay is not counted as a retry.
    assert (
        REGISTRY.get_sample_value(
            "workqueue_retries_total", {"name": "nan-delays", "controller": "nan-delays"}
        )
        == 2
    )


async def test_add_after_on_the_real_clock_wakes_a_blocked_getter() -> None:
    q: WorkQueue[str] = WorkQueue()
    async with anyio.create_task_group() as tg:
        tg.start_soon(q.run)
        q.add_after("a", 0.02)
        with anyio.fail_after(5):
            assert await q.get() == "a"
        q.shutdown()


async def test_rate_limited_requeues_back_off_until_forgotten() -> None:
    clock = FakeClock()
    q: WorkQueue[str] = WorkQueue(
        rate_limiter=ItemExponentialFailureRateLimiter(base=1.0, max=60.0), clock=clock
    )
    async with anyio.create_task_group() as tg:
        tg.start_soon(q.run)
        for attempt, delay in enumerate([1.0, 2.0, 4.0], start=1):
            q.add_rate_limited("a")
            assert q.num_requeues("a") == attempt
            clock.advance(delay - 0.5)
            await settle()
            assert len(q) == 0
            clock.advance(0.5)
            assert await q.get() == "a"
            q.done("a")
        q.forget("a")  # success: the next failure starts over
        assert q.num_requeues("a") == 0
        q.add_rate_limited("a")
        clock.advance(1.0)
        assert await q.get() == "a"
        q.done("a")
        q.shutdown()


async def test_delayed_adds_wait_for_run() -> None:
    clock = FakeClock()
    q: WorkQueue[str] = WorkQueue(clock=clock)
    q.add_after("a", 1.0)
    clock.advance(2.0)
    assert len(q) == 0  # nothing moves delayed items until run() starts
    async with anyio.create_task_group() as tg:
        tg.start_soon(q.run)
        assert await q.get() == "a"
        q.shutdown()


async def test_second_run_is_refused() -> None:
    q: WorkQueue[str] = WorkQueue()
    async with anyio.create_task_group() as tg:
        tg.start_soon(q.run)
        await settle()
        with pytest.raises(RuntimeError):
            await q.run()
        q.shutdown()


# --- shutdown --------------------------------------------------------------------------------


async def test_shutdown_abandons_queued_and_delayed_items() -> None:
    clock = FakeClock()
    q: WorkQueue[str] = WorkQueue(clock=clock)
    outcome: list[str] = []

    async def blocked_getter() -> None:
        try:
            await q.get()
        except ShutDown:
            outcome.append("shutdown")

    async with anyio.create_task_group() as tg:
        tg.start_soon(q.run)
        q.add("held")
        assert await q.get() == "held"
        tg.start_soon(blocked_getter)
        await settle()
        q.add("held")  # dirty while processing
        q.add_after("later", 1.0)
        q.shutdown()
        assert q.shutting_down
    assert outcome == ["shutdown"]  # and run() returned, so the group ended
    assert len(q) == 0
    q.add("new")
    q.add_after("new", 0)
    q.add_rate_limited("new")
    assert len(q) == 0
    assert q.num_requeues("new") == 0  # a shut-down queue charges no failure
    q.done("held")  # the held item can still be finished; its dirty re-add is dropped
    assert len(q) == 0
    with pytest.raises(ShutDown):
        await q.get()


async def test_shutdown_with_drain_waits_for_items_in_flight() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("a")
    q.add("b")
    q.add("queued")
    a, b = await q.get(), await q.get()
    q.add("a")  # dirty while processing: dropped by the shutdown
    drained = anyio.Event()

    async def drain() -> None:
        await q.shutdown_with_drain()
        drained.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(drain)
        await settle()
        assert not drained.is_set() and q.shutting_down and len(q) == 0
        with pytest.raises(ShutDown):
            await q.get()
        q.done(a)
        await settle()
        assert not drained.is_set()
        q.done(b)
    assert drained.is_set()
    assert len(q) == 0


async def test_shutdown_with_drain_returns_at_once_when_idle() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("a")
    with anyio.fail_after(5):
        await q.shutdown_with_drain()
    assert len(q) == 0


async def test_shutdown_cuts_a_drain_short() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("a")
    await q.get()  # "a" in flight and never done: a drain alone would wait for ever
    drained = anyio.Event()

    async def drain() -> None:
        await q.shutdown_with_drain()
        drained.set()

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(drain)
            await settle()
            assert not drained.is_set()  # waiting for "a"
            q.shutdown()  # e.g. the graceful-shutdown timeout expired
            await drained.wait()
    assert q.shutting_down


# --- metrics ---------------------------------------------------------------------------------


def metric(name: str, queue: str, controller: str | None = None) -> float | None:
    return REGISTRY.get_sample_value(name, {"name": queue, "controller": controller or queue})


async def test_metrics_follow_client_go() -> None:
    clock = FakeClock()
    n, c = "test-metrics-queue", "test-metrics-controller"
    q: WorkQueue[str] = WorkQueue(
        n,
        controller=c,
        rate_limiter=ItemExponentialFailureRateLimiter(base=1.0, max=60.0),
        clock=clock,
    )

    def m(name: str) -> float | None:
        return metric(name, n, c)

    assert (m("workqueue_depth"), m("workqueue_adds_total")) == (0.0, 0.0)
    q.add("a")
    q.add("b")
    q.add("a")  # deduplicated: not an add
    assert (m("workqueue_depth"), m("workqueue_adds_total")) == (2.0, 2.0)

    clock.advance(1.5)
    assert await q.get() == "a"  # queued 1.5 s
    assert m("workqueue_depth") == 1.0
    assert m("workqueue_queue_duration_seconds_count") == 1.0
    assert m("workqueue_queue_duration_seconds_sum") == 1.5

    q.add("a")  # dirty while processing: counts in depth until handed out again
    assert (m("workqueue_depth"), m("workqueue_adds_total")) == (2.0, 3.0)

    clock.advance(2.0)
    q.update_unfinished_work()
    assert m("workqueue_unfinished_work_seconds") == 2.0
    assert m("workqueue_longest_running_processor_seconds") == 2.0

    assert await q.get() == "b"  # queued 3.5 s
    assert m("workqueue_queue_duration_seconds_sum") == 5.0
    clock.advance(1.0)
    q.update_unfinished_work()
    assert m("workqueue_unfinished_work_seconds") == 4.0  # a: 3 s, b: 1 s
    assert m("workqueue_longest_running_processor_seconds") == 3.0

    q.done("a")  # worked 3 s; re-queued (still dirty, depth unchanged)
    assert m("workqueue_work_duration_seconds_count") == 1.0
    assert m("workqueue_work_duration_seconds_sum") == 3.0
    assert m("workqueue_depth") == 1.0
    # b is still in flight: the gauges wait for the owner's periodic refresh ...
    assert m("workqueue_unfinished_work_seconds") == 4.0
    q.update_unfinished_work()
    assert m("workqueue_unfinished_work_seconds") == 1.0
    assert m("workqueue_longest_running_processor_seconds") == 1.0
    assert await q.get() == "a"  # re-added at t=1.5, handed out at t=4.5
    assert m("workqueue_queue_duration_seconds_sum") == 8.0
    q.done("a")
    q.done("b")  # ... but the last one done zeroes them at once
    assert m("workqueue_unfinished_work_seconds") == 0.0
    assert m("workqueue_longest_running_processor_seconds") == 0.0
    assert m("workqueue_depth") == 0.0

    assert m("workqueue_retries_total") == 0.0
    q.add_rate_limited("c")
    q.add_after("d", 1.0)
    q.add_after("e", 0)  # an immediate add_after is still a retry (and an add)
    assert m("workqueue_retries_total") == 3.0
    assert (m("workqueue_depth"), m("workqueue_adds_total")) == (1.0, 4.0)

    q.add("f")
    item = await q.get()
    q.add(item)
    q.shutdown()  # abandoned items leave the depth
    assert m("workqueue_depth") == 0.0


async def test_controller_label_defaults_to_the_name() -> None:
    q: WorkQueue[str] = WorkQueue("test-default-controller-label")
    q.add("a")
    assert metric("workqueue_adds_total", "test-default-controller-label") == 1.0
    assert metric("workqueue_depth", "test-default-controller-label") == 1.0

"""Property tests: random sequences of queue operations keep client-go's guarantees.

One test drives the queue step by step against a small reference model (what client-go
promises, written as plainly as possible) and checks the state invariants after every
step; the other runs real concurrent workers on a random schedule.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sdgruntime.workqueue import FakeClock, ShutDown, WorkQueue
from tests.runtime.helpers import settle

# A broken queue hangs rather than fails; the timeout turns a hang into a failure.
pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]

KEYS = st.sampled_from("abcde")


@dataclass
class Model:
    """The queue's contract. ``dirty`` = added since last handed out; an add that makes an
    item dirty starts a new "epoch", and each epoch is handed out exactly once."""

    now: float = 0.0
    queue: list[str] = field(default_factory=list)
    dirty: set[str] = field(default_factory=set)
    processing: set[str] = field(default_factory=set)
    waiting: dict[str, tuple[float, int]] = field(default_factory=dict)
    seq: int = 0
    epochs: Counter[str] = field(default_factory=Counter)

    def add(self, item: str) -> None:
        if item in self.dirty:
            return
        self.dirty.add(item)
        self.epochs[item] += 1
        if item not in self.processing:
            self.queue.append(item)

    def get(self) -> str:
        item = self.queue.pop(0)
        self.dirty.discard(item)
        self.processing.add(item)
        return item

    def done(self, item: str) -> None:
        self.processing.remove(item)
        if item in self.dirty:
            self.queue.append(item)

    def add_after(self, item: str, delay: float) -> None:
        if delay <= 0:
            self.add(item)
            return
        ready_at = self.now + delay
        current = self.waiting.get(item)
        if current is None or ready_at < current[0]:  # the earlier deadline wins
            self.waiting[item] = (ready_at, self.seq)
            self.seq += 1

    def advance(self, seconds: float) -> None:
        self.now += seconds
        due = sorted((when, item) for item, when in self.waiting.items() if when[0] <= self.now)
        for _, item in due:  # by deadline, then by order of the add_after
            del self.waiting[item]
            self.add(item)


def check_invariants(q: WorkQueue[str]) -> None:
    """The invariants stated on WorkQueue (white-box)."""
    queued = list(q._queue)
    assert len(queued) == len(set(queued)), "an item is queued twice"
    assert set(queued) == q._dirty - q._processing.keys(), "queued != dirty - processing"
    assert all(q._waiting.get(item) == (ready, seq) for ready, seq, item in q._heap[:1]), (
        "run() would sleep on a stale deadline"
    )


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), KEYS),
        st.tuples(st.just("get")),
        st.tuples(st.just("done"), st.integers(0, 4)),
        st.tuples(st.just("add_after"), KEYS, st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.0])),
        st.tuples(st.just("advance"), st.sampled_from([0.5, 1.0, 2.0])),
    ),
    max_size=60,
)


@settings(max_examples=400, deadline=None)
@given(ops=OPS)
async def test_random_operations_match_the_contract(ops: list[tuple]) -> None:
    clock = FakeClock()
    q: WorkQueue[str] = WorkQueue(clock=clock)
    model = Model()
    held: list[str] = []
    handouts: Counter[str] = Counter()

    async def get() -> None:
        with anyio.fail_after(5):
            item = await q.get()
        assert item == model.get(), "not FIFO"
        assert item not in held, "one item handed to two workers"
        held.append(item)
        handouts[item] += 1

    async with anyio.create_task_group() as tg:
        tg.start_soon(q.run)
        await settle()
        for op in ops:
            match op:
                case ("add", item):
                    q.add(item)
                    model.add(item)
                case ("get",):
                    if model.queue:  # a get on an empty queue would just block
                        await get()
                case ("done", index):
                    if held:
                        item = held.pop(index % len(held))
                        q.done(item)
                        model.done(item)
                case ("add_after", item, delay):
                    q.add_after(item, delay)
                    model.add_after(item, delay)
                case ("advance", seconds):
                    clock.advance(seconds)
                    await settle()  # let run() move what is due
                    model.advance(seconds)
            check_invariants(q)
            assert len(q) == len(model.queue)

        # Finish everything: every epoch must come out exactly once.
        while held:
            item = held.pop()
            q.done(item)
            model.done(item)
        clock.advance(10.0)
        await settle()
        model.advance(10.0)
        while model.queue:
            await get()
            item = held.pop()
            q.done(item)
            model.done(item)
            check_invariants(q)
        assert len(q) == 0 and not model.waiting
        q.shutdown()
    assert handouts == model.epochs


@settings(max_examples=150, deadline=None)
@given(
    adds=st.lists(st.tuples(KEYS, st.integers(0, 2)), min_size=1, max_size=80),
    workers=st.integers(1, 5),
    seed=st.integers(0, 2**32),
)
async def test_concurrent_workers_never_share_a_key(
    adds: list[tuple[str, int]], workers: int, seed: int
) -> None:
    rng = random.Random(seed)  # worker pacing (hypothesis draws must not happen in tasks)
    q: WorkQueue[str] = WorkQueue()
    held: set[str] = set()
    pending: set[str] = set()  # the contract's "dirty": added since last handed out
    epochs: Counter[str] = Counter()
    handouts: Counter[str] = Counter()

    async def worker() -> None:
        while True:
            try:
                item = await q.get()
            except ShutDown:
                return
            assert item not in held, "one item handed to two workers"
            held.add(item)
            pending.discard(item)
            handouts[item] += 1
            for _ in range(rng.randrange(3)):
                await anyio.lowlevel.checkpoint()
            held.remove(item)
            q.done(item)

    async with anyio.create_task_group() as tg:
        for _ in range(workers):
            tg.start_soon(worker)
        for item, pause in adds:
            if item not in pending:
                pending.add(item)
                epochs[item] += 1
            q.add(item)
            for _ in range(pause):
                await anyio.lowlevel.checkpoint()
        await settle()  # all workers idle in get(): everything handed out and done
        assert len(q) == 0 and not held and not pending
        q.shutdown()
    assert handouts == epochs

"""Start-up recovery runs as a leader-only runnable that gates the group scheduler: no
reconcile places a group before it succeeded, and a failed try is retried."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import anyio
import pytest

from controllers.groupscheduler import GroupScheduler

pytestmark = pytest.mark.anyio


class Recovery:
    def __init__(self, failures: int) -> None:
        self.failures, self.runs = failures, 0

    async def run(self) -> None:
        self.runs += 1
        if self.runs <= self.failures:
            raise ConnectionError("the API server is away")


async def test_recovery_is_retried_and_opens_the_gate_once_it_succeeds() -> None:
    scheduler: Any = SimpleNamespace(recovery=Recovery(failures=1), recovered=anyio.Event())
    async with anyio.create_task_group() as tg:
        tg.start_soon(GroupScheduler.recover, scheduler)
        await anyio.wait_all_tasks_blocked()
        assert scheduler.recovery.runs == 1 and not scheduler.recovered.is_set()
        with anyio.fail_after(10):
            await scheduler.recovered.wait()
        assert scheduler.recovery.runs == 2
        tg.cancel_scope.cancel()  # the runnable idles until the manager stops


class StopAtRead:
    """A cache whose first read ends the reconcile: reaching it means the gate opened."""

    def __init__(self) -> None:
        self.reads = 0

    def get(self, *_args: Any, **_kwargs: Any) -> Any:
        self.reads += 1
        raise LookupError("stop here")


async def test_a_reconcile_waits_for_recovery() -> None:
    gate, cache = anyio.Event(), StopAtRead()
    scheduler: Any = SimpleNamespace(recovered=gate, cache=cache)

    async def reconcile() -> None:
        with pytest.raises(LookupError):
            await GroupScheduler._reconcile(scheduler, SimpleNamespace(name="g"))

    async with anyio.create_task_group() as tg:
        tg.start_soon(reconcile)
        await anyio.wait_all_tasks_blocked()
        assert cache.reads == 0  # still waiting at the gate
        gate.set()
    assert cache.reads == 1

"""The per-key group commit: what goes into which flush, and who gets which outcome."""

from __future__ import annotations

from collections.abc import Sequence

import anyio
import pytest

from controllers.ledger.coalesce import Abandoned, Coalescer
from tests.factories import settle

pytestmark = pytest.mark.anyio


class Flusher:
    """Records every flush; each one waits until the test opens ``gate``."""

    def __init__(self, fail: dict[str, BaseException] | None = None) -> None:
        self.calls: list[tuple[str, list[str]]] = []
        self.running: set[str] = set()
        self.overlapped = False
        self.gate = anyio.Event()
        self.fail = fail or {}
        self.raise_: BaseException | None = None

    async def __call__(self, key: str, changes: list[str]) -> Sequence[BaseException | None]:
        if key in self.running:
            self.overlapped = True
        self.running.add(key)
        self.calls.append((key, list(changes)))
        try:
            await self.gate.wait()
            if self.raise_ is not None:
                raise self.raise_
            return [self.fail.get(c) for c in changes]
        finally:
            self.running.discard(key)


async def submit(c: Coalescer[str, str], key: str, change: str, out: dict[str, object]) -> None:
    try:
        await c.submit(key, change)
        out[change] = "ok"
    except Exception as err:
        out[change] = err


async def test_changes_arriving_during_a_flush_go_together_in_the_next_one() -> None:
    flush = Flusher()
    c: Coalescer[str, str] = Coalescer(flush)
    out: dict[str, object] = {}
    async with anyio.create_task_group() as tg:
        tg.start_soon(submit, c, "n0", "a", out)
        await settle()
        assert flush.calls == [("n0", ["a"])]  # alone, at once
        for change in ("b", "c", "d"):
            tg.start_soon(submit, c, "n0", change, out)
            await settle()
        assert flush.calls == [("n0", ["a"])]  # nothing overtakes the flush in flight
        flush.gate.set()
    assert flush.calls == [("n0", ["a"]), ("n0", ["b", "c", "d"])]
    assert out == {"a": "ok", "b": "ok", "c": "ok", "d": "ok"}
    assert not flush.overlapped


async def test_keys_flush_independently() -> None:
    flush = Flusher()
    c: Coalescer[str, str] = Coalescer(flush)
    out: dict[str, object] = {}
    async with anyio.create_task_group() as tg:
        tg.start_soon(submit, c, "n0", "a", out)
        tg.start_soon(submit, c, "n1", "b", out)
        await settle()
        assert sorted(flush.calls) == [("n0", ["a"]), ("n1", ["b"])]  # both in flight
        flush.gate.set()
    assert out == {"a": "ok", "b": "ok"}


async def test_each_submitter_gets_its_own_outcome() -> None:
    boom = ValueError("b overlaps")
    flush = Flusher(fail={"b": boom})
    flush.gate.set()
    c: Coalescer[str, str] = Coalescer(flush)
    out: dict[str, object] = {}
    async with anyio.create_task_group() as tg:
        tg.start_soon(submit, c, "n0", "first", out)
        tg.start_soon(submit, c, "n0", "a", out)
        tg.start_soon(submit, c, "n0", "b", out)
        tg.start_soon(submit, c, "n0", "c", out)
    assert out == {"first": "ok", "a": "ok", "b": boom, "c": "ok"}


async def test_a_raising_flush_fails_every_change_of_that_batch() -> None:
    calls: list[list[str]] = []
    err = ConnectionError("no answer")

    async def flush(key: str, changes: list[str]) -> list[BaseException | None]:
        calls.append(list(changes))
        await anyio.sleep(0.01)
        if "b" in changes:
            raise err
        return [None] * len(changes)

    c: Coalescer[str, str] = Coalescer(flush)
    out: dict[str, object] = {}
    async with anyio.create_task_group() as tg:
        tg.start_soon(submit, c, "n0", "a", out)
        await settle()
        tg.start_soon(submit, c, "n0", "b", out)
        tg.start_soon(submit, c, "n0", "c", out)
        await settle()
        await anyio.sleep(0.015)  # a is done, b+c in flight
        tg.start_soon(submit, c, "n0", "d", out)
    assert calls == [["a"], ["b", "c"], ["d"]]
    assert out == {"a": "ok", "b": err, "c": err, "d": "ok"}


async def test_a_submitter_cancelled_before_its_batch_is_left_out() -> None:
    flush = Flusher()
    c: Coalescer[str, str] = Coalescer(flush)
    out: dict[str, object] = {}
    scopes: list[anyio.CancelScope] = []

    async def given_up() -> None:
        with anyio.CancelScope() as scope:
            scopes.append(scope)
            await c.submit("n0", "x")
            out["x"] = "ok"

    async with anyio.create_task_group() as tg:
        tg.start_soon(submit, c, "n0", "a", out)
        await settle()
        tg.start_soon(given_up)
        await settle()
        tg.start_soon(submit, c, "n0", "b", out)
        await settle()
        scopes[0].cancel()
        await settle()
        flush.gate.set()
    assert flush.calls == [("n0", ["a"]), ("n0", ["b"])]
    assert out == {"a": "ok", "b": "ok"}


async def test_when_the_submitter_running_a_batch_is_cancelled_the_rest_are_abandoned() -> None:
    flush = Flusher()
    c: Coalescer[str, str] = Coalescer(flush)
    out: dict[str, object] = {}
    scopes: list[anyio.CancelScope] = []

    async def leader() -> None:
        with anyio.CancelScope() as scope:
            scopes.append(scope)
            await c.submit("n0", "a")

    async with anyio.create_task_group() as tg:
        tg.start_soon(submit, c, "n0", "first", out)
        await settle()
        tg.start_soon(leader)  # waits; it will run the next batch
        await settle()
        tg.start_soon(submit, c, "n0", "b", out)
        await settle()
        first_gate = flush.gate
        flush.gate = anyio.Event()  # the next batch blocks on a new gate
        first_gate.set()  # "first" finishes; the leader of a+b takes over
        await settle()
        assert flush.calls[-1] == ("n0", ["a", "b"])
        scopes[0].cancel()
    assert isinstance(out["b"], Abandoned) and out["first"] == "ok"
    assert not c._locks and not c._pending  # nothing left behind

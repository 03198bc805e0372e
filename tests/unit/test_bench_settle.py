"""``compare.settle_writes``: S1's phase ends once the API server's writes have settled,
so what a contender defers past its last bind (paced Events, batched status) counts."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import pytest

from hack.bench.compare import SETTLE_WATCHED, settle_detail, settle_writes

pytestmark = pytest.mark.anyio


class Server:
    """An API server whose collections change on a script: ``changes[path]`` events, one
    every ``every`` seconds, on a watch from the version its list gave."""

    def __init__(self, changes: dict[str, int], every: float = 0.2, fail: bool = False) -> None:
        self.changes, self.every, self.fail = changes, every, fail
        self.watched: dict[str, str] = {}

    async def request(self, method: str, path: str, params: dict[str, str]) -> dict[str, Any]:
        assert (method, params) == ("GET", {"limit": "1"})
        return {"metadata": {"resourceVersion": "42"}, "items": []}

    async def watch(self, path: str, rv: str, on: Callable[[str, dict[str, Any]], None]) -> None:
        self.watched[path] = rv
        if self.fail:
            raise RuntimeError("410: too old")
        for _ in range(self.changes.get(path, 0)):
            await anyio.sleep(self.every)
            on("MODIFIED", {})
        await anyio.sleep_forever()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_waits_for_the_events_written_after_the_last_bind() -> None:
    kube = Server({"/api/v1/events": 4})
    waited = await settle_writes(kube, quiet=0.3)  # type: ignore[arg-type]
    assert waited >= 4 * 0.2 + 0.3
    # every kind a contender writes is watched from the version of now, not replayed
    assert kube.watched == dict.fromkeys(SETTLE_WATCHED, "42")


async def test_nothing_written_is_quiet_at_once() -> None:
    assert await settle_writes(Server({}), quiet=0.3) < 0.6  # type: ignore[arg-type]


async def test_writes_that_never_stop_are_given_up_after_the_limit() -> None:
    kube = Server({SETTLE_WATCHED[-1]: 1000}, every=0.05)
    waited = await settle_writes(kube, quiet=0.3, limit=0.8)  # type: ignore[arg-type]
    assert 0.8 <= waited < 1.3


async def test_a_watch_that_fails_is_not_taken_for_quiet() -> None:
    with pytest.raises(RuntimeError, match="too old"):
        await settle_writes(Server({}, fail=True), quiet=0.3)  # type: ignore[arg-type]


def test_s1_detail_says_how_long_writes_went_on_and_the_idle_cpu() -> None:
    sdg = {"settle_s": 28.3, "idle_cpu_per_s": {"kube-apiserver": 0.31}}
    kube = {"settle_s": 1.2, "idle_cpu_per_s": {"kube-apiserver": 0.05}}
    text = settle_detail(sdg, kube)
    assert "went on 28.3 s / 1.2 s after the last bind" in text
    assert "idling at 0.31 / 0.05 CPU-s per s" in text
    assert settle_detail({}, kube) == ""  # a run from before S1 settled says nothing

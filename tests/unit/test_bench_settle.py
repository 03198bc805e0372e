"""``compare.settle_writes``: S1's phase ends once the API server's writes have settled,
so what a contender defers past its last bind (paced Events, batched status) counts."""

from __future__ import annotations

from collections import Counter

import pytest

from hack.bench.compare import settle_detail, settle_writes

pytestmark = pytest.mark.anyio


class Writes:
    """An API server whose write counts follow a script, one entry per poll (the last
    repeats); Lease renewals tick on every poll."""

    def __init__(self, script: list[dict[str, int]]) -> None:
        self.script = script
        self.polls = 0

    async def writes(self) -> Counter[str]:
        step = self.script[min(self.polls, len(self.script) - 1)]
        self.polls += 1
        return Counter({**step, "leases PUT": self.polls})


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_waits_for_the_events_written_after_the_last_bind() -> None:
    kube = Writes([{"events POST": n} for n in (10, 20, 30, 40)])
    waited = await settle_writes(kube, quiet=0.3)  # type: ignore[arg-type]
    assert kube.polls >= 4 + 2  # every change seen, then quiet for 0.3 s at 0.2 s a poll
    assert waited >= 3 * 0.2 + 0.3


async def test_lease_renewals_alone_are_quiet() -> None:
    kube = Writes([{}])
    assert await settle_writes(kube, quiet=0.3) < 1.0  # type: ignore[arg-type]


async def test_writes_that_never_stop_are_given_up_after_the_limit() -> None:
    kube = Writes([{"events POST": n} for n in range(1000)])
    waited = await settle_writes(kube, quiet=0.3, limit=0.8)  # type: ignore[arg-type]
    assert 0.8 <= waited < 1.3


def test_s1_detail_says_how_long_writes_went_on_and_the_idle_cpu() -> None:
    sdg = {"settle_s": 28.3, "idle_cpu_per_s": {"kube-apiserver": 0.31}}
    kube = {"settle_s": 1.2, "idle_cpu_per_s": {"kube-apiserver": 0.05}}
    text = settle_detail(sdg, kube)
    assert "went on 28.3 s / 1.2 s after the last bind" in text
    assert "idling at 0.31 / 0.05 CPU-s per s" in text
    assert settle_detail({}, kube) == ""  # a run from before S1 settled says nothing

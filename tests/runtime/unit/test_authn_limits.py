"""The bound on TokenReviews/SubjectAccessReviews (sdgruntime.authn.ReviewLimiter): a
token bucket and a cap on reviews in progress, 429 with Retry-After beyond them, and
cached tokens never limited. tests/e2e/test_abuse.py floods the real manager."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from pydantic import ValidationError

from sdgruntime import errors
from sdgruntime.authn import TOKENREVIEWS, ReviewLimiter
from sdgruntime.kinds import Kind
from sdgruntime.manager import ManagerOptions
from tests.runtime.unit.test_metrics_auth import Clock, FakeAPIServer, auth_for, get, ok

pytestmark = pytest.mark.anyio


def test_the_bucket_lets_a_burst_through_then_the_rate() -> None:
    clock = Clock()
    limiter = ReviewLimiter(rate=10, burst=3, max_concurrent=100, clock=clock)
    for _ in range(3):
        assert limiter.acquire() is None
        limiter.release()
    wait, why = limiter.acquire() or (0.0, "")
    assert wait == pytest.approx(0.1) and why == "over 10 reviews per second (burst 3)"
    clock.now += 0.05  # half a token back: not yet
    wait, _ = limiter.acquire() or (0.0, "")
    assert wait == pytest.approx(0.05)
    clock.now += 0.05
    assert limiter.acquire() is None  # one token back
    limiter.release()
    clock.now += 100  # a quiet time saves up to the burst, no more
    for _ in range(3):
        assert limiter.acquire() is None
        limiter.release()
    assert limiter.acquire() is not None


def test_reviews_in_progress_are_capped_and_released() -> None:
    limiter = ReviewLimiter(rate=1000, burst=1000, max_concurrent=2, clock=Clock())
    assert limiter.acquire() is None and limiter.acquire() is None
    assert limiter.acquire() == (1.0, "2 reviews in progress")
    assert limiter.in_progress == 2
    limiter.release()
    assert limiter.acquire() is None  # a slot is free again
    # A refusal by the cap takes no token from the bucket.
    before = limiter._tokens
    assert limiter.acquire() is not None and limiter._tokens == before


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"rate": 0}, "rate must be over 0"),
        ({"burst": 0}, "burst must be at least 1"),
        ({"max_concurrent": 0}, "concurrent reviews must be at least 1"),
    ],
)
def test_limits_that_could_never_review_are_refused(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ReviewLimiter(**kwargs)


async def test_over_the_rate_new_tokens_get_429_and_cached_ones_are_served() -> None:
    api, clock = FakeAPIServer(), Clock()
    guarded = auth_for(api, clock=clock, review_rate=1, review_burst=2).protect(ok)
    assert (await guarded(get("good"))).status == 200  # one token: both reviews
    assert (await guarded(get("unknown"))).status == 401  # the second token
    r = await guarded(get("made-up"))
    assert r.status == 429
    assert r.headers["retry-after"] == "1"
    assert r.body == (
        b"Too many requests to authenticate: over 1 reviews per second (burst 2); a token "
        b"already reviewed is answered at once. Retry after 1s\n"
    )
    reviews = len(api.calls)
    for _ in range(20):  # the cached ones, however many, ask nothing and are not limited
        assert (await guarded(get("good"))).status == 200
        assert (await guarded(get("unknown"))).status == 401
    assert len(api.calls) == reviews
    clock.now += 1  # a token back: one new review
    assert (await guarded(get("other"))).status == 403
    assert (await guarded(get("made-up-2"))).status == 429


async def test_retry_after_says_when_a_token_is_back() -> None:
    clock = Clock()
    guarded = auth_for(FakeAPIServer(), clock=clock, review_rate=0.25, review_burst=1).protect(ok)
    assert (await guarded(get("a"))).status == 401
    r = await guarded(get("b"))
    assert (r.status, r.headers["retry-after"]) == (429, "4")


class SlowAPIServer(FakeAPIServer):
    """Reviews that wait until ``gate`` is set, counting how many wait at once."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = anyio.Event()
        self.waiting = 0

    async def create(self, kind: Kind, obj: dict[str, Any]) -> dict[str, Any]:
        self.waiting += 1
        try:
            await self.gate.wait()
        finally:
            self.waiting -= 1
        return await super().create(kind, obj)


async def test_reviews_in_progress_are_capped_and_cached_tokens_never_wait() -> None:
    api = SlowAPIServer()
    auth = auth_for(api, max_concurrent_reviews=3, review_burst=100)
    guarded = auth.protect(ok)
    api.gate.set()
    assert (await guarded(get("good"))).status == 200  # cached from here on
    api.gate = anyio.Event()
    answers: list[int] = []

    async def scrape(token: str) -> None:
        answers.append((await guarded(get(token))).status)

    async with anyio.create_task_group() as tg:
        for i in range(3):
            tg.start_soon(scrape, f"slow-{i}")
        with anyio.fail_after(5):
            while api.waiting < 3:  # noqa: ASYNC110 - polls the fake's counter
                await anyio.sleep(0.01)
        for i in range(5):  # over the cap: refused at once, without waiting
            with anyio.fail_after(1):
                r = await guarded(get(f"more-{i}"))
            assert r.status == 429 and b"3 reviews in progress" in r.body
        with anyio.fail_after(1):  # a cached token is served while the slow ones wait
            assert (await guarded(get("good"))).status == 200
        assert api.waiting == 3 and auth.limiter.in_progress == 3
        api.gate.set()
    assert answers == [401, 401, 401]
    assert auth.limiter.in_progress == 0  # released, also for the handler's run
    assert api.count(TOKENREVIEWS) == 4


async def test_a_failing_review_releases_its_slot() -> None:
    api = FakeAPIServer()
    auth = auth_for(api, max_concurrent_reviews=1)
    api.fail = errors.TransportError("no answer")
    for _ in range(3):
        assert (await auth.protect(ok)(get("good"))).status == 500
    assert auth.limiter.in_progress == 0


def test_manager_options_bound_the_reviews() -> None:
    defaults = ManagerOptions()
    assert (
        defaults.metrics_auth_review_rate,
        defaults.metrics_auth_review_burst,
        defaults.metrics_auth_max_concurrent_reviews,
    ) == (20.0, 40, 8)
    for bad in (
        {"metrics_auth_review_rate": 0},
        {"metrics_auth_review_burst": 0},
        {"metrics_auth_max_concurrent_reviews": 0},
    ):
        with pytest.raises(ValidationError, match=next(iter(bad))):
            ManagerOptions(**bad)

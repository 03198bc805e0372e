"""Rate limiters: exact delays with an injected clock."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sdgruntime.ratelimiter import (
    BucketRateLimiter,
    ItemExponentialFailureRateLimiter,
    ItemFastSlowRateLimiter,
    MaxOfRateLimiter,
    WithMaxWaitRateLimiter,
    default_controller_rate_limiter,
)
from sdgruntime.workqueue import FakeClock


def test_exponential_doubles_per_failure_and_caps() -> None:
    rl = ItemExponentialFailureRateLimiter[str](base=0.005, max=1.0)
    delays = [rl.when("a") for _ in range(10)]
    assert delays == [0.005 * 2**n for n in range(8)] + [1.0, 1.0]
    assert rl.num_requeues("a") == 10


def test_exponential_tracks_items_independently_and_forget_resets() -> None:
    rl = ItemExponentialFailureRateLimiter[str](base=1.0, max=100.0)
    assert [rl.when("a"), rl.when("a"), rl.when("b"), rl.when("a")] == [1.0, 2.0, 1.0, 4.0]
    assert (rl.num_requeues("a"), rl.num_requeues("b"), rl.num_requeues("c")) == (3, 1, 0)
    rl.forget("a")
    assert rl.num_requeues("a") == 0
    assert rl.when("a") == 1.0
    assert rl.num_requeues("b") == 1
    rl.forget("never-seen")  # no error


def test_exponential_survives_huge_failure_counts() -> None:
    rl = ItemExponentialFailureRateLimiter[str](base=0.005, max=1000.0)
    for _ in range(1100):  # 0.005 * 2**1099 overflows a float
        last = rl.when("a")
    assert last == 1000.0


def test_exponential_defaults_are_client_go() -> None:
    rl = ItemExponentialFailureRateLimiter[str]()
    assert (rl.base, rl.max_delay) == (0.005, 1000.0)


def test_bucket_spends_burst_then_spaces_reservations() -> None:
    clock = FakeClock()
    rl = BucketRateLimiter[str](qps=2.0, burst=3, clock=clock.now)
    assert [rl.when("x") for _ in range(6)] == [0.0, 0.0, 0.0, 0.5, 1.0, 1.5]
    # One second refills two tokens against the three reserved: the next waits 1 s.
    clock.advance(1.0)
    assert rl.when("x") == 1.0
    # A long pause refills to the burst, not beyond.
    clock.advance(100.0)
    assert [rl.when("x") for _ in range(4)] == [0.0, 0.0, 0.0, 0.5]


def test_bucket_is_shared_by_items_and_keeps_no_item_state() -> None:
    clock = FakeClock()
    rl = BucketRateLimiter[str](qps=4.0, burst=1, clock=clock.now)
    assert [rl.when("a"), rl.when("b"), rl.when("c")] == [0.0, 0.25, 0.5]
    assert rl.num_requeues("a") == 0
    rl.forget("a")
    assert rl.when("a") == 0.75  # forget returns no token


def test_bucket_unlimited_and_invalid_arguments() -> None:
    rl = BucketRateLimiter[str](qps=float("inf"), burst=1)
    assert all(rl.when("a") == 0.0 for _ in range(1000))
    with pytest.raises(ValueError):
        BucketRateLimiter[str](qps=0, burst=1)
    with pytest.raises(ValueError):
        BucketRateLimiter[str](qps=1, burst=0)


def test_max_of_takes_strictest_and_every_limiter_keeps_books() -> None:
    clock = FakeClock()
    bucket = BucketRateLimiter[str](qps=1.0, burst=2, clock=clock.now)
    backoff = ItemExponentialFailureRateLimiter[str](base=0.25, max=10.0)
    rl = MaxOfRateLimiter(backoff, bucket)
    # backoff 0.25, 0.5, 1, 2 vs bucket 0, 0, 1, 2 (the bucket reserves even when
    # the backoff wins).
    assert [rl.when("a") for _ in range(4)] == [0.25, 0.5, 1.0, 2.0]
    assert rl.when("b") == 3.0
    assert rl.num_requeues("a") == 4
    rl.forget("a")
    assert rl.num_requeues("a") == 0
    assert backoff.num_requeues("b") == 1
    with pytest.raises(ValueError):
        MaxOfRateLimiter()


def test_default_controller_rate_limiter_matches_client_go() -> None:
    clock = FakeClock()
    rl = default_controller_rate_limiter(clock.now)
    # A burst of 100 first failures: each waits only the 5 ms backoff.
    assert {rl.when(i) for i in range(100)} == {0.005}
    # The 101st reserves a token 1/10 s out.
    assert rl.when(100) == 0.1
    clock.advance(1000.0)  # refill the bucket
    # One item failing over and over: 5 ms doubling, capped at 1000 s.
    delays = [rl.when("x") for _ in range(20)]
    assert delays[:18] == [0.005 * 2**n for n in range(18)]
    assert delays[18:] == [1000.0, 1000.0]
    assert rl.num_requeues("x") == 20


def test_fast_slow_is_fast_for_max_fast_attempts_then_slow() -> None:
    # client-go's TestItemFastSlowRateLimiter: 5 ms, 10 s, 3 fast attempts.
    rl = ItemFastSlowRateLimiter[str](0.005, 10.0, 3)
    assert [rl.when("one") for _ in range(5)] == [0.005, 0.005, 0.005, 10.0, 10.0]
    assert rl.num_requeues("one") == 5
    # Items are counted apart.
    assert [rl.when("two"), rl.when("two")] == [0.005, 0.005]
    assert rl.num_requeues("two") == 2
    # Forget starts an item over with fast attempts.
    rl.forget("one")
    assert rl.num_requeues("one") == 0
    assert rl.when("one") == 0.005
    assert rl.num_requeues("two") == 2


def test_fast_slow_without_fast_attempts_is_always_slow() -> None:
    rl = ItemFastSlowRateLimiter[str](0.005, 2.0, 0)
    assert [rl.when("a") for _ in range(3)] == [2.0, 2.0, 2.0]
    with pytest.raises(ValueError):
        ItemFastSlowRateLimiter[str](-1.0, 1.0, 1)
    with pytest.raises(ValueError):
        ItemFastSlowRateLimiter[str](0.0, 1.0, -1)


class StepRateLimiter:
    """client-go's test helper: ``base`` for the first ``threshold`` calls (any items),
    then ``max``."""

    def __init__(self, base: float, max: float, threshold: int) -> None:
        self.base, self.max, self.threshold = base, max, threshold
        self.calls = 0
        self.forgotten: list[object] = []

    def when(self, item: object) -> float:
        self.calls += 1
        return self.base if self.calls <= self.threshold else self.max

    def forget(self, item: object) -> None:
        self.forgotten.append(item)

    def num_requeues(self, item: object) -> int:
        return self.calls


def test_with_max_wait_caps_the_delay_and_passes_smaller_ones_through() -> None:
    # client-go's TestWithMaxWaitRateLimiter: 5 ms for 100 calls, then 1000 s capped at 500.
    step = StepRateLimiter(0.005, 1000.0, 100)
    rl = WithMaxWaitRateLimiter(step, 500.0)
    assert {rl.when(i) for i in range(100)} == {0.005}
    assert {rl.when(i) for i in range(100, 200)} == {500.0}
    # The wrapped limiter keeps the books: forget and num_requeues are its own.
    rl.forget(7)
    assert step.forgotten == [7]
    assert rl.num_requeues(7) == 200


def test_with_max_wait_bounds_the_default_backoff_without_changing_its_growth() -> None:
    """The use case: client-go's default limiter, but never wait more than a minute."""
    clock = FakeClock()
    rl = WithMaxWaitRateLimiter(default_controller_rate_limiter(clock.now), 60.0)
    delays = [rl.when("x") for _ in range(16)]
    assert delays[:14] == [0.005 * 2**n for n in range(14)]  # 0.005 * 2**13 = 40.96 s
    assert delays[14:] == [60.0, 60.0]
    assert rl.num_requeues("x") == 16
    rl.forget("x")
    assert rl.when("x") == 0.005
    with pytest.raises(ValueError):
        WithMaxWaitRateLimiter(default_controller_rate_limiter(clock.now), float("nan"))


@given(
    steps=st.lists(
        st.tuples(st.sampled_from([0.0, 0.25, 1.0, 3.0]), st.integers(1, 5)), max_size=40
    ),
    qps=st.sampled_from([1.0, 2.0, 4.0, 10.0]),
    burst=st.integers(1, 5),
)
def test_bucket_grants_at_most_burst_plus_rate_in_any_window(
    steps: list[tuple[float, int]], qps: float, burst: int
) -> None:
    """The token bucket's contract: in any window [t0, t1] at most burst + qps*(t1 - t0)
    reservations fall due, and they fall due in the order they were made."""
    clock = FakeClock()
    rl = BucketRateLimiter[str](qps=qps, burst=burst, clock=clock.now)
    due: list[float] = []
    for pause, calls in steps:
        clock.advance(pause)
        due.extend(clock.now() + rl.when("x") for _ in range(calls))
    assert due == sorted(due)
    for i in range(len(due)):
        for j in range(i, len(due)):
            assert j - i + 1 <= burst + qps * (due[j] - due[i]) + 1e-9

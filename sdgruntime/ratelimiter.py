"""Rate limiters that decide how long a failed item waits before it is retried.

They follow client-go's ``workqueue`` limiters: pure, synchronous bookkeeping (no I/O, no
tasks), so the work queue can call them inline and tests can drive them with an injected
clock. They are not thread-safe; use each from one event loop.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Hashable
from typing import Any, Generic, Protocol, TypeVar

__all__ = [
    "BucketRateLimiter",
    "ItemExponentialFailureRateLimiter",
    "ItemFastSlowRateLimiter",
    "MaxOfRateLimiter",
    "RateLimiter",
    "WithMaxWaitRateLimiter",
    "default_controller_rate_limiter",
]

T = TypeVar("T", bound=Hashable)
T_contra = TypeVar("T_contra", bound=Hashable, contravariant=True)

#: A clock returns monotonic seconds; injectable so tests get exact numbers.
Clock = Callable[[], float]


class RateLimiter(Protocol[T_contra]):
    """Decides the delay before an item is retried, and remembers its failures."""

    def when(self, item: T_contra) -> float:
        """Record one more failure of ``item``; return how many seconds it should wait."""
        ...

    def forget(self, item: T_contra) -> None:
        """Stop tracking ``item`` (it succeeded): its next failure starts from scratch."""
        ...

    def num_requeues(self, item: T_contra) -> int:
        """How many failures of ``item`` are being tracked."""
        ...


class ItemExponentialFailureRateLimiter(Generic[T]):
    """Per-item exponential backoff: the n-th failure (0-based) waits ``base * 2**n``,
    capped at ``max``.

    Invariant: ``_failures[item]`` is the number of ``when(item)`` calls since the last
    ``forget(item)``; items never failed are absent.
    """

    def __init__(self, base: float = 0.005, max: float = 1000.0) -> None:
        if base < 0 or max < 0:
            raise ValueError("base and max must be >= 0")
        self.base = base
        self.max_delay = max
        self._failures: dict[T, int] = {}

    def when(self, item: T) -> float:
        exp = self._failures.get(item, 0)
        self._failures[item] = exp + 1
        try:
            delay = math.ldexp(self.base, exp)  # base * 2**exp, exactly
        except OverflowError:
            return self.max_delay
        return min(delay, self.max_delay)

    def forget(self, item: T) -> None:
        self._failures.pop(item, None)

    def num_requeues(self, item: T) -> int:
        return self._failures.get(item, 0)


class ItemFastSlowRateLimiter(Generic[T]):
    """Per-item: the first ``max_fast_attempts`` failures wait ``fast_delay``, every later
    one ``slow_delay`` (client-go's ItemFastSlowRateLimiter).

    For errors that are either a blip (retry at once, a few times) or a lasting condition
    (then poll slowly), where exponential growth would first be too slow and then too long.
    Invariant: ``_failures[item]`` counts ``when(item)`` calls since the last ``forget``.
    """

    def __init__(self, fast_delay: float, slow_delay: float, max_fast_attempts: int) -> None:
        if fast_delay < 0 or slow_delay < 0:
            raise ValueError("fast_delay and slow_delay must be >= 0")
        if max_fast_attempts < 0:
            raise ValueError("max_fast_attempts must be >= 0")
        self.fast_delay = fast_delay
        self.slow_delay = slow_delay
        self.max_fast_attempts = max_fast_attempts
        self._failures: dict[T, int] = {}

    def when(self, item: T) -> float:
        failures = self._failures[item] = self._failures.get(item, 0) + 1
        return self.fast_delay if failures <= self.max_fast_attempts else self.slow_delay

    def forget(self, item: T) -> None:
        self._failures.pop(item, None)

    def num_requeues(self, item: T) -> int:
        return self._failures.get(item, 0)


class BucketRateLimiter(Generic[T]):
    """One token bucket shared by all items (overall retry rate), as golang.org/x/time/rate.

    The bucket holds up to ``burst`` tokens and refills at ``qps`` tokens per second.
    ``when`` reserves one token and returns the seconds until it is available (0 if one
    is in the bucket now). Reservations may drive the balance negative: the n-th waiting
    reservation is due ``n / qps`` seconds out. It tracks no per-item state.

    Invariant: ``_tokens`` is the balance at time ``_last``; the balance at ``t >= _last``
    is ``min(burst, _tokens + (t - _last) * qps)``.
    """

    def __init__(self, qps: float = 10.0, burst: int = 100, clock: Clock = time.monotonic) -> None:
        if not qps > 0:
            raise ValueError("qps must be > 0 (math.inf means unlimited)")
        if burst < 1:
            raise ValueError("burst must be >= 1")
        self.qps = qps
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._last = clock()

    def when(self, item: T) -> float:
        if math.isinf(self.qps):
            return 0.0
        now = self._clock()
        # A clock that went backwards refills nothing (as x/time/rate).
        elapsed = max(0.0, now - self._last)
        self._tokens = min(float(self.burst), self._tokens + elapsed * self.qps) - 1.0
        self._last = max(now, self._last)
        if self._tokens >= 0:
            return 0.0
        return -self._tokens / self.qps

    def forget(self, item: T) -> None:
        pass

    def num_requeues(self, item: T) -> int:
        return 0


class MaxOfRateLimiter(Generic[T]):
    """Combines limiters: waits as long as the strictest one says.

    Every limiter sees every call (so each keeps its own books: the bucket reserves a token
    even when the backoff dominates), as client-go's MaxOfRateLimiter.
    """

    def __init__(self, *limiters: RateLimiter[T]) -> None:
        if not limiters:
            raise ValueError("MaxOfRateLimiter needs at least one limiter")
        self.limiters = limiters

    def when(self, item: T) -> float:
        return max([limiter.when(item) for limiter in self.limiters])

    def forget(self, item: T) -> None:
        for limiter in self.limiters:
            limiter.forget(item)

    def num_requeues(self, item: T) -> int:
        return max(limiter.num_requeues(item) for limiter in self.limiters)


class WithMaxWaitRateLimiter(Generic[T]):
    """Caps another limiter's delay at ``max_wait`` (client-go's WithMaxWaitRateLimiter).

    The wrapped limiter still keeps its own books (failure counts, bucket reservations);
    only the answer is capped, so e.g. the default limiter's 1000 s backoff ceiling can be
    lowered without changing how it grows.
    """

    def __init__(self, limiter: RateLimiter[T], max_wait: float) -> None:
        if not max_wait >= 0:
            raise ValueError("max_wait must be >= 0")
        self.limiter = limiter
        self.max_wait = max_wait

    def when(self, item: T) -> float:
        return min(self.limiter.when(item), self.max_wait)

    def forget(self, item: T) -> None:
        self.limiter.forget(item)

    def num_requeues(self, item: T) -> int:
        return self.limiter.num_requeues(item)


def default_controller_rate_limiter(
    clock: Clock = time.monotonic,
) -> MaxOfRateLimiter[Any]:
    """client-go's DefaultTypedControllerRateLimiter: per-item backoff 5 ms .. 1000 s, and
    an overall bucket of 10 qps with a burst of 100 (which only matters under a storm)."""
    return MaxOfRateLimiter(
        ItemExponentialFailureRateLimiter(0.005, 1000.0),
        BucketRateLimiter(qps=10.0, burst=100, clock=clock),
    )

"""Reconnect backoff for list/watch: client-go's exponential backoff manager, in small."""

from __future__ import annotations

import random
import time
from collections.abc import Callable

__all__ = ["Backoff"]


class Backoff:
    """Delays between failed attempts: ``initial`` doubling up to ``maximum``, with jitter.

    A failure that comes more than ``reset_after`` seconds after the previous one starts
    over at ``initial``: a connection that stayed healthy that long earned a quick retry.
    Jitter adds up to ``jitter * delay`` so that many informers (or many replicas) that lost
    the same API server do not reconnect in lock step. Defaults are client-go's reflector:
    0.8 s, 30 s, reset after 2 min, factor 2.
    """

    __slots__ = (
        "_clock",
        "_current",
        "_last",
        "_rand",
        "factor",
        "initial",
        "jitter",
        "maximum",
        "reset_after",
    )

    def __init__(
        self,
        initial: float = 0.8,
        maximum: float = 30.0,
        *,
        factor: float = 2.0,
        jitter: float = 0.5,
        reset_after: float = 120.0,
        clock: Callable[[], float] = time.monotonic,
        rand: Callable[[], float] = random.random,
    ) -> None:
        if initial <= 0 or maximum < initial or factor < 1 or jitter < 0:
            raise ValueError("need 0 < initial <= maximum, factor >= 1, jitter >= 0")
        self.initial = initial
        self.maximum = maximum
        self.factor = factor
        self.jitter = jitter
        self.reset_after = reset_after
        self._clock = clock
        self._rand = rand
        self._current = initial
        self._last: float | None = None

    def next(self) -> float:
        """The delay to wait before the next attempt, after a failure now."""
        now = self._clock()
        if self._last is not None and now - self._last >= self.reset_after:
            self._current = self.initial
        self._last = now
        base = self._current
        self._current = min(base * self.factor, self.maximum)
        return base * (1.0 + self.jitter * self._rand())

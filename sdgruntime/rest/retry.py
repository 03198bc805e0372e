"""Which failed requests are replayed, and how long to wait before each replay.

:func:`should_retry` is the policy: idempotent verbs on no answer, 429 and 5xx; POST (and a
JSON patch without a ``test`` op, :func:`has_test_op`) only on 429 or when the request
provably never left (:class:`RequestNotSent`); never 409 Conflict, never watches.
:class:`RetryPolicy` holds the backoff, honouring ``Retry-After``. Invariant: the
transport never replays on its own, so every attempt is one this policy allowed and counts
in ``rest_client_requests_total``. Why each rule: docs/contracts.md, "Retries".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import anyio
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential,
    wait_random,
)

from sdgruntime import errors

__all__ = ["IDEMPOTENT", "RequestNotSent", "RetryPolicy", "has_test_op", "should_retry"]

IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "PATCH", "DELETE", "OPTIONS"})


class RequestNotSent(errors.TransportError):
    """The request never reached the server (connect failed, no pooled connection free).

    Always safe to retry, even for POST.
    """


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How transient failures are retried. ``attempts=1`` disables retries.

    The wait before attempt n+1 is the server's ``Retry-After`` (capped) if it sent one, else
    ``initial_backoff * 2**(n-1)`` capped at ``max_backoff``, plus up to ``jitter`` seconds.
    """

    attempts: int = 5
    max_elapsed: float = 30.0  # no new attempt starts this long after the first failure
    initial_backoff: float = 0.1
    max_backoff: float = 5.0
    jitter: float = 0.2
    max_retry_after: float = 10.0

    def wait(self, state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        retry_after = getattr(exc, "retry_after", None)
        if retry_after is not None and retry_after >= 0:
            return min(float(retry_after), self.max_retry_after)
        backoff = wait_exponential(multiplier=self.initial_backoff, max=self.max_backoff)
        return (backoff + wait_random(0, self.jitter))(state)

    def retrying(self, method: str, *, idempotent: bool | None = None) -> AsyncRetrying:
        """A fresh tenacity loop for one request of ``method`` (see :func:`should_retry`)."""
        return AsyncRetrying(
            stop=stop_after_attempt(self.attempts) | stop_after_delay(self.max_elapsed),
            wait=self.wait,
            retry=retry_if_exception(lambda e: should_retry(method, e, idempotent=idempotent)),
            reraise=True,
            sleep=anyio.sleep,
        )


def should_retry(method: str, err: BaseException, *, idempotent: bool | None = None) -> bool:
    """Whether a failed attempt of ``method`` may be replayed (the policy in the module doc).

    ``idempotent`` overrides what the method implies (``False`` for an unguarded JSON
    patch: a PATCH, but not safe to replay).
    """
    if isinstance(err, RequestNotSent):
        return True
    if not isinstance(err, errors.ApiError) or isinstance(err, errors.Conflict):
        return False
    if idempotent is None:
        idempotent = method.upper() in IDEMPOTENT
    if idempotent:
        return errors.is_retriable(err)
    # POST and friends: only when the server said it did not handle the request.
    return isinstance(err, errors.TooManyRequests)


def has_test_op(patch: Any) -> bool:
    """Whether a JSON patch holds a ``test`` op, which makes a replay fail instead of
    applying twice (if it tests something the patch changes, e.g. the resourceVersion)."""
    return isinstance(patch, list) and any(
        isinstance(op, Mapping) and op.get("op") == "test" for op in patch
    )

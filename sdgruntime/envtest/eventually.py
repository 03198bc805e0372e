"""``eventually``: wait for what a user would see, with a hang guard, not a timing test.

As gomega's ``Eventually``: poll a check until it holds. A test against a real API server
asserts on results that appear asynchronously (a reconcile, the garbage collector); a
fixed sleep is either slow or flaky, a poll under a deadline is neither.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

import anyio

from sdgruntime import errors

__all__ = ["eventually"]

T = TypeVar("T")


@overload
async def eventually(  # an async check is awaited: its result is returned
    check: Callable[[], Awaitable[T | None]],
    what: str = ...,
    *,
    within: float = ...,
    interval: float = ...,
) -> T: ...


@overload
async def eventually(
    check: Callable[[], T | None],
    what: str = ...,
    *,
    within: float = ...,
    interval: float = ...,
) -> T: ...


async def eventually(
    check: Callable[[], Any],
    what: str = "the check",
    *,
    within: float = 20.0,
    interval: float = 0.05,
) -> Any:
    """Call ``check()`` (sync or async) until it returns something truthy, and return that.

    ``errors.NotFound`` and ``AssertionError`` from the check count as "not yet" (so a
    check may ``get`` what is not created yet, or ``assert``); any other exception fails
    at once. After ``within`` seconds it raises ``AssertionError`` naming ``what`` and the
    last result or error.
    """
    last: object = None
    with anyio.move_on_after(within):
        while True:
            try:
                result = check()
                if inspect.isawaitable(result):
                    result = await result
                if result:
                    return result
                last = result
            except (errors.NotFound, AssertionError) as exc:
                last = exc
            await anyio.sleep(interval)
    raise AssertionError(f"not within {within:g}s: {what} (last: {last!r})")

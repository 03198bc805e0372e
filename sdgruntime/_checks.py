"""Checks made when something is registered, so that a mistake fails at start-up with a
message that says what to write, instead of at the first event with a confusing error."""

from __future__ import annotations

import functools
import inspect
from typing import Any


def is_async_callable(fn: Any) -> bool:
    """Whether calling ``fn`` returns a coroutine: an ``async def`` function or method, a
    ``functools.partial`` of one, or an object whose ``__call__`` is ``async def``."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    if isinstance(fn, type):
        return False  # calling a class makes an instance, never a coroutine
    if inspect.iscoroutinefunction(fn):
        return True
    return inspect.iscoroutinefunction(getattr(fn, "__call__", None))  # noqa: B004


def name_of(fn: Any) -> str:
    """A readable name for messages: ``Mirror.reconcile``, ``handle``, ``<lambda>``."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return getattr(fn, "__qualname__", None) or type(fn).__qualname__

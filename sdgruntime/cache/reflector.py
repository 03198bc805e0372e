"""The reflector: keeps a Store equal to the server's state of one kind by list + watch.

Like client-go's: list (paged) into the store, then watch from the list's
resourceVersion with bookmarks, telling the sink what changed. It recovers on its own
from an ended watch, a dropped connection, 410 Gone (relist, the difference delivered as
events, deletes with their last known state) and a stream silent for
``inactivity_timeout`` (a restarted watch). :attr:`Reflector.last_sync_error` says why
the first sync is not coming. Each case: docs/contracts.md, "Watches that recover".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import anyio

from sdgruntime import errors
from sdgruntime.cache.backoff import Backoff
from sdgruntime.cache.store import Store, object_key
from sdgruntime.kinds import Kind, MutableObj

#: Seconds: how stale the watchdog's deadline may get before an event moves it.
_MAX_DEADLINE_STEP = 1.0

if TYPE_CHECKING:
    from sdgruntime.client import Client

__all__ = [
    "EventSink",
    "Reflector",
    "ReflectorOptions",
    "ReflectorStats",
    "Selector",
    "selector_string",
]

log = logging.getLogger(__name__)

Selector = str | Mapping[str, str]
"""A label or field selector: the API's string form, or equality terms as a mapping."""


def selector_string(selector: Selector | None) -> str | None:
    """The API form of a selector: ``{"a": "1", "b": "2"}`` -> ``"a=1,b=2"``."""
    if selector is None or isinstance(selector, str):
        return selector or None
    return ",".join(f"{k}={v}" for k, v in selector.items()) or None


@dataclass(frozen=True, slots=True)
class ReflectorOptions:
    """Tuning of list/watch; the defaults suit production (client-go's values)."""

    page_size: int = 500
    # list as a streamed list (a watch with sendInitialEvents, Kubernetes 1.27+): one object
    # in memory at a time instead of a page; paged lists where the server refuses it
    watch_list: bool = False
    # server-side timeoutSeconds of each watch: uniform in [min, 2*min], as client-go
    min_watch_timeout: float = 300.0
    # client read timeout of the watch stream; None: the watch's timeoutSeconds + 30 s
    read_timeout: float | None = None
    # no event nor bookmark for this long: the stream is presumed dead, restart the watch
    inactivity_timeout: float = 180.0
    backoff_initial: float = 0.8
    backoff_max: float = 30.0
    backoff_jitter: float = 0.5
    backoff_reset_after: float = 120.0

    def backoff(self) -> Backoff:
        return Backoff(
            self.backoff_initial,
            self.backoff_max,
            jitter=self.backoff_jitter,
            reset_after=self.backoff_reset_after,
        )


@dataclass(slots=True)
class ReflectorStats:
    """Counters of what the reflector went through (for tests, debugging and metrics)."""

    lists: int = 0  # successful lists (the first sync and every relist)
    list_errors: int = 0
    watches: int = 0  # watch requests started
    watch_errors: int = 0  # watches that failed (transport, 5xx, 403, ...), not 410
    gone: int = 0  # 410 Gone on a watch, each followed by a relist
    inactivity_restarts: int = 0  # watches the inactivity watchdog restarted
    events: int = 0  # ADDED/MODIFIED/DELETED events applied
    bookmarks: int = 0


class EventSink(Protocol):
    """Where a reflector reports changes to its store (objects are the stored ones)."""

    def on_add(self, obj: MutableObj) -> None: ...
    def on_update(self, old: MutableObj, new: MutableObj) -> None: ...
    def on_delete(self, obj: MutableObj) -> None: ...


class Reflector:
    """List + watch one kind (optionally one namespace, selectors) into a store."""

    def __init__(
        self,
        client: Client,
        kind: Kind,
        store: Store,
        sink: EventSink,
        *,
        namespace: str | None = None,
        label_selector: Selector | None = None,
        field_selector: Selector | None = None,
        options: ReflectorOptions | None = None,
        on_state: Callable[[], None] | None = None,
    ) -> None:
        self.client = client
        self.kind = kind
        self.store = store
        self.sink = sink
        self.namespace = namespace if kind.namespaced else None
        self.label_selector = selector_string(label_selector)
        self.field_selector = selector_string(field_selector)
        self.options = options or ReflectorOptions()
        self._on_state = on_state
        self.stats = ReflectorStats()
        self.resource_version: str | None = None
        self.has_synced = False
        self.last_sync_error: BaseException | None = None  # of the latest list attempt
        self._backoff = self.options.backoff()
        self._delivered = False  # the current watch delivered an event or bookmark
        self._stream_refused = False  # the server refused a streamed list: page instead

    def __repr__(self) -> str:
        scope = f" in {self.namespace}" if self.namespace else ""
        return f"<Reflector {self.kind.name}{scope} rv={self.resource_version}>"

    # --- the loop ------------------------------------------------------------------------

    async def run(self) -> None:
        """List and watch until cancelled. Restarted after a cancel, it resumes the watch
        from where it stopped (a 410 then relists)."""
        need_list = not self.has_synced
        while True:
            fresh = False
            if need_list:
                try:
                    await self._list()
                except Exception as exc:
                    self._failed_list(exc)
                    await anyio.sleep(self._backoff.next())
                    continue
                need_list, fresh = False, True
            try:
                await self._watch()
            except errors.Gone as exc:
                # Our resourceVersion is too old: relist at once, like client-go (but a watch
                # from a list's own resourceVersion that is Gone again must not spin).
                self.stats.gone += 1
                log.info("%s: watch expired (%s), relisting", self.kind.name, exc.message)
                need_list = True
                if fresh and not self._delivered:
                    await anyio.sleep(self._backoff.next())
            except Exception as exc:
                self.stats.watch_errors += 1
                # Transient failures resume the watch; others (RBAC revoked, CRD deleted)
                # may have changed what we can see, so relist.
                need_list = not errors.is_retriable(exc)
                delay = self._backoff.next()
                log.warning(
                    "%s: watch failed, retrying in %.1fs: %s", self.kind.name, delay, _text(exc)
                )
                await anyio.sleep(delay)

    async def _list_items(self) -> tuple[list[MutableObj], str]:
        """Every object, transformed, and the resourceVersion to watch from."""
        opts = self.options
        # A client without streamed lists (a test's stand-in) lists in pages.
        streamed = getattr(self.client, "list_streamed", None)
        if opts.watch_list and not self._stream_refused and streamed is not None:
            timeout_seconds = max(1, int(2 * opts.min_watch_timeout))
            try:
                return await streamed(
                    self.kind,
                    self.namespace,
                    label_selector=self.label_selector,
                    field_selector=self.field_selector,
                    transform=self.store.transform,
                    timeout_seconds=timeout_seconds,
                    read_timeout=opts.read_timeout or timeout_seconds + 30.0,
                )
            except (errors.BadRequest, errors.Invalid, errors.MethodNotAllowed) as exc:
                self._stream_refused = True
                log.info("%s: no streamed list (%s), listing in pages", self.kind.name, exc)
        return await self.client.list_all(
            self.kind,
            self.namespace,
            label_selector=self.label_selector,
            field_selector=self.field_selector,
            page_size=opts.page_size,
            transform=self.store.transform,
        )

    async def _list(self) -> None:
        items, rv = await self._list_items()
        changes = self.store.replace(items, transformed=True)
        self.resource_version = rv
        self.stats.lists += 1
        self.last_sync_error = None
        if self.has_synced:
            log.info(
                "%s: relisted at %s: %d added, %d updated, %d deleted",
                self.kind.name,
                rv,
                len(changes.added),
                len(changes.updated),
                len(changes.deleted),
            )
        # Deletes first: a consumer that accounts for resources frees before it claims.
        sink = self.sink
        for obj in changes.deleted:
            sink.on_delete(obj)
        for old, new in changes.updated:
            sink.on_update(old, new)
        for obj in changes.added:
            sink.on_add(obj)
        self.has_synced = True
        self._state_changed()

    def _failed_list(self, exc: Exception) -> None:
        self.stats.list_errors += 1
        self.last_sync_error = exc
        if isinstance(exc, errors.ApiError):
            log.warning("%s: list failed: %s", self.kind.name, _text(exc))
        else:
            log.exception("%s: list failed", self.kind.name, exc_info=exc)
        self._state_changed()

    def _state_changed(self) -> None:
        if self._on_state is not None:
            self._on_state()

    async def _watch(self) -> None:
        """One watch request, until the server ends it or the watchdog restarts it."""
        opts = self.options
        timeout_seconds = max(
            1, int(random.uniform(opts.min_watch_timeout, 2 * opts.min_watch_timeout))
        )
        # The server ends the stream at timeout_seconds; a socket silent well past that is dead.
        read_timeout = opts.read_timeout or timeout_seconds + 30.0
        self.stats.watches += 1
        started = anyio.current_time()
        self._delivered = False
        with anyio.CancelScope() as watchdog:
            watchdog.deadline = started + opts.inactivity_timeout
            events = self.client.watch(
                self.kind,
                self.namespace,
                resource_version=self.resource_version,
                label_selector=self.label_selector,
                field_selector=self.field_selector,
                timeout_seconds=timeout_seconds,
                allow_bookmarks=True,
                read_timeout=read_timeout,
            )
            # The loop's clock is anyio's on asyncio, without a backend lookup per event;
            # the deadline (a timer rescheduled on each set) moves once per ``step`` at
            # most, so the watchdog fires within ``step`` past the timeout.
            now = asyncio.get_running_loop().time
            step = min(_MAX_DEADLINE_STEP, opts.inactivity_timeout / 8)
            moved = started
            async with contextlib.aclosing(events):
                async for event in events:
                    if (t := now()) - moved >= step:
                        watchdog.deadline = t + opts.inactivity_timeout
                        moved = t
                    self._delivered = True
                    self._apply(event)
        if watchdog.cancelled_caught:
            self.stats.inactivity_restarts += 1
            log.info(
                "%s: no event nor bookmark for %gs, restarting the watch",
                self.kind.name,
                opts.inactivity_timeout,
            )
        elif not self._delivered and anyio.current_time() - started < 1.0:
            # A stream that ends at once and empty, over and over, must not spin.
            await anyio.sleep(self._backoff.next())

    def _apply(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        obj = event.get("object") or {}
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        if kind == "BOOKMARK":
            self.stats.bookmarks += 1
        elif kind == "ADDED" or kind == "MODIFIED":
            self.stats.events += 1
            old, new = self.store.upsert(obj)
            if old is None:
                self.sink.on_add(new)
            else:
                self.sink.on_update(old, new)
        elif kind == "DELETED":
            self.stats.events += 1
            transform = self.store.transform
            final = transform(obj) if transform is not None else obj
            self.store.delete(object_key(final))
            self.sink.on_delete(final)
        else:
            log.warning("%s: ignoring watch event of type %r", self.kind.name, kind)
            return
        if rv:
            self.resource_version = rv


def _text(exc: BaseException) -> str:
    if isinstance(exc, errors.ApiError):
        return f"{type(exc).__name__}: {exc.message}"
    return f"{type(exc).__name__}: {exc}"

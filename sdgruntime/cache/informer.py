"""The shared informer: one reflector and store per kind, fanning events out to handlers."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sdgruntime.cache.reflector import Reflector, ReflectorOptions, Selector
from sdgruntime.cache.store import IndexFunc, Store, Transform, drop_managed_fields
from sdgruntime.cache.sync import Notifier, wait_synced
from sdgruntime.kinds import Kind, MutableObj

if TYPE_CHECKING:
    from sdgruntime.client import Client

__all__ = ["NAMESPACE_INDEX", "Handler", "Informer", "namespace_index"]

log = logging.getLogger(__name__)

NAMESPACE_INDEX = "metadata.namespace"
"""The index every informer of a namespaced kind has, so namespace lists skip a scan."""


def namespace_index(obj: MutableObj) -> list[str]:
    ns = obj["metadata"].get("namespace")
    return [ns] if ns else []


# Handlers may return anything (a method that also answers its own callers): it is ignored.
OnAdd = Callable[[MutableObj], object]
OnUpdate = Callable[[MutableObj, MutableObj], object]
OnDelete = Callable[[MutableObj], object]

_ids = itertools.count(1)


@dataclass(frozen=True, slots=True, eq=False)
class Handler:
    """A registration returned by :meth:`Informer.add_handler` (to remove it again)."""

    on_add: OnAdd | None
    on_update: OnUpdate | None
    on_delete: OnDelete | None
    id: int


class Informer:
    """One kind's list/watch, store and event handlers, shared by every controller.

    Handlers are plain callables run inline on the event loop as each change is applied,
    in order; they must be cheap (enqueue a request, update a counter) and must not mutate
    the objects they get, which are the stored ones. A handler that raises is logged and
    the others still run.
    """

    def __init__(
        self,
        client: Client,
        kind: Kind,
        *,
        namespace: str | None = None,
        label_selector: Selector | None = None,
        field_selector: Selector | None = None,
        transform: Transform | None = drop_managed_fields,
        options: ReflectorOptions | None = None,
    ) -> None:
        self.kind = kind
        self.store = Store(transform=transform)
        if kind.namespaced:
            self.store.add_indexer(NAMESPACE_INDEX, namespace_index)
        self._handlers: tuple[Handler, ...] = ()
        self._listeners: list[Callable[[], None]] = []
        self._changed = Notifier()
        self._running = False
        self.reflector = Reflector(
            client,
            kind,
            self.store,
            self,
            namespace=namespace,
            label_selector=label_selector,
            field_selector=field_selector,
            options=options,
            on_state=self._state_changed,
        )

    def __repr__(self) -> str:
        return f"<Informer {self.kind.name} synced={self.has_synced}>"

    # --- state ---------------------------------------------------------------------------

    @property
    def has_synced(self) -> bool:
        """The first list has been stored (and its add events delivered)."""
        return self.reflector.has_synced

    @property
    def last_sync_error(self) -> BaseException | None:
        """Why the latest list failed (None once a list succeeded)."""
        return self.reflector.last_sync_error

    def add_state_listener(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` after every list attempt, successful or not."""
        self._listeners.append(callback)

    def _state_changed(self) -> None:
        self._changed.notify()
        for cb in self._listeners:
            cb()

    async def wait_for_sync(self, timeout: float) -> None:  # noqa: ASYNC109 - in the error
        """Return once synced; raise CacheSyncError early on a permanent list error, or at
        the timeout."""
        await wait_synced(lambda: (self,), self._changed, timeout)

    async def run(self) -> None:
        """List and watch until cancelled."""
        if self._running:
            raise RuntimeError(f"informer for {self.kind.name} is already running")
        self._running = True
        try:
            await self.reflector.run()
        finally:
            self._running = False

    # --- indexes and handlers ------------------------------------------------------------

    def add_index(self, name: str, fn: IndexFunc) -> None:
        """Add an index (objects already stored are indexed at once)."""
        self.store.add_indexer(name, fn)

    def add_handler(
        self,
        on_add: OnAdd | None = None,
        on_update: OnUpdate | None = None,
        on_delete: OnDelete | None = None,
    ) -> Handler:
        """Register handlers; objects already in the store are delivered to ``on_add`` now,
        so a late handler sees the same world as an early one."""
        handler = Handler(on_add, on_update, on_delete, next(_ids))
        if on_add is not None:
            for obj in self.store.list(copy=False):
                _call(on_add, obj)
        self._handlers = (*self._handlers, handler)
        return handler

    def remove_handler(self, handler: Handler) -> None:
        self._handlers = tuple(h for h in self._handlers if h is not handler)

    # --- EventSink (called by the reflector) ---------------------------------------------

    def on_add(self, obj: MutableObj) -> None:
        for h in self._handlers:
            if h.on_add is not None:
                _call(h.on_add, obj)

    def on_update(self, old: MutableObj, new: MutableObj) -> None:
        for h in self._handlers:
            if h.on_update is not None:
                _call(h.on_update, old, new)

    def on_delete(self, obj: MutableObj) -> None:
        for h in self._handlers:
            if h.on_delete is not None:
                _call(h.on_delete, obj)


def _call(fn: Callable[..., object], *args: MutableObj) -> None:
    try:
        fn(*args)
    except Exception:
        log.exception("event handler %r failed", fn)

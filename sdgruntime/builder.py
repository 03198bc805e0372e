"""A fluent way to declare a controller, as controller-runtime's ``builder``.

``mgr.controller(name).for_(KIND).owns(OTHER).watches(KIND2, handler).complete(rec)``:
``for_`` is the reconciled kind, ``owns`` enqueues the controlling owner (of the ``for_``
kind) of another kind's objects, ``watches`` takes any handler. ``complete`` builds the
:class:`~sdgruntime.controller.Controller` and adds it to the manager; as in
controller-runtime it refuses a builder that would never reconcile (no ``for_`` and no
``watches``), ``owns`` without ``for_``, and a controller with neither ``for_`` nor a name.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, cast

from sdgruntime.cache import Cache
from sdgruntime.controller import Controller
from sdgruntime.handler import EnqueueRequestForObject, EnqueueRequestForOwner, EventHandler
from sdgruntime.kinds import Kind
from sdgruntime.predicate import Predicate
from sdgruntime.reconcile import Reconciler, ReconcilerFunc, Request, Result

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

__all__ = ["Builder", "ControllerHost"]


class _HostOptions(Protocol):
    @property
    def cache_sync_timeout(self) -> float: ...
    @property
    def graceful_shutdown_timeout(self) -> float: ...
    @property
    def skip_name_validation(self) -> bool: ...


class ControllerHost(Protocol):
    """What a builder needs of its manager (:class:`~sdgruntime.manager.Manager` is one):
    the builder knows the manager only by this, so the manager may hand out builders
    (``mgr.controller(name)``) without an import cycle."""

    @property
    def options(self) -> _HostOptions: ...
    @property
    def cache(self) -> Cache: ...
    @property
    def tracer_provider(self) -> TracerProvider | None: ...
    def add_controller(self, controller: Controller) -> Controller: ...


_OPTIONS = frozenset(
    {
        "max_concurrent_reconciles",
        "rate_limiter",
        "need_leader_election",
        "cache_sync_timeout",
        "graceful_shutdown_timeout",
        "skip_name_validation",
        "tracer_provider",
        "clock",
    }
)


@dataclass(slots=True)
class _Source:
    kind: Kind
    handler: EventHandler
    predicates: tuple[Predicate, ...]


@dataclass(slots=True)
class Builder:
    """Collects a controller's watches and options; ``complete`` creates it."""

    manager: ControllerHost
    name: str | None = None
    _for: _Source | None = None
    _owns: list[tuple[Kind, tuple[Predicate, ...]]] = field(default_factory=list)
    _watches: list[_Source] = field(default_factory=list)
    _filters: list[Predicate] = field(default_factory=list)
    _options: dict[str, Any] = field(default_factory=dict)

    def for_(self, kind: Kind, predicates: Iterable[Predicate] = ()) -> Builder:
        """The kind this controller reconciles: its events enqueue the object itself."""
        if self._for is not None:
            raise ValueError("for_() may be called only once")
        self._for = _Source(kind, EnqueueRequestForObject(), tuple(predicates))
        return self

    def owns(self, kind: Kind, predicates: Iterable[Predicate] = ()) -> Builder:
        """Objects of ``kind`` controlled by a ``for_`` object: their events enqueue it."""
        self._owns.append((kind, tuple(predicates)))
        return self

    def watches(
        self, kind: Kind, handler: EventHandler, predicates: Iterable[Predicate] = ()
    ) -> Builder:
        """Any other source: ``handler`` maps ``kind``'s events to requests."""
        self._watches.append(_Source(kind, handler, tuple(predicates)))
        return self

    def with_event_filter(self, predicate: Predicate) -> Builder:
        """A predicate for every watch of this controller."""
        self._filters.append(predicate)
        return self

    def with_options(self, **options: Any) -> Builder:
        """Controller options: ``max_concurrent_reconciles``, ``rate_limiter``,
        ``need_leader_election``, ``cache_sync_timeout``, ``graceful_shutdown_timeout``,
        ``skip_name_validation``. Unknown names are refused here, not at ``complete()``."""
        unknown = set(options) - _OPTIONS
        if unknown:
            raise TypeError(
                f"unknown controller options {sorted(unknown)}; known: {sorted(_OPTIONS)}"
            )
        self._options.update(options)
        return self

    def _check_watches(self) -> None:
        """As controller-runtime's builder: ``owns`` only with ``for_``, and at least one
        watch, or the controller would never be woken."""
        where = f"controller {self.name!r}" if self.name else "a controller"
        if self._for is None and self._owns:
            raise ValueError(
                f"{where}: owns() needs for_(): the owner whose reconcile an owned object's "
                "event triggers is of the for_() kind; call .for_(kind) first"
            )
        if self._for is None and not self._watches:
            raise ValueError(
                f"{where} has no watches, so nothing would ever reconcile: call "
                ".for_(kind) with the kind it reconciles (or .watches(kind, handler)) "
                "before .complete(). A controller fed only by enqueue() is built as "
                "Controller(name, reconciler, mgr.cache) and mgr.add_controller(controller)"
            )

    def complete(
        self, reconciler: Reconciler | Callable[[Request], Awaitable[Result | None]]
    ) -> Controller:
        """Build the controller, add it to the manager and return it."""
        target: Reconciler
        if isinstance(reconciler, type) or hasattr(reconciler, "reconcile"):
            # As given: Controller checks it (check_reconciler), and refuses a class passed
            # instead of an instance with what to write instead.
            target = cast(Reconciler, reconciler)
        elif callable(reconciler):
            target = ReconcilerFunc(reconciler)  # refuses a sync function
        else:
            raise TypeError(
                f"{reconciler!r} is neither a Reconciler (an object with `async def "
                "reconcile(self, request)`) nor an async function of the request"
            )
        self._check_watches()
        name = self.name or (self._for.kind.kind.lower() if self._for else None)
        if not name:
            raise ValueError(
                "a controller without for_() needs a name: mgr.controller(name) (a for_() "
                "controller defaults to its kind's)"
            )
        mgr = self.manager
        options: dict[str, Any] = {
            "cache_sync_timeout": mgr.options.cache_sync_timeout,
            "graceful_shutdown_timeout": mgr.options.graceful_shutdown_timeout,
            "tracer_provider": mgr.tracer_provider,
            "skip_name_validation": mgr.options.skip_name_validation,
            **self._options,
        }
        controller = Controller(name, target, mgr.cache, predicates=self._filters, **options)
        if self._for is not None:
            controller.watch(self._for.kind, self._for.handler, self._for.predicates)
            for kind, predicates in self._owns:
                handler = EnqueueRequestForOwner(self._for.kind, only_controller=True)
                controller.watch(kind, handler, predicates)
        for source in self._watches:
            controller.watch(source.kind, source.handler, source.predicates)
        mgr.add_controller(controller)
        return controller

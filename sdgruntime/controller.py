"""The controller: watch events -> requests -> work queue -> N workers -> Reconciler.

As controller-runtime's ``controller``: each watch is a kind in the shared cache, an
:class:`~sdgruntime.handler.EventHandler` and predicates; :class:`Controller` runs the
workers. Invariants: a request is reconciled by at most one worker at a time, workers
start only once the cache has synced, and an exception never kills a worker. What each
reconcile outcome does to the queue: docs/contracts.md, "What a reconcile's outcome
does". A graceful stop lets in-flight reconciles finish for up to
``graceful_shutdown_timeout``; :meth:`Controller.abort` cancels them at once.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import anyio
import anyio.abc
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from sdgruntime import errors, metrics, tracing
from sdgruntime.handler import EnqueueRequestForObject, EventHandler
from sdgruntime.kinds import Kind, Obj
from sdgruntime.log import reconciling
from sdgruntime.predicate import Predicate
from sdgruntime.ratelimiter import RateLimiter
from sdgruntime.reconcile import Reconciler, Request, Result, TerminalError, check_reconciler
from sdgruntime.workqueue import Clock, ShutDown, WorkQueue

__all__ = ["CacheLike", "Controller", "InformerLike", "Watch"]

log = logging.getLogger(__name__)


UNFINISHED_WORK_INTERVAL = 0.5  # seconds between workqueue_unfinished_work refreshes
_RESULTS = ("success", "error", "requeue", "requeue_after")


class InformerLike(Protocol):
    """What a controller needs of an informer (``sdgruntime.cache.Informer``)."""

    def add_handler(
        self,
        on_add: Callable[[Any], None],
        on_update: Callable[[Any, Any], None],
        on_delete: Callable[[Any], None],
    ) -> Any: ...

    def remove_handler(self, handler: Any) -> None: ...

    async def wait_for_sync(self, timeout: float) -> None: ...  # noqa: ASYNC109


class CacheLike(Protocol):
    """What a controller needs of the shared cache (``sdgruntime.cache.Cache``)."""

    def informer(self, kind: Kind) -> InformerLike: ...


@dataclass(frozen=True, slots=True)
class Watch:
    """One event source of a controller: a kind, its handler, and its predicates."""

    kind: Kind
    handler: EventHandler
    predicates: tuple[Predicate, ...] = ()


def _all_of(
    preds: tuple[Predicate, ...],
) -> tuple[Callable[[Obj], bool], Callable[[Obj, Obj], bool], Callable[[Obj], bool]]:
    """Whether an event passes every predicate, for create, update and delete. Every event
    of a kind runs these once per watch: one predicate (the usual case) is called as it
    is, none costs nothing, and only several make a generator per event."""
    if not preds:
        return (lambda _obj: True), (lambda _old, _new: True), (lambda _obj: True)
    if len(preds) == 1:
        return preds[0].create, preds[0].update, preds[0].delete
    return (
        lambda obj: all(p.create(obj) for p in preds),
        lambda old, new: all(p.update(old, new) for p in preds),
        lambda obj: all(p.delete(obj) for p in preds),
    )


class Controller:
    """Runs ``reconciler`` for the requests its watches produce (docs/contracts.md).

    ``name`` labels metrics, logs and spans; a manager refuses a second controller of the
    same name unless ``skip_name_validation=True``. ``reconciler`` must have an ``async def
    reconcile(request)`` (checked here: a sync one would fail only at the first event).
    ``predicates`` apply to every watch, in addition to each watch's own.
    ``need_leader_election=False`` lets a manager run it on every replica.
    ``clock`` and ``rate_limiter`` go to the work queue (tests inject a FakeClock).
    """

    def __init__(
        self,
        name: str,
        reconciler: Reconciler,
        cache: CacheLike,
        *,
        max_concurrent_reconciles: int = 1,
        rate_limiter: RateLimiter[Request] | None = None,
        predicates: Sequence[Predicate] = (),
        need_leader_election: bool = True,
        cache_sync_timeout: float = 120.0,
        graceful_shutdown_timeout: float = 30.0,
        tracer_provider: trace.TracerProvider | None = None,
        clock: Clock | None = None,
        skip_name_validation: bool = False,
    ) -> None:
        if not name:
            raise ValueError("a controller needs a name")
        if max_concurrent_reconciles < 1:
            raise ValueError("max_concurrent_reconciles must be >= 1")
        check_reconciler(reconciler)
        self.name = name
        self.skip_name_validation = skip_name_validation
        self.reconciler = reconciler
        self.cache = cache
        self.max_concurrent_reconciles = max_concurrent_reconciles
        self.need_leader_election = need_leader_election
        self.cache_sync_timeout = cache_sync_timeout
        self.graceful_shutdown_timeout = graceful_shutdown_timeout
        self.predicates = tuple(predicates)
        self.tracer_provider = tracer_provider
        self.queue: WorkQueue[Request] = WorkQueue(
            name, controller=name, rate_limiter=rate_limiter, clock=clock
        )
        self._watches: list[Watch] = []
        self._started = False
        self._aborted = False
        self._inflight: set[anyio.CancelScope] = set()
        self._tracer: trace.Tracer | None = None
        # Resolve the metric children once: reconcile is the hot path.
        self._m_total = {r: metrics.RECONCILE_TOTAL.labels(name, r) for r in _RESULTS}
        self._m_errors = metrics.RECONCILE_ERRORS.labels(name)
        self._m_terminal = metrics.TERMINAL_RECONCILE_ERRORS.labels(name)
        self._m_time = metrics.RECONCILE_TIME.labels(name)
        self._m_active = metrics.ACTIVE_WORKERS.labels(name)
        self._m_max = metrics.MAX_CONCURRENT_RECONCILES.labels(name)

    def __repr__(self) -> str:
        return f"Controller({self.name!r})"

    # --- configuration ------------------------------------------------------------------

    def watch(
        self,
        kind: Kind,
        handler: EventHandler | None = None,
        predicates: Iterable[Predicate] = (),
    ) -> Controller:
        """Reconcile what ``handler`` (default: the object itself) makes of ``kind``'s
        events that pass ``predicates``. Only before the controller starts."""
        if self._started:
            raise RuntimeError(f"controller {self.name}: watch() after start")
        self._watches.append(
            Watch(kind, handler or EnqueueRequestForObject(), (*self.predicates, *predicates))
        )
        return self

    @property
    def watches(self) -> list[Watch]:
        return list(self._watches)

    @property
    def kinds(self) -> list[Kind]:
        """The kinds this controller reads events of (for the cache to set up early)."""
        return list(dict.fromkeys(w.kind for w in self._watches))

    # --- requests from elsewhere ----------------------------------------------------------

    def enqueue(self, request: Request, after: float = 0.0) -> None:
        """Queue ``request`` (e.g. from a timer or another controller); deduplicated.

        Raises ``TypeError`` for anything but a :class:`Request` and ``ValueError`` for a
        delay that is not a finite number (as :meth:`WorkQueue.add_after`).
        """
        if not isinstance(request, Request):
            raise TypeError(f"enqueue() needs a Request, not {type(request).__name__}")
        if not math.isfinite(after):
            raise ValueError(f"enqueue() delay must be finite, not {after!r}")
        if after > 0:
            self.queue.add_after(request, after)
        else:
            self.queue.add(request)

    # --- event dispatch (sync, called by the informer) ------------------------------------

    def _handlers(self, w: Watch) -> tuple[Callable[..., None], ...]:
        handler, name = w.handler, self.name
        add = self._add_from_handler
        create_ok, update_ok, delete_ok = _all_of(w.predicates)

        def on_add(obj: Obj) -> None:
            try:
                if create_ok(obj):
                    for request in handler.create(obj):
                        add(request, w, "create")
            except Exception:
                log.exception("controller %s: create handler for %s failed", name, w.kind.name)

        def on_update(old: Obj, new: Obj) -> None:
            try:
                if update_ok(old, new):
                    for request in handler.update(old, new):
                        add(request, w, "update")
            except Exception:
                log.exception("controller %s: update handler for %s failed", name, w.kind.name)

        def on_delete(obj: Obj) -> None:
            try:
                if delete_ok(obj):
                    for request in handler.delete(obj):
                        add(request, w, "delete")
            except Exception:
                log.exception("controller %s: delete handler for %s failed", name, w.kind.name)

        return on_add, on_update, on_delete

    def _add_from_handler(self, request: object, w: Watch, event: str) -> None:
        """Queue what a handler made, if it is a Request: anything else (a name, a tuple, a
        dict from a map function) would fail later in a worker, outside any handler."""
        if isinstance(request, Request):
            self.queue.add(request)
        else:
            log.error(
                "controller %s: %s handler for %s made %r, not a Request; dropped",
                self.name,
                event,
                w.kind.name,
                request,
            )

    # --- running --------------------------------------------------------------------------

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Register the watches, wait for the cache to sync, reconcile until cancelled.

        ``task_status.started()`` fires once the workers run. Runs once per instance.
        Raises the cache's ``CacheSyncError`` if a watched kind does not sync in time.
        """
        if self._started:
            raise RuntimeError(f"controller {self.name} already started")
        self._started = True
        if not self._watches:
            log.warning("controller %s has no watches: only enqueue() feeds it", self.name)
        self._tracer = tracing.tracer_for(self.tracer_provider)
        registered = []
        try:
            for w in self._watches:
                informer = self.cache.informer(w.kind)
                registered.append((informer, informer.add_handler(*self._handlers(w))))
            for informer, _ in registered:
                await informer.wait_for_sync(self.cache_sync_timeout)
            self._m_max.set(self.max_concurrent_reconciles)
            async with anyio.create_task_group() as tg:
                tg.start_soon(self.queue.run)
                tg.start_soon(self._report_unfinished_work)
                for _ in range(self.max_concurrent_reconciles):
                    tg.start_soon(self._worker)
                log.info(
                    "controller %s: started %d workers", self.name, self.max_concurrent_reconciles
                )
                task_status.started()
                try:
                    await anyio.sleep_forever()
                finally:
                    with anyio.CancelScope(shield=True):
                        await self._drain()
        finally:
            for informer, registration in registered:
                informer.remove_handler(registration)
            self.queue.shutdown()
            log.info("controller %s: stopped", self.name)

    def abort(self) -> None:
        """Stop at once: hand out nothing more and cancel in-flight reconciles (lost
        leadership). Safe to call at any time, also before or after ``run``."""
        self._aborted = True
        self.queue.shutdown()
        for scope in list(self._inflight):
            scope.cancel()

    async def _drain(self) -> None:
        """Graceful stop: no new requests; in-flight reconciles get the timeout to finish."""
        if self._inflight and not self._aborted:
            log.info(
                "controller %s: stopping, waiting for %d in-flight reconciles",
                self.name,
                len(self._inflight),
            )
            with anyio.move_on_after(self.graceful_shutdown_timeout):
                await self.queue.shutdown_with_drain()
        self.queue.shutdown()
        if self._inflight:
            log.warning(
                "controller %s: cancelling %d reconciles that did not finish in time",
                self.name,
                len(self._inflight),
            )
            for scope in list(self._inflight):
                scope.cancel()

    async def _report_unfinished_work(self) -> None:
        while True:
            await anyio.sleep(UNFINISHED_WORK_INTERVAL)
            self.queue.update_unfinished_work()

    async def _worker(self) -> None:
        """Reconciles what the queue hands out until it shuts down (``_drain`` always shuts
        it down). Shielded, in one scope for the worker's life rather than one per request
        (that was ~2% of the manager's CPU): a graceful stop lets the running reconcile
        finish; abort/_drain cancel the scopes of the workers in a reconcile."""
        request: Request | None = None
        with anyio.CancelScope(shield=True) as scope:
            while True:
                try:
                    request = await self.queue.get()
                except ShutDown:
                    return
                self._inflight.add(scope)
                self._m_active.inc()
                try:
                    await self._process(request)
                finally:
                    self._m_active.dec()
                    self._inflight.discard(scope)
                    self.queue.done(request)
                request = None
        if scope.cancelled_caught and request is not None:
            log.info("controller %s: reconcile of %s cancelled", self.name, request)

    async def _process(self, request: Request) -> None:
        with reconciling(self.name, request):  # for sdgruntime.log.from_context()
            await self._traced(request)

    async def _traced(self, request: Request) -> None:
        tracer = self._tracer
        start = time.perf_counter()
        if tracer is None:
            await self._reconcile(request, None)
        else:
            with tracer.start_as_current_span(
                f"reconcile {self.name}",
                context=otel_context.Context(),  # each reconcile is its own trace
                kind=SpanKind.INTERNAL,
                attributes={
                    "controller": self.name,
                    "request.namespace": request.namespace or "",
                    "request.name": request.name,
                },
                record_exception=False,
                set_status_on_exception=False,
            ) as span:
                await self._reconcile(request, span)
        self._m_time.observe(time.perf_counter() - start)

    async def _reconcile(self, request: Request, span: trace.Span | None) -> None:
        """One reconcile and its consequences for the queue, the metrics and the span.

        Everything that depends on what the reconciler returned runs inside the ``try``: a
        reconciler that returns something other than ``Result``/``None`` is a bug that
        must be counted and retried like any other error, never kill the worker.
        """
        queue = self.queue
        try:
            result = await self.reconciler.reconcile(request)
            if result is None:
                result = Result()
            elif not isinstance(result, Result):
                raise TypeError(f"reconcile returned {_short_repr(result)}, not a Result or None")
            if result.requeue_after:
                queue.forget(request)
                queue.add_after(request, result.requeue_after)
                outcome = "requeue_after"
            elif result.requeue:
                queue.add_rate_limited(request)
                outcome = "requeue"
            else:
                queue.forget(request)
                outcome = "success"
        except Exception as err:
            # A reconciler running a task group raises an ExceptionGroup: it is terminal
            # only if every error in it is, and routine only if every one is.
            leaves = _leaves(err)
            terminal = all(isinstance(e, TerminalError) for e in leaves)
            if terminal:
                self._m_terminal.inc()
                queue.forget(request)  # nothing pending: don't keep its backoff around
            else:
                queue.add_rate_limited(request)
            self._m_errors.inc()
            self._m_total["error"].inc()
            if span is not None:
                span.set_attribute("result", "error")
                span.record_exception(err)
                span.set_status(Status(StatusCode.ERROR, f"{type(err).__name__}: {err}"))
            # API errors (conflicts, ...) are routine: no traceback. Anything else is a bug.
            log.error(
                "controller %s: reconcile of %s failed%s: %s",
                self.name,
                request,
                " (terminal, not retried)" if terminal else "",
                "; ".join(f"{type(e).__name__}: {e}" for e in leaves),
                exc_info=not all(isinstance(e, errors.ApiError | TerminalError) for e in leaves),
            )
            return
        self._m_total[outcome].inc()
        if span is not None:
            span.set_attribute("result", outcome)


def _leaves(err: BaseException) -> list[BaseException]:
    """The errors inside (nested) exception groups, or ``[err]``."""
    if isinstance(err, BaseExceptionGroup):
        return [leaf for sub in err.exceptions for leaf in _leaves(sub)]
    return [err]


def _short_repr(value: object, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."

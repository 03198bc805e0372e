"""Controller semantics a reconciler relies on, driven by an in-memory informer and a fake
clock: requeue rules, backoff, one worker per key, graceful stop, metrics, spans; and the
handlers and predicates that turn watch events into requests."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from sdgruntime import errors, tracing
from sdgruntime.controller import Controller
from sdgruntime.handler import (
    EnqueueRequestForObject,
    EnqueueRequestForOwner,
    EnqueueRequestsFromMapFunc,
    request_for,
)
from sdgruntime.kinds import CONFIGMAPS, NODES, PODS, Kind
from sdgruntime.metrics import REGISTRY
from sdgruntime.predicate import (
    And,
    AnnotationChangedPredicate,
    Funcs,
    GenerationChangedPredicate,
    LabelChangedPredicate,
    Not,
    Or,
    ResourceVersionChangedPredicate,
)
from sdgruntime.reconcile import Request, Result, TerminalError
from sdgruntime.workqueue import FakeClock
from tests.runtime.helpers import settle

SDG = Kind("deviceshare.io", "v1alpha1", "SharedDeviceGroup", "shareddevicegroups", False)
DEPLOY = Kind("apps", "v1", "Deployment", "deployments", True)
_names = itertools.count()


def unique(prefix: str) -> str:
    """A controller name of its own per test, so metric samples are the test's alone."""
    return f"{prefix}-{next(_names)}"


def obj(
    name: str,
    namespace: str | None = "ns",
    *,
    generation: int = 1,
    rv: str = "1",
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    owners: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "generation": generation, "resourceVersion": rv}
    if namespace:
        meta["namespace"] = namespace
    if labels is not None:
        meta["labels"] = labels
    if annotations is not None:
        meta["annotations"] = annotations
    if owners is not None:
        meta["ownerReferences"] = owners
    return {"metadata": meta}


def sample(metric: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(metric, labels) or 0.0


# --- an in-memory informer and cache ------------------------------------------------------


class FakeInformer:
    """Delivers the events a test makes; synced when the test says so."""

    def __init__(self) -> None:
        self.handlers: list[tuple[Callable[..., None], ...]] = []
        self.synced = anyio.Event()
        self.synced.set()

    def add_handler(self, *callbacks: Callable[..., None]) -> tuple[Callable[..., None], ...]:
        self.handlers.append(callbacks)
        return callbacks

    def remove_handler(self, handler: tuple[Callable[..., None], ...]) -> None:
        self.handlers.remove(handler)

    async def wait_for_sync(self, timeout: float) -> None:  # noqa: ASYNC109
        with anyio.fail_after(timeout):
            await self.synced.wait()

    def add(self, o: dict[str, Any]) -> None:
        for on_add, _, _ in self.handlers:
            on_add(o)

    def update(self, old: dict[str, Any], new: dict[str, Any]) -> None:
        for _, on_update, _ in self.handlers:
            on_update(old, new)

    def delete(self, o: dict[str, Any]) -> None:
        for _, _, on_delete in self.handlers:
            on_delete(o)


class FakeCache:
    def __init__(self) -> None:
        self.informers: dict[Kind, FakeInformer] = {}

    def informer(self, kind: Kind) -> FakeInformer:
        return self.informers.setdefault(kind, FakeInformer())


@dataclass
class Scripted:
    """A reconciler that answers from a script per request name and records its calls."""

    script: dict[str, list[Any]] = field(default_factory=dict)
    calls: list[Request] = field(default_factory=list)
    called: anyio.Event = field(default_factory=anyio.Event)

    async def reconcile(self, request: Request) -> Result | None:
        self.calls.append(request)
        self.called.set()
        self.called = anyio.Event()
        steps = self.script.get(request.name)
        step = steps.pop(0) if steps else None
        if isinstance(step, BaseException):
            raise step
        return step

    def count(self, name: str) -> int:
        return sum(1 for r in self.calls if r.name == name)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@dataclass
class Running:
    controller: Controller
    cache: FakeCache
    clock: FakeClock
    scope: anyio.CancelScope

    @property
    def informer(self) -> FakeInformer:
        return self.cache.informer(CONFIGMAPS)


@pytest.fixture
async def run_controller() -> AsyncIterator[Callable[..., Any]]:
    """Start a controller on CONFIGMAPS with a FakeClock; stopped after the test."""
    async with anyio.create_task_group() as tg:

        async def start(reconciler: Any, **kwargs: Any) -> Running:
            cache, clock = FakeCache(), FakeClock()
            c = Controller(unique("unit"), reconciler, cache, clock=clock, **kwargs)
            c.watch(CONFIGMAPS)
            scope = anyio.CancelScope()

            async def run(*, task_status: Any) -> None:
                with scope:
                    await c.run(task_status=task_status)

            await tg.start(run)
            return Running(c, cache, clock, scope)

        yield start
        tg.cancel_scope.cancel()


pytestmark = pytest.mark.anyio


# --- requests and results --------------------------------------------------------------------


def test_request_is_a_hashable_value() -> None:
    a, b = Request("x", "ns"), Request("x", "ns")
    assert a == b and hash(a) == hash(b) and len({a, b, Request("x")}) == 2
    assert str(a) == "ns/x" and str(Request("node-1")) == "node-1"
    with pytest.raises(AttributeError):
        a.name = "y"  # type: ignore[misc]


def test_result_accepts_timedelta_and_rejects_negative_delays() -> None:
    from datetime import timedelta

    assert Result(requeue_after=timedelta(minutes=1)).requeue_after == 60.0
    assert Result().is_zero() and not Result(requeue=True).is_zero()
    with pytest.raises(ValueError):
        Result(requeue_after=-1)
    with pytest.raises(ValueError):
        Result(requeue_after=timedelta(seconds=-1))
    for bad in (float("nan"), float("inf"), float("-inf")):
        with pytest.raises(ValueError, match="finite"):
            Result(requeue_after=bad)


# --- the requeue rules ---------------------------------------------------------------------


async def test_success_reconciles_once_and_counts(run_controller: Any) -> None:
    r = Scripted()
    run = await run_controller(r)
    run.informer.add(obj("a"))
    await settle()
    run.clock.advance(3600)
    await settle()
    assert r.calls == [Request("a", "ns")]
    name = run.controller.name
    assert sample("controller_runtime_reconcile_total", controller=name, result="success") == 1
    assert sample("controller_runtime_reconcile_time_seconds_count", controller=name) == 1
    assert sample("workqueue_adds_total", name=name, controller=name) == 1


async def test_error_is_retried_with_growing_backoff_then_forgotten(run_controller: Any) -> None:
    r = Scripted({"a": [RuntimeError("boom"), RuntimeError("boom again"), None]})
    run = await run_controller(r)
    run.informer.add(obj("a"))
    await settle()
    assert r.count("a") == 1
    assert run.controller.queue.num_requeues(Request("a", "ns")) == 1

    run.clock.advance(0.004)  # the first retry waits 5 ms
    await settle()
    assert r.count("a") == 1
    run.clock.advance(0.001)
    await settle()
    assert r.count("a") == 2

    run.clock.advance(0.009)  # the second waits 10 ms
    await settle()
    assert r.count("a") == 2
    run.clock.advance(0.001)
    await settle()
    assert r.count("a") == 3
    assert run.controller.queue.num_requeues(Request("a", "ns")) == 0  # success forgets

    name = run.controller.name
    assert sample("controller_runtime_reconcile_errors_total", controller=name) == 2
    assert sample("controller_runtime_reconcile_total", controller=name, result="error") == 2
    assert sample("controller_runtime_reconcile_total", controller=name, result="success") == 1
    assert sample("controller_runtime_terminal_reconcile_errors_total", controller=name) == 0
    assert sample("workqueue_retries_total", name=name, controller=name) == 2


async def test_an_exception_never_kills_the_worker(run_controller: Any) -> None:
    r = Scripted({"a": [ValueError("bug")]})
    run = await run_controller(r, max_concurrent_reconciles=1)
    run.informer.add(obj("a"))
    run.informer.add(obj("b"))
    await settle()
    assert [c.name for c in r.calls] == ["a", "b"]


@pytest.mark.parametrize(
    "returned",
    [True, 5, {"requeue_after": 5}, Result, "done"],
    ids=["True", "int", "dict", "the-Result-class", "str"],
)
async def test_a_non_result_return_is_an_error_not_a_dead_worker(
    run_controller: Any, returned: Any, caplog: pytest.LogCaptureFixture
) -> None:
    r = Scripted({"a": [returned, None]})
    run = await run_controller(r, max_concurrent_reconciles=1)
    run.informer.add(obj("a"))
    await settle()
    assert run.controller.queue.num_requeues(Request("a", "ns")) == 1  # rate limited
    name = run.controller.name
    assert sample("controller_runtime_reconcile_errors_total", controller=name) == 1
    assert sample("controller_runtime_reconcile_total", controller=name, result="error") == 1
    assert "not a Result or None" in caplog.text
    run.informer.add(obj("b"))  # the one worker still runs
    run.clock.advance(0.005)  # and the retry of "a" happens
    await settle()
    assert [c.name for c in r.calls] == ["a", "b", "a"]
    assert sample("controller_runtime_reconcile_total", controller=name, result="success") == 2


async def test_handlers_drop_what_is_not_a_request(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """With tracing on, a non-Request reaching a worker used to kill the controller."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    cache, r = FakeCache(), Scripted()

    def sloppy(o: Any) -> list[Any]:
        return ["just-a-name", ("ns", "tuple"), None, Request("good")]

    c = Controller(unique("sloppy"), r, cache, tracer_provider=provider)
    c.watch(NODES, EnqueueRequestsFromMapFunc(sloppy))
    async with anyio.create_task_group() as tg:
        await tg.start(c.run)
        cache.informer(NODES).add(obj("n", None))
        cache.informer(NODES).update(obj("n", None), obj("n", None, rv="2"))
        cache.informer(NODES).delete(obj("n", None))
        await settle()
        assert r.calls == [Request("good")]
        assert "'just-a-name', not a Request; dropped" in caplog.text
        with pytest.raises(TypeError, match="Request"):
            c.enqueue("later")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="finite"):
            c.enqueue(Request("x"), after=float("nan"))
        c.enqueue(Request("good"))  # the controller is still alive
        await settle()
        assert r.calls == [Request("good")] * 2
        tg.cancel_scope.cancel()


async def test_terminal_error_is_not_retried(run_controller: Any) -> None:
    r = Scripted({"a": [TerminalError("spec can never work")]})
    run = await run_controller(r)
    run.informer.add(obj("a"))
    await settle()
    run.clock.advance(10_000)
    await settle()
    assert r.count("a") == 1
    assert run.controller.queue.num_requeues(Request("a", "ns")) == 0
    name = run.controller.name
    assert sample("controller_runtime_terminal_reconcile_errors_total", controller=name) == 1
    assert sample("controller_runtime_reconcile_errors_total", controller=name) == 1
    assert sample("controller_runtime_reconcile_total", controller=name, result="error") == 1

    run.informer.update(obj("a"), obj("a", rv="2"))  # the next event reconciles again
    await settle()
    assert r.count("a") == 2


@dataclass
class Fanout:
    """A reconciler that runs its work in a task group, one child per error to raise: anyio
    then raises an ExceptionGroup of them out of reconcile()."""

    failures: list[Exception]
    calls: int = 0

    async def reconcile(self, request: Request) -> None:
        self.calls += 1

        async def fail(err: Exception) -> None:
            raise err

        async with anyio.create_task_group() as tg:
            for err in self.failures:
                tg.start_soon(fail, err)


async def failed(run: Running, times: int) -> None:
    """Settle until the controller has counted ``times`` failed reconciles (a task group's
    failure takes anyio a few more loop turns: it cancels the siblings first)."""
    for _ in range(100):
        await settle()
        errors_total = "controller_runtime_reconcile_errors_total"
        if sample(errors_total, controller=run.controller.name) >= times:
            return
    raise AssertionError(f"not {times} failed reconciles")


async def test_a_task_group_of_terminal_errors_is_terminal(
    run_controller: Any, caplog: pytest.LogCaptureFixture
) -> None:
    r = Fanout([TerminalError("no image"), TerminalError("no port")])
    run = await run_controller(r)
    run.informer.add(obj("a"))
    await failed(run, 1)
    run.clock.advance(10_000)
    await settle()
    assert r.calls == 1  # not retried
    assert run.controller.queue.num_requeues(Request("a", "ns")) == 0
    name = run.controller.name
    assert sample("controller_runtime_terminal_reconcile_errors_total", controller=name) == 1
    (record,) = [rec for rec in caplog.records if "reconcile of ns/a failed" in rec.getMessage()]
    # each error of the group named; no traceback: terminal errors are not bugs
    assert record.getMessage().endswith(
        "failed (terminal, not retried): TerminalError: no image; TerminalError: no port"
    )
    assert not record.exc_info


async def test_a_task_group_with_one_retriable_error_is_retried(
    run_controller: Any, caplog: pytest.LogCaptureFixture
) -> None:
    r = Fanout([TerminalError("no image"), errors.Conflict("object was modified", code=409)])
    run = await run_controller(r)
    run.informer.add(obj("a"))
    await failed(run, 1)
    assert run.controller.queue.num_requeues(Request("a", "ns")) == 1  # rate limited
    run.clock.advance(0.005)
    await failed(run, 2)
    assert r.calls == 2
    name = run.controller.name
    assert sample("controller_runtime_terminal_reconcile_errors_total", controller=name) == 0
    records = [rec for rec in caplog.records if "reconcile of ns/a failed" in rec.getMessage()]
    assert "TerminalError: no image; Conflict: object was modified" in records[0].getMessage()
    assert not records[0].exc_info  # API and terminal errors are routine
    # a bug inside the group is logged with its traceback
    r.failures = [ValueError("bug")]
    run.clock.advance(0.01)
    await failed(run, 3)
    assert r.calls == 3
    last = [rec for rec in caplog.records if "reconcile of ns/a failed" in rec.getMessage()][-1]
    assert last.getMessage().endswith("failed: ValueError: bug") and last.exc_info


async def test_requeue_after_waits_exactly_and_is_not_a_failure(run_controller: Any) -> None:
    r = Scripted({"a": [Result(requeue_after=30)]})
    run = await run_controller(r)
    run.informer.add(obj("a"))
    await settle()
    assert run.controller.queue.num_requeues(Request("a", "ns")) == 0
    run.clock.advance(29.999)
    await settle()
    assert r.count("a") == 1
    run.clock.advance(0.001)
    await settle()
    assert r.count("a") == 2
    name = run.controller.name
    assert sample("controller_runtime_reconcile_total", controller=name, result="requeue_after")
    assert sample("controller_runtime_reconcile_errors_total", controller=name) == 0


async def test_requeue_true_backs_off_like_a_failure(run_controller: Any) -> None:
    r = Scripted({"a": [Result(requeue=True)]})
    run = await run_controller(r)
    run.informer.add(obj("a"))
    await settle()
    assert run.controller.queue.num_requeues(Request("a", "ns")) == 1
    run.clock.advance(0.005)
    await settle()
    assert r.count("a") == 2
    name = run.controller.name
    assert sample("controller_runtime_reconcile_total", controller=name, result="requeue") == 1
    assert sample("controller_runtime_reconcile_errors_total", controller=name) == 0


async def test_one_worker_per_key_and_events_meanwhile_collapse(run_controller: Any) -> None:
    release = anyio.Event()
    running: Counter[str] = Counter()
    peak: Counter[str] = Counter()
    calls: Counter[str] = Counter()

    class Blocking:
        async def reconcile(self, request: Request) -> None:
            calls[request.name] += 1
            running[request.name] += 1
            peak[request.name] = max(peak[request.name], running[request.name])
            try:
                if request.name == "a":
                    await release.wait()
            finally:
                running[request.name] -= 1

    run = await run_controller(Blocking(), max_concurrent_reconciles=4)
    run.informer.add(obj("a"))
    await settle()
    for rv in "234":  # three more events while "a" is being reconciled
        run.informer.update(obj("a"), obj("a", rv=rv))
    run.informer.add(obj("b"))  # other keys are not held up
    await settle()
    assert running["a"] == 1 and calls["b"] == 1
    name = run.controller.name
    assert sample("controller_runtime_active_workers", controller=name) == 1
    assert sample("controller_runtime_max_concurrent_reconciles", controller=name) == 4

    release.set()
    await settle()
    assert calls["a"] == 2  # the three events made exactly one more reconcile
    assert peak["a"] == 1
    assert sample("controller_runtime_active_workers", controller=name) == 0


async def test_workers_start_only_after_the_cache_synced() -> None:
    cache, r = FakeCache(), Scripted()
    informer = cache.informer(CONFIGMAPS)
    informer.synced = anyio.Event()
    c = Controller(unique("sync"), r, cache).watch(CONFIGMAPS)
    async with anyio.create_task_group() as tg:
        tg.start_soon(c.run)
        await settle()
        informer.add(obj("a"))  # the initial list arrives before the cache reports synced
        await settle()
        assert r.calls == []
        informer.synced.set()
        await settle()
        assert r.calls == [Request("a", "ns")]
        tg.cancel_scope.cancel()
    assert informer.handlers == []  # unregistered when stopped


# --- stopping -------------------------------------------------------------------------------


async def test_graceful_stop_lets_in_flight_reconciles_finish() -> None:
    cache, entered, release = FakeCache(), anyio.Event(), anyio.Event()
    finished: list[str] = []

    class Slow:
        async def reconcile(self, request: Request) -> None:
            entered.set()
            await release.wait()
            await anyio.lowlevel.checkpoint()  # may still await after the stop began
            finished.append(request.name)

    c = Controller(unique("graceful"), Slow(), cache, graceful_shutdown_timeout=60)
    c.watch(CONFIGMAPS)
    stop, stopped = anyio.CancelScope(), anyio.Event()

    async def run() -> None:
        with stop:
            await c.run()
        stopped.set()

    with anyio.fail_after(10):  # a stop that never ends fails here, not at the 300 s limit
        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            await settle()
            cache.informer(CONFIGMAPS).add(obj("a"))
            await entered.wait()
            stop.cancel()  # stop while "a" is in flight
            cache.informer(CONFIGMAPS).add(obj("b"))  # not handed out any more
            await settle()
            assert not stopped.is_set()  # waiting for "a"
            release.set()
    assert stopped.is_set()
    assert finished == ["a"]


async def test_graceful_stop_cancels_reconciles_that_overrun_the_timeout() -> None:
    cache, entered = FakeCache(), anyio.Event()
    outcome: list[str] = []

    class Stuck:
        async def reconcile(self, request: Request) -> None:
            entered.set()
            try:
                await anyio.sleep_forever()
            except anyio.get_cancelled_exc_class():
                outcome.append("cancelled")
                raise

    c = Controller(unique("overrun"), Stuck(), cache, graceful_shutdown_timeout=0.01)
    c.watch(CONFIGMAPS)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(c.run)
            await settle()
            cache.informer(CONFIGMAPS).add(obj("a"))
            await entered.wait()
            tg.cancel_scope.cancel()
    assert outcome == ["cancelled"]


async def test_abort_cancels_in_flight_reconciles_at_once() -> None:
    cache, entered = FakeCache(), anyio.Event()
    outcome: list[str] = []

    class Stuck:
        async def reconcile(self, request: Request) -> None:
            entered.set()
            try:
                await anyio.sleep_forever()
            except anyio.get_cancelled_exc_class():
                outcome.append("cancelled")
                raise

    c = Controller(unique("abort"), Stuck(), cache, graceful_shutdown_timeout=3600)
    c.watch(CONFIGMAPS)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(c.run)
            await settle()
            cache.informer(CONFIGMAPS).add(obj("a"))
            await entered.wait()
            c.abort()
            tg.cancel_scope.cancel()
    assert outcome == ["cancelled"]


# --- watches: handlers and predicates through the controller ----------------------------------


async def test_owned_objects_enqueue_their_controller_owner() -> None:
    cache, r = FakeCache(), Scripted()
    c = Controller(unique("owns"), r, cache)
    c.watch(DEPLOY).watch(PODS, EnqueueRequestForOwner(DEPLOY, only_controller=True))
    ref = {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "controller": True}
    async with anyio.create_task_group() as tg:
        tg.start_soon(c.run)
        await settle()
        cache.informer(PODS).add(obj("web-1", owners=[ref]))
        cache.informer(PODS).add(obj("lonely"))
        await settle()
        assert r.calls == [Request("web", "ns")]
        tg.cancel_scope.cancel()


async def test_predicates_filter_each_event_kind() -> None:
    cache, r = FakeCache(), Scripted()
    c = Controller(unique("pred"), r, cache, predicates=[Funcs(delete=lambda o: False)])
    c.watch(CONFIGMAPS, predicates=[GenerationChangedPredicate()])
    async with anyio.create_task_group() as tg:
        tg.start_soon(c.run)
        await settle()
        inf = cache.informer(CONFIGMAPS)
        inf.add(obj("a"))
        await settle()
        inf.update(obj("a"), obj("a", rv="2", labels={"x": "y"}))  # status/metadata only
        await settle()
        assert r.count("a") == 1
        inf.update(obj("a", rv="2"), obj("a", rv="3", generation=2))  # spec changed
        await settle()
        assert r.count("a") == 2
        inf.delete(obj("a", generation=2))  # filtered by the controller-wide predicate
        await settle()
        assert r.count("a") == 2
        tg.cancel_scope.cancel()


async def test_a_failing_map_function_does_not_stop_other_events() -> None:
    cache, r = FakeCache(), Scripted()

    def fragile(o: Any) -> list[Request]:
        if o["metadata"]["name"] == "bad":
            raise KeyError("spec")
        return [request_for(o)]

    c = Controller(unique("fragile"), r, cache).watch(NODES, EnqueueRequestsFromMapFunc(fragile))
    async with anyio.create_task_group() as tg:
        tg.start_soon(c.run)
        await settle()
        cache.informer(NODES).add(obj("bad", None))
        cache.informer(NODES).add(obj("good", None))
        await settle()
        assert r.calls == [Request("good")]
        tg.cancel_scope.cancel()


async def test_enqueue_from_outside_the_watches(run_controller: Any) -> None:
    r = Scripted()
    run = await run_controller(r)
    run.controller.enqueue(Request("timer"))
    run.controller.enqueue(Request("later"), after=5)
    await settle()
    assert r.calls == [Request("timer")]
    run.clock.advance(5)
    await settle()
    assert r.calls == [Request("timer"), Request("later")]


# --- tracing ----------------------------------------------------------------------------------


async def test_one_span_per_reconcile_with_result_and_reconciler_attributes() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    cache, clock = FakeCache(), FakeClock()

    class Enriching:
        def __init__(self) -> None:
            self.failed = False

        async def reconcile(self, request: Request) -> None:
            trace.get_current_span().set_attribute("sdg.node", "node-1")
            if not self.failed:
                self.failed = True
                raise RuntimeError("first try fails")

    name = unique("trace")
    c = Controller(name, Enriching(), cache, tracer_provider=provider, clock=clock)
    c.watch(CONFIGMAPS)
    async with anyio.create_task_group() as tg:
        tg.start_soon(c.run)
        await settle()
        cache.informer(CONFIGMAPS).add(obj("a"))
        await settle()
        clock.advance(1)
        await settle()
        tg.cancel_scope.cancel()
    spans = exporter.get_finished_spans()
    assert [s.name for s in spans] == [f"reconcile {name}"] * 2
    first, second = spans
    assert first.attributes is not None and second.attributes is not None
    assert dict(first.attributes) == {
        "controller": name,
        "request.namespace": "ns",
        "request.name": "a",
        "sdg.node": "node-1",
        "result": "error",
    }
    assert first.status.status_code == trace.StatusCode.ERROR
    assert [e.name for e in first.events] == ["exception"]
    assert second.attributes["result"] == "success"
    assert first.context.trace_id != second.context.trace_id  # each reconcile its own trace


def test_tracing_is_off_without_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_SDK_DISABLED"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    assert tracing.exporter_names() == []
    assert tracing.setup_tracing("sdg", set_global=False) is None
    assert tracing.tracer_for(trace.NoOpTracerProvider()) is None
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")
    assert tracing.exporter_names() == ["otlp"]
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console,otlp")
    assert tracing.exporter_names() == ["console", "otlp"]
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    assert tracing.exporter_names() == []
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "zipkin")
    with pytest.raises(tracing.TracingConfigError, match="zipkin"):
        tracing.exporter_names()
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert tracing.exporter_names() == []


def test_setup_tracing_builds_the_configured_exporters(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "from-env")
    provider = tracing.setup_tracing("sdg", set_global=False)
    assert provider is not None
    assert provider.resource.attributes["service.name"] == "from-env"
    assert tracing.tracer_for(provider) is not None
    provider.shutdown()
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")  # its package is not installed
    with pytest.raises(tracing.TracingConfigError, match="opentelemetry-exporter-otlp-proto-grpc"):
        tracing.setup_tracing("sdg", set_global=False)


# --- handlers (pure) ----------------------------------------------------------------------------


def _ref(kind: str, name: str, api: str = "deviceshare.io/v1alpha1", **kw: Any) -> dict[str, Any]:
    return {"apiVersion": api, "kind": kind, "name": name, "uid": "u", **kw}


def test_owner_handler_matches_group_and_kind_in_any_version() -> None:
    h = EnqueueRequestForOwner(SDG)
    pod = obj(
        "p",
        owners=[
            _ref("SharedDeviceGroup", "g1", controller=True),
            _ref("SharedDeviceGroup", "g2", api="deviceshare.io/v1beta1"),
            _ref("SharedDeviceGroup", "other-group", api="example.com/v1alpha1"),
            _ref("ReplicaSet", "rs", api="apps/v1"),
        ],
    )
    # a cluster-scoped owner has no namespace, even for a namespaced dependent
    assert list(h.create(pod)) == [Request("g1"), Request("g2")]
    assert list(EnqueueRequestForOwner(SDG, only_controller=True).delete(pod)) == [Request("g1")]


def test_owner_handler_update_reconciles_old_and_new_owners() -> None:
    h = EnqueueRequestForOwner(DEPLOY)
    old = obj("p", owners=[_ref("Deployment", "a", api="apps/v1")])
    new = obj("p", owners=[_ref("Deployment", "b", api="apps/v1")])
    assert list(h.update(old, new)) == [Request("a", "ns"), Request("b", "ns")]
    assert list(h.update(new, new)) == [Request("b", "ns")]
    core = EnqueueRequestForOwner(CONFIGMAPS)  # core group: apiVersion "v1"
    assert list(core.create(obj("x", owners=[_ref("ConfigMap", "c", api="v1")]))) == [
        Request("c", "ns")
    ]
    assert list(h.create(obj("node", None, owners=[_ref("Deployment", "a")]))) == []


def test_object_and_map_handlers() -> None:
    h = EnqueueRequestForObject()
    assert list(h.create(obj("a"))) == [Request("a", "ns")]
    assert list(h.update(obj("a"), obj("a", rv="2"))) == [Request("a", "ns")]
    assert list(h.delete(obj("n", None))) == [Request("n")]

    def group_of(o: Any) -> list[Request]:
        g = (o["metadata"].get("annotations") or {}).get("deviceshare.io/group")
        return [Request(g)] if g else []

    m = EnqueueRequestsFromMapFunc(group_of)
    old = obj("p", annotations={"deviceshare.io/group": "g1"})
    new = obj("p", annotations={"deviceshare.io/group": "g2"})
    assert list(m.update(old, new)) == [Request("g1"), Request("g2")]
    assert list(m.update(new, new)) == [Request("g2")]
    assert list(m.create(obj("p"))) == []


# --- predicates (pure) --------------------------------------------------------------------------


def test_change_predicates_filter_updates_only() -> None:
    base = obj("a", labels={"x": "1"}, annotations={"k": "v"})
    cases = {
        GenerationChangedPredicate(): obj("a", generation=2, labels={"x": "1"}),
        LabelChangedPredicate(): obj("a", labels={"x": "2"}, annotations={"k": "v"}),
        AnnotationChangedPredicate(): obj("a", labels={"x": "1"}, annotations={}),
        ResourceVersionChangedPredicate(): obj("a", rv="2", labels={"x": "1"}),
    }
    for pred, changed in cases.items():
        assert pred.create(base) and pred.delete(base), pred
        assert not pred.update(base, base), pred
        assert pred.update(base, changed), pred
    # absent labels/annotations equal empty ones
    assert not LabelChangedPredicate().update(obj("a"), obj("a", labels={}))
    assert not AnnotationChangedPredicate().update(obj("a"), obj("a", annotations={}))


def test_predicate_combinators_and_funcs() -> None:
    gen, labels = GenerationChangedPredicate(), LabelChangedPredicate()
    a, relabelled = obj("a"), obj("a", labels={"x": "1"})
    assert Or(gen, labels).update(a, relabelled)
    assert not And(gen, labels).update(a, relabelled)
    assert Not(gen).update(a, a) and not Not(gen).create(a)
    only_ns = Funcs(create=lambda o: o["metadata"].get("namespace") == "ns")
    assert only_ns.create(a) and not only_ns.create(obj("a", "other"))
    assert only_ns.update(a, a) and only_ns.delete(a)  # no function: passes

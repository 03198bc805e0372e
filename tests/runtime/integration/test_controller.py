"""Controllers against the real API server: ConfigMap creates, updates and deletes are
reconciled from the shared cache; a failing reconcile is retried until it succeeds;
owned objects wake their owner; every reconcile is one span."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from sdgruntime import errors
from sdgruntime.cache import KindOptions
from sdgruntime.client import Client
from sdgruntime.kinds import CONFIGMAPS, SECRETS
from sdgruntime.manager import Manager, ManagerOptions
from sdgruntime.metrics import REGISTRY
from sdgruntime.reconcile import Request, Result

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


def cm(name: str, **data: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data}


async def until(predicate: Callable[[], Any], within: float = 20.0) -> None:
    """Poll until ``predicate()`` is true; a hang guard, not a timing assertion."""
    with anyio.fail_after(within):
        while not predicate():  # noqa: ASYNC110 - polls state of other tasks and the API
            await anyio.sleep(0.02)


def options(namespace: str) -> ManagerOptions:
    return ManagerOptions(
        metrics_bind_address="0",
        health_probe_bind_address="0",
        cache_by_kind={
            CONFIGMAPS: KindOptions(namespace=namespace),
            SECRETS: KindOptions(namespace=namespace),
        },
    )


@pytest.fixture
async def start(client: Client) -> AsyncIterator[Callable[[Manager], Any]]:
    """Run managers until the test ends."""
    async with anyio.create_task_group() as tg:

        async def run(mgr: Manager) -> Manager:
            await tg.start(mgr.run_until_cancelled)
            return mgr

        yield run
        tg.cancel_scope.cancel()


async def test_configmap_creates_updates_and_deletes_are_reconciled(
    client: Client, namespace: str, start: Any
) -> None:
    mgr = Manager(client, options=options(namespace))
    seen: list[tuple[str, str | None]] = []

    class Mirror:
        """Records what the cache holds for each request (None once deleted)."""

        async def reconcile(self, request: Request) -> None:
            found = mgr.cache.find(CONFIGMAPS, request.name, request.namespace)
            try:
                obj = mgr.cache.get(CONFIGMAPS, request.name, request.namespace)
            except errors.NotFound:
                assert found is None  # find says None where get says NotFound
                seen.append((request.name, None))
                return
            assert found == obj
            seen.append((request.name, (obj.get("data") or {}).get("v")))

    mgr.controller("cm-mirror").for_(CONFIGMAPS).complete(Mirror())
    await client.create(CONFIGMAPS, cm("existing", v="0"), namespace)
    await start(mgr)

    await until(lambda: ("existing", "0") in seen)  # objects present at start
    await client.create(CONFIGMAPS, cm("a", v="1"), namespace)
    await until(lambda: ("a", "1") in seen)
    await client.patch(CONFIGMAPS, "a", {"data": {"v": "2"}}, namespace)
    await until(lambda: ("a", "2") in seen)
    await client.delete(CONFIGMAPS, "a", namespace)
    await until(lambda: ("a", None) in seen)
    assert seen.index(("a", "1")) < seen.index(("a", "2")) < seen.index(("a", None))


async def test_a_failing_reconcile_is_retried_until_it_succeeds(
    client: Client, namespace: str, start: Any
) -> None:
    mgr = Manager(client, options=options(namespace))
    attempts: list[Request] = []

    class Flaky:
        """Fails twice, then writes its result to the object."""

        async def reconcile(self, request: Request) -> None:
            attempts.append(request)
            if len(attempts) <= 2:
                raise RuntimeError(f"transient failure #{len(attempts)}")
            await client.patch(
                CONFIGMAPS, request.name, {"data": {"done": "yes"}}, request.namespace
            )

    name = f"flaky-{uuid.uuid4().hex[:6]}"
    mgr.controller(name).for_(CONFIGMAPS).complete(Flaky())
    await start(mgr)
    await client.create(CONFIGMAPS, cm("x"), namespace)

    async def done() -> bool:
        obj = await client.get(CONFIGMAPS, "x", namespace)
        return (obj.get("data") or {}).get("done") == "yes"

    with anyio.fail_after(20):
        while not await done():  # noqa: ASYNC110 - polls the API server
            await anyio.sleep(0.05)
    assert attempts[:3] == [Request("x", namespace)] * 3
    labels = {"controller": name}
    assert REGISTRY.get_sample_value("controller_runtime_reconcile_errors_total", labels) == 2
    success = REGISTRY.get_sample_value(
        "controller_runtime_reconcile_total", {**labels, "result": "success"}
    )
    assert success is not None and success >= 1


async def test_owned_objects_wake_their_owner(client: Client, namespace: str, start: Any) -> None:
    """A ConfigMap that owns a Secret is reconciled when its Secret changes."""
    mgr = Manager(client, options=options(namespace))
    requests: list[Request] = []

    async def reconcile(request: Request) -> Result:
        requests.append(request)
        return Result()

    mgr.controller("cm-owns-secrets").for_(CONFIGMAPS).owns(SECRETS).complete(reconcile)
    await start(mgr)
    owner = await client.create(CONFIGMAPS, cm("owner"), namespace)
    await until(lambda: Request("owner", namespace) in requests)
    requests.clear()
    ref = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": "owner",
        "uid": owner["metadata"]["uid"],
        "controller": True,
    }
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "owned", "ownerReferences": [ref]},
        "stringData": {"k": "v"},
    }
    await client.create(SECRETS, secret, namespace)
    await until(lambda: Request("owner", namespace) in requests)
    assert Request("owned", namespace) not in requests


async def test_each_reconcile_is_one_span(client: Client, namespace: str, start: Any) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    mgr = Manager(client, options=options(namespace), tracer_provider=provider)
    reconciles: list[Request] = []

    async def reconcile(request: Request) -> None:
        reconciles.append(request)
        trace.get_current_span().set_attribute("test.data", "enriched")

    name = f"traced-{uuid.uuid4().hex[:6]}"
    mgr.controller(name).for_(CONFIGMAPS).complete(reconcile)
    await start(mgr)
    for i in range(3):
        await client.create(CONFIGMAPS, cm(f"t{i}"), namespace)
    await until(lambda: len(reconciles) >= 3)
    spans = [s for s in exporter.get_finished_spans() if s.name == f"reconcile {name}"]
    assert len(spans) == len(reconciles)
    by_name = {s.attributes["request.name"]: s for s in spans if s.attributes}
    assert set(by_name) == {"t0", "t1", "t2"}
    for span in by_name.values():
        assert span.attributes is not None
        assert span.attributes["controller"] == name
        assert span.attributes["request.namespace"] == namespace
        assert span.attributes["result"] == "success"
        assert span.attributes["test.data"] == "enriched"

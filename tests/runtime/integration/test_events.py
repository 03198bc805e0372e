"""sdgruntime.events.EventRecorder against the real local kube-apiserver."""

from __future__ import annotations

import logging
import uuid
from typing import Any

import anyio
import pytest

from sdgruntime.cache import KindOptions
from sdgruntime.client import Client
from sdgruntime.events import EventRecorder
from sdgruntime.kinds import CONFIGMAPS, EVENTS, NODES
from sdgruntime.manager import Manager, ManagerOptions

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


async def _events_about(client: Client, obj: dict[str, Any], namespace: str) -> list[dict]:
    page = await client.list(
        EVENTS, namespace, field_selector=f"involvedObject.uid={obj['metadata']['uid']}"
    )
    return page["items"]


async def test_repeated_event_is_aggregated_into_one_with_count(client: Client, namespace: str):
    cm = await client.create(CONFIGMAPS, {"metadata": {"name": "subject"}}, namespace)
    recorder = EventRecorder(client, "sdg-test", host="node-a")
    for _ in range(3):
        await recorder.event(cm, "Warning", "NoFit", "0/3 nodes are available")

    (event,) = await _events_about(client, cm, namespace)
    assert event["count"] == 3
    assert event["type"] == "Warning"
    assert event["reason"] == "NoFit"
    assert event["message"] == "0/3 nodes are available"
    assert event["source"] == {"component": "sdg-test", "host": "node-a"}
    assert event["firstTimestamp"] <= event["lastTimestamp"]
    assert event["metadata"]["name"].startswith("subject.")
    involved = event["involvedObject"]
    assert involved["kind"] == "ConfigMap"
    assert involved["apiVersion"] == "v1"
    assert involved["name"] == "subject"
    assert involved["namespace"] == namespace
    assert involved["uid"] == cm["metadata"]["uid"]


async def test_different_events_are_recorded_separately(client: Client, namespace: str):
    cm = await client.create(CONFIGMAPS, {"metadata": {"name": "subject"}}, namespace)
    recorder = EventRecorder(client, "sdg-test")
    await recorder.event(cm, "Normal", "Bound", "bound to node-1", action="Bind")
    await recorder.event(cm, "Normal", "Bound", "bound to node-2", action="Bind")
    await recorder.event(cm, "Warning", "Bound", "bound to node-2", action="Bind")
    events = await _events_about(client, cm, namespace)
    got = sorted((e["type"], e["message"], e["count"], e.get("action")) for e in events)
    assert got == [
        ("Normal", "bound to node-1", 1, "Bind"),
        ("Normal", "bound to node-2", 1, "Bind"),
        ("Warning", "bound to node-2", 1, "Bind"),
    ]


async def test_events_outside_the_window_start_a_new_event(client: Client, namespace: str):
    cm = await client.create(CONFIGMAPS, {"metadata": {"name": "subject"}}, namespace)
    recorder = EventRecorder(client, "sdg-test", window=0.0)  # every repeat is "late"
    await recorder.event(cm, "Normal", "Synced", "ok")
    await recorder.event(cm, "Normal", "Synced", "ok")
    events = await _events_about(client, cm, namespace)
    assert [e["count"] for e in events] == [1, 1]


async def test_aggregation_survives_a_deleted_event(client: Client, namespace: str):
    cm = await client.create(CONFIGMAPS, {"metadata": {"name": "subject"}}, namespace)
    recorder = EventRecorder(client, "sdg-test")
    await recorder.event(cm, "Normal", "Synced", "ok")
    (first,) = await _events_about(client, cm, namespace)
    await client.delete(EVENTS, first["metadata"]["name"], namespace)  # e.g. expired by TTL
    await recorder.event(cm, "Normal", "Synced", "ok")
    (second,) = await _events_about(client, cm, namespace)
    assert second["metadata"]["name"] != first["metadata"]["name"]
    assert second["count"] == 1


async def test_cluster_scoped_object_events_go_to_default(client: Client):
    node = await client.create(NODES, {"metadata": {"name": f"n-{uuid.uuid4().hex[:8]}"}})
    try:
        await EventRecorder(client, "sdg-test").event(node, "Normal", "Seen", "hello node")
        (event,) = await _events_about(client, node, "default")
        assert event["involvedObject"]["kind"] == "Node"
        assert "namespace" not in event["involvedObject"]
        await client.delete(EVENTS, event["metadata"]["name"], "default")
    finally:
        await client.delete(NODES, node["metadata"]["name"])


async def test_recording_failures_are_logged_not_raised(
    client: Client, caplog: pytest.LogCaptureFixture
):
    ghost = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "ghost", "namespace": f"no-such-{uuid.uuid4().hex[:6]}", "uid": "u"},
    }
    with caplog.at_level(logging.WARNING, logger="sdgruntime.events"):
        await EventRecorder(client, "sdg-test").event(ghost, "Warning", "Lost", "nowhere")
    assert "could not record event Warning/Lost on ConfigMap" in caplog.text


async def test_concurrent_repeats_still_make_one_event(client: Client, namespace: str):
    cm = await client.create(CONFIGMAPS, {"metadata": {"name": "subject"}}, namespace)
    recorder = EventRecorder(client, "sdg-test")
    async with anyio.create_task_group() as tg:
        for _ in range(5):
            tg.start_soon(recorder.event, cm, "Normal", "Busy", "same thing")
    (event,) = await _events_about(client, cm, namespace)
    assert event["count"] == 5


async def test_emitted_events_are_written_by_the_running_recorder(
    client: Client, namespace: str, caplog: pytest.LogCaptureFixture
):
    cm = await client.create(CONFIGMAPS, {"metadata": {"name": "emitted"}}, namespace)
    recorder = EventRecorder(client, "sdg-test")
    with caplog.at_level(logging.WARNING, logger="sdgruntime.events"):
        recorder.emit(cm, "Normal", "Early", "before run: dropped")
    assert "dropped event Early" in caplog.text
    async with anyio.create_task_group() as tg:
        await tg.start(recorder.run)
        for _ in range(3):
            recorder.emit(cm, "Normal", "Joined", "a pod joined")
        with anyio.fail_after(10):
            while True:
                events = await _events_about(client, cm, namespace)
                if events and events[0]["count"] >= 3:
                    break
                await anyio.sleep(0.05)
        tg.cancel_scope.cancel()
    assert [(e["reason"], e["count"]) for e in events] == [("Joined", 3)]


async def test_events_queued_when_the_manager_stops_are_all_on_the_api_server(
    kubeconfig: str, client: Client, namespace: str
) -> None:
    """The last Events before a restart (the binds before a rolling update) survive it."""
    cm = await client.create(CONFIGMAPS, {"metadata": {"name": "last-words"}}, namespace)
    options = ManagerOptions(
        kubeconfig=kubeconfig,
        metrics_bind_address="0",
        health_probe_bind_address="0",
        cache_by_kind={CONFIGMAPS: KindOptions(namespace=namespace)},
    )
    mgr = Manager(options=options)
    recorder = mgr.event_recorder("sdg-test")
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            await tg.start(mgr.run_until_cancelled)
            for i in range(300):
                recorder.emit(cm, "Normal", "Scheduled", f"pod-{i} bound to node-a")
            tg.cancel_scope.cancel()  # at once: nearly all of them are still queued
    assert recorder.dropped == 0
    events = await _events_about(client, cm, namespace)
    assert sorted(e["message"] for e in events) == sorted(
        f"pod-{i} bound to node-a" for i in range(300)
    )

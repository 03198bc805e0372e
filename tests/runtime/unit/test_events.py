"""EventRecorder bookkeeping that needs no API server: events lost at shutdown count."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from sdgruntime.events import EventRecorder
from sdgruntime.kinds import Kind

CM = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "ns"}}


class StuckClient:
    """An API server that never answers: writers block on their first create."""

    def __init__(self) -> None:
        self.creates = 0
        self.entered = anyio.Event()

    async def create(self, kind: Kind, obj: dict[str, Any], namespace: str) -> dict[str, Any]:
        self.creates += 1
        self.entered.set()
        await anyio.sleep_forever()
        raise AssertionError


@pytest.mark.anyio
async def test_events_still_queued_when_run_stops_are_counted_as_dropped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = StuckClient()
    recorder = EventRecorder(client, "test", writers=1)  # type: ignore[arg-type]
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            await tg.start(recorder.run)
            for i in range(4):
                recorder.emit(CM, "Normal", f"Reason{i}", "message")
            await client.entered.wait()  # the one writer holds the first event
            tg.cancel_scope.cancel()
    assert client.creates == 1
    assert recorder.dropped == 3
    assert caplog.text.count("dropped 3 queued events") == 1
    recorder.emit(CM, "Normal", "Late", "after the stop")  # not running: dropped too
    assert recorder.dropped == 4

"""envtest's FakeRecorder: what a reconciler emits, kept in order, nothing written."""

from __future__ import annotations

import pytest

from sdgruntime.envtest import FakeRecorder
from sdgruntime.events import EventRecorder

pytestmark = pytest.mark.anyio


async def test_emitted_events_are_kept_in_order() -> None:
    recorder = FakeRecorder()
    assert isinstance(recorder, EventRecorder)  # passes wherever a recorder is expected
    pod = {"metadata": {"name": "p", "namespace": "ns", "uid": "u1"}}
    recorder.emit(pod, "Normal", "Scheduled", "bound to n1")
    recorder.emit(pod, "Warning", "Failed", "no devices", action="Bind")
    assert recorder.emitted.is_set()
    assert [(e.name, e.uid, e.type, e.reason) for e in recorder.recorded] == [
        ("p", "u1", "Normal", "Scheduled"),
        ("p", "u1", "Warning", "Failed"),
    ]
    assert recorder.recorded[1].message == "no devices"
    assert recorder.recorded[1].action == "Bind"
    assert recorder.client.actions == []  # nothing was written

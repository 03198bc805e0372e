"""An EventRecorder for unit tests that keeps what it is told instead of writing it
(client-go's ``record.FakeRecorder``): pass it wherever an EventRecorder is expected and
read :attr:`FakeRecorder.recorded`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import anyio

from sdgruntime.envtest.fakeclient import FakeClient
from sdgruntime.events import EventRecorder, EventType


@dataclass(frozen=True, slots=True)
class RecordedEvent:
    """One :meth:`FakeRecorder.emit` call, as it was made."""

    object: Mapping[str, Any]
    type: EventType
    reason: str
    message: str
    action: str | None = None

    @property
    def name(self) -> str:
        return str((self.object.get("metadata") or {}).get("name") or "")

    @property
    def uid(self) -> str:
        return str((self.object.get("metadata") or {}).get("uid") or "")


class FakeRecorder(EventRecorder):
    """Records every :meth:`emit` in :attr:`recorded` (in order) and sets :attr:`emitted`;
    writes nothing, so it needs no :meth:`run` and no API server."""

    def __init__(self, component: str = "test") -> None:
        super().__init__(FakeClient(), component)  # type: ignore[arg-type]  # never written to
        self.recorded: list[RecordedEvent] = []
        self.emitted = anyio.Event()

    def emit(
        self,
        obj: Mapping[str, Any],
        type_: EventType,
        reason: str,
        message: str,
        *,
        action: str | None = None,
    ) -> None:
        self.recorded.append(RecordedEvent(obj, type_, reason, message, action))
        self.emitted.set()

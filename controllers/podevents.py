"""PodsJoined / PodsLeft events, coalesced per group.

The pods that joined or left a group are collected until the group has been quiet for
``quiet`` seconds (at most ``longest`` seconds after its first unreported change), then
told in one PodsJoined and one PodsLeft Event naming at most ``EVENT_PODS`` pods and
counting the rest ("and N more"), so bursts of pods do not cost an Event write per status
write. Invariants: nothing is lost but the timing (every pod is named or counted in its
group's next event), and memory is bounded: a group has pending state only until its
flush, dropped at once when the group is gone or replaced.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import anyio

from sdgruntime.events import EventRecorder
from sdgruntime.kinds import meta_of

#: Pods named in one PodsJoined/PodsLeft event; the rest are counted.
EVENT_PODS: Final = 10
#: A group's events go out once no pod has joined or left it for this many seconds: one
#: event per burst of pods. (A setting would be ``--pod-event-quiet``.)
EVENT_QUIET: Final = 5.0
#: ... but no later than this many seconds after its first unreported change, so a group
#: that never rests still reports.
EVENT_LONGEST: Final = 30.0
#: The runner tells what is due at most this often: an event comes up to this late.
EVENT_TICK: Final = 0.25


@dataclass(slots=True)
class _Names:
    """The first ``EVENT_PODS`` pod keys in arrival order and how many more came."""

    first: list[str] = field(default_factory=list)
    more: int = 0

    def add(self, keys: Iterable[str]) -> None:
        for key in keys:
            if key in self.first:
                # told again by a write made before the cache held our previous one
                continue
            if len(self.first) < EVENT_PODS:
                self.first.append(key)
            else:
                self.more += 1

    def text(self) -> str:
        more = f" and {self.more} more" if self.more else ""
        return ", ".join(self.first) + more


@dataclass(slots=True)
class _Pending:
    ref: dict[str, Any]  # the group's identity as of its newest status write
    due: float  # the earlier of (last change + quiet) and (first change + longest)
    latest: float  # first change + longest
    joined: _Names = field(default_factory=_Names)
    left: _Names = field(default_factory=_Names)


def _ref(group: Mapping[str, Any]) -> dict[str, Any]:
    """What an Event's involvedObject needs of the group, not the whole object."""
    meta = meta_of(group)
    return {
        "apiVersion": group.get("apiVersion"),
        "kind": group.get("kind"),
        "metadata": {k: meta[k] for k in ("name", "uid", "resourceVersion") if meta.get(k)},
    }


class PodEvents:
    """Collects each group's joined/left pods and emits them once the group is quiet."""

    def __init__(
        self,
        recorder: EventRecorder,
        *,
        quiet: float = EVENT_QUIET,
        longest: float = EVENT_LONGEST,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        for what, value in (("quiet", quiet), ("longest", longest)):
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{what} must be a finite number of seconds >= 0, not {value!r}")
        self.recorder = recorder
        self.quiet = quiet
        self.longest = max(longest, quiet)
        self.clock = clock
        self._pending: dict[str, _Pending] = {}
        # (due, seq, name); an entry whose due is no longer its group's is stale and skipped.
        # Every change pushes one, so there are at most as many as changes in ``longest``.
        self._heap: list[tuple[float, int, str]] = []
        self._seq = itertools.count()
        self._wake = anyio.Event()

    def __len__(self) -> int:
        """Groups with unreported changes."""
        return len(self._pending)

    def record(self, group: Mapping[str, Any], joined: Iterable[str], left: Iterable[str]) -> None:
        """Note that ``joined``/``left`` pods changed ``group`` (the object just written)."""
        joined, left = list(joined), list(left)
        if not joined and not left:
            return
        ref = _ref(group)
        name = ref["metadata"].get("name", "")
        now = self.clock()
        pending = self._pending.get(name)
        uid = ref["metadata"].get("uid")
        if pending is not None and pending.ref["metadata"].get("uid") != uid:
            self.flush(name)  # those changes were of the group this one replaced
            pending = None
        if pending is None:
            latest = now + self.longest
            pending = self._pending[name] = _Pending(ref, min(now + self.quiet, latest), latest)
        else:
            pending.ref = ref
            pending.due = min(now + self.quiet, pending.latest)
        pending.joined.add(joined)
        pending.left.add(left)
        if self.quiet <= 0:
            self.flush(name)
            return
        # No due is ever earlier than one already queued (now + quiet at most, and every
        # queued one was set no later than now): only an idle runner needs waking.
        heapq.heappush(self._heap, (pending.due, next(self._seq), name))
        self._wake.set()

    def flush(self, name: str) -> None:
        """Emit ``name``'s pending events now and drop its state (the group is gone)."""
        pending = self._pending.pop(name, None)
        if pending is None:
            return
        if pending.joined.first:
            self.recorder.emit(
                pending.ref, "Normal", "PodsJoined", f"pods joined: {pending.joined.text()}"
            )
        if pending.left.first:
            self.recorder.emit(
                pending.ref, "Normal", "PodsLeft", f"pods left: {pending.left.text()}"
            )

    def flush_due(self) -> float | None:
        """Emit every group whose time has come; seconds until the next one is due."""
        now = self.clock()
        while self._heap:
            due, _, name = self._heap[0]
            pending = self._pending.get(name)
            if pending is None or pending.due != due:
                heapq.heappop(self._heap)  # stale: flushed, or its due moved on
                continue
            if due > now:
                return due - now
            heapq.heappop(self._heap)
            self.flush(name)
        return None

    def flush_all(self) -> None:
        for name in list(self._pending):
            self.flush(name)
        self._heap.clear()

    async def run(self) -> None:
        """Emit pending events when due, until cancelled; then emit what is left (the
        recorder writes it if it still runs: leadership lost, shutdown). Wakes at most
        once per ``EVENT_TICK`` (or ``quiet``, if shorter) and tells every group due by
        then: a burst over many groups has as many dues as writes, and a wake per due was
        most of what the events cost the manager in S4."""
        tick = min(EVENT_TICK, self.quiet)
        try:
            while True:
                wait = self.flush_due()
                if wait is None:
                    await self._wake.wait()
                else:
                    await anyio.sleep(max(wait, tick))
                if self._wake.is_set():
                    self._wake = anyio.Event()
        finally:
            self.flush_all()


class BurstTeller:
    """Which binds of a group get their own Scheduled Event: one per burst, not one per pod.

    A bind is told if its group had no bind in the last ``quiet`` seconds (a new burst), or
    if the group's last told bind is ``longest`` seconds old (a group that never rests still
    tells one bind per ``longest``). The binds not told are named in the group's PodsJoined
    Event (``--allocated-pods names``), and each pod still shows its node and
    ``PodScheduled=True``. Memory: one entry per group bound within ``longest``, the
    oldest dropped first.
    """

    def __init__(
        self,
        *,
        quiet: float = EVENT_QUIET,
        longest: float = EVENT_LONGEST,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.quiet = quiet
        self.longest = max(longest, quiet)
        self.clock = clock
        # group -> (last bind, last told bind), in order of last bind (oldest first)
        self._last: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._last)

    def tell(self, group: str) -> bool:
        """Record a bind of ``group``; whether it gets its own Event."""
        now = self.clock()
        while self._last:
            oldest, (bound, _) = next(iter(self._last.items()))
            if now - bound < self.longest:
                break
            del self._last[oldest]
        last = self._last.pop(group, None)
        tell = last is None or now - last[0] >= self.quiet or now - last[1] >= self.longest
        self._last[group] = (now, now if tell or last is None else last[1])
        return tell

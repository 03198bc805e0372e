"""A Python contender's CPU by part while a phase runs: py-spy's raw stacks
(``compare.PySpy``), each sample given to the first part in ``PARTS`` with a frame on its
stack. S9's parts come from it: SDG's manager beside the floor, so a change in S9 names
what moved.

Part of the benchmarks, not of SDG.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

#: (part, frames): a sample belongs to the first part with one of its frames on the stack
#: (substrings of py-spy's ``function (file:line)`` frames). Most specific first: a
#: Binding POST runs inside a reconcile, a TLS write inside whatever asked for it.
PARTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("TLS handshakes", ("SSLObject.do_handshake ",)),
    ("webhook: the review", ("Webhook.review ", "Floor.mutate ")),
    ("webhook: HTTP server", ("sdgruntime/httpserver.py",)),
    # the floor's bind task POSTs the Binding and then its Event
    ("binds: checks, Binding POSTs", ("PodScheduler.reconcile ", "Floor.bind ")),
    ("Events", ("sdgruntime/events.py", "controllers/podevents.py")),
    # S4's contenders: SDG's status controller, the status floor's writer
    ("status writes", ("StatusController.reconcile ", "StatusFloor.write ")),
    ("other reconciles", ("Controller._reconcile ",)),
    (
        "watches: decode, cache, handlers",
        (
            *("sdgruntime/cache/", "sdgruntime/rest/watch.py", "Kube.watch "),
            *("Floor.on_pod ", "StatusFloor.on_pod "),
        ),
    ),
    ("controller queues and workers", ("sdgruntime/controller.py", "sdgruntime/workqueue.py")),
    ("TLS reads and writes", ("(ssl.py:",)),
    # requests no part above made, and the client's connections' own callbacks (the
    # floor's client is _kube.Kube; its module is on every stack of it, by run_loop)
    ("API client: other requests, reads", ("sdgruntime/client.py", "sdgruntime/rest/", "Kube.")),
    # nothing but the loop's own frames: its native work (polling, socket reads and
    # writes, callbacks) and what py-spy cannot see below it
    ("event loop (native)", ("asyncio/runners.py", "asyncio/base_events.py")),
)
OTHER = "other"
#: Leaf frames (py-spy ``--native``) of a thread waiting in the event loop's poll: py-spy
#: counts a thread woken there but not yet on a core as active, so on a busy host these
#: are run-queue waits, not CPU (47.6% of the manager's S4 samples in session 37).
WAITING = ("epoll_pwait (", "epoll_wait (")
#: Python frames that only block, as the deepest Python frame of a stack: with
#: ``--native`` py-spy counts a pool thread waiting for work as active when it cannot
#: name the libc frame it sleeps in (kopf's handler threads; so kopf is not profiled).
BLOCKING = (
    "_worker (concurrent/futures/thread.py:",  # a pool thread waiting on its work queue
    "Condition.wait (threading.py:",
    "Event.wait (threading.py:",
    "Thread.join (threading.py:",
    "select (selectors.py:",
)


def part_of(frames: list[str]) -> str:
    """The part of a sample whose stack is ``frames`` (root first), by ``PARTS``."""
    for part, markers in PARTS[:-1]:
        if any(m in f for f in frames for m in markers):
            return part
    loop_part, loop_markers = PARTS[-1]
    python = [f for f in frames if ".py:" in f]  # (``--native`` adds C frames below)
    if python and any(m in python[-1] for m in loop_markers):
        return loop_part
    return OTHER


def stack_parts(path: Path) -> dict[str, int]:
    """Samples by part in a py-spy raw file (``stack count`` lines, frames ``;``-joined,
    idle stacks already dropped by py-spy, those ``waiting`` in the poll dropped here)."""
    out: Counter[str] = Counter()
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        if stack and not waiting(frames):
            out[part_of(frames)] += int(count)
    return dict(out)


def waiting(frames: list[str]) -> bool:
    """Whether a sample's thread waits (in the loop's poll, ``WAITING``, or in a Python
    frame that only blocks, ``BLOCKING``) rather than runs."""
    if frames[-1].startswith(WAITING):
        return True
    python = [f for f in frames if ".py:" in f]
    if not python or ".py:" in frames[-1]:
        return False  # a Python frame itself is the leaf: it runs
    return python[-1].startswith(BLOCKING)


def ms_per_pod(samples: dict[str, int], cpu_s: float, pods: int) -> dict[str, float]:
    """``cpu_s`` (the process's CPU-s while py-spy sampled) in ms per pod, shared out by
    ``samples``."""
    total = sum(samples.values())
    if total <= 0 or pods <= 0:
        return {}
    return {part: cpu_s * 1e3 / pods * n / total for part, n in samples.items()}

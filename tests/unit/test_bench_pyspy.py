"""S9's parts: a Python contender's py-spy stacks split by what it was doing."""

from __future__ import annotations

from pathlib import Path

import pytest

from hack.bench._pyspy import OTHER, part_of, stack_parts, waiting
from hack.bench.compare import S1_FLOOR, S1_KUBE, S1_SDG, cost_parts, python_ms

RUN = "run (asyncio/runners.py:86)"
# py-spy raw output (--function): root first, ';'-joined, then the sample count.
STACKS = "\n".join(
    [
        f"{RUN};_worker (sdgruntime/controller.py:302);reconcile (x);"
        "PodScheduler.reconcile (controllers/podscheduler.py:87);Client.bind (c);"
        "SSLObject.write (ssl.py:924) 6",
        f"{RUN};serve (sdgruntime/httpserver.py:740);Webhook.review (w);loads (j) 3",
        f"{RUN};SSLObject.do_handshake (ssl.py:977) 2",
        f"{RUN};SSLObject.read (ssl.py:912) 1",
        f"{RUN} 5",
        f"{RUN};Reflector._watch (sdgruntime/cache/reflector.py:248);loads (j) 2",
        "_bootstrap (threading.py:1002) 1",
    ]
)


def test_a_sample_goes_to_the_most_specific_part_on_its_stack(tmp_path: Path) -> None:
    raw = tmp_path / "py-spy-s1.txt"
    raw.write_text(STACKS + "\n")
    # The TLS write of a Binding POST is the bind's; the loop alone is the loop's.
    assert stack_parts(raw) == {
        "binds: checks, Binding POSTs": 6,
        "webhook: the review": 3,
        "TLS handshakes": 2,
        "TLS reads and writes": 1,
        "event loop (native)": 5,
        "watches: decode, cache, handlers": 2,
        OTHER: 1,
    }
    # with --native, C frames below the loop's last Python frame are still the loop's
    assert part_of([RUN, "epoll_pwait (libc.so.6)"]) == "event loop (native)"
    # the floor's own functions map to the same parts
    assert part_of([RUN, "Floor.mutate (hack/bench/floor.py:92)"]) == "webhook: the review"
    assert part_of([RUN, "Floor.bind (hack/bench/floor.py:123)"]) == (
        "binds: checks, Binding POSTs"
    )
    # the floor's whole life runs under _kube.run_loop: that frame names no part
    floor_root = ["<module> (floor.py:1)", "main (floor.py:217)", "run_loop (_kube.py:35)"]
    assert part_of([*floor_root, RUN]) == "event loop (native)"
    assert part_of([*floor_root, RUN, "Kube.request (_kube.py:109)"]) == (
        "API client: other requests, reads"
    )


def test_a_thread_woken_in_the_loops_poll_is_not_counted(tmp_path: Path) -> None:
    """py-spy --native counts a thread woken in epoll but not yet on a core as active: on
    a busy host those samples are run-queue waits, and no part may take them."""
    raw = tmp_path / "py-spy-s4.txt"
    poll = "uv__io_poll (core.c:1);epoll_pwait (libc.so.6)"
    raw.write_text(f"{RUN};{poll} 40\n{RUN};uv__io_poll (core.c:1) 3\n{RUN} 2\n")
    assert stack_parts(raw) == {"event loop (native)": 5}
    # a pool thread waiting for work, in a libc frame py-spy cannot name, is not running
    pool = "run (threading.py:971);_worker (concurrent/futures/thread.py:69)"
    assert waiting([*pool.split(";"), "0x7fcf3d8a3f16 (libc.so.6)"])
    assert not waiting(pool.split(";"))  # its own Python frame is the leaf: it runs


def test_python_parts_share_out_the_cpu_up_to_the_last_bind() -> None:
    phase = {
        "cpu": {"manager": 5.0},
        "cpu_at_last_bind": {"manager": 4.0},
        "python_parts": {"manager": {"a": 3, "b": 1}},
    }
    assert python_ms(phase, 1000) == pytest.approx(
        {"a": 3.0, "b": 1.0, "after the last bind (not profiled)": 1.0}
    )
    assert python_ms({"cpu": {"manager": 5.0}}, 1000) == {}


def test_cost_parts_print_each_python_contenders_parts_in_its_column() -> None:
    def run(name: str, who: str | None, cpu: float) -> dict[str, object]:
        phase: dict[str, object] = {"name": name, "pods": 1000, "cpu": {"kube-apiserver": 4.0}}
        if who is not None:
            phase["cpu"] = {"kube-apiserver": 4.0, who: cpu}
            phase["cpu_at_last_bind"] = {who: cpu}
            phase["python_parts"] = {who: {"webhook: the review": 1, "binds": 1}}
        return phase

    out = {
        "phases": [
            run(S1_SDG, "manager", 2.0),
            run(S1_KUBE, None, 0.0),
            run(S1_FLOOR, "floor", 1.0),
        ]
    }
    lines = cost_parts(out)
    assert "| Python process: webhook: the review | 1.00 ms | - | 0.50 ms |" in lines
    assert "| Python process: after the last bind (not profiled) | 0.00 ms | - | 0.00 ms |" in (
        lines
    )

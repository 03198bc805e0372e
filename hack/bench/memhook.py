"""``python hack/bench/memhook.py [manager flags]``: the SDG manager (``python -m
controllers``) with a heap census on signals, for ``soak.py``. Debug only: nothing in the
manager's own code or defaults changes; this module wraps it.

- ``SIGUSR1`` (mark, after the warm-up): ``gc.collect()``, then counts of live objects by
  type, the sizes of every large container (dict, set, list, deque), the allocators'
  books (Python's blocks, glibc malloc's in-use and free bytes) and, when
  ``SDG_MEMHOOK_TRACE=N`` is set, a ``tracemalloc`` snapshot. Tracing (N frames per
  allocation) then runs from the start, so the diff of two snapshots is growth by
  allocation site: entries replaced in a structure of steady size cancel out. (Started
  at the mark instead, every live allocation made since would count, churn or not.)
- ``SIGUSR2`` (report): the same census again, written as JSON to
  ``$SDG_MEMHOOK_OUT/report.json`` (a rename, so a reader never sees half a file): the
  types whose counts grew most, the containers that grew most (and who holds each,
  as ``Class.attribute`` found through ``gc.get_referrers``), new large containers, the
  allocators' books then and now, and the top growth by ``file:line`` (and call stacks).

The census runs inside the signal handler, on the event loop's thread, between two
bytecodes: it stops the manager for a second or two, which a soak can afford.
"""

from __future__ import annotations

import collections
import ctypes
import gc
import json
import os
import runpy
import signal
import sys
import time
import tracemalloc
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: Containers at least this long are followed between mark and report.
MIN_LEN = 32
TOP = 30

_CONTAINERS = (dict, set, list, collections.deque)


class _Census:
    """What the mark saw, kept for the report."""

    def __init__(self) -> None:
        self.t_mark: float | None = None
        self.types: collections.Counter[str] = collections.Counter()
        self.sizes: dict[int, tuple[str, int]] = {}
        self.snapshot: tracemalloc.Snapshot | None = None
        self.allocators: dict[str, int] = {}
        self.out = Path(os.environ.get("SDG_MEMHOOK_OUT") or ".")
        self.frames = int(os.environ.get("SDG_MEMHOOK_TRACE") or 0)


_STATE = _Census()


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
            "uordblks", "fordblks", "keepcost",
        )
    ]  # fmt: skip


def allocators() -> dict[str, int]:
    """Python's allocated blocks (pymalloc and others) and glibc malloc's books: bytes in
    use (``uordblks``), free inside its heap (``fordblks``: fragmentation) and mmapped
    (``hblkhd``). A growth that gc and tracemalloc do not show is C memory (OpenSSL,
    extension modules) or fragmentation; these say which."""
    out = {"python_blocks": sys.getallocatedblocks()}
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
        info = libc.mallinfo2()
    except (OSError, AttributeError):
        return out
    out |= {f"malloc_{k}": int(getattr(info, k)) for k in ("uordblks", "fordblks", "hblkhd")}
    return out


def _type_name(obj: object) -> str:
    t = type(obj)
    return f"{t.__module__}.{t.__qualname__}"


def _live() -> tuple[collections.Counter[str], dict[int, tuple[str, int]]]:
    gc.collect()
    counts: collections.Counter[str] = collections.Counter()
    sizes: dict[int, tuple[str, int]] = {}
    for obj in _containers_too(gc.get_objects()):
        counts[_type_name(obj)] += 1
        if isinstance(obj, _CONTAINERS):
            n = len(obj)
            if n >= MIN_LEN:
                sizes[id(obj)] = (_type_name(obj), n)
    return counts, sizes


def _containers_too(tracked: list[object]) -> Iterator[object]:
    """The objects gc tracks, and the containers it does not: a dict of only strings and
    numbers (``name -> node``) is untracked, so it is found as a tracked object's part."""
    for obj in tracked:
        yield obj
        for part in gc.get_referents(obj):
            if isinstance(part, _CONTAINERS) and not gc.is_tracked(part):
                yield part


def _module_dicts() -> dict[int, str]:
    return {id(vars(m)): name for name, m in list(sys.modules.items()) if m is not None}


def _holder(target: object, modules: dict[int, str], skip: list[object], depth: int = 0) -> str:
    """Who holds ``target``: ``module.NAME``, ``Class.attr``, ``Class.attr[key]`` ... (an
    attribute or a module global before a closure cell; ``?`` if nothing says)."""
    if depth > 3:
        return "?"
    fallback = "?"
    for ref in gc.get_referrers(target):
        if ref is skip or ref is _STATE or isinstance(ref, types.FrameType | types.GeneratorType):
            continue
        if isinstance(ref, dict):
            key = next((k for k, v in ref.items() if v is target), None)
            if key is None:
                continue
            if id(ref) in modules:
                return f"{modules[id(ref)]}.{key}"
            for owner in gc.get_referrers(ref):
                if getattr(owner, "__dict__", None) is ref:
                    return f"{_type_name(owner)}.{key}"
            return f"{_holder(ref, modules, skip, depth + 1)}[{key!r:.40}]"
        slots = [
            s
            for klass in type(ref).__mro__
            for s in getattr(klass, "__slots__", ())
            if isinstance(s, str) and getattr(ref, s, None) is target
        ]
        if slots:
            return f"{_type_name(ref)}.{slots[0]}"
        attrs = getattr(ref, "__dict__", None)  # 3.11 keeps small instance dicts inline
        if isinstance(attrs, dict) and not isinstance(ref, type | types.ModuleType):
            name = next((k for k, v in attrs.items() if v is target), None)
            if name is not None:
                return f"{_type_name(ref)}.{name}"
        if isinstance(ref, types.CellType):
            fallback = "a closure's cell"
    return fallback


def _by_id(ids: set[int]) -> Iterator[object]:
    for obj in _containers_too(gc.get_objects()):
        if id(obj) in ids:
            yield obj


def mark() -> None:
    st = _STATE
    st.types, st.sizes = _live()
    st.t_mark = time.monotonic()
    st.allocators = allocators()
    if tracemalloc.is_tracing():
        st.snapshot = tracemalloc.take_snapshot()
    _write(
        "mark.json",
        {"objects": sum(st.types.values()), "containers": len(st.sizes), **st.allocators},
    )


def report() -> None:
    st = _STATE
    types_now, sizes_now = _live()
    grown_types = [
        (name, types_now[name] - st.types.get(name, 0), types_now[name]) for name in types_now
    ]
    grown_types.sort(key=lambda r: -r[1])
    growth: list[tuple[int, int, int]] = []  # (id, before, now)
    new: list[tuple[int, int]] = []
    own = {id(st.types), id(st.sizes)}  # the mark's own books
    for i, (name, n) in sizes_now.items():
        if i in own:
            continue
        before = st.sizes.get(i)
        if before is not None and before[0] == name:
            if n > before[1]:
                growth.append((i, before[1], n))
        else:
            new.append((i, n))
    growth.sort(key=lambda r: r[1] - r[2])
    new.sort(key=lambda r: -r[1])
    growth, new = growth[:TOP], new[:TOP]
    wanted = {i for i, *_ in growth} | {i for i, _ in new}
    modules = _module_dicts()
    targets = list(_by_id(wanted))
    holders = {id(obj): (_type_name(obj), _holder(obj, modules, targets)) for obj in targets}
    del targets
    out: dict[str, Any] = {
        "seconds_since_mark": time.monotonic() - (st.t_mark or time.monotonic()),
        "objects": {"mark": sum(st.types.values()), "now": sum(types_now.values())},
        "allocators": {"mark": st.allocators, "now": allocators()},
        "types_grown": [{"type": n, "grew": d, "now": c} for n, d, c in grown_types[:TOP] if d > 0],
        "containers_grown": [
            {"holder": holders.get(i, ("?", "?"))[1], "type": holders.get(i, ("?",))[0]}
            | {"before": b, "now": n}
            for i, b, n in growth
        ],
        "containers_new": [
            {"holder": holders.get(i, ("?", "?"))[1], "type": holders.get(i, ("?",))[0], "now": n}
            for i, n in new
        ],
    }
    if st.snapshot is not None:
        snap = tracemalloc.take_snapshot().filter_traces(
            [tracemalloc.Filter(False, tracemalloc.__file__), tracemalloc.Filter(False, __file__)]
        )
        stats = snap.compare_to(st.snapshot, "lineno")
        out["tracemalloc_lineno"] = [
            {"where": str(s.traceback[0]), "size_diff": s.size_diff, "count_diff": s.count_diff}
            for s in stats[:TOP]
        ]
        stacks = snap.compare_to(st.snapshot, "traceback")
        out["tracemalloc_traceback"] = [
            {"size_diff": s.size_diff, "count_diff": s.count_diff, "stack": s.traceback.format()}
            for s in stacks[:12]
        ]
        out["tracemalloc_traced"] = tracemalloc.get_traced_memory()
    _write("report.json", out)


def _write(name: str, data: dict[str, Any]) -> None:
    _STATE.out.mkdir(parents=True, exist_ok=True)
    tmp = _STATE.out / f".{name}.tmp"
    tmp.write_text(json.dumps(data, indent=1, default=str))
    tmp.replace(_STATE.out / name)


def _on_signal(signum: int, _frame: object) -> None:
    try:
        mark() if signum == signal.SIGUSR1 else report()
    except Exception as exc:  # a census bug must not kill the manager under test
        _write("error.json", {"error": repr(exc)})


def main() -> None:
    if _STATE.frames:
        # From the start: a diff between two snapshots then shows growth by allocation
        # site, where entries replaced in a structure of steady size cancel out.
        tracemalloc.start(_STATE.frames)
    signal.signal(signal.SIGUSR1, _on_signal)
    signal.signal(signal.SIGUSR2, _on_signal)
    sys.argv = ["controllers", *sys.argv[1:]]
    runpy.run_module("controllers", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()

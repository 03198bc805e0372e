"""Shared bits of the benchmarks: machine facts, latency summaries, and RESULTS.md upkeep.

Each benchmark owns one marked section of ``RESULTS.md`` and rewrites only that, so a
rerun refreshes its numbers while the hand-written analysis around them stays.
"""

from __future__ import annotations

import datetime as dt
import math
import os
import platform
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"

_SKELETON = """# SDG benchmarks

Generated sections are rewritten by `hack/bench/bench_placement.py` and
`hack/bench/bench_e2e.py`; the text outside them is written by hand.
"""


def machine() -> dict[str, Any]:
    """What the numbers depend on: cores this process may use, CPU, Python, load."""
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu": cpu or platform.processor(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "platform": platform.platform(),
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "loadavg": os.getloadavg(),
    }


def machine_line(m: dict[str, Any], extra: str = "") -> str:
    load = ", ".join(f"{x:.2f}" for x in m["loadavg"])
    parts = [
        f"{m['date']}",
        f"nproc={m['nproc']} ({m['cpu']})",
        m["python"],
        m["platform"],
        f"load average at start {load}",
    ]
    if extra:
        parts.append(extra)
    return "; ".join(parts)


def nearest_rank(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank quantile of an ascending sequence (no interpolation)."""
    if not sorted_values:
        return float("nan")
    rank = math.ceil(q * len(sorted_values) - 1e-9)  # 1-based; epsilon absorbs float error
    return sorted_values[min(len(sorted_values), max(1, rank)) - 1]


def summary(values: Iterable[float]) -> dict[str, float]:
    """n, mean, p50, p95, p99, max of a sample."""
    data = sorted(values)
    if not data:
        return {"n": 0}
    return {
        "n": len(data),
        "mean": statistics.fmean(data),
        "p50": nearest_rank(data, 0.50),
        "p95": nearest_rank(data, 0.95),
        "p99": nearest_rank(data, 0.99),
        "max": data[-1],
    }


def update_section(key: str, body: str, path: Path = RESULTS) -> None:
    """Replace the text between ``<!-- bench:KEY:begin -->`` and its end marker."""
    begin, end = f"<!-- bench:{key}:begin -->", f"<!-- bench:{key}:end -->"
    text = path.read_text() if path.exists() else _SKELETON
    block = f"{begin}\n{body.rstrip()}\n{end}"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        _, tail = rest.split(end, 1)
        text = head + block + tail
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    path.write_text(text)

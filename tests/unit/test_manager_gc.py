"""The manager's GC tuning (``controllers.__main__.tune_gc``): what was loaded before it is
frozen, young collections are rarer, and garbage cycles made afterwards are still
collected, so memory under churn stays bounded. In a child process: the tuning is global."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import gc, weakref
import controllers.app
from controllers.__main__ import GC_YOUNG_THRESHOLD, tune_gc

default = gc.get_threshold()
tune_gc()
assert gc.get_threshold() == (GC_YOUNG_THRESHOLD, *default[1:]), gc.get_threshold()
assert gc.get_freeze_count() > 10_000, gc.get_freeze_count()

class Node:
    pass

a, b = Node(), Node()
a.other, b.other = b, a  # a cycle made while the manager runs
gone = weakref.ref(a)
del a, b
gc.collect()
print("collected" if gone() is None else "leaked")
"""


def test_the_tuned_gc_freezes_the_loaded_code_and_still_collects_new_cycles() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "collected"

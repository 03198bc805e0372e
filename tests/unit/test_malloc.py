"""``controllers.__main__.tune_malloc``: big buffers stay out of glibc's heap."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from controllers.__main__ import tune_malloc

pytestmark = pytest.mark.skipif(
    not (sys.platform.startswith("linux") and os.confstr("CS_GNU_LIBC_VERSION")),
    reason="glibc's mallopt: other C libraries have no mmap threshold to fix",
)

# In a fresh interpreter: free one 4 MiB buffer (the first big free, as after the initial
# lists), then allocate a 1 MiB one (a list page's body; bigger than any hole the imports
# leave, which glibc would reuse whatever the threshold) and say whether glibc gave it its
# own mmap (mallinfo2's hblks counts those), to be returned to the system when freed.
PROBE = """
import ctypes, sys
if sys.argv[1] == "tuned":
    from controllers.__main__ import tune_malloc
    assert tune_malloc()
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
        "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Info
big = bytearray(4 << 20)
del big
before = libc.mallinfo2().hblks
buf = bytearray(1 << 20)
print(libc.mallinfo2().hblks - before)
"""


def mmapped_after_a_big_free(mode: str, **env: str) -> int:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, mode],
        env={k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"} | env,
        capture_output=True,
        text=True,
        check=True,
    )
    return int(out.stdout)


def test_a_big_buffer_is_mmapped_even_after_a_big_free() -> None:
    assert mmapped_after_a_big_free("tuned") == 1


def test_without_it_glibc_would_put_that_buffer_in_the_heap() -> None:
    # The control: glibc's dynamic threshold, what the manager had before.
    assert mmapped_after_a_big_free("plain") == 0


def test_the_users_own_threshold_stands(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "1048576")
    assert tune_malloc() is False

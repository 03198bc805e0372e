"""Reads into one buffer per thread instead of a new bytes object per read.

Without it, each read of a TLS connection allocates what asyncio's (and uvloop's) SSL
layer asks the record layer for, 256 KiB: above glibc's mmap threshold (which the
manager fixes at 128 KiB for its RSS), so every read was an ``mmap``, an ``mremap`` to
shrink it and a ``munmap``, each page faulted in fresh: ~9% of the manager's CPU in S4
(hack/bench/RESULTS.md, session 37). A :class:`BufferedReads` protocol is handed a
slice of the thread's buffer instead and must not keep it past ``data_received``
(httptools copies what its callbacks are given).
"""

from __future__ import annotations

import asyncio
import threading

#: Bytes a read may fill at most; more waiting is read on the loop's next turn.
READ_BUFFER_BYTES = 64 * 1024

_local = threading.local()


def _shared() -> memoryview:
    buf: memoryview | None = getattr(_local, "buffer", None)
    if buf is None:
        buf = _local.buffer = memoryview(bytearray(READ_BUFFER_BYTES))
        _local.busy = False
    return buf


class BufferedReads(asyncio.BufferedProtocol):
    """A ``BufferedProtocol`` whose reads land in its thread's shared buffer and reach
    :meth:`data_received` as a ``memoryview`` of it. The invariant: the buffer is handed
    out only while no ``data_received`` of it runs (a read nested in one, which asyncio
    does not do, gets a buffer of its own)."""

    _read_into: memoryview | None = None

    def get_buffer(self, sizehint: int) -> memoryview:
        buf = _shared()
        if _local.busy:
            buf = memoryview(bytearray(READ_BUFFER_BYTES))
        self._read_into = buf
        return buf

    def buffer_updated(self, nbytes: int) -> None:
        buf, self._read_into = self._read_into, None
        if buf is None:
            return
        if buf is not _local.buffer:
            self.data_received(buf[:nbytes])
            return
        _local.busy = True
        try:
            self.data_received(buf[:nbytes])
        finally:
            _local.busy = False

    def data_received(self, data: memoryview) -> None:
        """The bytes just read (valid only during the call)."""
        raise NotImplementedError

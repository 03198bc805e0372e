"""Reads into one buffer per thread (sdgruntime._readbuffer): what a protocol is handed
stays what was read while it looks at it."""

from __future__ import annotations

from sdgruntime._readbuffer import READ_BUFFER_BYTES, BufferedReads


class Recording(BufferedReads):
    def __init__(self, seen: list[bytes], inner: Recording | None = None) -> None:
        self.seen, self.inner = seen, inner

    def data_received(self, data: memoryview) -> None:
        if self.inner is not None:  # a read of another connection, nested in this one
            buf = self.inner.get_buffer(-1)
            buf[:3] = b"xyz"
            self.inner.buffer_updated(3)
        self.seen.append(bytes(data))


def read(proto: BufferedReads, data: bytes) -> None:
    buf = proto.get_buffer(len(data))
    assert len(buf) >= len(data)
    buf[: len(data)] = data
    proto.buffer_updated(len(data))


def test_each_read_is_handed_over_as_read() -> None:
    seen: list[bytes] = []
    a, b = Recording(seen), Recording(seen)
    read(a, b"GET / HTTP/1.1\r\n")
    read(b, b"HTTP/1.1 200 OK\r\n")
    read(a, b"x" * READ_BUFFER_BYTES)
    assert seen == [b"GET / HTTP/1.1\r\n", b"HTTP/1.1 200 OK\r\n", b"x" * READ_BUFFER_BYTES]


def test_a_read_nested_in_another_gets_its_own_buffer() -> None:
    seen: list[bytes] = []
    outer = Recording(seen, inner=Recording(seen))
    read(outer, b"hello")
    assert seen == [b"xyz", b"hello"]  # the shared buffer was not overwritten under it

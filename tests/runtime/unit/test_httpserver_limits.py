"""The HTTP server's limits against one greedy client (real sockets on 127.0.0.1 and
127.0.0.2): connections per client address, and idle connections closed early under
pressure. tests/e2e/test_abuse.py floods SDG's webhook the same way through the real API
server."""

from __future__ import annotations

import time
from contextlib import AsyncExitStack
from typing import Any

import anyio
import anyio.abc
import pytest
from pydantic import ValidationError

from sdgruntime.httpserver import HTTPServer
from sdgruntime.manager import Manager, ManagerOptions
from tests.runtime.helpers import both_event_loops as anyio_backend  # noqa: F401
from tests.runtime.unit.test_httpserver import RawReader, Serving, _until, make_server, running

pytestmark = pytest.mark.anyio

GET = b"GET /echo HTTP/1.1\r\nHost: x\r\n\r\n"


async def connect(srv: Serving, source: str = "127.0.0.1") -> anyio.abc.SocketStream:
    return await anyio.connect_tcp("127.0.0.1", srv.port, local_host=source)


async def served(stack: AsyncExitStack, srv: Serving, source: str = "127.0.0.1") -> RawReader:
    """A connection from ``source`` that got one answer and stays open (kept alive)."""
    stream = await stack.enter_async_context(await connect(srv, source))
    await stream.send(GET)
    reader = RawReader(stream)
    assert (await reader.response()).status == 200
    return reader


async def test_one_address_holds_at_most_its_share_and_others_are_served() -> None:
    server = make_server(max_connections=10, max_connections_per_client=2)
    async with running(server) as srv, AsyncExitStack() as stack:
        held = [await served(stack, srv) for _ in range(2)]
        assert server.connections_from("127.0.0.1") == 2

        async with await connect(srv) as extra:  # a third from the same address
            await extra.send(GET)
            reader = RawReader(extra)
            refused = await reader.response()
            assert refused.status == 503
            assert (
                refused.body
                == b"too many connections from 127.0.0.1 (limit 2 per client address)\n"
            )
            assert refused.headers["connection"] == "close"
            assert refused.headers["retry-after"] == "1"
            assert await reader.closed()

        other = await served(stack, srv, "127.0.0.2")  # another address: served
        assert server.connections_from("127.0.0.2") == 1
        assert server.connections == 3

        for reader in (*held, other):  # the held ones go on being served
            await reader.stream.send(GET)
            assert (await reader.response()).status == 200
        await held[0].stream.aclose()
        await _until(lambda: server.connections_from("127.0.0.1") == 1)
        await served(stack, srv)  # its slot is free again
    assert server.connections_from("127.0.0.1") == 0


async def test_the_default_share_admits_a_burst_of_64_connections_from_one_address() -> None:
    # The API server over HTTP/1.1: one connection per review in flight, all from its
    # address; a burst of 64 concurrent pod creates must not meet a 503.
    server = make_server()
    async with running(server) as srv, AsyncExitStack() as stack:
        for _ in range(64):
            await served(stack, srv)
        assert server.connections_from("127.0.0.1") == 64


async def test_the_total_cap_still_applies_across_addresses() -> None:
    server = make_server(max_connections=2, max_connections_per_client=2)
    async with running(server) as srv, AsyncExitStack() as stack:
        await served(stack, srv, "127.0.0.1")
        await served(stack, srv, "127.0.0.2")
        async with await connect(srv, "127.0.0.3") as extra:
            await extra.send(GET)
            refused = await RawReader(extra).response()
            assert (refused.status, refused.body) == (503, b"too many connections (limit 2)\n")


async def test_without_a_per_client_limit_one_address_may_take_every_slot() -> None:
    server = make_server(max_connections=5, max_connections_per_client=None)
    async with running(server) as srv, AsyncExitStack() as stack:
        for _ in range(5):
            await served(stack, srv)
        assert server.connections_from("127.0.0.1") == 5


async def _closed_within(reader: RawReader, limit: float) -> float:
    """Seconds until the server closes ``reader``'s connection (asserted below ``limit``)."""
    start = time.monotonic()
    with anyio.fail_after(limit):
        assert await reader.closed()
    return time.monotonic() - start


def pressured(**kwargs: Any) -> HTTPServer:
    return make_server(
        max_connections=6,
        pressure_connections=2,
        pressure_idle_timeout=0.5,
        idle_timeout=60.0,
        request_timeout=60.0,
        **kwargs,
    )


async def test_under_pressure_idle_connections_are_closed_after_the_short_timeout() -> None:
    server = pressured()
    async with running(server) as srv, AsyncExitStack() as stack:
        first = await served(stack, srv)
        await anyio.sleep(0.8)  # idle longer than the short timeout, but no pressure yet
        await first.stream.send(GET)
        assert (await first.response()).status == 200  # still open: idle_timeout applies
        second = await served(stack, srv, "127.0.0.2")
        assert not server.under_pressure  # 2 open: not over pressure_connections

        silent = await stack.enter_async_context(await connect(srv, "127.0.0.3"))
        await _until(lambda: server.connections == 3)
        assert server.under_pressure
        # Every connection waiting for a request now has 0.5 s from its wait's start.
        took = await _closed_within(first, 5)
        assert took < 1.0, took
        await _closed_within(second, 5)
        took = await _closed_within(RawReader(silent), 5)  # its wait began on connecting
        assert took < 1.0, took
        await _until(lambda: server.connections == 0)
        assert not server.under_pressure


async def test_a_request_in_progress_is_not_cut_by_pressure() -> None:
    server = pressured()
    async with running(server) as srv, AsyncExitStack() as stack:
        # A request whose body is still coming is not waiting: its request_timeout holds.
        slow = await stack.enter_async_context(await connect(srv))
        await slow.send(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nab")
        for source in ("127.0.0.2", "127.0.0.3"):
            await stack.enter_async_context(await connect(srv, source))
        await _until(lambda: server.connections == 3)
        assert server.under_pressure
        await anyio.sleep(1.0)  # the idle ones are gone, the slow one not
        await _until(lambda: server.connections == 1)
        await slow.send(b"cd")
        answer = await RawReader(slow).response()
        assert answer.status == 200 and b'"body":"abcd"' in answer.body


async def test_without_pressure_idle_connections_keep_the_long_timeout() -> None:
    server = pressured()
    async with running(server) as srv, AsyncExitStack() as stack:
        readers = [await served(stack, srv), await served(stack, srv, "127.0.0.2")]
        await anyio.sleep(1.0)  # twice the short timeout: both still open
        for reader in readers:
            await reader.stream.send(GET)
            assert (await reader.response()).status == 200


def test_limits_that_make_no_sense_are_refused() -> None:
    with pytest.raises(ValueError, match="max_connections_per_client must be at least 1"):
        make_server(max_connections_per_client=0)
    with pytest.raises(ValueError, match="pressure_idle_timeout must be over 0"):
        make_server(pressure_idle_timeout=0)
    assert make_server(max_connections=100).pressure_connections == 75  # 3/4 by default


def test_the_manager_options_reach_the_webhook_server() -> None:
    for bad in (
        {"webhook_max_connections_per_client": 0},
        {"webhook_pressure_idle_timeout": 0},
        {"webhook_client_max_connections": 0},
    ):
        with pytest.raises(ValidationError, match=next(iter(bad))):
            ManagerOptions(**bad)
    options = ManagerOptions(
        webhook_max_connections=40,
        webhook_max_connections_per_client=3,
        webhook_pressure_idle_timeout=1.5,
    )
    http = webhook_http(options)
    assert http.max_connections == 40
    assert http.max_connections_per_client == 3
    assert http.pressure_idle_timeout == 1.5
    assert http.pressure_connections == 30
    defaults = webhook_http(ManagerOptions())
    assert (defaults.max_connections, defaults.max_connections_per_client) == (256, 128)
    assert defaults.pressure_idle_timeout == 5.0
    unlimited = webhook_http(ManagerOptions(webhook_max_connections_per_client=None))
    assert unlimited.max_connections_per_client is None


def webhook_http(options: ManagerOptions) -> HTTPServer:
    """The HTTP server under the webhook server a manager builds from ``options``."""
    return Manager(client=object(), options=options).webhook_server.http  # type: ignore[arg-type]

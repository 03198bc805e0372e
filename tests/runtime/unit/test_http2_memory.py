"""A long-lived HTTP/2 connection (the API server's to the webhooks) does not grow with
the number of requests it has carried (issue 24): h2 remembers at most
``CLOSED_STREAMS_KEPT`` closed streams per connection, not its default 65536."""

from __future__ import annotations

from typing import Any

import h2.connection
import pytest

from sdgruntime import http2
from tests.runtime.unit.test_http2 import h2_client, serving

pytestmark = pytest.mark.anyio


async def test_closed_streams_are_remembered_up_to_the_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made: list[http2._Connection] = []

    class Small(http2._Connection):
        MAX_CLOSED_STREAMS = 8  # the bound's mechanism, at a size a test can pass

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(http2, "_Connection", Small)
    async with serving(name="h2-closed") as (server, _), h2_client(server) as client:
        for i in range(60):
            response = await client.post(f"/echo?i={i}", content=b"x")
            assert response.status_code == 200 and response.http_version == "HTTP/2"
        assert len(made) == 1  # one connection carried all 60
        assert len(made[0]._closed_streams) <= 8
        assert len(made[0].streams) <= 2  # and open ones are only the few in flight


def test_the_production_bound_is_far_below_h2s_default() -> None:
    assert http2._Connection.MAX_CLOSED_STREAMS == http2.CLOSED_STREAMS_KEPT
    assert http2.CLOSED_STREAMS_KEPT <= 4096 < h2.connection.H2Connection.MAX_CLOSED_STREAMS

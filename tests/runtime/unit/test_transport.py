"""The client's transport (sdgruntime.rest.transport) against a bare TCP socket: what goes
on the wire (query encoding, headers, bodies), that answers are taken as they come (no
redirects followed), that the pools open in whichever event loop uses them, and the JSON
helpers' fallbacks. A healthy API server is in tests/runtime/integration/test_client.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import anyio
import anyio.abc
import pytest
import yaml

from sdgruntime import errors
from sdgruntime.client import Client
from sdgruntime.kinds import CONFIGMAPS
from sdgruntime.rest.transport import decode, dumps, loads


def _kubeconfig(tmp_path: Path, port: int) -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "u", "user": {"token": "s3cr3t"}}],
        "contexts": [{"name": "u", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "u",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(doc))
    return path


class Peer:
    """Answers every request with one canned response and keeps what it received."""

    def __init__(self, status: str = "200 OK", body: bytes = b'{"kind":"ConfigMap"}') -> None:
        self.status, self.body = status, body
        self.requests: list[tuple[str, dict[str, str], bytes]] = []

    async def serve(self, stream: anyio.abc.SocketStream) -> None:
        async with stream:
            data = b""
            while b"\r\n\r\n" not in data:
                data += await stream.receive()
            head, _, body = data.partition(b"\r\n\r\n")
            lines = head.decode().split("\r\n")
            headers = {k.lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:])}
            while len(body) < int(headers.get("content-length", 0)):
                body += await stream.receive()
            self.requests.append((lines[0], headers, body))
            await stream.send(
                f"HTTP/1.1 {self.status}\r\nContent-Type: application/json\r\n"
                f"Location: /elsewhere\r\nContent-Length: {len(self.body)}\r\n\r\n".encode()
                + self.body
            )


async def _with_peer(tmp_path: Path, peer: Peer, use: Any) -> None:
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, peer.serve)
        async with Client.from_kubeconfig(_kubeconfig(tmp_path, port)) as client:
            await use(client)
        tg.cancel_scope.cancel()


@pytest.mark.anyio
async def test_query_headers_and_body_on_the_wire(tmp_path: Path) -> None:
    peer = Peer()
    selector = "app in (a,b),tier!=x+y,env=prod"

    async def use(client: Client) -> None:
        await client.list(CONFIGMAPS, "ns", label_selector=selector, limit=5)
        await client.request("GET", "/api", params={"watch": True, "pretty": False})
        await client.patch(CONFIGMAPS, "cm", {"data": {"k": "ü"}}, "ns")

    await _with_peer(tmp_path, peer, use)
    (line, headers, _), (line2, _, _), (line3, patch_headers, body) = peer.requests
    method, target, version = line.split(" ")
    assert (method, version) == ("GET", "HTTP/1.1")
    url = urlsplit(target)
    assert url.path == "/api/v1/namespaces/ns/configmaps"
    assert parse_qs(url.query) == {"labelSelector": [selector], "limit": ["5"]}
    assert headers["authorization"] == "Bearer s3cr3t"
    assert headers["accept"] == "application/json"
    assert headers["user-agent"].startswith("sdgruntime/")
    assert "cookie" not in headers
    assert parse_qs(urlsplit(line2.split(" ")[1]).query) == {
        "watch": ["true"],
        "pretty": ["false"],
    }
    assert line3.startswith("PATCH /api/v1/namespaces/ns/configmaps/cm ")
    assert patch_headers["content-type"] == "application/merge-patch+json"
    assert patch_headers["authorization"] == "Bearer s3cr3t"
    assert json.loads(body) == {"data": {"k": "ü"}}


@pytest.mark.anyio
async def test_a_redirect_is_an_answer_not_followed(tmp_path: Path) -> None:
    peer = Peer("301 Moved Permanently", b"")

    async def use(client: Client) -> None:
        with pytest.raises(errors.ApiError) as moved:
            await client.get(CONFIGMAPS, "cm", "ns")
        assert moved.value.code == 301

    await _with_peer(tmp_path, peer, use)
    assert len(peer.requests) == 1  # nothing sent to /elsewhere


def test_a_client_built_before_the_loop_runs_works_in_each_later_loop(tmp_path: Path) -> None:
    """The Manager builds its client in __init__; tests may run it in more than one loop."""
    peer = Peer()

    async def serve_one(port: int, name: str) -> None:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=port)
        async with listener, anyio.create_task_group() as tg:
            tg.start_soon(listener.serve, peer.serve)
            assert await client.get(CONFIGMAPS, name, "ns") == {"kind": "ConfigMap"}
            tg.cancel_scope.cancel()

    async def free_port() -> int:
        async with await anyio.create_tcp_listener(local_host="127.0.0.1") as listener:
            return int(listener.extra(anyio.abc.SocketAttribute.local_port))

    port = anyio.run(free_port)
    client = Client.from_kubeconfig(_kubeconfig(tmp_path, port))  # no loop runs yet
    anyio.run(serve_one, port, "a")  # this loop ends with the pool open ...
    anyio.run(serve_one, port, "b")  # ... so the next loop opens its own

    async def closed() -> None:
        await client.aclose()
        with pytest.raises(RuntimeError, match="closed"):
            await client.get(CONFIGMAPS, "c", "ns")

    anyio.run(closed)
    assert [r[0].split(" ")[1] for r in peer.requests] == [
        "/api/v1/namespaces/ns/configmaps/a",
        "/api/v1/namespaces/ns/configmaps/b",
    ]


def test_json_helpers_fall_back_to_the_json_module() -> None:
    assert dumps({"a": [1, "ü"]}) == '{"a":[1,"ü"]}'.encode()
    assert json.loads(dumps({1: "int key"})) == {"1": "int key"}  # orjson refuses it
    assert json.loads(dumps({"n": 2**70})) == {"n": 2**70}  # beyond 64 bits
    assert loads(b'{"x": NaN}')["x"] != loads(b'{"x": NaN}')["x"]  # json accepts NaN
    assert decode(b"", "application/json") is None
    assert decode(b"ok", "text/plain") == "ok"
    assert decode(b"{not json", "application/json") == "{not json"

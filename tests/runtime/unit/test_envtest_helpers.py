"""The test helpers sdgruntime.envtest ships: ``eventually`` (a poll under a deadline),
``admission_review`` (the request a webhook gets, for deciding it without a server) and
``free_port``."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import anyio
import pytest

from sdgruntime import errors
from sdgruntime.envtest import admission_review, controlplane, eventually
from sdgruntime.kinds import CONFIGMAPS, NODES
from sdgruntime.webhook import CustomValidator, Denied, WebhookBuilder, WebhookServer
from sdgruntime.webhook.admission import parse_review

pytestmark = pytest.mark.anyio


async def test_eventually_returns_the_first_truthy_result() -> None:
    calls: list[int] = []

    async def ready() -> dict[str, int] | None:
        calls.append(1)
        if len(calls) == 1:
            raise errors.NotFound("not yet")  # not created yet: not yet
        assert len(calls) > 2, "an assertion is 'not yet' too"
        return {"replicas": 3} if len(calls) > 3 else None

    assert await eventually(ready, "ready", interval=0) == {"replicas": 3}
    assert len(calls) == 4
    assert await eventually(lambda: "sync checks too") == "sync checks too"


async def test_eventually_says_what_never_happened_and_what_it_saw_last() -> None:
    with anyio.fail_after(5), pytest.raises(AssertionError) as info:
        await eventually(lambda: [], "the Secret", within=0.1)
    assert str(info.value) == "not within 0.1s: the Secret (last: [])"


async def test_eventually_fails_at_once_on_another_error() -> None:
    def broken() -> None:
        raise errors.Forbidden("no rights")

    with anyio.fail_after(5), pytest.raises(errors.Forbidden):
        await eventually(broken, within=60)


def cm(name: str, **data: str) -> dict[str, Any]:
    meta = {"name": name, "namespace": "shop"}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}


def test_an_admission_review_is_what_the_api_server_sends() -> None:
    body = admission_review(CONFIGMAPS, "UPDATE", cm("a", k="2"), cm("a", k="1"), user="bob")
    request = parse_review(body)  # as the webhook server reads it
    assert (request.operation, request.name, request.namespace) == ("UPDATE", "a", "shop")
    assert request.user_info == {"username": "bob", "groups": ["system:authenticated"]}
    assert request.object == cm("a", k="2") and request.old_object == cm("a", k="1")
    raw = json.loads(body)["request"]
    assert raw["resource"] == {"group": "", "version": "v1", "resource": "configmaps"}
    deleted = parse_review(admission_review(CONFIGMAPS, "DELETE", None, cm("gone")))
    assert (deleted.object, deleted.name) == (None, "gone")
    node = {"metadata": {"name": "n1", "namespace": "ignored"}}
    assert parse_review(admission_review(NODES, "CREATE", node)).namespace in ("", None)


async def test_a_typed_webhook_decides_an_admission_review() -> None:
    class NoEmpty(CustomValidator):
        async def validate_create(self, obj: dict[str, Any]) -> None:
            if not obj.get("data"):
                raise Denied("data must not be empty")

    server = WebhookServer("127.0.0.1", 0, "/nonexistent")
    [path] = WebhookBuilder(server, CONFIGMAPS).with_validator(NoEmpty()).complete()
    denied = await server.webhooks[path].review(admission_review(CONFIGMAPS, "CREATE", cm("a")))
    assert denied["response"]["status"]["message"] == "data must not be empty"
    ok = await server.webhooks[path].review(admission_review(CONFIGMAPS, "CREATE", cm("a", k="v")))
    assert ok["response"]["allowed"]


def test_free_port_is_bindable_and_outside_the_ephemeral_range(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Outgoing connections take ports from the kernel's ephemeral range: a port handed
    out from it could be gone before the process it is for binds it."""
    ranges = tmp_path / "ip_local_port_range"
    ranges.write_text("32768\t60999\n")
    monkeypatch.setattr(controlplane, "_EPHEMERAL_RANGE", ranges)
    ports = {controlplane.free_port() for _ in range(20)}
    assert all(controlplane._LOWEST_PORT <= p < 32768 for p in ports)
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports.pop()))  # free, as promised
    # No readable range (not Linux): the kernel's own pick
    monkeypatch.setattr(controlplane, "_EPHEMERAL_RANGE", tmp_path / "missing")
    with socket.socket() as s:
        s.bind(("127.0.0.1", controlplane.free_port()))

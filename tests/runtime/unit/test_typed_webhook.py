"""Typed per-kind webhooks: the conventional paths, validators called per operation with
the objects, warnings and denials in the verdict, defaults sent as a JSON patch, reviews
of another kind refused, and wiring mistakes refused when registered."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from sdgruntime.envtest import FakeClient
from sdgruntime.kinds import CONFIGMAPS, Kind
from sdgruntime.manager import Manager, ManagerOptions
from sdgruntime.webhook import (
    CustomValidator,
    Denied,
    WebhookBuilder,
    WebhookServer,
    admission_request,
    mutate_path,
    validate_path,
)
from tests.runtime.helpers import as_client

WIDGETS = Kind("apps.example.com", "v1beta1", "FancyWidget", "fancywidgets", namespaced=True)


def review(
    operation: str,
    obj: dict[str, Any] | None,
    old: dict[str, Any] | None = None,
    kind: Kind = WIDGETS,
    username: str = "alice",
) -> bytes:
    request = {
        "uid": "u-1",
        "kind": {"group": kind.group, "version": kind.version, "kind": kind.kind},
        "resource": {"group": kind.group, "version": kind.version, "resource": kind.plural},
        "operation": operation,
        "namespace": "ns",
        "name": "w",
        "userInfo": {"username": username},
        "object": obj,
        "oldObject": old,
    }
    body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
    return json.dumps(body).encode()


def widget(size: int, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": WIDGETS.api_version,
        "kind": WIDGETS.kind,
        "metadata": {"name": "w", "namespace": "ns"},
        "spec": {"size": size, **spec},
    }


class SizeRules(CustomValidator):
    """Records what it was called with; denies sizes over 10; size may only grow."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    async def validate_create(self, obj: dict[str, Any]) -> list[str] | None:
        self.calls.append(("create", obj["spec"]["size"]))
        if obj["spec"]["size"] > 10:
            raise Denied("size must be at most 10", warnings=["sizes over 10 are refused"])
        return ["size 0 does nothing"] if obj["spec"]["size"] == 0 else None

    async def validate_update(self, old: dict[str, Any], new: dict[str, Any]) -> list[str]:
        self.calls.append(("update", (old["spec"]["size"], new["spec"]["size"])))
        if new["spec"]["size"] < old["spec"]["size"]:
            raise Denied(f"size may only grow, not shrink from {old['spec']['size']}")
        return []

    async def validate_delete(self, obj: dict[str, Any]) -> str | None:
        self.calls.append(("delete", obj["spec"]["size"]))
        return f"deleted by {admission_request().user_info['username']}"


class Defaults:
    async def default(self, obj: dict[str, Any]) -> None:
        obj["spec"].setdefault("color", "blue")
        obj["metadata"].setdefault("labels", {})["owner"] = admission_request().user_info[
            "username"
        ]


def server() -> WebhookServer:
    return WebhookServer("127.0.0.1", 0, "/nonexistent")


async def decide(srv: WebhookServer, path: str, body: bytes) -> dict[str, Any]:
    return (await srv.webhooks[path].review(body))["response"]


def test_conventional_paths_are_kubebuilders() -> None:
    assert validate_path(WIDGETS) == "/validate-apps-example-com-v1beta1-fancywidget"
    assert mutate_path(WIDGETS) == "/mutate-apps-example-com-v1beta1-fancywidget"
    assert validate_path(CONFIGMAPS) == "/validate--v1-configmap"  # the core group is ""
    srv = server()
    paths = WebhookBuilder(srv, WIDGETS).with_validator(SizeRules()).with_defaulter(Defaults())
    assert paths.complete() == [mutate_path(WIDGETS), validate_path(WIDGETS)]
    assert {p: w.kind for p, w in srv.webhooks.items()} == {
        mutate_path(WIDGETS): "mutating",
        validate_path(WIDGETS): "validating",
    }


def test_the_manager_registers_typed_webhooks_on_its_server() -> None:
    mgr = Manager(client=as_client(FakeClient()), options=ManagerOptions())
    mgr.webhook_for(WIDGETS).with_validator(SizeRules()).complete()
    assert list(mgr.webhook_server.webhooks) == [validate_path(WIDGETS)]


@pytest.mark.anyio
async def test_validator_gets_each_operation_with_its_objects() -> None:
    rules, srv = SizeRules(), server()
    WebhookBuilder(srv, WIDGETS).with_validator(rules).complete()
    path = validate_path(WIDGETS)

    ok = await decide(srv, path, review("CREATE", widget(3)))
    assert ok["allowed"] is True and "warnings" not in ok
    warned = await decide(srv, path, review("CREATE", widget(0)))
    assert warned["allowed"] is True and warned["warnings"] == ["size 0 does nothing"]
    refused = await decide(srv, path, review("CREATE", widget(11)))
    assert refused["allowed"] is False
    assert refused["status"] == {
        "code": 403,
        "message": "size must be at most 10",
        "reason": "Forbidden",
    }
    assert refused["warnings"] == ["sizes over 10 are refused"]  # warnings with a denial
    shrink = await decide(srv, path, review("UPDATE", widget(2), old=widget(5)))
    assert shrink["status"]["message"] == "size may only grow, not shrink from 5"
    grow = await decide(srv, path, review("UPDATE", widget(6), old=widget(5)))
    assert grow["allowed"] is True
    # DELETE carries the object as oldObject; a single string is one warning.
    gone = await decide(srv, path, review("DELETE", None, old=widget(6), username="bob"))
    assert gone["allowed"] is True and gone["warnings"] == ["deleted by bob"]
    connect = await decide(srv, path, review("CONNECT", None))
    assert connect["allowed"] is True
    assert rules.calls == [
        ("create", 3),
        ("create", 0),
        ("create", 11),
        ("update", (5, 2)),
        ("update", (5, 6)),
        ("delete", 6),
    ]


@pytest.mark.anyio
async def test_defaulter_edits_in_place_and_the_server_sends_the_patch() -> None:
    srv = server()
    WebhookBuilder(srv, WIDGETS).with_defaulter(Defaults()).complete()
    response = await decide(srv, mutate_path(WIDGETS), review("CREATE", widget(1)))
    assert response["allowed"] is True and response["patchType"] == "JSONPatch"
    assert json.loads(base64.b64decode(response["patch"])) == [
        {"op": "add", "path": "/metadata/labels", "value": {"owner": "alice"}},
        {"op": "add", "path": "/spec/color", "value": "blue"},
    ]
    # Nothing to default: no patch. DELETE is not defaulted.
    done = widget(1, color="red")
    done["metadata"]["labels"] = {"owner": "alice"}
    assert "patch" not in await decide(srv, mutate_path(WIDGETS), review("UPDATE", done, done))
    deleted = await decide(srv, mutate_path(WIDGETS), review("DELETE", None, old=done))
    assert deleted == {"uid": "u-1", "allowed": True}


@pytest.mark.anyio
async def test_a_review_of_another_kind_is_refused_as_a_configuration_error() -> None:
    srv = server()
    WebhookBuilder(srv, WIDGETS).with_validator(SizeRules()).complete()
    response = await decide(srv, validate_path(WIDGETS), review("CREATE", {}, kind=CONFIGMAPS))
    assert response["allowed"] is False
    assert response["status"]["code"] == 400
    assert response["status"]["message"] == (
        "this webhook is for apps.example.com/v1beta1 FancyWidget, got core/v1 ConfigMap: "
        "check the rules of its WebhookConfiguration"
    )


def test_admission_request_outside_a_webhook_says_so() -> None:
    with pytest.raises(RuntimeError, match="only available inside a typed validator"):
        admission_request()


def test_wiring_mistakes_are_refused_when_registered() -> None:
    class SyncValidate(CustomValidator):
        def validate_update(self, old: Any, new: Any) -> None:  # type: ignore[override]
            return None

    class SyncDefault:
        def default(self, obj: dict[str, Any]) -> None:
            return None

    builder = WebhookBuilder(server(), WIDGETS)
    # The class once, then the method: "SyncValidate: validate_update() is not async".
    with pytest.raises(TypeError, match=r"^SyncValidate: validate_update\(\) is not async: "):
        builder.with_validator(SyncValidate())
    with pytest.raises(TypeError, match=r"has no validate_create.*subclass CustomValidator"):
        builder.with_validator(Defaults())
    with pytest.raises(
        TypeError, match=r"^SyncDefault: default\(\) is not async: define `async def default"
    ):
        builder.with_defaulter(SyncDefault())
    with pytest.raises(TypeError, match="got the class SizeRules; pass an instance"):
        builder.with_validator(SizeRules)
    with pytest.raises(ValueError, match="needs with_validator"):
        builder.complete()
    builder.with_validator(SizeRules()).complete()
    with pytest.raises(RuntimeError, match="already called"):
        builder.complete()

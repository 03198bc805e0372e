"""The real API server calls an sdgruntime WebhookServer over TLS for a test CRD:
a mutation is applied, a denial's message reaches the client, warnings are passed on."""

from __future__ import annotations

import anyio
import pytest
import yaml

from sdgruntime import errors, metrics
from sdgruntime.client import Client
from sdgruntime.envtest import ControlPlane
from sdgruntime.envtest.controlplane import free_port
from sdgruntime.kinds import Kind
from sdgruntime.webhook import (
    AdmissionRequest,
    AdmissionResponse,
    WebhookServer,
    allowed,
    denied,
    patched,
)
from tests.runtime.integration.crds import namespaced_crd

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

GADGETS = Kind("webhooktest.example.com", "v1", "Gadget", "gadgets", namespaced=True)

CRD = namespaced_crd(
    GADGETS,
    {
        "spec": {
            "type": "object",
            "properties": {
                "size": {"type": "integer"},
                "color": {"type": "string"},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            },
        }
    },
)


def _configs(namespace: str) -> list[dict]:
    rule = {
        "apiGroups": ["webhooktest.example.com"],
        "apiVersions": ["v1"],
        "operations": ["CREATE", "UPDATE"],
        "resources": ["gadgets"],
    }
    selector = {"matchLabels": {"kubernetes.io/metadata.name": namespace}}

    def hook(name: str, path: str) -> dict:
        return {
            "name": name,
            "admissionReviewVersions": ["v1"],
            "clientConfig": {"service": {"name": "svc", "namespace": "x", "path": path}},
            "rules": [rule],
            "namespaceSelector": selector,
            "failurePolicy": "Fail",
            "sideEffects": "None",
        }

    return [
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": f"gadgets-{namespace}"},
            "webhooks": [hook("mgadget.webhooktest.example.com", "/mutate-gadget")],
        },
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": f"gadgets-{namespace}"},
            "webhooks": [hook("vgadget.webhooktest.example.com", "/validate-gadget")],
        },
    ]


class DefaultColor:
    async def mutate(self, request: AdmissionRequest) -> AdmissionResponse:
        obj = request.copy_object()
        spec = obj.setdefault("spec", {})
        spec.setdefault("color", "blue")
        spec.setdefault("labels", {})["team/owner"] = request.user_info.get("username", "")
        return patched(request.object, obj)


class SizeLimit:
    async def validate(self, request: AdmissionRequest) -> AdmissionResponse:
        size = ((request.object or {}).get("spec") or {}).get("size", 0)
        if size > 10:
            return denied(f"size {size} is over the limit of 10; use at most 10")
        warnings = ["size 0 makes a useless gadget"] if size == 0 else []
        return allowed(warnings=warnings)


async def test_api_server_calls_our_webhooks(
    control_plane: ControlPlane, client: Client, namespace: str
) -> None:
    path = control_plane.work_dir / "gadget-crd.yaml"
    path.write_text(yaml.safe_dump(CRD))
    control_plane.install_crds([path])
    port = free_port()
    server = WebhookServer("127.0.0.1", port, control_plane.webhook_cert_dir())
    server.register("/mutate-gadget", DefaultColor())
    server.register("/validate-gadget", SizeLimit())
    async with anyio.create_task_group() as tg:
        await tg.start(server.serve)
        control_plane.install_webhooks(_configs(namespace), port)
        try:
            created = await client.create(
                GADGETS,
                {
                    "apiVersion": GADGETS.api_version,
                    "kind": "Gadget",
                    "metadata": {"name": "g1"},
                    "spec": {"size": 3},
                },
                namespace,
            )
            assert created["spec"]["color"] == "blue"
            assert created["spec"]["labels"] == {"team/owner": "envtest-admin"}
            with pytest.raises(errors.ApiError) as info:
                await client.create(
                    GADGETS,
                    {
                        "apiVersion": GADGETS.api_version,
                        "kind": "Gadget",
                        "metadata": {"name": "g2"},
                        "spec": {"size": 11},
                    },
                    namespace,
                )
            assert info.value.code == 403
            assert (
                'admission webhook "vgadget.webhooktest.example.com" denied the request: '
                "size 11 is over the limit of 10; use at most 10"
            ) in info.value.message
            # An update passes through both webhooks again (and keeps the user's color).
            created["spec"]["color"] = "red"
            updated = await client.update(GADGETS, created)
            assert updated["spec"]["color"] == "red"
            # Warnings come back to the client as Warning headers (kubectl prints them).
            # (a blocking call: run it off the event loop that serves the webhook)
            r = await anyio.to_thread.run_sync(
                lambda: control_plane.http.post(
                    f"/apis/{GADGETS.api_version}/namespaces/{namespace}/gadgets",
                    json={
                        "apiVersion": GADGETS.api_version,
                        "kind": "Gadget",
                        "metadata": {"name": "g0"},
                        "spec": {"size": 0},
                    },
                )
            )
            assert r.status_code == 201, r.text
            assert "size 0 makes a useless gadget" in r.headers.get("warning", "")
        finally:
            for obj in _configs(namespace):
                control_plane.delete(obj["apiVersion"], obj["kind"], obj["metadata"]["name"])
            tg.cancel_scope.cancel()


async def allow_all(request: AdmissionRequest) -> AdmissionResponse:
    return allowed()


class NeedsAnOwner:
    """A validator that trusts ``spec.labels`` to have an owner: objects without one are
    what a handler meets when an object is not what it expects."""

    async def validate(self, request: AdmissionRequest) -> AdmissionResponse:
        owner = ((request.object or {}).get("spec") or {})["labels"]["team/owner"]
        return allowed() if owner else denied("no owner")


async def test_an_object_the_handler_cannot_read_fails_the_call_with_our_reason(
    control_plane: ControlPlane, client: Client, namespace: str
) -> None:
    """The webhook answers HTTP 400; the API server (failurePolicy Fail) refuses the
    request and passes our reason on to the client."""
    path = control_plane.work_dir / "gadget-crd.yaml"
    path.write_text(yaml.safe_dump(CRD))
    control_plane.install_crds([path])
    port = free_port()
    server = WebhookServer("127.0.0.1", port, control_plane.webhook_cert_dir())
    server.register("/mutate-gadget", allow_all)
    server.register("/validate-gadget", NeedsAnOwner())
    async with anyio.create_task_group() as tg:
        await tg.start(server.serve)
        control_plane.install_webhooks(_configs(namespace), port)
        try:
            gadget = {"apiVersion": GADGETS.api_version, "kind": "Gadget", "spec": {"size": 1}}
            with pytest.raises(errors.ApiError) as info:
                await client.create(GADGETS, {**gadget, "metadata": {"name": "g1"}}, namespace)
            assert 'failed calling webhook "vgadget.webhooktest.example.com"' in (
                info.value.message
            )
            assert "the object could not be read: KeyError: 'labels'" in info.value.message, (
                info.value.message
            )
            # the server goes on deciding the objects its handler can read
            owned = {**gadget["spec"], "labels": {"team/owner": "a"}}
            created = await client.create(
                GADGETS, {**gadget, "metadata": {"name": "g2"}, "spec": owned}, namespace
            )
            assert created["metadata"]["name"] == "g2"
        finally:
            for obj in _configs(namespace):
                control_plane.delete(obj["apiVersion"], obj["kind"], obj["metadata"]["name"])
            tg.cancel_scope.cancel()


async def test_the_api_server_keeps_its_http11_connections_to_our_webhooks(
    control_plane: ControlPlane, client: Client, namespace: str
) -> None:
    """kube-apiserver (Go's net/http) is offered only HTTP/1.1, and reuses its kept-alive
    connections for later reviews; a burst over its 25 idle connections is served too."""

    def count(protocol: str) -> float:
        value = metrics.REGISTRY.get_sample_value(
            "sdgruntime_http_connections_total", {"server": "webhook", "protocol": protocol}
        )
        return value or 0.0

    path = control_plane.work_dir / "gadget-crd.yaml"
    path.write_text(yaml.safe_dump(CRD))
    control_plane.install_crds([path])
    port = free_port()
    server = WebhookServer("127.0.0.1", port, control_plane.webhook_cert_dir())
    server.register("/mutate-gadget", DefaultColor())
    server.register("/validate-gadget", SizeLimit())
    h2_before, h1_before = count("h2"), count("http/1.1")
    async with anyio.create_task_group() as tg:
        await tg.start(server.serve)
        control_plane.install_webhooks(_configs(namespace), port)
        try:

            async def create(i: int) -> None:
                created = await client.create(
                    GADGETS,
                    {
                        "apiVersion": GADGETS.api_version,
                        "kind": "Gadget",
                        "metadata": {"name": f"h1-{i}"},
                        "spec": {"size": 1},
                    },
                    namespace,
                )
                assert created["spec"]["color"] == "blue"  # the mutation was applied

            await create(-1)
            warm = count("http/1.1")
            assert warm > h1_before
            for i in range(10):
                await create(i)
            assert count("http/1.1") == warm  # one after another: kept connections
            async with anyio.create_task_group() as creates:
                for i in range(40):  # over client-go's 25 idle connections per host
                    creates.start_soon(create, 100 + i)
            assert count("h2") == h2_before
        finally:
            for obj in _configs(namespace):
                control_plane.delete(obj["apiVersion"], obj["kind"], obj["metadata"]["name"])
            tg.cancel_scope.cancel()

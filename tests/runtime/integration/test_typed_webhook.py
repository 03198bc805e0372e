"""Typed per-kind webhooks called by the real API server over TLS: registered at the
conventional paths, a defaulter's edits are applied, a validator's denial and warnings
reach the client, and deletion is validated with the object being deleted."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
import yaml

from sdgruntime import errors
from sdgruntime.client import Client
from sdgruntime.envtest import ControlPlane
from sdgruntime.envtest.controlplane import free_port
from sdgruntime.kinds import Kind
from sdgruntime.webhook import (
    CustomValidator,
    Denied,
    WebhookBuilder,
    WebhookServer,
    admission_request,
    mutate_path,
    validate_path,
)
from tests.runtime.integration.crds import namespaced_crd

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

GIZMOS = Kind("typedhook.example.com", "v1", "Gizmo", "gizmos", namespaced=True)

CRD = namespaced_crd(
    GIZMOS,
    {
        "spec": {
            "type": "object",
            "properties": {
                "replicas": {"type": "integer"},
                "owner": {"type": "string"},
                "protected": {"type": "boolean"},
            },
        }
    },
)


class GizmoRules(CustomValidator):
    async def validate_create(self, obj: dict[str, Any]) -> list[str]:
        return self._check(obj)

    async def validate_update(self, old: dict[str, Any], new: dict[str, Any]) -> list[str]:
        if old["spec"].get("owner") != new["spec"].get("owner"):
            raise Denied("spec.owner is immutable: delete and re-create the gizmo instead")
        return self._check(new)

    async def validate_delete(self, obj: dict[str, Any]) -> None:
        if obj["spec"].get("protected"):
            raise Denied(f"gizmo {obj['metadata']['name']} is protected: unprotect it first")

    def _check(self, obj: dict[str, Any]) -> list[str]:
        replicas = obj["spec"].get("replicas", 1)
        if replicas > 5:
            raise Denied(f"spec.replicas {replicas} is over 5")
        return ["one replica has no redundancy"] if replicas == 1 else []


class GizmoDefaults:
    async def default(self, obj: dict[str, Any]) -> None:
        obj["spec"].setdefault("owner", admission_request().user_info["username"])


def configurations(namespace: str) -> list[dict[str, Any]]:
    def hook(name: str, path: str, operations: list[str]) -> dict[str, Any]:
        return {
            "name": name,
            "admissionReviewVersions": ["v1"],
            "clientConfig": {"service": {"name": "svc", "namespace": "x", "path": path}},
            "rules": [
                {
                    "apiGroups": [GIZMOS.group],
                    "apiVersions": [GIZMOS.version],
                    "operations": operations,
                    "resources": [GIZMOS.plural],
                }
            ],
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "failurePolicy": "Fail",
            "sideEffects": "None",
        }

    api = "admissionregistration.k8s.io/v1"
    return [
        {
            "apiVersion": api,
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": f"gizmos-{namespace}"},
            "webhooks": [hook("mgizmo.example.com", mutate_path(GIZMOS), ["CREATE", "UPDATE"])],
        },
        {
            "apiVersion": api,
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": f"gizmos-{namespace}"},
            "webhooks": [
                hook("vgizmo.example.com", validate_path(GIZMOS), ["CREATE", "UPDATE", "DELETE"])
            ],
        },
    ]


def gizmo(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": GIZMOS.api_version,
        "kind": GIZMOS.kind,
        "metadata": {"name": name},
        "spec": spec,
    }


async def test_api_server_calls_typed_validator_and_defaulter(
    control_plane: ControlPlane, client: Client, namespace: str
) -> None:
    path = control_plane.work_dir / "gizmo-crd.yaml"
    path.write_text(yaml.safe_dump(CRD))
    control_plane.install_crds([path])
    port = free_port()
    server = WebhookServer("127.0.0.1", port, control_plane.webhook_cert_dir())
    paths = (
        WebhookBuilder(server, GIZMOS)
        .with_validator(GizmoRules())
        .with_defaulter(GizmoDefaults())
        .complete()
    )
    assert paths == [
        "/mutate-typedhook-example-com-v1-gizmo",
        "/validate-typedhook-example-com-v1-gizmo",
    ]
    async with anyio.create_task_group() as tg:
        await tg.start(server.serve)
        control_plane.install_webhooks(configurations(namespace), port)
        try:
            created = await client.create(GIZMOS, gizmo("g1", replicas=2), namespace)
            assert created["spec"] == {"replicas": 2, "owner": "envtest-admin"}  # defaulted

            with pytest.raises(errors.ApiError) as info:
                await client.create(GIZMOS, gizmo("g2", replicas=9), namespace)
            assert info.value.code == 403
            assert (
                'admission webhook "vgizmo.example.com" denied the request: '
                "spec.replicas 9 is over 5"
            ) in info.value.message

            created["spec"]["owner"] = "mallory"
            with pytest.raises(errors.ApiError, match=r"spec\.owner is immutable"):
                await client.update(GIZMOS, created)

            # Warnings reach the client as Warning headers.
            r = await anyio.to_thread.run_sync(
                lambda: control_plane.http.post(
                    f"/apis/{GIZMOS.api_version}/namespaces/{namespace}/gizmos",
                    json=gizmo("g3", replicas=1, protected=True),
                )
            )
            assert r.status_code == 201, r.text
            assert "one replica has no redundancy" in r.headers.get("warning", "")

            # Deletion is validated with the stored object.
            with pytest.raises(errors.ApiError, match="gizmo g3 is protected: unprotect it"):
                await client.delete(GIZMOS, "g3", namespace)
            await client.delete(GIZMOS, "g1", namespace)
            with pytest.raises(errors.NotFound):
                await client.get(GIZMOS, "g1", namespace)
        finally:
            for obj in configurations(namespace):
                control_plane.delete(obj["apiVersion"], obj["kind"], obj["metadata"]["name"])
            tg.cancel_scope.cancel()

"""envtest's webhook configurations point the real API server at a webhook server on
loopback, keeping the path a configuration names (a service path or a URL's path)."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import pytest

from sdgruntime.envtest import ControlPlane


@pytest.fixture
def cp() -> Iterator[ControlPlane]:
    plane = ControlPlane()  # not started: only its CA is used
    yield plane
    plane.stop()


def config(*client_configs: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "v"},
        "webhooks": [
            {"name": f"h{i}.example.com", "clientConfig": c} for i, c in enumerate(client_configs)
        ],
    }


def test_service_paths_and_url_paths_are_kept(cp: ControlPlane) -> None:
    original = config(
        {"service": {"name": "op", "namespace": "ops", "path": "/validate--v1-configmap"}},
        {"url": "https://operator.example.com:8443/validate-apps-v1-deployment"},
        {"url": "https://operator.example.com"},
        {"service": {"name": "op", "namespace": "ops"}},
    )
    [rewritten] = cp.webhook_configurations([original, {"kind": "ConfigMap"}], 9443)
    ca = base64.b64encode(cp.ca.cert_pem).decode()
    assert [h["clientConfig"] for h in rewritten["webhooks"]] == [
        {"url": "https://127.0.0.1:9443/validate--v1-configmap", "caBundle": ca},
        {"url": "https://127.0.0.1:9443/validate-apps-v1-deployment", "caBundle": ca},
        {"url": "https://127.0.0.1:9443/", "caBundle": ca},
        {"url": "https://127.0.0.1:9443/", "caBundle": ca},
    ]
    # The input is not modified (it may be a manifest shared by tests).
    assert original["webhooks"][1]["clientConfig"]["url"].startswith("https://operator.")


def test_scoped_to_a_namespace_they_are_named_apart_and_see_only_it(cp: ControlPlane) -> None:
    original = config({"service": {"name": "op", "namespace": "ops", "path": "/v"}})
    original["webhooks"][0]["namespaceSelector"] = {"matchLabels": {"team": "a"}}
    [scoped] = cp.webhook_configurations([original], 9443, namespace="t-1")
    assert scoped["metadata"]["name"] == "v-t-1"
    assert scoped["webhooks"][0]["namespaceSelector"] == {
        "matchLabels": {"kubernetes.io/metadata.name": "t-1"}
    }
    assert original["metadata"]["name"] == "v"  # the manifest itself is left alone

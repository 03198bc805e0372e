"""A namespaced test CRD for one Kind: the tests that need a custom resource of their own
(webhooks called by the API server, controllerutil) build it here instead of each
spelling out the CustomResourceDefinition."""

from __future__ import annotations

from typing import Any

from sdgruntime.kinds import Kind


def namespaced_crd(
    kind: Kind,
    properties: dict[str, Any],
    *,
    status_subresource: bool = False,
) -> dict[str, Any]:
    """A served, stored, namespaced CRD for ``kind`` whose schema has ``properties``."""
    version: dict[str, Any] = {
        "name": kind.version,
        "served": True,
        "storage": True,
        "schema": {"openAPIV3Schema": {"type": "object", "properties": properties}},
    }
    if status_subresource:
        version["subresources"] = {"status": {}}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{kind.plural}.{kind.group}"},
        "spec": {
            "group": kind.group,
            "scope": "Namespaced",
            "names": {
                "plural": kind.plural,
                "singular": kind.kind.lower(),
                "kind": kind.kind,
            },
            "versions": [version],
        },
    }

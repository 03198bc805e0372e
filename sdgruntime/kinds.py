"""Resource descriptors: where a kind lives in the API, without any model classes, and
the one type of a decoded object."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any
from urllib.parse import quote

#: A decoded Kubernetes object (or any JSON object) as code reads it.
Obj = Mapping[str, Any]
#: One that code builds or edits in place.
MutableObj = dict[str, Any]

_NONE: Mapping[str, Any] = MappingProxyType({})


def meta_of(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """``obj.metadata``, or an empty (read-only) mapping when the object has none."""
    return (obj or _NONE).get("metadata") or _NONE


def spec_of(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """``obj.spec``, or an empty (read-only) mapping."""
    return (obj or _NONE).get("spec") or _NONE


def status_of(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """``obj.status``, or an empty (read-only) mapping."""
    return (obj or _NONE).get("status") or _NONE


@dataclass(frozen=True, slots=True)
class Kind:
    """A Kubernetes resource type, enough to build its REST paths.

    ``group`` is ``""`` for the core API group.
    """

    group: str
    version: str
    kind: str
    plural: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def name(self) -> str:
        """A readable name for messages and metrics: ``pods``, ``leases.coordination.k8s.io``."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    def path(
        self,
        namespace: str | None = None,
        name: str | None = None,
        subresource: str | None = None,
    ) -> str:
        """The REST path of the collection, or of one object (and its subresource)."""
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{quote(namespace, safe='')}"
        base += f"/{self.plural}"
        if name is not None:
            base += f"/{quote(name, safe='')}"
            if subresource:
                base += f"/{subresource}"
        return base


PODS = Kind("", "v1", "Pod", "pods", namespaced=True)
NODES = Kind("", "v1", "Node", "nodes", namespaced=False)
NAMESPACES = Kind("", "v1", "Namespace", "namespaces", namespaced=False)
EVENTS = Kind("", "v1", "Event", "events", namespaced=True)
CONFIGMAPS = Kind("", "v1", "ConfigMap", "configmaps", namespaced=True)
SECRETS = Kind("", "v1", "Secret", "secrets", namespaced=True)
SERVICEACCOUNTS = Kind("", "v1", "ServiceAccount", "serviceaccounts", namespaced=True)
LEASES = Kind("coordination.k8s.io", "v1", "Lease", "leases", namespaced=True)
RUNTIMECLASSES = Kind("node.k8s.io", "v1", "RuntimeClass", "runtimeclasses", namespaced=False)
CRDS = Kind(
    "apiextensions.k8s.io", "v1", "CustomResourceDefinition", "customresourcedefinitions", False
)
MUTATING_WEBHOOKS = Kind(
    "admissionregistration.k8s.io",
    "v1",
    "MutatingWebhookConfiguration",
    "mutatingwebhookconfigurations",
    namespaced=False,
)
VALIDATING_WEBHOOKS = Kind(
    "admissionregistration.k8s.io",
    "v1",
    "ValidatingWebhookConfiguration",
    "validatingwebhookconfigurations",
    namespaced=False,
)

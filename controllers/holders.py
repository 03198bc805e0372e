"""Holder pods: how a group's devices on a device-plugin node enter the kubelet's books.

On a node whose resource comes from a device plugin, kube-scheduler and the kubelet count
devices by pod requests. A group's pods request none (they are given the group's devices
by env, RuntimeClass or CDI), so SDG creates one *holder pod* per group on the group's
node, asking for exactly the group's devices: kube-scheduler and the kubelet then count
them, and no plain pod is ever given them. The devices the group holds are the ones the
kubelet gave its holder, read back from the holder's ``status.containerStatuses[].
allocatedResourcesStatus`` (written by the kubelet's device manager; feature
ResourceHealthStatus, on by default since Kubernetes 1.36).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

#: Label on every holder pod SDG creates (value ``holder``), in the manager's namespace.
ROLE_LABEL: Final = "deviceshare.io/role"
ROLE_HOLDER: Final = "holder"
#: Annotation naming the group a holder pod holds devices for.
HOLDER_FOR_ANNOTATION: Final = "deviceshare.io/holder-for"

Obj = Mapping[str, Any]


def is_holder(pod: Obj, namespace: str | None) -> bool:
    """Whether ``pod`` is one of SDG's holder pods: labelled so *in the manager's
    namespace* (only SDG writes there; the same label elsewhere proves nothing)."""
    if not namespace:
        return False
    meta = pod.get("metadata") or {}
    return (
        meta.get("namespace") == namespace
        and (meta.get("labels") or {}).get(ROLE_LABEL) == ROLE_HOLDER
    )

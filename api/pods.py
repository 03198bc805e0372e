"""Pod facts shared by the schedulers, the status controller and the webhooks."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from api.constants import GROUP_ANNOTATION
from api.envvars import env_var_for
from api.v1alpha1 import parse_ids

#: Cache index: pods by the group their annotation names.
POD_GROUP_INDEX = "group"
#: Cache index: pods by ``spec.nodeName``.
POD_NODE_INDEX = "node"


def pod_group(pod: Mapping[str, Any]) -> str | None:
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    value = annotations.get(GROUP_ANNOTATION)
    return value if isinstance(value, str) and value else None


def index_by_group(pod: Mapping[str, Any]) -> list[str]:
    group = pod_group(pod)
    return [group] if group else []


def index_by_node(pod: Mapping[str, Any]) -> list[str]:
    node = (pod.get("spec") or {}).get("nodeName")
    return [node] if node else []


def is_active(pod: Mapping[str, Any]) -> bool:
    """A pod that may still use its devices: not Succeeded or Failed.

    A terminating pod still counts until its object is gone: its containers may still
    run on the GPUs, so its group must not release them yet.
    """
    return (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


def pod_key(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def devices_from_env(
    pod: Mapping[str, Any], resources: Mapping[str, int], env_table: Mapping[str, str]
) -> dict[str, list[int]] | None:
    """The device IDs our webhook injected into a pod (first container), if complete."""
    containers = (pod.get("spec") or {}).get("containers") or []
    if not containers:
        return None
    env = {e.get("name"): e.get("value") for e in containers[0].get("env") or []}
    out: dict[str, list[int]] = {}
    for res in resources:
        var = env_var_for(res, env_table)
        value = env.get(var) if var else None
        if not value:
            return None
        try:
            out[res] = parse_ids(value)
        except ValueError:
            return None
    return out

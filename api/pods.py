"""Pod facts shared by the schedulers, the status controller and the webhooks, and what
the manager caches of pods and nodes."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

from api.constants import (
    DEVICES_ANNOTATION,
    GROUP_ANNOTATION,
    INJECTOR_ANNOTATION_FAMILIES,
)
from api.envvars import device_env_vars, env_var_for
from api.v1alpha1 import format_ids, parse_ids
from sdgruntime.cache.store import INTERN_MAX_LEN, intern_strings
from sdgruntime.kinds import meta_of, spec_of, status_of

#: Cache index: pods by the group their annotation names.
POD_GROUP_INDEX = "group"
#: Cache index: pods by ``spec.nodeName``.
POD_NODE_INDEX = "node"


def pod_group(pod: Mapping[str, Any]) -> str | None:
    annotations = meta_of(pod).get("annotations") or {}
    value = annotations.get(GROUP_ANNOTATION)
    return value if isinstance(value, str) and value else None


def index_by_group(pod: Mapping[str, Any]) -> list[str]:
    group = pod_group(pod)
    return [group] if group else []


def index_by_node(pod: Mapping[str, Any]) -> list[str]:
    node = spec_of(pod).get("nodeName")
    return [node] if node else []


#: The phases of a pod whose containers have all ended for good.
FINISHED_PHASES: Final = frozenset({"Succeeded", "Failed"})


def pod_phase(pod: Mapping[str, Any]) -> str:
    """``status.phase``; a pod the kubelet has not reported yet is Pending."""
    return str(status_of(pod).get("phase") or "Pending")


def is_finished(pod: Mapping[str, Any]) -> bool:
    """Succeeded or Failed: its containers will not run again."""
    return status_of(pod).get("phase") in FINISHED_PHASES


def is_active(pod: Mapping[str, Any]) -> bool:
    """A pod that may still use its devices: not finished.

    A terminating pod still counts until its object is gone: its containers may still
    run on the GPUs, so its group must not release them yet.
    """
    return not is_finished(pod)


def pod_key(pod: Mapping[str, Any]) -> str:
    meta = meta_of(pod)
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def devices_from_env(
    pod: Mapping[str, Any], resources: Mapping[str, int], env_table: Mapping[str, str]
) -> dict[str, list[int]] | None:
    """The device IDs our webhook injected into a pod (first container), if complete."""
    containers = spec_of(pod).get("containers") or []
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


def devices_annotation(devices: Mapping[str, list[int]]) -> str:
    """The ``deviceshare.io/devices`` value for ``devices``: compact JSON, keys sorted, IDs
    ascending (``{"nvidia.com/gpu":"0,1"}``), so equal devices give equal strings."""
    return json.dumps(
        {res: format_ids(ids) for res, ids in sorted(devices.items())}, separators=(",", ":")
    )


#: Annotation values up to this long are parsed once and remembered (the pods of a group
#: carry one value; every bind reads it): at most ``1024`` of them, well under 1 MiB.
_MEMO_ANNOTATION_LEN = 128


def parse_devices_annotation(value: Any) -> dict[str, list[int]] | None:
    """``deviceshare.io/devices`` parsed, or None when it is not a JSON object of ID lists."""
    if not isinstance(value, str) or len(value) > 65536:
        return None
    parsed = _parsed_devices(value) if len(value) <= _MEMO_ANNOTATION_LEN else _parse_devices(value)
    return None if parsed is None else {res: list(ids) for res, ids in parsed}


@functools.lru_cache(maxsize=1024)
def _parsed_devices(value: str) -> tuple[tuple[str, tuple[int, ...]], ...] | None:
    return _parse_devices(value)


def _parse_devices(value: str) -> tuple[tuple[str, tuple[int, ...]], ...] | None:
    try:
        raw = json.loads(value)
    except ValueError:
        return None
    if not isinstance(raw, dict):
        return None
    try:
        return tuple((res, tuple(parse_ids(ids))) for res, ids in raw.items())
    except ValueError:
        return None


def delivered_devices(
    pod: Mapping[str, Any], resources: Mapping[str, int], env_table: Mapping[str, str]
) -> dict[str, list[int]] | None:
    """The device IDs a group pod was given, or None when that cannot be told.

    The ``deviceshare.io/devices`` annotation first: it names the IDs in every delivery
    mode (env values may be UUIDs, or ``void`` under CDI). It is returned whole, so a pod
    given other resources than ``resources`` (its group was recreated) shows it; malformed
    gives None (never a guess from env that may not hold IDs). Pods admitted before the
    annotation existed fall back to the env of their first container.
    """
    annotations = meta_of(pod).get("annotations") or {}
    if DEVICES_ANNOTATION in annotations:
        return parse_devices_annotation(annotations[DEVICES_ANNOTATION])
    return devices_from_env(pod, resources, env_table)


def tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """Kubernetes' ``Toleration.ToleratesTaint``: an empty effect matches every effect, an
    empty key (with Exists) every key; operator "" means Equal."""
    effect = toleration.get("effect") or ""
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key") or ""
    if key and key != taint.get("key"):
        return False
    op = toleration.get("operator") or "Equal"
    if op == "Exists":
        return True
    if op == "Equal":
        return (toleration.get("value") or "") == (taint.get("value") or "")
    return False


# --- what the manager caches of a pod ------------------------------------------------
# Every pod of the cluster is cached (foreign device users and node fit need all of them),
# so a pod's volumes, probes, images, commands and container statuses would be most of
# the manager's memory without being read. These are the fields SDG reads; a reader of a
# new field adds it here (tests/unit/test_podcache.py checks the readers agree).
_KEPT_METADATA = (
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "labels",
    "annotations",
    "deletionTimestamp",
    "ownerReferences",
)
_KEPT_SPEC = (
    "nodeName",
    "schedulerName",
    "nodeSelector",
    "affinity",
    "tolerations",
    "overhead",
    "resources",
    "schedulingGates",
    "hostNetwork",
    "priority",
)
_KEPT_CONTAINER = ("name", "resources", "ports", "env", "restartPolicy")
_CONTAINER_LISTS = ("containers", "initContainers", "ephemeralContainers")
_KEPT_STATUS = ("phase", "conditions", "nominatedNodeName", "reason", "message")
#: Of each container status, only which devices the kubelet gave it (how SDG reads back a
#: holder pod's devices, ``controllers.holders``); absent for pods without devices.
_KEPT_CONTAINER_STATUS = ("name", "allocatedResourcesStatus")
#: Annotations of a pod SDG reads: its own, and the device-injector's.
_KEPT_ANNOTATION_PREFIXES = ("deviceshare.io/", *INJECTOR_ANNOTATION_FAMILIES)
#: The device variables of SDG's default table (what ``cached_pod`` keeps of env).
_DEFAULT_ENV_VARS = device_env_vars()


#: Foreign detection reads whether a container's ``envFrom`` may set a device variable
#: (its ``prefix``) and names the ConfigMap or Secret; a pod's ``resourceClaims`` by name.
#: Both are kept bounded: at most this many entries, prefixes cut to ``_MAX_PREFIX``.
_MAX_KEPT_REFS = 16
_MAX_PREFIX = 64


def _kept(obj: Any, fields: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(obj, dict):
        return {}
    return {k: obj[k] for k in fields if k in obj}


def _slim_env_from(entries: Any) -> Any:
    """``envFrom`` as foreign detection reads it: each entry's prefix and the name of its
    ConfigMap or Secret. Cutting a prefix keeps a start of it, so it matches every
    variable the whole one matches (and maybe more): the cut errs towards counting. Past
    ``_MAX_KEPT_REFS`` distinct entries, one without prefix stands for the rest."""
    if not isinstance(entries, list):
        return entries
    out: list[dict[str, Any]] = []
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        slim: dict[str, Any] = {}
        if entry.get("prefix"):
            slim["prefix"] = str(entry["prefix"])[:_MAX_PREFIX]
        for key in ("configMapRef", "secretRef"):
            ref = entry.get(key)
            if isinstance(ref, dict):
                slim[key] = {"name": ref.get("name", "")}
        if slim in out:
            continue
        if len(out) == _MAX_KEPT_REFS:
            out[-1] = {"configMapRef": {"name": "..."}}  # no prefix: matches every name
            break
        out.append(slim)
    return out


_KEPT_CLAIM = ("name", "resourceClaimName", "resourceClaimTemplateName")


def _slim_claims(claims: Any) -> Any:
    """``spec.resourceClaims`` (at most ``_MAX_KEPT_REFS``, names only): foreign detection
    needs that a pod claims DRA devices, and says which claims."""
    if not isinstance(claims, list):
        return claims
    return [_kept(c, _KEPT_CLAIM) if isinstance(c, dict) else c for c in claims[:_MAX_KEPT_REFS]]


def _slim_container(container: Any, env_vars: frozenset[str]) -> Any:
    if not isinstance(container, dict):
        return container
    out = _kept(container, _KEPT_CONTAINER)
    env = container.get("env")
    if isinstance(env, list):
        # Only the device variables (every one SDG reads: delivery, recovery, foreign
        # use); a pod's other env may be megabytes the manager would keep for nothing.
        out["env"] = [e for e in env if not isinstance(e, dict) or e.get("name") in env_vars]
    elif env is not None:
        out["env"] = env
    if container.get("envFrom"):
        out["envFrom"] = _slim_env_from(container["envFrom"])
    return out


def _slim_metadata(meta: Any) -> Any:
    """Metadata with only the annotations SDG reads: its own (``deviceshare.io/``) and
    NRI's device-injector families (what foreign detection and delivery read)."""
    out = _kept(meta, _KEPT_METADATA)
    annotations = out.get("annotations")
    if isinstance(annotations, dict):
        out["annotations"] = {
            k: v
            for k, v in annotations.items()
            if not isinstance(k, str) or k.startswith(_KEPT_ANNOTATION_PREFIXES)
        }
    return out


def pod_transform(env_vars: Iterable[str]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """The manager's cache transform for pods (``cached_pod``), keeping the env entries
    of ``env_vars`` (the device variables of its ``--device-env`` table)."""
    names = frozenset(env_vars)
    return lambda pod: _slim_pod(pod, names)


def cached_pod(pod: dict[str, Any]) -> dict[str, Any]:
    """The cache transform for pods with SDG's default device variables: only the fields
    SDG reads (a third to a tenth of a real pod's size, bounded whatever its env and
    annotations), their short strings shared (``intern_strings``) but for the pod's own
    name, UID and resourceVersion (``_UNIQUE_METADATA``). Malformed parts are kept as they
    are, for readers to judge."""
    return _slim_pod(pod, _DEFAULT_ENV_VARS)


def _slim_pod(pod: dict[str, Any], env_vars: frozenset[str]) -> dict[str, Any]:
    spec = pod.get("spec")
    slim_spec = _kept(spec, _KEPT_SPEC)
    if isinstance(spec, dict):
        for key in _CONTAINER_LISTS:
            containers = spec.get(key)
            if isinstance(containers, list):
                slim_spec[key] = [_slim_container(c, env_vars) for c in containers]
        if spec.get("resourceClaims"):
            slim_spec["resourceClaims"] = _slim_claims(spec["resourceClaims"])
    out: dict[str, Any] = {k: pod[k] for k in ("apiVersion", "kind") if k in pod}
    if "metadata" in pod:
        out["metadata"] = _slim_metadata(pod["metadata"])
    if "spec" in pod:
        out["spec"] = slim_spec if isinstance(spec, dict) else spec
    if "status" in pod:
        status = pod["status"]
        if isinstance(status, dict):
            slim = _kept(status, _KEPT_STATUS)
            given = [
                _kept(c, _KEPT_CONTAINER_STATUS)
                for c in status.get("containerStatuses") or ()
                if isinstance(c, dict) and c.get("allocatedResourcesStatus")
            ]
            if given:
                slim["containerStatuses"] = given
            out["status"] = slim
        else:
            out["status"] = status
    _intern_but(out, _METADATA)
    if type(out.get("metadata")) is dict:
        _intern_but(out["metadata"], _UNIQUE_METADATA)
    return out


#: Metadata values no other pod shares: interning them shares nothing and costs the
#: interpreter's string table an insert and a delete for every event of every pod (the
#: watches' largest part after decoding, RESULTS.md session 39).
_UNIQUE_METADATA = frozenset(("name", "uid", "resourceVersion", "deletionTimestamp"))
_METADATA = frozenset(("metadata",))


def _intern_but(obj: dict[str, Any], skip: frozenset[str]) -> None:
    """``intern_strings`` over ``obj``'s values but those under the keys in ``skip``."""
    for key, value in obj.items():
        if key in skip:
            continue
        kind = type(value)
        if kind is str:
            if len(value) <= INTERN_MAX_LEN:
                obj[key] = sys.intern(value)
        elif kind is dict or kind is list:
            intern_strings(value)


# A node's status is mostly what SDG never reads: its image list alone is often 10-50 KB.
_KEPT_NODE_METADATA = (
    "name",
    "uid",
    "resourceVersion",
    "labels",
    "annotations",
    "deletionTimestamp",
)
_KEPT_NODE_SPEC = ("unschedulable", "taints")
_KEPT_NODE_STATUS = ("allocatable", "capacity", "conditions", "runtimeHandlers")


def cached_node(node: dict[str, Any]) -> dict[str, Any]:
    """The manager's cache transform for nodes: what placement, fit checks, the inventory
    and the delivery choice (labels, runtime handlers) read; not images, addresses,
    nodeInfo or volumes."""
    out: dict[str, Any] = {k: node[k] for k in ("apiVersion", "kind") if k in node}
    for key, fields in (
        ("metadata", _KEPT_NODE_METADATA),
        ("spec", _KEPT_NODE_SPEC),
        ("status", _KEPT_NODE_STATUS),
    ):
        if key in node:
            part = node[key]
            out[key] = _kept(part, fields) if isinstance(part, dict) else part
    return intern_strings(out)

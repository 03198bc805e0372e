"""Pod mutation for SharedDeviceGroup members: the pure decisions, no I/O.

Given the pod being created and its group, either a JSON patch (RFC 6902) that points
every container at the group's devices and at our scheduler and lets the pod onto tainted
shared nodes, or a denial whose message tells the user what to change. The same for the
ephemeral containers (``kubectl debug``) added to a group's pod. The admission handler
does the lookups and wraps this.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from api.conditions import find_condition
from api.constants import (
    CONDITION_READY,
    CONDITION_SCHEDULED,
    CONFLICT_REASONS,
    DEFAULT_ENV_TABLE,
    DEFAULT_SCHEDULER_NAME,
    DEVICE_ENV_FLAG,
    GROUP_ANNOTATION,
    PHASE_BOUND,
    SCHEDULER_NAME,
    SHARED_TAINT_KEY,
    SHARED_TAINT_VALUE,
)
from api.envvars import env_var_for
from api.validation import is_dns_subdomain

Obj = Mapping[str, Any]

#: Lets group pods onto shared nodes tainted ``deviceshare.io/mode=shared:NoSchedule``,
#: which keeps every other pod off them.
SHARED_TOLERATION: Mapping[str, str] = {
    "key": SHARED_TAINT_KEY,
    "operator": "Equal",
    "value": SHARED_TAINT_VALUE,
    "effect": "NoSchedule",
}
_SHARED_TAINT = {"key": SHARED_TAINT_KEY, "value": SHARED_TAINT_VALUE, "effect": "NoSchedule"}

#: Env vars an ephemeral container must copy from the pod's first container, whatever the
#: env table says; the API server's policy (config/policy) checks the same names.
DEVICE_ENV_SUFFIX = "_VISIBLE_DEVICES"


@dataclass(frozen=True, slots=True)
class Patch:
    """Allow, with these JSON patch operations (possibly none)."""

    operations: list[dict[str, Any]] = field(default_factory=list)
    allowed: bool = True


@dataclass(frozen=True, slots=True)
class Denial:
    """Deny the pod; ``message`` is shown to the user by kubectl."""

    message: str
    allowed: bool = False


def escape_pointer(token: str | int) -> str:
    """One JSON pointer reference token (RFC 6901): ``~`` -> ``~0``, ``/`` -> ``~1``."""
    return str(token).replace("~", "~0").replace("/", "~1")


def pointer(*tokens: str | int) -> str:
    return "".join("/" + escape_pointer(t) for t in tokens)


def group_annotation(pod: Obj) -> str | None:
    """The group a pod names, or None when it names none (annotation absent)."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    value = annotations.get(GROUP_ANNOTATION)
    return None if value is None else str(value)


def check_annotation(pod: Obj, scheduler_name: str = SCHEDULER_NAME) -> Denial | None:
    """Deny a malformed group annotation, or our scheduler without a group."""
    name = group_annotation(pod)
    scheduler = (pod.get("spec") or {}).get("schedulerName")
    if name is None:
        if scheduler == scheduler_name:
            return Denial(
                f"pod uses schedulerName {scheduler_name} but has no {GROUP_ANNOTATION} "
                f"annotation; add {GROUP_ANNOTATION}: <SharedDeviceGroup name>, or use "
                "another scheduler"
            )
        return None
    if not name.strip():
        return Denial(
            f"annotation {GROUP_ANNOTATION} is empty; set it to the name of a "
            "SharedDeviceGroup (kubectl get sdg lists them)"
        )
    if not is_dns_subdomain(name):
        return Denial(
            f"annotation {GROUP_ANNOTATION}={name!r} is not a valid SharedDeviceGroup name "
            "(lowercase letters, digits, '-' and '.', at most 253 characters)"
        )
    return None


def _containers(pod: Obj) -> list[tuple[str, int, Obj]]:
    spec = pod.get("spec") or {}
    return [
        (kind, i, c)
        for kind in ("initContainers", "containers")
        for i, c in enumerate(spec.get(kind) or ())
    ]


def _requested_devices(pod: Obj, resources: Mapping[str, Any]) -> Denial | None:
    for kind, _i, c in _containers(pod):
        res = c.get("resources") or {}
        for section in ("limits", "requests"):
            for name in sorted(res.get(section) or {}):
                if name in resources:
                    what = "init container" if kind == "initContainers" else "container"
                    return Denial(
                        f"{what} {c.get('name', '')!r} requests {name} in resources.{section}; "
                        f"the device plugin would hand it other devices than the group's. "
                        f"Remove the {name} limit and request: the group's devices are "
                        "injected through the environment"
                    )
    pod_level = (pod.get("spec") or {}).get("resources") or {}
    for section in ("limits", "requests"):
        for name in sorted(pod_level.get(section) or {}):
            if name in resources:
                return Denial(
                    f"pod requests {name} in spec.resources.{section}; the device plugin "
                    f"would hand it other devices than the group's. Remove the {name} "
                    "limit and request: the group's devices are injected through the "
                    "environment"
                )
    return None


def _group_env(group: Obj, env_table: Mapping[str, str]) -> dict[str, str] | Denial:
    """env var -> value for the group's resources, or a denial."""
    name = (group.get("metadata") or {}).get("name", "")
    resources = sorted((group.get("spec") or {}).get("resources") or {})
    selected = (group.get("status") or {}).get("selectedDevices") or {}
    env: dict[str, str] = {}
    owner: dict[str, str] = {}
    for res in resources:
        var = env_var_for(res, env_table)
        if var is None:
            return Denial(
                f"SharedDeviceGroup {name!r} holds {res}, which has no environment variable "
                f"configured; start the manager with {DEVICE_ENV_FLAG} {res}=<ENV_VAR> "
                "(e.g. the variable your container runtime reads for visible devices)"
            )
        if var in owner:
            return Denial(
                f"SharedDeviceGroup {name!r} holds {owner[var]} and {res}, which both map to "
                f"{var}; one variable cannot list both, so use one resource per group or "
                f"configure distinct variables with {DEVICE_ENV_FLAG}"
            )
        ids = selected.get(res)
        if not ids:
            return Denial(
                f"SharedDeviceGroup {name!r} is Bound but has no devices recorded for {res}; "
                "this is a controller inconsistency, check the manager's logs"
            )
        owner[var] = res
        env[var] = str(ids)
    return env


def _env_ops(kind: str, index: int, container: Obj, env: Mapping[str, Any]) -> list[dict]:
    """Set each ``env`` var (a value, or a whole env entry) in one container: replace every
    entry of that name (the kubelet lets the last one win), append the missing ones."""
    base = ("spec", kind, index, "env")
    entries = {
        var: dict(value) if isinstance(value, Mapping) else {"name": var, "value": value}
        for var, value in env.items()
    }
    existing = container.get("env")
    if not existing:
        op = "replace" if existing is not None else "add"
        return [{"op": op, "path": pointer(*base), "value": list(entries.values())}]
    ops: list[dict[str, Any]] = []
    for var, entry in entries.items():
        positions = [i for i, e in enumerate(existing) if e.get("name") == var]
        if not positions:
            ops.append({"op": "add", "path": pointer(*base, "-"), "value": entry})
        for i in positions:
            if existing[i] != entry:
                ops.append({"op": "replace", "path": pointer(*base, i), "value": entry})
    return ops


def tolerates_shared_taint(toleration: Obj) -> bool:
    """Kubernetes' ToleratesTaint for the shared-node taint: an empty effect matches every
    effect, an empty key with Exists every key, operator "" means Equal."""
    effect = toleration.get("effect") or ""
    if effect and effect != _SHARED_TAINT["effect"]:
        return False
    key = toleration.get("key") or ""
    if key and key != _SHARED_TAINT["key"]:
        return False
    op = toleration.get("operator") or "Equal"
    if op == "Exists":
        return True
    return op == "Equal" and (toleration.get("value") or "") == _SHARED_TAINT["value"]


def _toleration_ops(pod: Obj) -> list[dict[str, Any]]:
    tolerations = (pod.get("spec") or {}).get("tolerations")
    if any(tolerates_shared_taint(t) for t in tolerations or ()):
        return []
    if tolerations is None:
        return [{"op": "add", "path": "/spec/tolerations", "value": [dict(SHARED_TOLERATION)]}]
    return [{"op": "add", "path": "/spec/tolerations/-", "value": dict(SHARED_TOLERATION)}]


def conflict_denial(name: str, group: Obj) -> Denial | None:
    """Deny joining while the group's devices are disputed (``Ready=False`` with a conflict
    reason): a new pod would run on devices another group or pod may also be using."""
    status = group.get("status") or {}
    ready = find_condition(status.get("conditions"), CONDITION_READY)
    if not ready or ready.get("status") != "False":
        return None
    reason = ready.get("reason") or ""
    if reason not in CONFLICT_REASONS:
        return None
    message = (ready.get("message") or "").rstrip()
    message = message if not message or message.endswith(".") else message + "."
    return Denial(
        f"SharedDeviceGroup {name!r} takes no new pods while its devices are disputed: "
        f"Ready=False, reason {reason}: {message or '(no message)'} Resolve that first "
        f"(kubectl describe sdg {name}); pods can join again once the condition clears."
    )


def build_injection(
    pod: Obj,
    group: Obj | None,
    env_table: Mapping[str, str] = DEFAULT_ENV_TABLE,
    scheduler_name: str = SCHEDULER_NAME,
) -> Patch | Denial:
    """Decide a pod CREATE: the patch to apply, or why it is denied.

    ``group`` is the SharedDeviceGroup the annotation names (None when it does not exist).
    A pod without the annotation and not naming our scheduler gets an empty Patch. The
    patch is idempotent: applied to its own result it yields no operations (the webhook
    is reinvoked after other mutating webhooks).
    """
    denial = check_annotation(pod, scheduler_name)
    if denial is not None:
        return denial
    name = group_annotation(pod)
    if name is None:
        return Patch()
    if group is None:
        return Denial(
            f"SharedDeviceGroup {name!r} not found; create it first "
            f"(kubectl get sdg lists the groups) or fix annotation {GROUP_ANNOTATION}"
        )
    meta = group.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return Denial(f"SharedDeviceGroup {name!r} is being deleted; new pods cannot join it")
    conflict = conflict_denial(name, group)
    if conflict is not None:
        return conflict
    status = group.get("status") or {}
    if status.get("phase") != PHASE_BOUND or not status.get("nodeName"):
        cond = find_condition(status.get("conditions"), CONDITION_SCHEDULED)
        why = ((cond or {}).get("message") or "it has not been scheduled yet").rstrip()
        why = why if why.endswith(".") else why + "."
        return Denial(
            f"SharedDeviceGroup {name!r} is Pending: {why} "
            "Pods can join once it is Bound; fix the cause (kubectl describe sdg "
            f"{name}) or use another group."
        )
    node = (pod.get("spec") or {}).get("nodeName")
    if node and node != status.get("nodeName"):
        # The kubelet would run it on another node's GPUs with these IDs: someone else's.
        return Denial(
            f"pod sets spec.nodeName {node}, but SharedDeviceGroup {name!r} is bound to node "
            f"{status.get('nodeName')}; remove spec.nodeName and {scheduler_name} places "
            "the pod on the group's node"
        )
    resources = (group.get("spec") or {}).get("resources") or {}
    denial = _requested_devices(pod, resources)
    if denial is not None:
        return denial
    scheduler = (pod.get("spec") or {}).get("schedulerName")
    if scheduler not in (None, "", DEFAULT_SCHEDULER_NAME, scheduler_name):
        return Denial(
            f"pod uses schedulerName {scheduler}, but pods of SharedDeviceGroup {name!r} "
            f"must use {scheduler_name} (or leave it unset) to run on the group's node"
        )
    env = _group_env(group, env_table)
    if isinstance(env, Denial):
        return env
    ops: list[dict[str, Any]] = []
    for kind, i, c in _containers(pod):
        ops.extend(_env_ops(kind, i, c, env))
    ops.extend(_toleration_ops(pod))
    if scheduler != scheduler_name:
        op = "add" if scheduler is None else "replace"
        ops.append({"op": op, "path": "/spec/schedulerName", "value": scheduler_name})
    return Patch(ops)


def _pod_ref(pod: Obj) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def _added_ephemeral(pod: Obj, old_pod: Obj) -> list[tuple[int, Obj]]:
    """The ephemeral containers this request adds (existing ones can never change)."""
    before = {c.get("name") for c in (old_pod.get("spec") or {}).get("ephemeralContainers") or ()}
    return [
        (i, c)
        for i, c in enumerate((pod.get("spec") or {}).get("ephemeralContainers") or ())
        if c.get("name") not in before
    ]


def _stale_device_env(pod: Obj, env: Mapping[str, str]) -> str | None:
    """Where the pod's containers do not carry the group's current device env, if anywhere."""
    for kind, _i, c in _containers(pod):
        entries = c.get("env") or []
        what = "init container" if kind == "initContainers" else "container"
        for var, value in env.items():
            found = [e for e in entries if e.get("name") == var]
            wrong = next((e for e in found if e != {"name": var, "value": value}), None)
            if not found:
                return f"{what} {c.get('name', '')!r} has no {var}, the group holds {value}"
            if wrong is not None:
                has = f"={wrong['value']}" if "value" in wrong else " from valueFrom"
                return f"{what} {c.get('name', '')!r} has {var}{has}, the group holds {value}"
    return None


def build_ephemeral_injection(
    pod: Obj,
    old_pod: Obj,
    group: Obj | None,
    env_table: Mapping[str, str] = DEFAULT_ENV_TABLE,
) -> Patch | Denial:
    """Decide an UPDATE of ``pods/ephemeralcontainers`` (``kubectl debug``).

    New ephemeral containers of a group's pod get exactly the device env the pod's
    containers have: the group's env plus any other ``*_VISIBLE_DEVICES`` entry of the
    first container (the API server's policy demands the same), replacing what the user
    set for those names. Container images often name devices themselves (CUDA images:
    ``NVIDIA_VISIBLE_DEVICES=all``), so without it a debug container would see every GPU.
    Denied when the pod no longer runs on its group's devices, or when the new container
    sets a device variable the pod does not have.
    """
    name = group_annotation(pod)
    added = _added_ephemeral(pod, old_pod)
    if not name or not added:
        return Patch()
    ref = _pod_ref(pod)
    names = ", ".join(repr(c.get("name", "")) for _i, c in added)
    if group is None:
        return Denial(
            f"SharedDeviceGroup {name!r} of pod {ref} not found, so ephemeral container "
            f"{names} cannot be given the pod's devices; the pod runs outside any group's "
            "books: delete it and create it again in an existing group"
        )
    status = group.get("status") or {}
    if status.get("phase") != PHASE_BOUND:
        return Denial(
            f"SharedDeviceGroup {name!r} of pod {ref} is not Bound, so ephemeral container "
            f"{names} cannot be given its devices; kubectl describe sdg {name} says why"
        )
    env = _group_env(group, env_table)
    if isinstance(env, Denial):
        return env
    stale = _stale_device_env(pod, env)
    if stale is not None:
        return Denial(
            f"pod {ref} does not run on the devices SharedDeviceGroup {name!r} holds now "
            f"({stale}), so ephemeral container {names} cannot be given the pod's devices. "
            f"Delete the pod and create it again to run on the group's devices "
            f"(kubectl describe sdg {name})"
        )
    containers = (pod.get("spec") or {}).get("containers") or [{}]
    required: dict[str, Any] = {
        e["name"]: e
        for e in containers[0].get("env") or ()
        if str(e.get("name", "")).endswith(DEVICE_ENV_SUFFIX)
    }
    required.update(env)
    ops: list[dict[str, Any]] = []
    for i, c in added:
        extra = sorted(
            {
                str(e.get("name"))
                for e in c.get("env") or ()
                if str(e.get("name", "")).endswith(DEVICE_ENV_SUFFIX)
                and e.get("name") not in required
            }
        )
        if extra:
            return Denial(
                f"ephemeral container {c.get('name', '')!r} of pod {ref} sets "
                f"{', '.join(extra)}, which the pod's containers do not set: it would see "
                f"other devices than SharedDeviceGroup {name!r} holds. Remove "
                f"{'it' if len(extra) == 1 else 'them'} from the ephemeral container"
            )
        ops.extend(_env_ops("ephemeralContainers", i, c, required))
    return Patch(ops)


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def apply_operations(doc: Obj, operations: list[dict[str, Any]]) -> dict[str, Any]:
    """Apply this module's ``add``/``replace`` operations to a deep copy of ``doc``.

    For mutators that prefer to return the edited object (and for tests): the result is
    exactly what the API server makes of the patch.
    """
    out: dict[str, Any] = json.loads(json.dumps(doc))
    for op in operations:
        if op["op"] not in ("add", "replace"):
            raise ValueError(f"unsupported operation {op['op']!r}")
        *parents, last = [_unescape(t) for t in op["path"].split("/")[1:]]
        target: Any = out
        for token in parents:
            target = target[int(token)] if isinstance(target, list) else target[token]
        value = json.loads(json.dumps(op["value"]))
        if isinstance(target, list):
            if last == "-":
                target.append(value)
            elif op["op"] == "add":
                target.insert(int(last), value)
            else:
                target[int(last)] = value
        else:
            if op["op"] == "replace" and last not in target:
                raise ValueError(f"replace of missing member {op['path']}")
            target[last] = value
    return out


def inject_into(
    pod: Obj, group: Obj | None, env_table: Mapping[str, str] = DEFAULT_ENV_TABLE
) -> dict[str, Any] | Denial:
    """``build_injection`` as an edited copy of the pod instead of a patch."""
    result = build_injection(pod, group, env_table)
    if isinstance(result, Denial):
        return result
    return apply_operations(pod, result.operations)

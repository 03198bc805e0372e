"""Pod mutation for SharedDeviceGroup members: the pure decisions, no I/O.

:func:`build_injection` (a pod CREATE) and :func:`build_ephemeral_injection` (ephemeral
containers, ``kubectl debug``) return either a JSON patch (RFC 6902) that gives every
container the group's devices the way the node's runtime takes them
(:mod:`webhooks.delivery`), points the pod at our scheduler and tolerates the shared
taint, or a denial that tells the user what to change. Invariant: a group pod sees exactly
its group's devices, so any other way to devices is refused or, for its own CDI
annotations, replaced (docs/design.md, "Devices are real"). The admission handler does
the lookups.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from api.conditions import find_condition
from api.constants import (
    CONDITION_READY,
    CONDITION_SCHEDULED,
    CONFLICT_REASONS,
    DEFAULT_ENV_TABLE,
    DEFAULT_SCHEDULER_NAME,
    DELIVERED_ANNOTATION,
    DEVICE_ENV_FLAG,
    DEVICE_IDS_INDEX,
    DEVICE_NODE_ANNOTATION_FAMILIES,
    DEVICES_ANNOTATION,
    GROUP_ANNOTATION,
    HOST_ACCESS_ALLOWED,
    HOST_ACCESS_ANNOTATION,
    MOUNT_ANNOTATION_FAMILIES,
    NO_DEVICES,
    PHASE_BOUND,
    SCHEDULER_NAME,
    SHARED_TAINT_KEY,
    SHARED_TAINT_VALUE,
    VOID_DEVICES,
)
from api.envvars import device_env_vars, env_var_for, env_vars_reached, names_no_device
from api.pods import parse_devices_annotation, tolerates
from api.v1alpha1 import allows_host_access, format_ids, parse_ids
from api.validation import is_dns_subdomain
from sdgruntime.kinds import Obj, meta_of, spec_of, status_of
from sdgruntime.webhook.jsonpatch import unescape
from webhooks.delivery import (
    CUDA_DEVICE_ORDER,
    Delivery,
    Denial,
    Patch,
    ResourceDevices,
    annotation_ops,
    containers,
    delivered_record,
    delivery_ops,
    env_ops,
    escape_pointer,
    owned_cdi_changes,
    pointer,
)

__all__ = [
    "SHARED_TOLERATION",
    "Delivery",
    "Denial",
    "Patch",
    "apply_operations",
    "build_ephemeral_injection",
    "build_injection",
    "check_annotation",
    "escape_pointer",
    "group_annotation",
    "inject_into",
    "pointer",
]


#: Lets group pods onto shared nodes tainted ``deviceshare.io/mode=shared`` with any
#: effect: NoSchedule keeps every other pod off them, and NoExecute also evicts the ones
#: already there. Group placement ignores this taint whatever its effect, so a group pod
#: must tolerate every effect, or a NoExecute taint would evict it from its group's node.
SHARED_TOLERATION: Mapping[str, str] = {
    "key": SHARED_TAINT_KEY,
    "operator": "Equal",
    "value": SHARED_TAINT_VALUE,
}
_TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")

#: Env vars an ephemeral container must copy from the pod's first container, whatever the
#: env table says; the API server's policy (config/policy) checks the same names.
DEVICE_ENV_SUFFIX = "_VISIBLE_DEVICES"

#: ``status.physicalDevices`` entries: a device UUID as the inventory accepts it.
_UUID = re.compile(r"[^\s=,]{1,128}")

_DEFAULT_DELIVERY = Delivery()


def group_annotation(pod: Obj) -> str | None:
    """The group a pod names, or None when it names none (annotation absent)."""
    annotations = meta_of(pod).get("annotations") or {}
    value = annotations.get(GROUP_ANNOTATION)
    return None if value is None else str(value)


def check_annotation(pod: Obj, scheduler_name: str = SCHEDULER_NAME) -> Denial | None:
    """Deny a malformed group annotation, or our scheduler without a group."""
    name = group_annotation(pod)
    scheduler = spec_of(pod).get("schedulerName")
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


def _what(kind: str) -> str:
    return "init container" if kind == "initContainers" else "container"


def _request_denial(
    who: str, res: str, where: str, resources: Mapping[str, Any], group_name: str
) -> Denial:
    if res in resources:
        return Denial(
            f"{who} requests {res} in {where}; the device plugin would hand it other "
            f"devices than the group's. Remove the {res} limit and request: SDG gives the "
            "pod the group's devices"
        )
    holds = ", ".join(sorted(resources)) or "no devices"
    return Denial(
        f"{who} requests {res} in {where}, a device resource: a pod of SharedDeviceGroup "
        f"{group_name!r} sees exactly the group's devices ({holds}), and the device plugin "
        "would hand it other devices besides, outside every group's books. Remove the "
        f"{res} limit and request, or run the pod outside the group (or in a group that "
        f"holds {res})"
    )


def _requested_devices(
    pod: Obj, resources: Mapping[str, Any], env_table: Mapping[str, str], group_name: str = ""
) -> Denial | None:
    """A request or limit of any device resource: the group's own, or any name whose
    devices an env var of the table reaches (``env_vars_reached``: aliases included)."""

    def device(name: str) -> bool:
        return name in resources or bool(env_vars_reached(name, env_table))

    for kind, _i, c in containers(pod):
        res = c.get("resources") or {}
        for section in ("limits", "requests"):
            for name in sorted(res.get(section) or {}):
                if device(name):
                    who = f"{_what(kind)} {c.get('name', '')!r}"
                    return _request_denial(who, name, f"resources.{section}", resources, group_name)
    pod_level = spec_of(pod).get("resources") or {}
    for section in ("limits", "requests"):
        for name in sorted(pod_level.get(section) or {}):
            if device(name):
                return _request_denial(
                    "pod", name, f"spec.resources.{section}", resources, group_name
                )
    return None


def _claims_denial(pod: Obj, group_name: str) -> Denial | None:
    """DRA claims: a driver would hand the pod the claimed devices beside the group's."""
    claims = spec_of(pod).get("resourceClaims") or []
    if not claims:
        return None
    names = [str(c.get("name", "")) if isinstance(c, Mapping) else "?" for c in claims]
    shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
    return Denial(
        f"pod asks for devices through spec.resourceClaims ({shown}): a pod of "
        f"SharedDeviceGroup {group_name!r} sees exactly the group's devices, and a DRA "
        "driver would hand it the claimed devices besides, outside the group's books. "
        "Remove spec.resourceClaims (and the containers' resources.claims), or run the pod "
        "outside the group"
    )


def _shown_value(entry: Obj) -> str:
    if entry.get("valueFrom") is not None:
        return " from valueFrom"
    value = str(entry.get("value") or "")
    return "=" + (value if len(value) <= 40 else value[:40] + "...")


def _foreign_env_denial(
    pod: Obj, group_vars: frozenset[str], env_table: Mapping[str, str], group_name: str
) -> Denial | None:
    """Another vendor's device variable naming devices (``AMD_VISIBLE_DEVICES=all`` in
    an NVIDIA group): that vendor's runtime would hand the container those devices."""
    others = device_env_vars(env_table) - group_vars
    for kind, _i, c in containers(pod):
        for entry in c.get("env") or ():
            var = entry.get("name") if isinstance(entry, Mapping) else None
            if var not in others:
                continue
            if entry.get("valueFrom") is None and names_no_device(entry.get("value")):
                continue
            of = " or ".join(sorted(k for k, v in env_table.items() if v == var))
            own = ", ".join(sorted(group_vars)) or "none"
            return Denial(
                f"{_what(kind)} {c.get('name', '')!r} sets {var}{_shown_value(entry)}, the "
                f"device variable of {of}, which SharedDeviceGroup {group_name!r} does not "
                "hold: that runtime would hand the container those devices beside the "
                f"group's, outside every group's books. Remove {var} (SDG sets the group's "
                f'own: {own}), or set it to "" for no device'
            )
    return None


def _in_families(key: str, families: tuple[str, ...]) -> bool:
    return any(key == f or key.startswith(f + "/") for f in families)


def _injector_denial(pod: Obj, group_name: str) -> Denial | None:
    """NRI device-injector annotations for raw device nodes or mounts: SDG writes neither
    family, and either reaches devices (``/dev/nvidia3``, a bind mount of ``/dev``)."""
    annotations = meta_of(pod).get("annotations") or {}
    keys = sorted(
        k
        for k in annotations
        if _in_families(k, DEVICE_NODE_ANNOTATION_FAMILIES + MOUNT_ANNOTATION_FAMILIES)
    )
    if not keys:
        return None
    shown = ", ".join(keys[:4]) + (f" and {len(keys) - 4} more" if len(keys) > 4 else "")
    families = ", ".join(f"{f}/..." for f in DEVICE_NODE_ANNOTATION_FAMILIES)
    families += ", " + ", ".join(f"{f}/..." for f in MOUNT_ANNOTATION_FAMILIES)
    return Denial(
        f"annotation {shown} asks NRI's device-injector for device nodes or mounts in the "
        f"pod's containers: a pod of SharedDeviceGroup {group_name!r} sees exactly the "
        "group's devices, and SDG owns these annotations on group pods (a /dev/nvidia* "
        f"node or a mount of /dev reaches other devices). Remove {shown} ({families} are "
        "refused on group pods; files reach a pod through volumes), or run the pod "
        "outside the group"
    )


def _cdi_warning(keys: list[str], group_name: str) -> str:
    shown = ", ".join(keys[:3]) + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")
    return (
        f"SDG replaced or removed CDI device annotation {shown}: a pod of "
        f"SharedDeviceGroup {group_name!r} gets exactly the group's devices, and SDG owns "
        "these annotations on group pods"
    )


def _group_devices(
    group: Obj, env_table: Mapping[str, str], *, uuids_used: bool = False
) -> list[ResourceDevices] | Denial:
    """The bound group's devices per resource (sorted), with env var and, when
    ``uuids_used``, the UUIDs ``status.physicalDevices`` records for them; or a denial."""
    name = meta_of(group).get("name", "")
    resources = sorted(spec_of(group).get("resources") or {})
    status = status_of(group)
    selected = status.get("selectedDevices") or {}
    physical = status.get("physicalDevices") or {}
    out: list[ResourceDevices] = []
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
        try:
            ids = parse_ids(selected.get(res) or "")
        except ValueError as err:
            return Denial(
                f"SharedDeviceGroup {name!r} is Bound but its status.selectedDevices is "
                f"malformed for {res} ({err}); this is a controller inconsistency, check the "
                "manager's logs"
            )
        if not ids:
            return Denial(
                f"SharedDeviceGroup {name!r} is Bound but has no devices recorded for {res}; "
                "this is a controller inconsistency, check the manager's logs"
            )
        uuids: tuple[str, ...] | None = None
        if uuids_used and physical.get(res):
            listed = str(physical[res]).split(",")
            if len(listed) != len(ids) or not all(_UUID.fullmatch(u) for u in listed):
                return Denial(
                    f"SharedDeviceGroup {name!r} records UUIDs {physical[res]!r} for {res} "
                    f"devices {format_ids(ids)}, which do not match them one to one; this is "
                    "a controller inconsistency, check the manager's logs"
                )
            uuids = tuple(listed)
        owner[var] = res
        out.append(ResourceDevices(res, var, tuple(ids), uuids))
    return out


def _group_env(group: Obj, env_table: Mapping[str, str]) -> dict[str, str] | Denial:
    """env var -> the group's IDs: what the webhook injected before delivery modes."""
    devices = _group_devices(group, env_table)
    if isinstance(devices, Denial):
        return devices
    return {d.env_var: format_ids(d.ids) for d in devices}


def tolerates_shared_taint(toleration: Obj, effect: str = "NoSchedule") -> bool:
    """Whether ``toleration`` tolerates the shared-node taint with ``effect`` for good: for
    NoExecute, ``tolerationSeconds`` only delays the eviction, so it does not count."""
    if effect == "NoExecute" and toleration.get("tolerationSeconds") is not None:
        return False
    taint = {"key": SHARED_TAINT_KEY, "value": SHARED_TAINT_VALUE, "effect": effect}
    return tolerates(toleration, taint)


def _toleration_ops(pod: Obj) -> list[dict[str, Any]]:
    """Add ``SHARED_TOLERATION`` unless the pod's own tolerations already tolerate the
    shared taint with every effect (one for NoSchedule only stays, ours goes beside it)."""
    tolerations = spec_of(pod).get("tolerations") or ()
    if all(any(tolerates_shared_taint(t, e) for t in tolerations) for e in _TAINT_EFFECTS):
        return []
    if spec_of(pod).get("tolerations") is None:
        return [{"op": "add", "path": "/spec/tolerations", "value": [dict(SHARED_TOLERATION)]}]
    return [{"op": "add", "path": "/spec/tolerations/-", "value": dict(SHARED_TOLERATION)}]


def _host_access(pod: Obj, group: Obj, name: str) -> dict[str, str | None] | Denial:
    """The host-access annotation to stamp: ``allowed`` for a group that opts out of the
    device promise (``spec.allowHostAccess``), else none; a pod that sets it itself in a
    group that does not opt out is refused (the API server's policy trusts it)."""
    if allows_host_access(group):
        return {HOST_ACCESS_ANNOTATION: HOST_ACCESS_ALLOWED}
    annotations = meta_of(pod).get("annotations") or {}
    if HOST_ACCESS_ANNOTATION in annotations:
        return Denial(
            f"pod sets annotation {HOST_ACCESS_ANNOTATION}, which only SDG sets, on pods of "
            "groups with spec.allowHostAccess: true; SharedDeviceGroup "
            f"{name!r} does not allow host access. Remove the annotation (and any privileged "
            "container, SYS_ADMIN, hostPath under /dev or hostPID), or let the group's pods "
            f"reach every device of the node: kubectl patch sdg {name} --type=merge -p "
            """'{"spec":{"allowHostAccess":true}}'"""
        )
    return {}


def conflict_denial(name: str, group: Obj) -> Denial | None:
    """Deny joining while the group's devices are disputed (``Ready=False`` with a conflict
    reason): a new pod would run on devices another group or pod may also be using."""
    status = status_of(group)
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
    delivery: Delivery = _DEFAULT_DELIVERY,
    node: Obj | None = None,
    runtime_classes: Mapping[str, Obj] | None = None,
) -> Patch | Denial:
    """Decide a pod CREATE: the patch to apply, or why it is denied.

    ``group`` is the SharedDeviceGroup the annotation names (None when it does not exist);
    ``node`` its node (None when unknown) and ``runtime_classes`` the RuntimeClasses known
    by name: with the node's labels and runtime handlers they choose the delivery mode
    (``webhooks.delivery.choose_delivery``; the patch carries that choice). A pod without
    the annotation and not naming our scheduler gets an empty Patch. The patch is
    idempotent: applied to its own result it yields no operations (the webhook is
    reinvoked after other mutating webhooks).
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
    meta = meta_of(group)
    if meta.get("deletionTimestamp"):
        return Denial(f"SharedDeviceGroup {name!r} is being deleted; new pods cannot join it")
    conflict = conflict_denial(name, group)
    if conflict is not None:
        return conflict
    status = status_of(group)
    if status.get("phase") != PHASE_BOUND or not status.get("nodeName"):
        cond = find_condition(status.get("conditions"), CONDITION_SCHEDULED)
        why = ((cond or {}).get("message") or "it has not been scheduled yet").rstrip()
        why = why if why.endswith(".") else why + "."
        return Denial(
            f"SharedDeviceGroup {name!r} is Pending: {why} "
            "Pods can join once it is Bound; fix the cause (kubectl describe sdg "
            f"{name}) or use another group."
        )
    pinned = spec_of(pod).get("nodeName")
    if pinned and pinned != status.get("nodeName"):
        # The kubelet would run it on another node's GPUs with these IDs: someone else's.
        return Denial(
            f"pod sets spec.nodeName {pinned}, but SharedDeviceGroup {name!r} is bound to node "
            f"{status.get('nodeName')}; remove spec.nodeName and {scheduler_name} places "
            "the pod on the group's node"
        )
    resources = spec_of(group).get("resources") or {}
    group_vars = frozenset(v for r in resources if (v := env_var_for(r, env_table)) is not None)
    for denial in (
        _requested_devices(pod, resources, env_table, name),
        _claims_denial(pod, name),
        _foreign_env_denial(pod, group_vars, env_table, name),
        _injector_denial(pod, name),
    ):
        if denial is not None:
            return denial
    host_access = _host_access(pod, group, name)
    if isinstance(host_access, Denial):
        return host_access
    scheduler = spec_of(pod).get("schedulerName")
    if scheduler not in (None, "", DEFAULT_SCHEDULER_NAME, scheduler_name):
        return Denial(
            f"pod uses schedulerName {scheduler}, but pods of SharedDeviceGroup {name!r} "
            f"must use {scheduler_name} (or leave it unset) to run on the group's node"
        )
    devices = _group_devices(group, env_table, uuids_used=delivery.device_ids != DEVICE_IDS_INDEX)
    if isinstance(devices, Denial):
        return devices
    if node is not None and meta_of(node).get("name") != status["nodeName"]:
        node = None  # not the group's node: its label says nothing about this pod
    chosen = delivery.for_node(node, name, runtime_classes, [d.env_var for d in devices])
    if isinstance(chosen, Denial):
        return chosen
    how, choice = chosen
    delivered = delivery_ops(pod, devices, how)
    if isinstance(delivered, Denial):
        return delivered
    ops = list(delivered)
    domains = {d.partition("/")[0] for d in (*env_table, *resources) if "/" in d}
    record = delivered_record(devices, how, device_env_vars(env_table), domains)
    ops.extend(annotation_ops(pod, {DELIVERED_ANNOTATION: record, **host_access}))
    stripped = owned_cdi_changes(pod, ops, how.cdi_annotation_prefix)
    ops.extend(_toleration_ops(pod))
    if scheduler != scheduler_name:
        op = "add" if scheduler is None else "replace"
        ops.append({"op": op, "path": "/spec/schedulerName", "value": scheduler_name})
    warnings = (_cdi_warning(stripped, name),) if stripped else ()
    return Patch(ops, warnings=warnings, delivery=choice)


def _pod_ref(pod: Obj) -> str:
    meta = meta_of(pod)
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def _added_ephemeral(pod: Obj, old_pod: Obj) -> list[tuple[int, Obj]]:
    """The ephemeral containers this request adds (existing ones can never change)."""
    before = {c.get("name") for c in spec_of(old_pod).get("ephemeralContainers") or ()}
    return [
        (i, c)
        for i, c in enumerate(spec_of(pod).get("ephemeralContainers") or ())
        if c.get("name") not in before
    ]


def _stale_device_env(pod: Obj, env: Mapping[str, str]) -> str | None:
    """Where the pod's containers do not carry the group's current device env, if anywhere."""
    for kind, _i, c in containers(pod):
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


def _describe(devices: Mapping[str, list[int]]) -> str:
    return ", ".join(f"{res} {format_ids(ids) or '(none)'}" for res, ids in sorted(devices.items()))


def _pod_device_env(pod: Obj, devices: list[ResourceDevices]) -> tuple[dict[str, Any], str | None]:
    """The device env entries of the pod's first container, when its
    ``deviceshare.io/devices`` record names the group's devices; else why not."""
    annotations = meta_of(pod).get("annotations") or {}
    given = parse_devices_annotation(annotations[DEVICES_ANNOTATION])
    if given is None:
        return {}, f"its annotation {DEVICES_ANNOTATION} is not readable"
    holds = {d.resource: list(d.ids) for d in devices}
    if given != holds:
        return {}, f"it was given {_describe(given)}, the group holds {_describe(holds)}"
    first = (spec_of(pod).get("containers") or [{}])[0]
    entries = {str(e.get("name")): e for e in first.get("env") or ()}
    env: dict[str, Any] = {}
    for d in devices:
        if d.env_var not in entries:
            return {}, f"container {first.get('name', '')!r} has no {d.env_var}"
        env[d.env_var] = entries[d.env_var]
    if CUDA_DEVICE_ORDER in entries:
        env[CUDA_DEVICE_ORDER] = entries[CUDA_DEVICE_ORDER]
    return env, None


def build_ephemeral_injection(
    pod: Obj,
    old_pod: Obj,
    group: Obj | None,
    env_table: Mapping[str, str] = DEFAULT_ENV_TABLE,
) -> Patch | Denial:
    """Decide an UPDATE of ``pods/ephemeralcontainers`` (``kubectl debug``).

    New ephemeral containers of a group's pod get exactly the device env the pod's
    containers have: the device env of the first container (the group's variables, any
    other ``*_VISIBLE_DEVICES`` entry, CUDA_DEVICE_ORDER unless the new container sets its
    own; the API server's policy demands the same), replacing what the user set for those
    names. Container images often name devices themselves (CUDA images:
    ``NVIDIA_VISIBLE_DEVICES=all``), so without it a debug container would see every GPU.
    Pods given their devices by CDI annotations carry an empty value there (``void`` if
    admitted by an earlier SDG): their debug containers see no GPU (annotations cannot
    change on this subresource, and the CDI injector read them when the pod started),
    and kubectl shows a warning saying so.
    Denied when the pod no longer runs on its group's devices (by its
    ``deviceshare.io/devices`` record, or by its env for pods admitted before that), or
    when the new container sets a device variable the pod does not have.
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
    status = status_of(group)
    if status.get("phase") != PHASE_BOUND:
        return Denial(
            f"SharedDeviceGroup {name!r} of pod {ref} is not Bound, so ephemeral container "
            f"{names} cannot be given its devices; kubectl describe sdg {name} says why"
        )
    devices = _group_devices(group, env_table)
    if isinstance(devices, Denial):
        return devices
    annotations = meta_of(pod).get("annotations") or {}
    if DEVICES_ANNOTATION in annotations:
        env, stale = _pod_device_env(pod, devices)
    else:  # admitted before the record existed: env held the IDs
        env = {d.env_var: format_ids(d.ids) for d in devices}
        stale = _stale_device_env(pod, env)
    if stale is not None:
        return Denial(
            f"pod {ref} does not run on the devices SharedDeviceGroup {name!r} holds now "
            f"({stale}), so ephemeral container {names} cannot be given the pod's devices. "
            f"Delete the pod and create it again to run on the group's devices "
            f"(kubectl describe sdg {name})"
        )
    order = env.pop(CUDA_DEVICE_ORDER, None)
    containers_ = spec_of(pod).get("containers") or [{}]
    required: dict[str, Any] = {
        e["name"]: e
        for e in containers_[0].get("env") or ()
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
        want = dict(required)
        if order is not None and not any(
            e.get("name") == CUDA_DEVICE_ORDER for e in c.get("env") or ()
        ):
            want[CUDA_DEVICE_ORDER] = order
        ops.extend(env_ops("ephemeralContainers", i, c, want))
    empty = sorted(
        f"{var}={e.get('value') or chr(34) * 2}"
        for var, e in env.items()
        if isinstance(e, Mapping)
        and e.get("valueFrom") is None
        and str(e.get("value") or NO_DEVICES) in (NO_DEVICES, VOID_DEVICES)
    )
    warnings: tuple[str, ...] = ()
    if empty:
        warnings = (
            f"ephemeral container {names} of pod {ref} sees none of SharedDeviceGroup "
            f"{name!r}'s devices: the pod gets them through CDI annotations, which were read "
            f"when it started and cannot name a new container ({', '.join(empty)} keeps "
            "the image from seeing other devices). To use the GPUs, kubectl exec into one "
            "of the pod's containers",
        )
    return Patch(ops, warnings=warnings)


def apply_operations(doc: Obj, operations: list[dict[str, Any]]) -> dict[str, Any]:
    """Apply this module's ``add``/``replace`` operations to a deep copy of ``doc``.

    For mutators that prefer to return the edited object (and for tests): the result is
    exactly what the API server makes of the patch (``remove`` included).
    """
    out: dict[str, Any] = json.loads(json.dumps(doc))
    for op in operations:
        if op["op"] not in ("add", "replace", "remove"):
            raise ValueError(f"unsupported operation {op['op']!r}")
        *parents, last = [unescape(t) for t in op["path"].split("/")[1:]]
        target: Any = out
        for token in parents:
            target = target[int(token)] if isinstance(target, list) else target[token]
        if op["op"] == "remove":
            if isinstance(target, list):
                del target[int(last)]
            elif last in target:
                del target[last]
            else:
                raise ValueError(f"remove of missing member {op['path']}")
            continue
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
    pod: Obj,
    group: Obj | None,
    env_table: Mapping[str, str] = DEFAULT_ENV_TABLE,
    delivery: Delivery = _DEFAULT_DELIVERY,
    node: Obj | None = None,
    runtime_classes: Mapping[str, Obj] | None = None,
) -> dict[str, Any] | Denial:
    """``build_injection`` as an edited copy of the pod instead of a patch."""
    result = build_injection(
        pod, group, env_table, delivery=delivery, node=node, runtime_classes=runtime_classes
    )
    if isinstance(result, Denial):
        return result
    return apply_operations(pod, result.operations)

"""How a group pod is given its devices: the delivery modes, as pure functions.

``choose_delivery`` picks a node's mode (shared by the pod webhook, ``sdg explain`` and
``sdg doctor``; the rule: docs/design.md, "Devices are real"). Each mode (``env``,
``runtimeclass``, ``cdi``) turns (pod, the group's devices, settings) into RFC 6902
operations or a denial that says what to change. In every mode SDG owns the injector's CDI
annotation families on a group pod (``owned_cdi_changes``). Applied to their own result
the operations yield none, so the webhook can be reinvoked after other mutating webhooks.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any, Final

from api.constants import (
    CDI_ANNOTATION_FAMILIES,
    DEFAULT_CDI_ANNOTATION_PREFIX,
    DEFAULT_RUNTIME_CLASS,
    DEFAULT_RUNTIME_LABEL,
    DELIVERY_AUTO,
    DELIVERY_CDI,
    DELIVERY_ENV,
    DELIVERY_LABEL,
    DELIVERY_MODES,
    DELIVERY_RUNTIMECLASS,
    DELIVERY_SETTINGS,
    DEVICE_IDS_AUTO,
    DEVICE_IDS_FORMATS,
    DEVICE_IDS_INDEX,
    DEVICE_IDS_UUID,
    DEVICES_ANNOTATION,
    GROUP,
    GROUP_ANNOTATION,
    NO_DEVICES,
    UUID_ENV_VARS,
)
from api.pods import devices_annotation
from api.validation import is_dns_subdomain, is_label_key
from sdgruntime.kinds import Obj, meta_of, spec_of, status_of
from sdgruntime.webhook.jsonpatch import escape

#: The resource whose index-named devices get ``CUDA_DEVICE_ORDER``.
NVIDIA_GPU: Final = "nvidia.com/gpu"
#: The device variable of NVIDIA's GPUs: what a node is judged for when no group is given.
NVIDIA_ENV: Final = "NVIDIA_VISIBLE_DEVICES"
CUDA_DEVICE_ORDER: Final = "CUDA_DEVICE_ORDER"
PCI_BUS_ID: Final = "PCI_BUS_ID"

# CDI qualified device names: ``<vendor>/<class>=<name>`` (container-device-interface).
_CDI_KIND = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
_CDI_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._:-]*[A-Za-z0-9])?")


@dataclass(frozen=True, slots=True)
class Patch:
    """Allow, with these JSON patch operations (possibly none) and warnings for kubectl."""

    operations: list[dict[str, Any]] = field(default_factory=list)
    allowed: bool = True
    warnings: tuple[str, ...] = ()
    #: How the devices were delivered, and why (a group pod's patch only); not part of
    #: what the patch is (two patches with the same operations and warnings are equal).
    delivery: DeliveryChoice | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class Denial:
    """Deny the pod; ``message`` is shown to the user by kubectl."""

    message: str
    allowed: bool = False


def escape_pointer(token: str | int) -> str:
    """One JSON pointer reference token (RFC 6901; ``sdgruntime.webhook.jsonpatch``)."""
    return escape(str(token))


def pointer(*tokens: str | int) -> str:
    return "".join("/" + escape_pointer(t) for t in tokens)


def containers(pod: Obj) -> list[tuple[str, int, Obj]]:
    """(kind, index, container) for init containers (native sidecars among them) and
    containers: every container that runs when the pod starts."""
    spec = spec_of(pod)
    return [
        (kind, i, c)
        for kind in ("initContainers", "containers")
        for i, c in enumerate(spec.get(kind) or ())
    ]


def env_ops(kind: str, index: int, container: Obj, env: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Set each ``env`` var (a value, or a whole env entry) in one container: replace every
    entry of that name (the kubelet lets the last one win), append the missing ones."""
    base = ("spec", kind, index, "env")
    entries = {
        var: dict(value) if isinstance(value, Mapping) else {"name": var, "value": value}
        for var, value in env.items()
    }
    stored = {var: _as_stored(e) for var, e in entries.items()}
    existing = container.get("env")
    if not existing:
        if not entries:
            return []
        op = "replace" if existing is not None else "add"
        return [{"op": op, "path": pointer(*base), "value": list(entries.values())}]
    ops: list[dict[str, Any]] = []
    for var, entry in entries.items():
        positions = [i for i, e in enumerate(existing) if e.get("name") == var]
        if not positions:
            ops.append({"op": "add", "path": pointer(*base, "-"), "value": entry})
        for i in positions:
            if _as_stored(existing[i]) != stored[var]:
                ops.append({"op": "replace", "path": pointer(*base, i), "value": entry})
    return ops


def _as_stored(entry: Mapping[str, Any]) -> dict[str, Any]:
    """An env entry as the API server stores it: ``value: ""`` is omitted (omitempty), so
    ``{"name": X, "value": ""}`` and ``{"name": X}`` are the same entry."""
    return {k: v for k, v in entry.items() if not (k == "value" and v == "")}


def annotation_ops(pod: Obj, wanted: Mapping[str, str | None]) -> list[dict[str, Any]]:
    """Set (a string) or remove (None) each annotation; nothing for what already holds."""
    current = meta_of(pod).get("annotations")
    if not current:
        values = {k: v for k, v in wanted.items() if v is not None}
        if not values:
            return []
        op = "replace" if current is not None else "add"
        return [{"op": op, "path": "/metadata/annotations", "value": values}]
    ops: list[dict[str, Any]] = []
    for key, value in wanted.items():
        path = pointer("metadata", "annotations", key)
        if value is None:
            if key in current:
                ops.append({"op": "remove", "path": path})
        elif key not in current:
            ops.append({"op": "add", "path": path, "value": value})
        elif current[key] != value:
            ops.append({"op": "replace", "path": path, "value": value})
    return ops


# --- the devices of a group -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ResourceDevices:
    """One resource of a bound group: its env var, the IDs placement booked and, when the
    node's inventory knows every one, their UUIDs in the same (ascending ID) order."""

    resource: str
    env_var: str
    ids: tuple[int, ...]
    uuids: tuple[str, ...] | None = None

    def names(self, device_ids: str) -> list[str]:
        """How the runtime is told these devices: UUIDs where ``by_uuid``, else the IDs."""
        if self.uuids is not None and by_uuid(device_ids, self.env_var, known=True):
            return list(self.uuids)
        return [str(i) for i in self.ids]

    def by_index(self, device_ids: str) -> bool:
        return not by_uuid(device_ids, self.env_var, known=self.uuids is not None)


def by_uuid(device_ids: str, env_var: str, *, known: bool) -> bool:
    """Whether devices of ``env_var`` are named by UUID under ``--device-ids device_ids``,
    when their UUIDs are (``known``) or are not all known: ``uuid`` wherever known;
    ``auto`` where known and the vendor's runtime takes UUIDs (``UUID_ENV_VARS``)."""
    if not known or device_ids == DEVICE_IDS_INDEX:
        return False
    return device_ids == DEVICE_IDS_UUID or env_var in UUID_ENV_VARS


def ids_reason(device_ids: str, env_var: str, *, known: bool) -> str:
    """Why devices of ``env_var`` are named as they are (``by_uuid``), for ``sdg explain``."""
    if by_uuid(device_ids, env_var, known=known):
        return "by UUID, from status.physicalDevices"
    if device_ids == DEVICE_IDS_INDEX:
        return "by index (--device-ids index)"
    if not known:
        return "by index: the inventory knows no UUID for every one"
    return f"by index: the runtime reading {env_var} (and its CDI names) takes indices"


# --- settings ------------------------------------------------------------------------------


def cdi_prefix_problem(prefix: str) -> str | None:
    """Why ``prefix`` cannot start a per-container annotation key, if it cannot."""
    domain, sep, name = prefix.partition("/")
    if not sep or "/" in name or not is_dns_subdomain(domain):
        return (
            f"{prefix!r} must be '<DNS subdomain>/<start of a name>', "
            f"e.g. {DEFAULT_CDI_ANNOTATION_PREFIX}"
        )
    if domain == GROUP or domain.endswith("." + GROUP):
        return f"{prefix!r} is in SDG's own annotation domain {GROUP}"
    if not is_label_key(prefix + "c"):
        return (
            f"{prefix!r} followed by a container name is not a valid annotation key "
            "(the part after '/' takes letters, digits, '-', '_' and '.', at most 62 characters)"
        )
    return None


@dataclass(frozen=True, slots=True)
class Delivery:
    """The manager's delivery settings (``--delivery``, ``--device-ids``,
    ``--runtime-class-name``, ``--cdi-annotation-prefix``). ``mode`` may be ``auto`` here;
    the settings ``for_node`` returns name the mode itself."""

    mode: str = DELIVERY_AUTO
    device_ids: str = DEVICE_IDS_AUTO
    runtime_class_name: str = DEFAULT_RUNTIME_CLASS
    cdi_annotation_prefix: str = DEFAULT_CDI_ANNOTATION_PREFIX

    def __post_init__(self) -> None:
        if self.mode not in DELIVERY_SETTINGS:
            raise ValueError(
                f"delivery {self.mode!r}: expected one of {', '.join(DELIVERY_SETTINGS)}"
            )
        if self.device_ids not in DEVICE_IDS_FORMATS:
            raise ValueError(
                f"device IDs {self.device_ids!r}: expected one of {', '.join(DEVICE_IDS_FORMATS)}"
            )
        if not is_dns_subdomain(self.runtime_class_name):
            raise ValueError(f"RuntimeClass name {self.runtime_class_name!r} is not a valid name")
        problem = cdi_prefix_problem(self.cdi_annotation_prefix)
        if problem is not None:
            raise ValueError(f"CDI annotation prefix {problem}")

    def for_node(
        self,
        node: Obj | None,
        group_name: str = "",
        runtime_classes: Mapping[str, Obj] | None = None,
        env_vars: Collection[str] = (NVIDIA_ENV,),
    ) -> tuple[Delivery, DeliveryChoice] | Denial:
        """These settings with the mode ``choose_delivery`` picks for ``node``, and that
        choice; or the denial of a node label SDG cannot read."""
        choice = choose_delivery(node, runtime_classes or {}, self, env_vars, group_name)
        if isinstance(choice, Denial):
            return choice
        return _with_mode(self, choice.mode), choice


@lru_cache(maxsize=64)
def _with_mode(settings: Delivery, mode: str) -> Delivery:
    """``settings`` naming ``mode``, made (and checked) once: every pod admission asks.
    Keys are the manager's settings times the modes, a handful."""
    return replace(settings, mode=mode)


# --- which mode, per node ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DeliveryChoice:
    """The mode for a node, why, and whether anything in the cluster confirms that the
    node's runtime takes it (``verified`` False: env by default, nothing says it works);
    ``settle`` says then what would."""

    mode: str
    reason: str
    verified: bool = True
    settle: str = ""

    def describe(self) -> str:
        """One line: ``runtimeclass (why)``, or ``env, unverified: why``."""
        if self.verified:
            return f"{self.mode} ({self.reason})"
        return f"{self.mode}, unverified: {self.reason}"


def _node_name(node: Obj | None) -> str:
    return str(meta_of(node).get("name") or "")


def runtime_handlers(node: Obj | None) -> list[str]:
    """The runtime handlers the node's kubelet reports (``status.runtimeHandlers``, from
    the CRI: containerd 2.0+, CRI-O); ``""`` is the default handler."""
    handlers = status_of(node).get("runtimeHandlers") or ()
    return [str(h.get("name", "")) for h in handlers if isinstance(h, Mapping)]


def _vendors_of(env_vars: Collection[str]) -> set[str]:
    """``NVIDIA_VISIBLE_DEVICES`` -> ``nvidia``: the vendor whose runtime reads each."""
    suffix = "_VISIBLE_DEVICES"
    return {v[: -len(suffix)].lower() if v.endswith(suffix) else v.lower() for v in env_vars}


def _settle_text(node: str, settings: Delivery, env_vars: Collection[str]) -> str:
    rc = settings.runtime_class_name
    label = f"kubectl label node {node or '<node>'}"
    if env_vars and set(env_vars) <= {NVIDIA_ENV}:
        return (
            f"if NVIDIA's runtime is the node's default runtime, {label} "
            f"{DEFAULT_RUNTIME_LABEL}=nvidia; if its runtime has a handler for NVIDIA's, "
            f"create RuntimeClass {rc} with that handler (as the GPU Operator and k3s do); "
            f"or name the mode: {label} {DELIVERY_LABEL}=<{'|'.join(DELIVERY_MODES)}>"
        )
    vendors = sorted(_vendors_of(env_vars))
    return (
        f"label it for CDI where NRI's device-injector runs ({label} {DELIVERY_LABEL}=cdi; "
        "AMD's CDI names are amd.com/gpu=<N>, from amd-ctk cdi generate), or, if "
        f"{'/'.join(vendors)}'s runtime is the node's default runtime, {label} "
        f"{DEFAULT_RUNTIME_LABEL}={vendors[0] if len(vendors) == 1 else '<vendor>'}"
    )


def choose_delivery(
    node: Obj | None,
    runtime_classes: Mapping[str, Obj],
    settings: Delivery,
    env_vars: Collection[str] = (NVIDIA_ENV,),
    group_name: str = "",
) -> DeliveryChoice | Denial:
    """How pods on ``node`` get devices of the variables ``env_vars`` (a group's; by
    default NVIDIA's GPUs), and why. The one home of the rule:

    1. the node label ``deviceshare.io/delivery``, whatever the manager says (a value SDG
       does not know is denied rather than guessed: the wrong mode hands the runtime
       devices in a form it ignores, or every GPU);
    2. the manager's ``--delivery`` when it names a mode;
    3. ``auto``: ``runtimeclass`` when RuntimeClass ``--runtime-class-name`` exists and
       the node lists its handler in ``status.runtimeHandlers`` (NVIDIA's devices only:
       the toolkit's runtime turns the variable into devices, in CDI mode too);
    4. ``auto``: ``env`` when the node is labelled ``deviceshare.io/default-runtime=
       <vendor>`` for the vendor of every variable;
    5. else ``env``, unverified: on a node whose default runtime has no GPU hook (GPU
       Operator 25.10+, k3s; AMD under containerd) pods get no device from it.

    ``runtime_classes`` maps names to RuntimeClasses (those known; others are missing).
    """
    name = _node_name(node)
    labels = meta_of(node).get("labels") or {}
    value = labels.get(DELIVERY_LABEL)
    if value is not None:
        if value not in DELIVERY_MODES:
            of = f" of SharedDeviceGroup {group_name!r}" if group_name else ""
            fallback = (
                f"use the manager's default ({settings.mode})"
                if settings.mode != DELIVERY_AUTO
                else "let SDG choose from the node's runtime (--delivery auto)"
            )
            return Denial(
                f"node {name}{of} has label {DELIVERY_LABEL}={value!r}, which is not a "
                f"delivery mode SDG knows ({', '.join(DELIVERY_MODES)}), so it cannot tell "
                "how that node's runtime takes devices. Fix the label (kubectl label node "
                f"{name} {DELIVERY_LABEL}=<{'|'.join(DELIVERY_MODES)}> --overwrite) or remove "
                f"it to {fallback}"
            )
        return DeliveryChoice(value, f"node label {DELIVERY_LABEL}={value}")
    if settings.mode != DELIVERY_AUTO:
        return DeliveryChoice(settings.mode, f"the manager's --delivery {settings.mode}")
    if node is None:
        return DeliveryChoice(
            DELIVERY_ENV,
            "the node is not known, so nothing tells how its runtime takes devices",
            verified=False,
            settle=_settle_text(name, settings, env_vars),
        )
    rc_name = settings.runtime_class_name
    rc = runtime_classes.get(rc_name)
    handler = str((rc or {}).get("handler") or "")
    handlers = runtime_handlers(node)
    nvidia_only = bool(env_vars) and set(env_vars) <= {NVIDIA_ENV}
    if nvidia_only and rc is not None and handler and handler in handlers:
        return DeliveryChoice(
            DELIVERY_RUNTIMECLASS,
            f"RuntimeClass {rc_name} exists and node {name} lists its handler {handler} "
            "in status.runtimeHandlers",
        )
    runtime = labels.get(DEFAULT_RUNTIME_LABEL)
    if runtime and env_vars and _vendors_of(env_vars) == {str(runtime).lower()}:
        return DeliveryChoice(
            DELIVERY_ENV,
            f"node label {DEFAULT_RUNTIME_LABEL}={runtime}: its default runtime reads "
            f"{', '.join(sorted(env_vars))}",
        )
    seen = []
    if nvidia_only:
        if rc is None:
            seen.append(f"no RuntimeClass {rc_name}")
        elif not handler or handler not in handlers:
            listed = ", ".join(repr(h) for h in handlers) or "none"
            seen.append(
                f"RuntimeClass {rc_name} has handler {handler or '(none)'}, which node {name} "
                f"does not list in status.runtimeHandlers (it lists {listed})"
            )
    if runtime:
        seen.append(f"label {DEFAULT_RUNTIME_LABEL}={runtime} is not the runtime of these")
    else:
        seen.append(f"no label {DEFAULT_RUNTIME_LABEL}")
    seen.append(f"no label {DELIVERY_LABEL}")
    return DeliveryChoice(
        DELIVERY_ENV,
        f"nothing tells how node {name}'s runtime takes devices ({'; '.join(seen)}), and "
        f"{', '.join(sorted(env_vars)) or 'the device variable'} alone works only where the "
        "vendor's runtime is the node's default",
        verified=False,
        settle=_settle_text(name, settings, env_vars),
    )


# --- the modes -------------------------------------------------------------------------------


def _record(devices: Sequence[ResourceDevices]) -> str:
    return devices_annotation({d.resource: list(d.ids) for d in devices})


def _cuda_order(
    container: Obj, devices: Sequence[ResourceDevices], delivery: Delivery
) -> dict[str, str]:
    """``CUDA_DEVICE_ORDER=PCI_BUS_ID`` for a container whose NVIDIA GPUs go by index and
    that does not choose an order itself."""
    nvidia = next((d for d in devices if d.resource == NVIDIA_GPU), None)
    if nvidia is None or not nvidia.by_index(delivery.device_ids):
        return {}
    if any(e.get("name") == CUDA_DEVICE_ORDER for e in container.get("env") or ()):
        return {}
    return {CUDA_DEVICE_ORDER: PCI_BUS_ID}


def _vendor_env_ops(
    pod: Obj, devices: Sequence[ResourceDevices], delivery: Delivery, *, empty: bool = False
) -> list[dict[str, Any]]:
    ops: list[dict[str, Any]] = []
    for kind, i, c in containers(pod):
        env: dict[str, str] = {
            d.env_var: NO_DEVICES if empty else ",".join(d.names(delivery.device_ids))
            for d in devices
        }
        env.update(_cuda_order(c, devices, delivery))
        ops.extend(env_ops(kind, i, c, env))
    return ops


def _env_mode_ops(
    pod: Obj, devices: Sequence[ResourceDevices], delivery: Delivery
) -> list[dict[str, Any]]:
    """The env, the record, and none of the pod's own CDI annotations: the runtime's
    device-injector would add their devices to the group's."""
    ops = _vendor_env_ops(pod, devices, delivery)
    wanted: dict[str, str | None] = {DEVICES_ANNOTATION: _record(devices)}
    wanted.update(_owned_cdi_removals(pod, wanted, delivery.cdi_annotation_prefix))
    ops.extend(annotation_ops(pod, wanted))
    return ops


def env_delivery(
    pod: Obj, devices: Sequence[ResourceDevices], delivery: Delivery
) -> list[dict[str, Any]] | Denial:
    """``env``: the vendor env var with the devices' IDs (or UUIDs) in every container."""
    return _env_mode_ops(pod, devices, delivery)


def runtimeclass_delivery(
    pod: Obj, devices: Sequence[ResourceDevices], delivery: Delivery
) -> list[dict[str, Any]] | Denial:
    """``runtimeclass``: ``env``, run by the configured RuntimeClass. A pod naming another
    RuntimeClass is denied: under it the GPU hook may not run (no GPUs) or another one may
    (other GPUs); silently replacing it would break what the pod asked that runtime for."""
    spec = spec_of(pod)
    want = delivery.runtime_class_name
    have = spec.get("runtimeClassName")
    if have and have != want:
        name = (meta_of(pod).get("annotations") or {}).get(GROUP_ANNOTATION)
        return Denial(
            f"pod sets runtimeClassName {have}, but SharedDeviceGroup {name!r} gets its "
            f"devices on its node through RuntimeClass {want} (delivery "
            f"{DELIVERY_RUNTIMECLASS}): under another runtime the pod would see no GPUs or "
            f"other ones. Remove spec.runtimeClassName (SDG sets it) or set it to {want}"
        )
    ops = _env_mode_ops(pod, devices, delivery)
    if have != want:
        op = "add" if "runtimeClassName" not in spec else "replace"
        ops.append({"op": op, "path": "/spec/runtimeClassName", "value": want})
    return ops


def cdi_value(devices: Sequence[ResourceDevices], device_ids: str) -> str:
    """The annotation value NRI's device-injector reads: a YAML list of CDI device names
    (written as JSON, which is YAML), e.g. ``["nvidia.com/gpu=0","nvidia.com/gpu=1"]``.
    The CDI kind is the resource name: NVIDIA's and AMD's CDI specs use exactly that."""
    names = [f"{d.resource}={n}" for d in devices for n in d.names(device_ids)]
    return json.dumps(names, separators=(",", ":"))


def _cdi_key_owned(key: str, prefix: str) -> bool:
    """A key the CDI injector may read devices from: ours, or of NRI's families."""
    if key.startswith(prefix):
        return True
    return any(key == f or key.startswith(f + "/") for f in CDI_ANNOTATION_FAMILIES)


def _owned_cdi_removals(pod: Obj, keep: Mapping[str, Any], prefix: str) -> dict[str, None]:
    """Every CDI annotation key of the pod SDG owns and does not set: removed."""
    annotations = meta_of(pod).get("annotations") or {}
    return {k: None for k in sorted(annotations) if k not in keep and _cdi_key_owned(k, prefix)}


def owned_cdi_changes(pod: Obj, operations: Sequence[Mapping[str, Any]], prefix: str) -> list[str]:
    """The pod's own CDI annotation keys that ``operations`` remove or replace (sorted):
    what the user asked the device-injector for and does not get."""
    annotations = meta_of(pod).get("annotations") or {}
    head = "/metadata/annotations/"
    out = set()
    for op in operations:
        path = str(op.get("path", ""))
        if op.get("op") not in ("remove", "replace") or not path.startswith(head):
            continue
        key = path[len(head) :].replace("~1", "/").replace("~0", "~")
        if key in annotations and _cdi_key_owned(key, prefix):
            out.add(key)
    return sorted(out)


def cdi_delivery(
    pod: Obj, devices: Sequence[ResourceDevices], delivery: Delivery
) -> list[dict[str, Any]] | Denial:
    """``cdi``: the CDI device names under ``<prefix><container name>`` for every container,
    init container and native sidecar, and the vendor env var set empty in each.

    The group decides a member's devices, so on a group pod SDG owns every key of the
    device-injector's CDI annotation families: a container's key the pod set to other
    devices is overwritten, and any other key (``.../pod``, the bare family, keys of
    containers the pod does not have) is removed. Left in place, the injector would prefer
    a more specific key of the other family over ours, or hand a pod-wide key's devices
    to a later ``kubectl debug`` container. (A container's other CDI devices cannot be
    asked for through these annotations on a group pod.) The empty variable keeps a
    runtime hook that reads it (NVIDIA's legacy hook, where it is still installed) from
    reading a CUDA image's ``NVIDIA_VISIBLE_DEVICES=all``; empty names no device for
    NVIDIA's, AMD's and Ascend's runtimes alike (``api.constants.NO_DEVICES``), where
    ``void`` made ascend-docker-runtime fail to create the container.
    """
    prefix = delivery.cdi_annotation_prefix
    value = cdi_value(devices, delivery.device_ids)
    for d in devices:
        bad = next((n for n in d.names(delivery.device_ids) if not _CDI_NAME.fullmatch(n)), None)
        if not _CDI_KIND.fullmatch(d.resource) or bad is not None:
            what = f"device {bad!r} of {d.resource}" if bad is not None else d.resource
            return Denial(
                f"{what} cannot be named as a CDI device (<vendor>/<class>=<name>); "
                f"deliver it by env on this node (label {DELIVERY_LABEL}=env)"
            )
    wanted: dict[str, str | None] = {DEVICES_ANNOTATION: _record(devices)}
    for _kind, _i, c in containers(pod):
        key = prefix + str(c.get("name", ""))
        if not is_label_key(key):
            return Denial(
                f"container name {c.get('name', '')!r} is too long for its CDI annotation "
                f"{key}: the part after '/' may have at most 63 characters; use a container "
                f"name of at most {63 - len(prefix.partition('/')[2])} characters"
            )
        wanted[key] = value
    wanted.update(_owned_cdi_removals(pod, wanted, prefix))
    ops = _vendor_env_ops(pod, devices, delivery, empty=True)
    ops.extend(annotation_ops(pod, wanted))
    return ops


def delivered_record(
    devices: Sequence[ResourceDevices],
    delivery: Delivery,
    off: Collection[str] = (),
    domains: Collection[str] = (),
) -> str:
    """The ``deviceshare.io/delivered`` value for ``devices`` given by ``delivery`` (a
    mode), ``off`` the other vendors' variables, ``domains`` the vendor domains no request
    may name (``api.constants.DELIVERED_ANNOTATION`` says the tokens). No token holds a
    space: names, IDs, UUIDs, domains and CDI names have none."""
    mode = delivery.mode
    tokens = [f"mode={mode}"]
    if mode == DELIVERY_RUNTIMECLASS:
        tokens.append(f"runtimeClassName={delivery.runtime_class_name}")
    for d in devices:
        value = NO_DEVICES if mode == DELIVERY_CDI else ",".join(d.names(delivery.device_ids))
        tokens.append(f"env:{d.env_var}={value}")
    tokens.extend(f"off:{var}" for var in sorted(set(off) - {d.env_var for d in devices}))
    tokens.extend(f"domain:{domain}" for domain in sorted(set(domains)))
    if mode == DELIVERY_CDI:
        tokens.append(
            f"cdi:{delivery.cdi_annotation_prefix}={cdi_value(devices, delivery.device_ids)}"
        )
    return " ".join(tokens)


#: Each mode's patch builder, by the name the settings and node label use.
MODES: Final = {
    DELIVERY_ENV: env_delivery,
    DELIVERY_RUNTIMECLASS: runtimeclass_delivery,
    DELIVERY_CDI: cdi_delivery,
}


def delivery_ops(
    pod: Obj, devices: Sequence[ResourceDevices], delivery: Delivery
) -> list[dict[str, Any]] | Denial:
    """The patch of ``delivery.mode`` for ``pod`` (a mode: ``Delivery.for_node`` resolves
    ``auto``)."""
    mode = MODES.get(delivery.mode)
    if mode is None:
        raise ValueError(f"delivery {delivery.mode!r} is not a mode: resolve it with for_node")
    return mode(pod, devices, delivery)

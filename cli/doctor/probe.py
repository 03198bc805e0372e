"""``sdg doctor --probe``: what a group pod's container really sees, node by node.

For each shared node a short throwaway group (one device, pinned to the node) gets one pod
that prints what its container sees; that is compared with what the group holds. The
strongest evidence decides: ``nvidia-smi -L`` UUIDs, else the count of device nodes, else
the device variable alone (a warning: it shows only what the runtime was told). Pure:
``probe_script``/``probe_pod``, ``parse_report``, ``judge_seen``; I/O: ``run_probes``,
which always deletes the pod and the group again, also on timeout and Ctrl-C. The whole
story: README.md, "What a container really sees".
"""

from __future__ import annotations

import re
import secrets
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import anyio

from api.constants import (
    DEFAULT_ENV_TABLE,
    DELIVERY_LABEL,
    GROUP_ANNOTATION,
    SDG_KIND,
    VOID_DEVICES,
)
from api.envvars import env_var_for
from api.nodes import is_shared
from api.pods import FINISHED_PHASES
from api.v1alpha1 import is_bound
from cli.doctor.collect import read_list
from cli.doctor.facts import Check, Unreadable
from cli.doctor.judge import name_of, quote
from controllers.inventory import DEFAULT_DRA_DRIVERS, RESOURCESLICES, node_of_slice, node_offers
from sdgruntime import errors
from sdgruntime.client import Client
from sdgruntime.kinds import NODES, PODS, Obj, meta_of, spec_of, status_of

PROBE_GROUP_PREFIX: Final = "sdg-doctor-probe-"
#: The chart's CLI image needs a registry; busybox has ``sh``, ``ls`` and ``head``.
DEFAULT_PROBE_IMAGE: Final = "docker.io/library/busybox:1.36"
PULL_POLICIES: Final = ("Always", "IfNotPresent", "Never")
DEFAULT_TIMEOUT: Final = 120.0
MAX_TIMEOUT: Final = 1800.0
#: Deleting the pod and the group again: bounded too, also after Ctrl-C.
CLEANUP_TIMEOUT: Final = 30.0
POLL: Final = 0.5
#: Bytes of the probe's log read back (it prints a few lines).
LOG_LIMIT: Final = 65536
HOSTNAME_LABEL: Final = "kubernetes.io/hostname"
CREATED_BY: Final = {"app.kubernetes.io/created-by": "sdg-doctor"}
CONTAINER: Final = "probe"
_VAR: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: Device nodes, one per device, by the device variable of the vendor's runtime.
DEVICE_NODES: Final = {
    "NVIDIA_VISIBLE_DEVICES": re.compile(r"/dev/nvidia\d+"),
    "AMD_VISIBLE_DEVICES": re.compile(r"/dev/dri/renderD\d+"),
    "ASCEND_VISIBLE_DEVICES": re.compile(r"/dev/davinci\d+"),
}
_SMI_GPU: Final = re.compile(r"GPU \d+: .*\(UUID: (GPU-[^)\s]+)\)")
#: Waiting reasons of a container that will not start by itself: the probe stops there.
STUCK: Final = frozenset(
    {
        "ImagePullBackOff",
        "ErrImageNeverPull",
        "InvalidImageName",
        "CreateContainerConfigError",
        "CreateContainerError",
    }
)
_NO_DEVICE_VALUES: Final = frozenset({"", VOID_DEVICES, "none"})


# --- what runs ------------------------------------------------------------------------------


def probe_script(env_vars: Sequence[str]) -> str:
    """A POSIX sh script printing the report ``parse_report`` reads: each variable (or that
    it is unset), the vendors' /dev entries, ``nvidia-smi -L`` (or that it is absent)."""
    lines = ["echo '=== env'"]
    for var in env_vars:
        if not _VAR.fullmatch(var):
            raise ValueError(f"{var!r} is not an environment variable name")
        lines.append(
            f'if [ -n "${{{var}+x}}" ]; then echo "{var}=${var}"; else echo "{var} unset"; fi'
        )
    lines += [
        "echo '=== dev'",
        'for f in /dev/nvidia* /dev/dri/* /dev/kfd /dev/davinci*; do [ -e "$f" ] && echo "$f"; '
        "done | head -n 256",
        "echo '=== nvidia-smi'",
        "if command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi -L 2>&1 | head -n 64; "
        "else echo '(absent)'; fi",
        "echo '=== end'",
    ]
    return "\n".join(lines) + "\n"


def probe_group(name: str, resource: str, hostname: str) -> dict[str, Any]:
    """One device of ``resource`` on the node whose hostname label is ``hostname``."""
    return {
        "apiVersion": SDG_KIND.api_version,
        "kind": SDG_KIND.kind,
        "metadata": {"name": name, "labels": dict(CREATED_BY)},
        "spec": {"resources": {resource: 1}, "nodeSelector": {HOSTNAME_LABEL: hostname}},
    }


def probe_pod(
    name: str, group: str, image: str, pull_policy: str, env_vars: Sequence[str]
) -> dict[str, Any]:
    """The group's one pod: prints its report and exits; passes Pod Security
    "restricted" and quotas that require limits."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": dict(CREATED_BY),
            "annotations": {GROUP_ANNOTATION: group},
        },
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 65534,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": CONTAINER,
                    "image": image,
                    "imagePullPolicy": pull_policy,
                    "command": ["sh", "-c", probe_script(env_vars)],
                    "resources": {
                        "requests": {"cpu": "10m", "memory": "16Mi"},
                        "limits": {"cpu": "100m", "memory": "64Mi"},
                    },
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                    },
                }
            ],
        },
    }


# --- what was seen, what is held -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Seen:
    """A probe container's report: variables (None: unset), /dev entries, ``nvidia-smi -L``
    lines (None: no nvidia-smi in the container); ``complete`` when its end was printed."""

    env: Mapping[str, str | None] = field(default_factory=dict)
    dev: tuple[str, ...] = ()
    smi: tuple[str, ...] | None = None
    complete: bool = True


def parse_report(log: str) -> Seen:
    """The probe container's log (``probe_script``'s output) as ``Seen``."""
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in log.splitlines():
        if line.startswith("=== "):
            current = sections.setdefault(line[4:].strip(), [])
            continue
        if current is not None and line.strip():
            current.append(line.rstrip())
    env: dict[str, str | None] = {}
    for line in sections.get("env", ()):
        name, sep, value = line.partition("=")
        if sep and _VAR.fullmatch(name):
            env[name] = value
        elif line.endswith(" unset") and _VAR.fullmatch(line[: -len(" unset")]):
            env[line[: -len(" unset")]] = None
    smi_lines = sections.get("nvidia-smi", [])
    smi = None if smi_lines == ["(absent)"] or "nvidia-smi" not in sections else tuple(smi_lines)
    return Seen(env=env, dev=tuple(sections.get("dev", ())), smi=smi, complete="end" in sections)


@dataclass(frozen=True, slots=True)
class Held:
    """What the probe group holds on its node, and what its pod was told."""

    node: str
    group: str
    resource: str
    env_var: str
    ids: tuple[str, ...]
    #: From ``status.physicalDevices``, in the order of ``ids``; None where not known.
    uuids: tuple[str, ...] | None = None
    #: The variable's value in the pod as admitted (None: not set in the pod).
    told: str | None = None
    #: How the pod got its devices (the node label or the webhook's choice), for messages.
    delivery: str = ""

    def describe(self) -> str:
        names = (
            [f"{u} (ID {i})" for u, i in zip(self.uuids, self.ids, strict=True)]
            if self.uuids
            else [f"ID {i}" for i in self.ids]
        )
        return f"{self.resource} {', '.join(names)}"


def held_of(group: Obj, pod: Obj, resource: str, env_var: str) -> Held:
    """``Held`` from the Bound group and its pod as the API server admitted it."""
    status = status_of(group)
    ids = tuple(
        i for i in str((status.get("selectedDevices") or {}).get(resource, "")).split(",") if i
    )
    raw = str((status.get("physicalDevices") or {}).get(resource) or "")
    uuids = tuple(u for u in raw.split(",") if u) if raw else None
    if uuids is not None and len(uuids) != len(ids):
        uuids = None
    told: str | None = None
    for c in spec_of(pod).get("containers") or ():
        if c.get("name") == CONTAINER:
            for entry in c.get("env") or ():
                if entry.get("name") == env_var:
                    told = str(entry.get("value") or "")
    annotations = meta_of(pod).get("annotations") or {}
    cdi = sorted(k for k in annotations if k.startswith("cdi-devices."))
    runtime_class = spec_of(pod).get("runtimeClassName")
    if cdi:
        delivery = f"cdi ({cdi[0]}: {annotations[cdi[0]]})"
    elif runtime_class:
        delivery = f"runtimeclass ({runtime_class})"
    else:
        delivery = "env"
    return Held(
        node=str(status.get("nodeName") or ""),
        group=name_of(group),
        resource=resource,
        env_var=env_var,
        ids=ids,
        uuids=uuids,
        told=told,
        delivery=delivery,
    )


def _env_text(var: str, value: str | None) -> str:
    return f"{var} unset" if value is None else f'{var}="{value}"'


def _fix(held: Held) -> str:
    label = f"kubectl label node {held.node} {DELIVERY_LABEL}=<env|runtimeclass|cdi> --overwrite"
    return (
        f"the delivery ({held.delivery}) does not give the container the group's devices on "
        f"this node's runtime: see sdg doctor's 'node {held.node}: delivery' check, then\n"
        f"{label}"
    )


def judge_seen(held: Held, seen: Seen) -> Check:
    """Whether the container saw exactly the group's devices: ✗ naming node, expected and
    seen when it did not; ! when only the variable shows them (nothing proves delivery)."""
    name = f"node {held.node}: probe"
    expected = held.describe()
    where = f"group {held.group}, delivery {held.delivery}"
    if not seen.complete:
        return Check(
            name,
            False,
            f"the probe's report is cut short (no '=== end' line; {where}): the container "
            "stopped early, or --probe-image has no sh, ls or head",
        )
    value = seen.env.get(held.env_var)
    env = _env_text(held.env_var, value)
    tokens = [t.strip() for t in (value or "").split(",") if t.strip()]
    known = {i: i for i in held.ids}
    if held.uuids is not None:
        known.update(zip(held.uuids, held.ids, strict=True))
    env_ids = {known.get(t) for t in tokens}
    pattern = DEVICE_NODES.get(held.env_var)
    nodes = [d for d in seen.dev if pattern is not None and pattern.fullmatch(d)]
    smi_uuids = [m.group(1) for line in seen.smi or () if (m := _SMI_GPU.search(line))]
    smi_none = any("No devices were found" in line for line in seen.smi or ())
    mismatch = f"node {held.node}: expected {expected}; the container sees "
    if held.env_var == "NVIDIA_VISIBLE_DEVICES" and (smi_uuids or smi_none):
        if held.uuids is not None:
            same = sorted(smi_uuids) == sorted(held.uuids)
        else:
            same = len(smi_uuids) == len(held.ids)
        seen_text = ", ".join(smi_uuids) or "no GPU"
        if same:
            return Check(name, True, f"nvidia-smi -L lists exactly {expected} ({where})")
        return Check(
            name, False, f"{mismatch}{seen_text} (nvidia-smi -L; {env}; {where})", _fix(held)
        )
    if nodes:
        if len(nodes) == len(held.ids) and None not in env_ids and value is not None:
            return Check(
                name,
                True,
                f"{', '.join(nodes)} and {env}: {len(nodes)} device(s), as the group holds "
                f"{expected} (device node numbers are not IDs; {where})",
            )
        return Check(
            name,
            False,
            f"{mismatch}{len(nodes)} device node(s) {', '.join(nodes)} and {env} ({where})",
            _fix(held),
        )
    if value is None or value.lower() in _NO_DEVICE_VALUES or not tokens:
        return Check(
            name,
            False,
            f"{mismatch}no device ({env}, no {_nodes_text(held.env_var)}"
            f"{', no nvidia-smi' if seen.smi is None else ''}; {where})",
            _fix(held),
        )
    if value.lower() == "all" or None in env_ids or env_ids != set(held.ids):
        return Check(name, False, f"{mismatch}{env} ({where})", _fix(held))
    smi = " nor nvidia-smi" if seen.smi is None else ""
    return Check(
        name,
        None,
        f"{env} names exactly {expected} ({where}), but the container has no "
        f"{_nodes_text(held.env_var)}{smi}: nothing shows that the runtime acted on it",
        f"on a GPU node the runtime adds the device nodes; if it does not, see sdg doctor's "
        f"'node {held.node}: delivery' check",
    )


def _nodes_text(env_var: str) -> str:
    pattern = DEVICE_NODES.get(env_var)
    if pattern is None:
        return "vendor device node"
    return pattern.pattern.replace(r"\d+", "N")


# --- running it -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProbeOptions:
    """``sdg doctor --probe``'s flags."""

    namespace: str = "default"
    image: str = DEFAULT_PROBE_IMAGE
    pull_policy: str = "IfNotPresent"
    timeout: float = DEFAULT_TIMEOUT
    nodes: tuple[str, ...] = ()
    env_table: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_ENV_TABLE))
    dra_drivers: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_DRA_DRIVERS))

    def __post_init__(self) -> None:
        if self.pull_policy not in PULL_POLICIES:
            raise ValueError(
                f"image pull policy {self.pull_policy!r}: expected one of "
                + ", ".join(PULL_POLICIES)
            )
        if not 0 < self.timeout <= MAX_TIMEOUT:
            raise ValueError(
                f"probe timeout {self.timeout:g}s: expected more than 0 and at most "
                f"{MAX_TIMEOUT:g} seconds"
            )
        if not self.image.strip():
            raise ValueError("the probe image is empty: give --probe-image IMAGE")


def probe_resource(offers: Mapping[str, Any], env_table: Mapping[str, str]) -> str | None:
    """The resource to probe a node with: NVIDIA's GPUs first, else the first (by name)
    that has usable devices and a device variable."""
    usable = sorted(
        r for r, o in offers.items() if o.usable() and env_var_for(r, env_table) is not None
    )
    if "nvidia.com/gpu" in usable:
        return "nvidia.com/gpu"
    return usable[0] if usable else None


Say = Callable[[str], None]


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


async def run_probes(client: Client, options: ProbeOptions, say: Say = _say) -> list[Check]:
    """Probe every shared node (or ``options.nodes``), one after the other."""
    nodes = await read_list(client, NODES)
    if isinstance(nodes, Unreadable) or nodes is None:
        why = nodes.error if isinstance(nodes, Unreadable) else "404"
        return [Check("probe", False, f"cannot read nodes: {why}")]
    shared = {name_of(n): n for n in nodes if is_shared(n)}
    checks: list[Check] = []
    wanted = list(options.nodes) or sorted(shared)
    for missing in [n for n in wanted if n not in shared]:
        checks.append(
            Check(
                f"node {missing}: probe",
                False,
                f"{missing} is not a node labelled deviceshare.io/mode=shared"
                + (f"; shared nodes: {', '.join(sorted(shared))}" if shared else ""),
                f"kubectl label node {missing} deviceshare.io/mode=shared",
            )
        )
    wanted = [n for n in wanted if n in shared]
    if not wanted and not checks:
        return [
            Check(
                "probe",
                False,
                "no node is labelled deviceshare.io/mode=shared: nothing to probe",
                "kubectl label node NODE deviceshare.io/mode=shared",
            )
        ]
    slices = await read_list(client, RESOURCESLICES)
    slices = slices if isinstance(slices, list) else []
    for node_name in wanted:
        own = [s for s in slices if node_of_slice(s) == node_name]
        checks.append(await probe_node(client, shared[node_name], own, options, say))
    return checks


class _Stage:
    """What the probe is waiting for, for the timeout message."""

    def __init__(self) -> None:
        self.text = "starting"


async def probe_node(
    client: Client, node: Obj, slices: Sequence[Obj], options: ProbeOptions, say: Say = _say
) -> Check:
    """One node's probe; the group and its pod are deleted again on every way out."""
    node_name = name_of(node)
    name = f"node {node_name}: probe"
    offers = node_offers(node, slices, options.dra_drivers)
    resource = probe_resource(offers, options.env_table)
    if resource is None:
        return Check(name, False, "offers no usable device with a device variable to probe with")
    env_var = env_var_for(resource, options.env_table) or ""
    hostname = str((meta_of(node).get("labels") or {}).get(HOSTNAME_LABEL) or "")
    if not hostname:
        return Check(
            name,
            False,
            f"has no {HOSTNAME_LABEL} label: a probe group cannot be pinned to it",
            f"kubectl label node {node_name} {HOSTNAME_LABEL}={node_name}",
        )
    group = PROBE_GROUP_PREFIX + secrets.token_hex(4)
    env_vars = sorted({env_var, *options.env_table.values()})
    made: list[tuple[str, str | None]] = []  # ("group"|"pod", namespace)
    stage = _Stage()
    say(f"probing node {node_name}: group {group} (1 {resource}), pod {options.namespace}/{group}")
    started = time.monotonic()
    try:
        with anyio.move_on_after(options.timeout) as scope:
            return await _probe_steps(
                client,
                node_name,
                group,
                resource,
                env_var,
                hostname,
                env_vars,
                options,
                stage,
                made,
            )
        assert scope.cancelled_caught
        return Check(
            name,
            False,
            f"timed out after {time.monotonic() - started:.0f}s (--probe-timeout "
            f"{options.timeout:g}) {stage.text}",
            f"kubectl describe pod -n {options.namespace} {group}   (while it runs), or "
            "sdg doctor --probe --probe-timeout SECONDS",
        )
    except anyio.get_cancelled_exc_class():
        say(f"interrupted: deleting the probe's pod and group {group}")
        raise
    finally:
        await _cleanup(client, group, options.namespace, made, say)


async def _probe_steps(
    client: Client,
    node_name: str,
    group: str,
    resource: str,
    env_var: str,
    hostname: str,
    env_vars: Sequence[str],
    options: ProbeOptions,
    stage: _Stage,
    made: list[tuple[str, str | None]],
) -> Check:
    name = f"node {node_name}: probe"
    ns = options.namespace
    try:
        await client.create(SDG_KIND, probe_group(group, resource, hostname))
    except errors.ApiError as err:
        return Check(name, False, f"cannot create the probe group {group}: {quote(err.message)}")
    made.append(("group", None))
    stage.text = f"waiting for group {group} to be Bound"
    bound: Obj = {}
    while True:
        got = await client.get(SDG_KIND, group)
        status = status_of(got)
        if is_bound(got):
            bound = got
            break
        why = next(
            (
                c.get("message") or c.get("reason")
                for c in status.get("conditions") or ()
                if c.get("type") == "Scheduled" and c.get("status") != "True"
            ),
            None,
        )
        stage.text = f"waiting for group {group} to be Bound" + (
            f" (Pending: {quote(str(why), 200)})" if why else ""
        )
        await anyio.sleep(POLL)
    if bound["status"].get("nodeName") != node_name:
        return Check(
            name,
            False,
            f"the probe group was bound to {bound['status'].get('nodeName')}, not {node_name}: "
            f"nodes share the {HOSTNAME_LABEL} label value {hostname}",
        )
    try:
        pod = await client.create(
            PODS, probe_pod(group, group, options.image, options.pull_policy, env_vars), ns
        )
    except errors.ApiError as err:
        return Check(
            name,
            False,
            f"the probe pod {ns}/{group} of group {group} was refused: {quote(err.message)}",
            "sdg doctor   (the pod webhook and this node's delivery checks)",
        )
    made.append(("pod", ns))
    stage.text = f"waiting for pod {ns}/{group} to run"
    while True:
        pod = await client.get(PODS, group, ns)
        status = status_of(pod)
        phase = status.get("phase")
        if phase in FINISHED_PHASES:
            break
        waiting = _waiting(status)
        if waiting.partition(":")[0] in STUCK:
            return Check(
                name,
                False,
                f"the probe pod {ns}/{group} cannot start: {waiting} (image {options.image}, "
                f"imagePullPolicy {options.pull_policy})",
                "sdg doctor --probe --probe-image IMAGE --probe-image-pull-policy POLICY   "
                "(an image the node can run, with sh, ls and head)",
            )
        stage.text = (
            f"waiting for pod {ns}/{group} to run (phase {phase or 'Pending'}"
            + (f", {w}" if (w := _waiting(status)) else "")
            + ")"
        )
        await anyio.sleep(POLL)
    log = await client.request(
        "GET",
        f"/api/v1/namespaces/{ns}/pods/{group}/log",
        params={"container": CONTAINER, "limitBytes": LOG_LIMIT},
    )
    text = log if isinstance(log, str) else str(log)
    if phase == "Failed" and "=== end" not in text:
        return Check(
            name,
            False,
            f"the probe pod {ns}/{group} failed ({_waiting(status, terminated=True) or phase}): "
            f"{quote(text, 200)}",
        )
    return judge_seen(held_of(bound, pod, resource, env_var), parse_report(text))


def _waiting(status: Obj, terminated: bool = False) -> str:
    """The container's waiting (or terminated) reason and message, if any."""
    for cs in status.get("containerStatuses") or ():
        state = cs.get("state") or {}
        for key in ("terminated",) if terminated else ("waiting",):
            if key in state:
                s = state[key] or {}
                text = str(s.get("reason") or "")
                if s.get("message"):
                    text += f": {quote(str(s['message']), 200)}"
                return text
    return ""


async def _cleanup(
    client: Client, group: str, namespace: str, made: Sequence[tuple[str, str | None]], say: Say
) -> None:
    """Delete the probe's pod, then its group (its finalizer waits for the pod); shielded
    from cancellation and bounded, and what could not be deleted is said with the fix."""
    if not made:
        return
    left = [f"pod -n {namespace} {group}" if kind == "pod" else f"sdg {group}" for kind, _ in made]
    with anyio.CancelScope(shield=True), anyio.move_on_after(CLEANUP_TIMEOUT):
        for kind, ns in reversed(made):
            target = PODS if kind == "pod" else SDG_KIND
            try:
                await client.delete(target, group, ns, grace_period_seconds=0)
            except errors.NotFound:
                pass
            except errors.ApiError as err:
                say(f"cannot delete {kind} {group}: {quote(err.message, 200)}")
                continue
            while True:
                try:
                    await client.get(target, group, ns)
                except errors.NotFound:
                    break
                await anyio.sleep(POLL)
            left.remove(f"pod -n {namespace} {group}" if kind == "pod" else f"sdg {group}")
    if left:
        say(
            "the probe could not clean up in time; delete what is left: "
            + "; ".join(f"kubectl delete {what}" for what in left)
        )

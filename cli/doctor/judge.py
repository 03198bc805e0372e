"""``sdg doctor``'s judges: pure functions from collected facts to ``Check``s, tested
on hand-made objects without a server."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Final

from api.conditions import find_condition
from api.constants import (
    CONDITION_READY,
    DEFAULT_ENV_TABLE,
    DELIVERY_AUTO,
    DELIVERY_CDI,
    DELIVERY_LABEL,
    DELIVERY_RUNTIMECLASS,
    GROUP,
    GROUP_ANNOTATION,
    MANAGER_NAMESPACE,
    NODE_MODE_LABEL,
    NODE_MODE_SHARED,
    PLURAL,
    REASON_FOREIGN_DEVICE_PODS,
    SHARED_TAINT_KEY,
    SHARED_TAINT_VALUE,
    VERSION,
)
from api.envvars import env_var_for
from api.nodes import is_shared, node_labels, parse_time
from cli.doctor.facts import (
    CERT_MANAGER_CRD,
    CERT_MANAGER_INSTALL,
    CRD_NAME,
    DEFAULT_LEASE_SECONDS,
    DRA_V1_KUBERNETES,
    INSTALL,
    MANAGER_DEPLOYMENT,
    MANAGER_POD_SELECTOR,
    MAX_FOREIGN_SHOWN,
    MAX_NAMES_SHOWN,
    MAX_PRE_NODES,
    MIN_KUBERNETES,
    POLICIES,
    SERVING_CERTIFICATE,
    WEBHOOK_CONFIGURATIONS,
    WEBHOOK_SERVICE,
    Check,
    Facts,
    Fetched,
    ManagerConfig,
    PreFacts,
    Probe,
    Unreadable,
)
from controllers.foreign import DeviceUse, device_use
from controllers.inventory import (
    DEFAULT_DRA_DRIVERS,
    SOURCE_COUNT,
    Offer,
    annotation_key,
    node_of_slice,
    node_offers,
)
from controllers.ledger.book import Ledger
from controllers.ledger.records import RECORD_LABEL, RECORD_LABEL_VALUE
from controllers.ledger.view import describe
from controllers.placement import unaddressable_devices
from sdgruntime.kinds import Obj, meta_of, spec_of, status_of
from webhooks.delivery import NVIDIA_ENV, Delivery, Denial, choose_delivery, runtime_handlers

# --- small readers -----------------------------------------------------------------------


def _meta(obj: Obj | None) -> Obj:
    return meta_of(obj)


def name_of(obj: Obj) -> str:
    return str(_meta(obj).get("name") or "")


def _condition(obj: Obj, type_: str) -> Obj | None:
    for cond in (status_of(obj).get("conditions")) or ():
        if isinstance(cond, Mapping) and cond.get("type") == type_:
            return cond
    return None


def _names(names: Sequence[str], limit: int = MAX_NAMES_SHOWN) -> str:
    shown = ", ".join(names[:limit])
    return f"{shown} + {len(names) - limit} more" if len(names) > limit else shown


def _ranges(ids: Iterable[int]) -> str:
    """``[0, 1, 2, 5] -> "0-2,5"``: a node's IDs in one short cell."""
    out: list[str] = []
    run: list[int] = []
    for i in sorted(ids):
        if run and i == run[-1] + 1:
            run.append(i)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [i]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def quote(message: str, limit: int = 300) -> str:
    message = " ".join(message.split())
    return message if len(message) <= limit else message[: limit - 3] + "..."


def _unreadable(what: str, got: Unreadable) -> str:
    return f"cannot read {what}: {got.error}"


# --- judges: CRD, admission, cert-manager --------------------------------------------------


def judge_crd(crd: Fetched, groups_error: str | None = None, group_count: int = 0) -> Check:
    """Installed (the CRD object), Established with its names accepted, v1alpha1 served,
    and really answering (a list of groups)."""
    name = "CRD"
    if isinstance(crd, Unreadable):
        return Check(name, False, _unreadable(f"CRD {CRD_NAME}", crd))
    if crd is None:
        return Check(
            name,
            False,
            f"{CRD_NAME} is not installed: SharedDeviceGroups cannot be created",
            INSTALL,
        )
    problems = []
    for type_ in ("NamesAccepted", "Established"):
        cond = _condition(crd, type_)
        if not cond or cond.get("status") != "True":
            why = (cond or {}).get("message") or (cond or {}).get("reason") or "no condition"
            problems.append(f"not {type_} ({why})")
    versions = {str(v.get("name")): v for v in spec_of(crd).get("versions") or () if v}
    if not (versions.get(VERSION) or {}).get("served"):
        problems.append(f"version {VERSION} is not served")
    if groups_error is not None:
        problems.append(f"listing {PLURAL} fails: {quote(groups_error)}")
    if problems:
        return Check(name, False, f"{CRD_NAME}: " + "; ".join(problems), INSTALL)
    return Check(
        name,
        True,
        f"{CRD_NAME} Established, {GROUP}/{VERSION} served ({group_count} group(s))",
    )


def judge_webhook_configurations(
    webhooks: Mapping[str, Fetched], manager_namespace: str = MANAGER_NAMESPACE
) -> Check:
    """Both configurations of config/webhook exist; one without a caBundle is a warning
    (cert-manager's CA injector fills it; until then the API server distrusts SDG)."""
    name = "webhook configurations"
    missing, unreadable, no_ca, present = [], [], [], []
    for kind, config_name in WEBHOOK_CONFIGURATIONS.items():
        got = webhooks.get(config_name)
        if isinstance(got, Unreadable):
            unreadable.append(f"{kind} {config_name}: {got.error}")
        elif got is None:
            missing.append(f"{kind} {config_name}")
        else:
            hooks = [h for h in got.get("webhooks") or () if isinstance(h, Mapping)]
            present.append(f"{config_name} ({', '.join(str(h.get('name')) for h in hooks)})")
            if any(not (h.get("clientConfig") or {}).get("caBundle") for h in hooks):
                no_ca.append(config_name)
    if missing or unreadable:
        parts = [f"not registered: {', '.join(missing)}"] if missing else []
        parts += [f"cannot read {u}" for u in unreadable]
        return Check(name, False, "; ".join(parts), INSTALL if missing else "")
    if no_ca:
        return Check(
            name,
            None,
            f"registered, but without a caBundle: {', '.join(no_ca)}; cert-manager's CA "
            "injector fills it (annotation cert-manager.io/inject-ca-from)",
            f"kubectl -n {manager_namespace} describe certificate {SERVING_CERTIFICATE}",
        )
    return Check(name, True, "registered: " + ", ".join(present))


def probe_pod(group: str) -> dict[str, Any]:
    """The dry-run pod: it names ``group``, and it passes Pod Security "restricted" and a
    quota that requires limits, so that SDG's verdict is the only thing to refuse it."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": group, "annotations": {GROUP_ANNOTATION: group}},
        "spec": {
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 65534,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": "probe",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {
                        "requests": {"cpu": "1m", "memory": "8Mi"},
                        "limits": {"cpu": "10m", "memory": "16Mi"},
                    },
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                    },
                }
            ],
        },
    }


def probe_reached_sdg(probe: Probe) -> bool:
    """Whether SDG's pod webhook itself answered: denied with its "not found" verdict."""
    return (
        not probe.admitted
        and "denied the request" in probe.message
        and f"SharedDeviceGroup '{probe.group}' not found" in probe.message
    )


def _probe_unreachable(probe: Probe) -> bool:
    return not probe.admitted and "failed calling webhook" in probe.message


def judge_probe(probe: Probe | Unreadable | None, manager_namespace: str) -> Check:
    """The API server calls SDG's pod webhook for an annotated pod, and SDG answers."""
    name = "pod webhook"
    ns = manager_namespace
    if probe is None:
        return Check(name, None, "not probed")
    if isinstance(probe, Unreadable):
        return Check(name, False, f"the dry-run probe could not be sent: {probe.error}")
    if probe_reached_sdg(probe):
        return Check(
            name,
            True,
            f"reachable: a dry-run pod in {probe.namespace} naming the missing group "
            f"{probe.group} was denied by SDG",
        )
    if probe.admitted:
        return Check(
            name,
            False,
            f"a dry-run pod naming the missing group {probe.group} was admitted: SDG's pod "
            "webhook is not registered, or its rules/matchConditions do not match pods",
            INSTALL,
        )
    if _probe_unreachable(probe):
        fix = [
            f"kubectl -n {ns} rollout status deploy/{MANAGER_DEPLOYMENT}",
            f"kubectl -n {ns} get endpointslices -l kubernetes.io/service-name={WEBHOOK_SERVICE}",
        ]
        if "x509" in probe.message or "certificate" in probe.message:
            fix.append(f"kubectl -n {ns} describe certificate {SERVING_CERTIFICATE}")
        return Check(
            name,
            False,
            "registered, but the API server cannot call it: " + quote(probe.message),
            "\n".join(fix),
        )
    if probe.code == 403 and 'cannot create resource "pods"' in probe.message:
        return Check(
            name,
            None,
            f"cannot dry-run a pod in namespace {probe.namespace} (doctor needs create on "
            f"pods there; nothing is created): {quote(probe.message)}",
            "sdg doctor -n NAMESPACE   (a namespace where you may create pods)",
        )
    return Check(
        name,
        False,
        f"the dry-run pod in {probe.namespace} was refused, but not by SDG's verdict on a "
        f"missing group: {quote(probe.message)}",
    )


def judge_policies(policies: Mapping[str, Fetched], bindings: Mapping[str, Fetched]) -> Check:
    """config/policy: each ValidatingAdmissionPolicy and its Binding (without the Binding
    a policy is not enforced)."""
    name = "admission policies"
    missing, unreadable = [], []
    for policy in POLICIES:
        for kind, got in (
            ("ValidatingAdmissionPolicy", policies.get(policy)),
            ("ValidatingAdmissionPolicyBinding", bindings.get(policy)),
        ):
            if isinstance(got, Unreadable):
                unreadable.append(f"{kind} {policy}: {got.error}")
            elif got is None:
                missing.append(f"{kind} {policy}")
    if missing or unreadable:
        parts = [f"missing: {', '.join(missing)}"] if missing else []
        parts += [f"cannot read {u}" for u in unreadable]
        detail = "; ".join(parts)
        if missing:
            detail += " (the API server then does not hold group membership fixed by itself)"
        return Check(name, False, detail, f"{INSTALL}   (or kubectl apply -k config/policy)")
    return Check(name, True, "installed and bound: " + ", ".join(POLICIES))


def judge_cert_manager(
    crd: Fetched, certificate: Fetched, probe: Probe | Unreadable | None, manager_namespace: str
) -> Check:
    """cert-manager issues the webhook's serving certificate in config/default.

    Its absence is only a warning while SDG's webhook answers, because the probe is the
    real test of what cert-manager provides (a certificate the API server trusts): the
    certificate then comes from elsewhere, nothing rotates it, and config/default cannot
    be applied. When the webhook is registered but cannot be called, a missing
    cert-manager (or Certificate) is a likely cause, so it fails. When the webhook is not
    registered at all, the webhook checks fail with the fix; here it is a warning."""
    name = "cert-manager"
    reachable = isinstance(probe, Probe) and probe_reached_sdg(probe)
    unreachable = isinstance(probe, Probe) and _probe_unreachable(probe)
    cert = f"{manager_namespace}/{SERVING_CERTIFICATE}"
    if isinstance(crd, Unreadable):
        return Check(name, None, _unreadable(f"CRD {CERT_MANAGER_CRD}", crd))
    if crd is None:
        if unreachable:
            return Check(
                name,
                False,
                f"not installed (no CRD {CERT_MANAGER_CRD}), and the webhook cannot be called: "
                "config/default's serving certificate (Secret webhook-server-cert) comes "
                "from cert-manager",
                f"{CERT_MANAGER_INSTALL}\n{INSTALL}",
            )
        why = (
            "the webhook answers, so its certificate comes from elsewhere (nothing rotates "
            "it, and config/default's Certificate cannot be applied)"
            if reachable
            else "config/default's Certificate needs it: install it before applying it"
        )
        return Check(
            name, None, f"not installed (no CRD {CERT_MANAGER_CRD}); {why}", CERT_MANAGER_INSTALL
        )
    if isinstance(certificate, Unreadable):
        return Check(name, None, f"installed; {_unreadable(f'Certificate {cert}', certificate)}")
    if certificate is None:
        if reachable:
            return Check(
                name, True, f"installed (no Certificate {cert}: the webhook's comes from elsewhere)"
            )
        if unreachable:
            return Check(name, False, f"installed, but there is no Certificate {cert}", INSTALL)
        return Check(name, None, f"installed; no Certificate {cert} yet", INSTALL)
    ready = _condition(certificate, "Ready")
    if not ready or ready.get("status") != "True":
        why = (ready or {}).get("message") or (ready or {}).get("reason") or "no Ready condition"
        return Check(
            name,
            False,
            f"installed, but Certificate {cert} is not Ready: {quote(str(why))}",
            f"kubectl -n {manager_namespace} describe certificate {SERVING_CERTIFICATE}",
        )
    expires = status_of(certificate).get("notAfter")
    return Check(
        name,
        True,
        f"installed; Certificate {cert} Ready" + (f" (until {expires})" if expires else ""),
    )


# --- judges: nodes --------------------------------------------------------------------------


def judge_shared_nodes(nodes: Sequence[Obj] | Unreadable) -> Check:
    """At least one node is labelled shared: groups bind only there."""
    name = "shared nodes"
    if isinstance(nodes, Unreadable):
        return Check(name, False, _unreadable("nodes", nodes))
    shared = sorted(name_of(n) for n in nodes if is_shared(n))
    if shared:
        return Check(
            name,
            True,
            f"{len(shared)} labelled {NODE_MODE_LABEL}={NODE_MODE_SHARED}: {_names(shared)}",
        )
    with_devices = sorted(name_of(n) for n in nodes if node_offers(n))
    target = with_devices[0] if with_devices else "NODE"
    detail = f"no node is labelled {NODE_MODE_LABEL}={NODE_MODE_SHARED}: every group stays Pending"
    if with_devices:
        detail += f"; nodes with devices: {_names(with_devices)}"
    return Check(
        name, False, detail, f"kubectl label node {target} {NODE_MODE_LABEL}={NODE_MODE_SHARED}"
    )


def _taint_text() -> str:
    return f"{SHARED_TAINT_KEY}={SHARED_TAINT_VALUE}:NoSchedule"


def has_shared_taint(node: Obj) -> bool:
    return any(
        isinstance(t, Mapping)
        and t.get("key") == SHARED_TAINT_KEY
        and t.get("value") == SHARED_TAINT_VALUE
        and t.get("effect") in ("NoSchedule", "NoExecute")
        for t in spec_of(node).get("taints") or ()
    )


def judge_taint(node: Obj, holders: bool = False) -> Check:
    """A shared node is tainted so that pods outside any group stay off it: they would use
    its devices without SDG knowing which. Group pods get the toleration from the webhook
    (for every effect: NoSchedule keeps others off, NoExecute also evicts them); another
    value of the key would keep group pods off too. With holder pods (``holders``) the
    taint is optional: the kubelet counts the groups' devices, so plain pods asking the
    device plugin get only others."""
    node_name = name_of(node)
    name = f"node {node_name}: taint"
    add = f"kubectl taint node {node_name} {_taint_text()}"
    if has_shared_taint(node):
        return Check(name, True, f"tainted {_taint_text()}")
    others = [
        f"{t.get('key')}={t.get('value') or ''}:{t.get('effect')}"
        for t in spec_of(node).get("taints") or ()
        if isinstance(t, Mapping) and t.get("key") == SHARED_TAINT_KEY
    ]
    if others:
        return Check(
            name,
            False,
            f"tainted {', '.join(others)}, not {_taint_text()}: group pods tolerate only "
            f"{SHARED_TAINT_KEY}={SHARED_TAINT_VALUE}",
            f"kubectl taint node {node_name} {SHARED_TAINT_KEY}-\n{add}",
        )
    if holders:
        return Check(
            name,
            True,
            f"not tainted (optional with holder pods: plain pods asking the device plugin get "
            f"only GPUs no group holds; {add} keeps every other pod off)",
        )
    return Check(
        name,
        False,
        f"not tainted {_taint_text()}: pods outside any group can be scheduled here and use "
        "its devices unseen",
        add,
    )


def _annotate_fix(node: str, resource: str) -> str:
    key = annotation_key(resource)
    if resource == "nvidia.com/gpu":
        uuids = '"$(nvidia-smi --query-gpu=uuid --format=csv,noheader | paste -sd, -)"'
        return f"kubectl annotate node {node} {key}={uuids}   (nvidia-smi on that node)"
    return f"kubectl annotate node {node} {key}=UUID0,UUID1,...   (in device index order)"


def _offer_text(offer: Offer) -> str:
    usable = offer.usable()
    unhealthy = [d.id for d in offer.devices if not d.healthy]
    text = f"{offer.resource}: {len(usable)} from {offer.source}"
    if usable:
        text += f" ({_ranges(usable)})"
    if unhealthy:
        text += f", unhealthy {_ranges(unhealthy)}"
    if offer.guessed:
        text += ", IDs are guessed from a count"
    if offer.problem:
        text += f", {offer.problem}"
    return text


def judge_devices(
    node: Obj,
    slices: Iterable[Obj] = (),
    drivers: Mapping[str, str] = DEFAULT_DRA_DRIVERS,
) -> Check:
    """What the node offers per resource and from which source (inventory): nothing, or
    a source that offers nothing, fails; IDs guessed from a count are a warning (which
    physical GPU is ID 1 is then the runtime's numbering, and a failed GPU shifts them)."""
    node_name = name_of(node)
    name = f"node {node_name}: devices"
    offers = node_offers(node, slices, drivers)
    too_many = unaddressable_devices(node)
    parts = [_offer_text(offers[r]) for r in sorted(offers)]
    parts += [
        f"{r}: advertises {n}, more than SDG addresses, so offers none"
        for r, n in sorted(too_many.items())
    ]
    if not parts:
        return Check(
            name,
            False,
            "advertises no devices (no device resource in status.allocatable, no "
            f"{annotation_key('RESOURCE')} annotation, no ResourceSlice of a known driver)",
            "install the device plugin or DRA driver (e.g. the NVIDIA GPU Operator), or\n"
            + _annotate_fix(node_name, "nvidia.com/gpu"),
        )
    empty = [o for o in offers.values() if not o.usable()]
    guessed = sorted(r for r, o in offers.items() if o.source == SOURCE_COUNT)
    detail = "; ".join(parts)
    if empty or too_many:
        bad = sorted([o.resource for o in empty] + list(too_many))
        return Check(name, False, detail, "\n".join(_annotate_fix(node_name, r) for r in bad))
    if guessed or any(o.problem for o in offers.values()):
        fix = [_annotate_fix(node_name, r) for r in guessed]
        if guessed:
            fix.append("or install the DRA driver, whose ResourceSlices name each device")
        return Check(name, None, detail, "\n".join(fix))
    return Check(name, True, detail)


def judge_resource_slices(
    slices: Sequence[Obj] | Unreadable | None, config: ManagerConfig
) -> Check:
    """Whether DRA ResourceSlices (the best inventory source) can be read at all."""
    name = "ResourceSlices"
    if config.resource_slices == "off":
        return Check(name, True, "not read: the manager runs with --resource-slices=off")
    if slices is None:
        return Check(
            name,
            True,
            "resource.k8s.io/v1 is not served (Kubernetes 1.34+): skipped, device IDs come "
            "from node annotations or counts",
        )
    if isinstance(slices, Unreadable):
        return Check(
            name, None, _unreadable("ResourceSlices", slices) + "; device sources below may differ"
        )
    known = [s for s in slices if spec_of(s).get("driver") in config.dra_drivers]
    nodes = sorted({n for s in known if (n := node_of_slice(s))})
    detail = f"resource.k8s.io/v1 served: {len(known)} of a known driver"
    detail += f" on {_names(nodes)}" if nodes else ""
    return Check(name, True, detail + f" ({len(slices)} in all)")


def _foreign_reported(node_name: str, name: str, refused: str, groups: Sequence[Obj]) -> Check:
    """The foreign-pods check from the manager's findings, for a reader who may not list
    pods in every namespace (their env values may hold secrets): the groups bound to the
    node say ``Ready=False, ForeignDevicePods`` when pods outside any group use its
    devices; with no group bound there, nothing says, and the check is left undecided."""
    bound = sorted((g for g in groups if status_of(g).get("nodeName") == node_name), key=name_of)
    reported = []
    for g in bound:
        ready = find_condition(status_of(g).get("conditions"), CONDITION_READY) or {}
        if ready.get("status") == "False" and ready.get("reason") == REASON_FOREIGN_DEVICE_PODS:
            reported.append((name_of(g), str(ready.get("message") or "")))
    why = (
        f"doctor may not list pods outside the manager's namespace ({refused}): the "
        "deviceshare-doctor role leaves them out, since pods carry their env values"
    )
    if reported:
        group, message = reported[0]
        return Check(
            name,
            False,
            f"the manager reports for group(s) {_names([g for g, _ in reported])}: {message}",
            f"sdg explain {shlex.quote(group)}   (as someone who may list pods: kubectl get "
            f"pods -A --field-selector spec.nodeName={node_name})",
        )
    if bound:
        return Check(
            name,
            True,
            f"none reported by the manager for group(s) {_names([name_of(g) for g in bound])} "
            f"bound here ({why})",
        )
    return Check(
        name,
        None,
        f"not checked: no group is bound here to report them, and {why}",
        "bind the ClusterRole deviceshare-doctor-pods too (it reads every pod, env included) "
        "for this check, or run doctor as a cluster admin",
    )


def judge_foreign(
    node: Obj,
    pods: Sequence[Obj] | Unreadable,
    env_table: Mapping[str, str] = DEFAULT_ENV_TABLE,
    holders_namespace: str = MANAGER_NAMESPACE,
    *,
    refused: str | None = None,
    groups: Sequence[Obj] = (),
) -> Check:
    """Pods outside any group that use devices on a shared node: SDG cannot know which
    devices they see, so it hands out no more there and flags the groups bound there.
    (SDG's holder pods in the manager's namespace are SDG's own books.) ``refused``: the
    pods of other namespaces could not be read (why); then the groups' conditions say."""
    node_name = name_of(node)
    name = f"node {node_name}: foreign device pods"
    if isinstance(pods, Unreadable):
        return Check(name, False, _unreadable(f"the pods on node {node_name}", pods))
    if refused is not None:
        return _foreign_reported(node_name, name, refused, groups)
    uses = sorted(
        (
            u
            for p in pods
            if (u := device_use(p, env_table, holders_namespace)) is not None
            and u.node == node_name
        ),
        key=lambda u: u.pod,
    )
    if not uses:
        return Check(name, True, "none")
    shown: list[DeviceUse] = uses[:MAX_FOREIGN_SHOWN]
    listed = ", ".join(f"{u.pod} ({u.how()})" for u in shown)
    if len(uses) > len(shown):
        listed += f" + {len(uses) - len(shown)} more"
    fix = []
    for u in shown:
        ns, _, pod = u.pod.partition("/")
        fix.append(f"kubectl delete pod -n {shlex.quote(ns)} {shlex.quote(pod)}")
    fix[-1] += "   (or run them on a node that is not shared)"
    if not has_shared_taint(node):
        fix.append(f"kubectl taint node {node_name} {_taint_text()}   (keeps new ones off)")
    return Check(
        name,
        False,
        f"{len(uses)} pod(s) outside any group use devices here: {listed}; SDG hands out no "
        "more of them here",
        "\n".join(fix),
    )


def runtime_class_users(config: ManagerConfig, nodes: Sequence[Obj] | Unreadable) -> list[str]:
    """Who delivers devices through the RuntimeClass: the manager's setting, and shared
    nodes labelled ``deviceshare.io/delivery=runtimeclass``."""
    users = []
    if config.delivery == DELIVERY_RUNTIMECLASS:
        users.append(f"the manager (delivery {DELIVERY_RUNTIMECLASS}: {config.delivery_source})")
    if not isinstance(nodes, Unreadable):
        labelled = sorted(
            name_of(n)
            for n in nodes
            if is_shared(n) and node_labels(n).get(DELIVERY_LABEL) == DELIVERY_RUNTIMECLASS
        )
        if labelled:
            users.append(f"node(s) {_names(labelled)} ({DELIVERY_LABEL}={DELIVERY_RUNTIMECLASS})")
    return users


#: The first Kubernetes minor whose kubelets report a pod's devices in its status
#: (``allocatedResourcesStatus``, feature ResourceHealthStatus beta and on since 1.36):
#: how SDG reads back which devices a holder pod was given.
HOLDER_MIN_KUBELET = (1, 36)


def _kubelet_minor(node: Obj) -> tuple[int, int] | None:
    version = str((status_of(node).get("nodeInfo") or {}).get("kubeletVersion") or "")
    parts = version.lstrip("v").split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


def judge_holders(
    config: ManagerConfig, nodes: Sequence[Obj] | Unreadable, priority_class: Fetched
) -> Check:
    """Holder pods (``--holders auto``) need their PriorityClass, and kubelets that report
    which devices they gave a pod (1.36+); on an older kubelet a group stays Pending."""
    name = "holder pods"
    if config.holders != "auto":
        return Check(
            name,
            True,
            f"off ({config.source}): keep shared nodes tainted so only groups use them",
        )
    pc = config.holder_priority_class
    if pc and isinstance(priority_class, Unreadable):
        return Check(name, None, _unreadable(f"PriorityClass {pc}", priority_class))
    if pc and priority_class is None:
        return Check(
            name,
            False,
            f"PriorityClass {pc} is missing: no holder pod can be created, so groups on "
            "device-plugin nodes stay Pending",
            "kubectl apply -k config/holders   (or helm upgrade: the chart ships it)",
        )
    old = []
    for node in [] if isinstance(nodes, Unreadable) else nodes:
        minor = _kubelet_minor(node)
        if is_shared(node) and minor is not None and minor < HOLDER_MIN_KUBELET:
            old.append(f"{name_of(node)} (kubelet {minor[0]}.{minor[1]})")
    if old:
        return Check(
            name,
            None,
            f"kubelets older than 1.{HOLDER_MIN_KUBELET[1]} do not report which devices they "
            f"gave a pod, so groups on their device-plugin GPUs stay Pending: {', '.join(old)}",
            "upgrade those kubelets, enable feature gate ResourceHealthStatus on them, or run "
            "the manager with --holders off and taint those nodes",
        )
    return Check(name, True, f"on: PriorityClass {pc or '(none)'}; shared nodes' kubelets report")


def judge_runtime_class(
    config: ManagerConfig, nodes: Sequence[Obj] | Unreadable, runtime_class: Fetched
) -> Check:
    """The RuntimeClass group pods get exists when any delivery needs it: a pod naming a
    missing RuntimeClass is refused by the API server. Under ``auto`` it is looked for,
    not needed: the nodes whose runtime lists its handler get it (see each node's
    delivery check)."""
    name = "RuntimeClass"
    rc = config.runtime_class_name
    users = runtime_class_users(config, nodes)
    if not users and config.delivery == DELIVERY_AUTO:
        if isinstance(runtime_class, Unreadable):
            return Check(
                name,
                None,
                _unreadable(f"RuntimeClass {rc}", runtime_class)
                + ": delivery auto cannot tell which nodes take it",
            )
        if runtime_class is None:
            return Check(
                name,
                True,
                f"RuntimeClass {rc} does not exist, so delivery auto chooses it on no node",
            )
        handler = str(runtime_class.get("handler") or "")
        listing = sorted(
            name_of(n)
            for n in ([] if isinstance(nodes, Unreadable) else nodes)
            if is_shared(n) and handler and handler in runtime_handlers(n)
        )
        where = f"node(s) {_names(listing)}" if listing else "no shared node"
        return Check(
            name,
            True,
            f"RuntimeClass {rc} (handler {handler or '?'}) exists; delivery auto chooses it "
            f"where the node lists handler {handler or '?'} in status.runtimeHandlers: {where}",
        )
    if not users:
        return Check(
            name,
            True,
            f"not needed (delivery {config.delivery}; no shared node labelled "
            f"{DELIVERY_LABEL}={DELIVERY_RUNTIMECLASS})",
        )
    who = " and ".join(users)
    if isinstance(runtime_class, Unreadable):
        return Check(name, False, _unreadable(f"RuntimeClass {rc}", runtime_class))
    if runtime_class is None:
        body = json.dumps(
            {
                "apiVersion": "node.k8s.io/v1",
                "kind": "RuntimeClass",
                "metadata": {"name": rc},
                "handler": rc,
            },
            separators=(",", ":"),
        )
        return Check(
            name,
            False,
            f"RuntimeClass {rc} does not exist, but {who} deliver devices through it: "
            "group pods naming it are refused",
            f"kubectl apply -f - <<< '{body}'   (handler: the node runtime's, e.g. nvidia "
            "from the NVIDIA Container Toolkit)",
        )
    handler = runtime_class.get("handler") or "?"
    return Check(name, True, f"RuntimeClass {rc} (handler {handler}) exists, for {who}")


def delivery_settings(config: ManagerConfig) -> Delivery:
    """The manager's delivery settings as ``config`` knows them (its defaults where the
    Deployment's values are not valid: the manager would not start with them)."""
    try:
        return Delivery(config.delivery, config.device_ids, config.runtime_class_name)
    except ValueError:
        return Delivery()


def node_env_vars(node: Obj, slices: Iterable[Obj], config: ManagerConfig) -> list[str]:
    """The device variables of what the node offers (NVIDIA's when it offers nothing
    known): what its delivery is judged for."""
    offers = node_offers(node, slices, config.dra_drivers)
    found = {v for r in offers if (v := env_var_for(r, config.env_table)) is not None}
    return sorted(found) or [NVIDIA_ENV]


def judge_delivery(
    node: Obj,
    config: ManagerConfig,
    runtime_class: Fetched,
    env_vars: Sequence[str] = (NVIDIA_ENV,),
) -> Check:
    """How the node's group pods get their devices, by the webhook's own rule
    (``webhooks.delivery.choose_delivery``), and why: a label SDG cannot read fails; env
    that nothing on the node confirms is a warning naming what would settle it."""
    node_name = name_of(node)
    name = f"node {node_name}: delivery"
    try:
        settings = Delivery(config.delivery, runtime_class_name=config.runtime_class_name)
    except ValueError as err:
        return Check(name, False, f"the manager's settings ({config.delivery_source}): {err}")
    rc = config.runtime_class_name
    if isinstance(runtime_class, Unreadable) and config.delivery == DELIVERY_AUTO:
        return Check(
            name,
            None,
            _unreadable(f"RuntimeClass {rc}", runtime_class) + ": the delivery cannot be told",
        )
    known = {rc: runtime_class} if isinstance(runtime_class, Mapping) else {}
    choice = choose_delivery(node, known, settings, env_vars)
    if isinstance(choice, Denial):
        return Check(
            name,
            False,
            choice.message,
            f"kubectl label node {node_name} {DELIVERY_LABEL}=<env|runtimeclass|cdi> --overwrite",
        )
    if not choice.verified:
        return Check(
            name,
            None,
            f"{choice.mode}, unverified: {choice.reason} (group pods here may see no device)",
            choice.settle,
        )
    return Check(name, True, f"{choice.mode} ({choice.reason})")


# --- judges: the manager ---------------------------------------------------------------------


def judge_lease(
    lease: Fetched, config: ManagerConfig, now: datetime, replicas: int | None = None
) -> Check:
    """Some manager is leading: the Lease is held and renewed within its duration (by this
    machine's clock against the leader's timestamps, so a skewed clock can mislead)."""
    name = "leader Lease"
    where = f"{config.lease_namespace}/{config.lease_name}"
    logs = f"kubectl -n {config.lease_namespace} logs deploy/{MANAGER_DEPLOYMENT}"
    if not config.leader_elect:
        if replicas is not None and replicas > 1:
            return Check(
                name,
                None,
                f"leader election is off ({config.source}) with {replicas} replicas: each "
                "schedules (claims are fenced, but they race)",
                f"add --leader-elect to the manager's args ({config.source})",
            )
        return Check(name, True, f"not used: leader election is off ({config.source})")
    if isinstance(lease, Unreadable):
        return Check(name, False, _unreadable(f"Lease {where}", lease))
    if lease is None:
        return Check(
            name,
            False,
            f"no Lease {where}: no manager has become leader (none runs, or not with "
            "--leader-elect), so nothing binds groups or pods",
            logs,
        )
    spec = spec_of(lease)
    holder = str(spec.get("holderIdentity") or "")
    if not holder:
        return Check(name, False, f"Lease {where} was released and nobody took it over", logs)
    renewed = parse_time(spec.get("renewTime"))
    duration = spec.get("leaseDurationSeconds")
    duration = duration if isinstance(duration, int) and duration > 0 else DEFAULT_LEASE_SECONDS
    if renewed is None:
        return Check(name, False, f"Lease {where} held by {holder} has no renewTime", logs)
    age = max(0.0, (now - renewed).total_seconds())
    if age > duration:
        return Check(
            name,
            False,
            f"Lease {where} held by {holder}, but last renewed {age:.0f}s ago (it lasts "
            f"{duration}s): the leader is gone or cannot reach the API server",
            logs,
        )
    return Check(name, True, f"held by {holder}, renewed {age:.0f}s ago (lasts {duration}s)")


def judge_manager(
    deployment: Fetched,
    manager_namespace: str,
    lease_ok: bool | None,
    lease_unreadable: bool = False,
) -> Check:
    """The manager Deployment has a Ready replica; without a Deployment (a manager run
    elsewhere, as in tests), a live leader Lease is the proof that one runs (a Lease we
    may not read proves nothing either way)."""
    name = "manager"
    ns = manager_namespace
    where = f"{ns}/{MANAGER_DEPLOYMENT}"
    if isinstance(deployment, Unreadable):
        return Check(name, False, _unreadable(f"Deployment {where}", deployment))
    if deployment is None:
        if lease_ok:
            return Check(
                name,
                True,
                f"no Deployment {where}: a manager runs elsewhere (it holds the leader Lease)",
            )
        if lease_unreadable:
            return Check(
                name,
                None,
                f"no Deployment {where}, and the leader Lease cannot be read (see leader "
                "Lease): whether a manager runs elsewhere is unknown",
            )
        return Check(
            name,
            False,
            f"no Deployment {where}, and no live leader Lease: no manager runs",
            INSTALL,
        )
    spec, status = spec_of(deployment), status_of(deployment)
    wanted = spec.get("replicas", 1)
    ready = int(status.get("readyReplicas") or 0)
    if wanted == 0:
        return Check(
            name,
            False,
            f"Deployment {where} is scaled to 0",
            f"kubectl -n {ns} scale deploy/{MANAGER_DEPLOYMENT} --replicas=1",
        )
    if ready < 1:
        return Check(
            name,
            False,
            f"Deployment {where}: 0/{wanted} replicas Ready",
            f"kubectl -n {ns} get pods -l {MANAGER_POD_SELECTOR}\n"
            f"kubectl -n {ns} rollout status deploy/{MANAGER_DEPLOYMENT}",
        )
    return Check(name, True, f"Deployment {where}: {ready}/{wanted} replicas Ready")


# --- all checks ---------------------------------------------------------------------------


def judge(facts: Facts) -> list[Check]:
    """Every check, in the order a new user installs things."""
    ns = facts.manager_namespace
    config = facts.config
    checks = [
        judge_crd(facts.crd, facts.groups_error, facts.group_count),
        judge_cert_manager(facts.cert_manager_crd, facts.certificate, facts.probe, ns),
        judge_webhook_configurations(facts.webhooks, ns),
        judge_probe(facts.probe, ns),
        judge_policies(facts.policies, facts.bindings),
    ]
    replicas = None
    if isinstance(facts.deployment, Mapping):
        replicas = spec_of(facts.deployment).get("replicas", 1)
    lease = judge_lease(facts.lease, config, facts.now, replicas)
    unreadable = isinstance(facts.lease, Unreadable)
    checks += [judge_manager(facts.deployment, ns, lease.ok, unreadable), lease]
    checks.append(judge_shared_nodes(facts.nodes))
    checks.append(judge_resource_slices(facts.slices, config))
    slices_by_node: dict[str, list[Obj]] = {}
    if isinstance(facts.slices, list) and config.resource_slices != "off":
        for s in facts.slices:
            if (n := node_of_slice(s)) is not None:
                slices_by_node.setdefault(n, []).append(s)
    nodes = [] if isinstance(facts.nodes, Unreadable) else facts.nodes
    for node in sorted((n for n in nodes if is_shared(n)), key=name_of):
        node_name = name_of(node)
        checks.append(judge_taint(node, holders=config.holders == "auto"))
        checks.append(judge_devices(node, slices_by_node.get(node_name, ()), config.dra_drivers))
        checks.append(
            judge_foreign(
                node,
                facts.pods.get(node_name, []),
                config.env_table,
                facts.manager_namespace,
                refused=facts.pods_refused,
                groups=facts.groups,
            )
        )
        env_vars = node_env_vars(node, slices_by_node.get(node_name, ()), config)
        checks.append(judge_delivery(node, config, facts.runtime_class, env_vars))
    checks.append(judge_runtime_class(config, facts.nodes, facts.runtime_class))
    checks.append(judge_holders(config, facts.nodes, facts.priority_class))
    if facts.records is not None:
        offers = {name_of(n): node_offers(n, slices_by_node.get(name_of(n), ())) for n in nodes}
        pods = [p for listed in facts.pods.values() if isinstance(listed, list) for p in listed]
        checks.append(judge_books(facts.records, facts.groups, offers, pods, facts))
    return checks


def judge_books(
    records: list[Obj] | Unreadable,
    groups: Sequence[Obj],
    offers: Mapping[str, Mapping[str, Offer]],
    pods: Sequence[Obj],
    facts: Facts,
) -> Check:
    """The ledger the manager builds from the same objects: no unreadable record, no device
    with two holders (groups, or a group and a pod the kubelet gave it), each group
    claimed on one node, each Bound status its claim."""
    name = "claim records"
    if isinstance(records, Unreadable):
        return Check(name, None, _unreadable("the claim records (ConfigMaps)", records))
    ns = facts.manager_namespace
    ledger = Ledger.from_objects(
        configmaps=records,
        groups=groups,
        offers=offers,
        pods=pods,
        namespace=ns,
        env_table=facts.config.env_table,
    )
    problems = [f"node {n}: {why}" for n, why in sorted(ledger.broken.items())]
    for node in sorted(set(ledger.records) | set(offers)):
        for (res, i), held in sorted(ledger.view(node).conflicts().items()):
            problems.append(f"node {node}: {res} {i} is held by {describe(held)}")
    if problems:
        return Check(
            name,
            False,
            f"{len(problems)} problem(s): " + "; ".join(problems[:MAX_NAMES_SHOWN]),
            f"kubectl -n {ns} get configmaps -l {RECORD_LABEL}={RECORD_LABEL_VALUE} -o yaml; "
            "sdg devices shows every holder",
        )
    stale = []
    for group in groups:
        gname = name_of(group)
        where = ledger.nodes_claiming(gname)
        if len(where) > 1:
            stale.append(f"{gname} is claimed on {', '.join(where)}")
        elif gname in ledger.statuses and ledger.claim_of(gname) != ledger.statuses[gname]:
            stale.append(f"{gname}'s status is not its claim (a bind or a restore in flight)")
    if stale:
        return Check(
            name,
            None,
            "; ".join(stale[:MAX_NAMES_SHOWN]),
            "run again in a minute: the manager repairs these; if they stay, sdg explain GROUP",
        )
    bound = sum(1 for g in groups if name_of(g) in ledger.statuses)
    # Without other namespaces' pods, devices the kubelet gave pods outside any group are
    # not in this ledger (the foreign-pods checks say what the manager reports of them).
    partial = "" if facts.pods_refused is None else " (pods of the manager's namespace only)"
    return Check(
        name,
        True,
        f"{len(ledger.records)} record(s), {bound} Bound group(s): one holder each{partial}",
    )


def exit_code(checks: Iterable[Check]) -> int:
    """1 when any check failed; warnings do not fail."""
    return 1 if any(c.ok is False for c in checks) else 0


def _minor_of(version: str) -> tuple[int, int] | None:
    """``v1.37.2-eks-1`` -> ``(1, 37)``."""
    m = re.match(r"v?(\d+)\.(\d+)", version.strip())
    return (int(m.group(1)), int(m.group(2))) if m else None


def judge_version(version: Fetched) -> Check:
    """The API server's version (GET /version) against what SDG needs."""
    name = "Kubernetes version"
    need = f"{MIN_KUBERNETES[0]}.{MIN_KUBERNETES[1]}"
    if isinstance(version, Unreadable):
        return Check(name, False, _unreadable("the server version (GET /version)", version))
    text = str((version or {}).get("gitVersion") or "")
    minor = _minor_of(text)
    if minor is None:
        return Check(name, None, f"the server reports no version SDG can read ({text!r})")
    if minor < MIN_KUBERNETES:
        return Check(
            name,
            False,
            f"{text}: SDG needs {need}+ (the pod webhook's matchConditions, "
            "ValidatingAdmissionPolicy v1)",
            f"upgrade the cluster to Kubernetes {need} or later",
        )
    dra = (
        "DRA's resource.k8s.io/v1 is served from 1.34"
        if minor >= DRA_V1_KUBERNETES
        else "no DRA resource.k8s.io/v1 before 1.34: devices come from annotations or counts"
    )
    return Check(name, True, f"{text} (SDG needs {need}+; {dra})")


def judge_pre_nodes(nodes: Sequence[Obj] | Unreadable) -> Check:
    """Which nodes are labelled shared; before install none yet is only a warning."""
    name = "shared nodes"
    if isinstance(nodes, Unreadable):
        return Check(name, False, _unreadable("nodes", nodes))
    shared = sorted(name_of(n) for n in nodes if is_shared(n))
    if shared:
        return Check(
            name,
            True,
            f"{len(shared)} of {len(nodes)} labelled {NODE_MODE_LABEL}={NODE_MODE_SHARED}: "
            f"{_names(shared)}",
        )
    with_devices = sorted(name_of(n) for n in nodes if node_offers(n))
    target = with_devices[0] if with_devices else "NODE"
    detail = f"none of {len(nodes)} node(s) is labelled {NODE_MODE_LABEL}={NODE_MODE_SHARED} yet"
    detail += (
        f"; shown below: the nodes with devices ({_names(with_devices)})"
        if with_devices
        else "; no node advertises devices"
    )
    return Check(
        name, None, detail, f"kubectl label node {target} {NODE_MODE_LABEL}={NODE_MODE_SHARED}"
    )


def judge_dra_drivers(
    slices: Sequence[Obj] | Unreadable | None, drivers: Mapping[str, str] = DEFAULT_DRA_DRIVERS
) -> Check:
    """DRA drivers publishing ResourceSlices: per driver its nodes and device counts (all
    devices published, MIG and partitions included; each node's devices check says what
    SDG hands out of them)."""
    name = "DRA drivers"
    if slices is None:
        return Check(name, True, "resource.k8s.io/v1 is not served: no DRA driver")
    if isinstance(slices, Unreadable):
        return Check(name, None, _unreadable("ResourceSlices", slices))
    counts: dict[str, dict[str, int]] = {}
    for s in slices:
        spec = spec_of(s)
        driver = str(spec.get("driver") or "?")
        node = node_of_slice(s) or "(no single node)"
        per = counts.setdefault(driver, {})
        per[node] = per.get(node, 0) + len([d for d in spec.get("devices") or () if d])
    if not counts:
        return Check(
            name, True, "no ResourceSlice: no DRA driver publishes devices (device plugins may)"
        )
    parts = []
    for driver in sorted(counts):
        nodes = [f"{n} {c}" for n, c in sorted(counts[driver].items())]
        used = (
            f" -> {drivers[driver]}" if driver in drivers else " (not read by SDG: --dra-drivers)"
        )
        parts.append(f"{driver}{used}: {_names(nodes)}")
    return Check(name, True, "devices per node: " + "; ".join(parts))


def _runtime_of(node: Obj) -> tuple[str, tuple[int, int] | None]:
    """(``containerd``, (2, 4)) from ``status.nodeInfo.containerRuntimeVersion``."""
    text = str((status_of(node).get("nodeInfo") or {}).get("containerRuntimeVersion") or "")
    kind, _, version = text.partition("://")
    return kind, _minor_of(version)


def judge_runtime(node: Obj) -> Check:
    """The node's kubelet and runtime, and the runtime handlers it reports (delivery auto
    finds RuntimeClass handlers only there)."""
    node_name = name_of(node)
    name = f"node {node_name}: runtime"
    info = status_of(node).get("nodeInfo") or {}
    runtime = str(info.get("containerRuntimeVersion") or "unknown runtime")
    kubelet = str(info.get("kubeletVersion") or "unknown")
    handlers = runtime_handlers(node)
    shown = ", ".join(h or '"" (default)' for h in handlers)
    base = f"{runtime}, kubelet {kubelet}"
    if handlers:
        return Check(name, True, f"{base}; status.runtimeHandlers: {shown}")
    return Check(
        name,
        None,
        f"{base}; no status.runtimeHandlers (containerd before 2.0 and older kubelets report "
        "none): delivery auto cannot see a RuntimeClass handler such as nvidia here",
        f"kubectl label node {node_name} {DELIVERY_LABEL}=runtimeclass   (where NVIDIA's "
        "runtime runs only under RuntimeClass nvidia)",
    )


_NOT_VISIBLE: Final = (
    "not visible from the API: the CDI specs (nvidia-ctk cdi generate, amd-ctk cdi generate) "
    "and whether NRI's device-injector plugin runs"
)


def judge_cdi_nri(node: Obj, slices: Sequence[Obj] = ()) -> Check:
    """CDI and NRI as far as the API shows them: the runtime's version (its defaults) and
    DRA drivers on the node (they hand devices over as CDI). Delivery ``cdi`` (the node
    label) needs both and the device-injector, which no API shows."""
    node_name = name_of(node)
    name = f"node {node_name}: CDI/NRI"
    kind, version = _runtime_of(node)
    wants_cdi = node_labels(node).get(DELIVERY_LABEL) == DELIVERY_CDI
    ok: bool | None = True
    if kind == "containerd" and version is not None:
        if version >= (2, 0):
            said = "containerd 2.x: CDI and NRI are on by default"
        elif version >= (1, 7):
            said = (
                'containerd 1.7: CDI (enable_cdi) and NRI ([plugins."io.containerd.nri.v1.nri"] '
                "disable = false) are off by default"
            )
            ok = None if wants_cdi else True
        else:
            said = f"containerd {version[0]}.{version[1]}: no CDI, no NRI"
            ok = not wants_cdi
    elif kind == "cri-o":
        said = "CRI-O: CDI on (1.23+); NRI from 1.26 (enable_nri)"
    elif kind == "docker":
        said = "Docker (cri-dockerd): no NRI"
        ok = not wants_cdi
    else:
        said = f"runtime {kind or 'unknown'}: its CDI/NRI support is not known to SDG"
        ok = None if wants_cdi else True
    if any(node_of_slice(s) == node_name for s in slices):
        said += (
            "; a DRA driver publishes devices here, so CDI works (DRA hands devices over as CDI)"
        )
    use = (
        f"labelled {DELIVERY_LABEL}={DELIVERY_CDI}: needs CDI, NRI and the device-injector"
        if wants_cdi
        else f"needed only for delivery {DELIVERY_CDI}"
    )
    fix = ""
    if ok is not True:
        fix = (
            "enable CDI and NRI in the runtime and run NRI's device-injector there, or\n"
            f"kubectl label node {node_name} {DELIVERY_LABEL}=<env|runtimeclass> --overwrite"
        )
    return Check(
        name, ok, f"{said}; {use}; {_NOT_VISIBLE} (sdg doctor --probe shows what pods get)", fix
    )


def judge_pre(facts: PreFacts) -> list[Check]:
    """Every --pre check: the cluster, then per shared node (or, before any is labelled,
    per node with devices), then the RuntimeClass."""
    config = facts.config
    checks = [
        judge_version(facts.version),
        judge_pre_nodes(facts.nodes),
        judge_dra_drivers(facts.slices, config.dra_drivers),
    ]
    nodes = [] if isinstance(facts.nodes, Unreadable) else facts.nodes
    slices = facts.slices if isinstance(facts.slices, list) else []
    by_node: dict[str, list[Obj]] = {}
    for s in slices:
        if (n := node_of_slice(s)) is not None:
            by_node.setdefault(n, []).append(s)
    shown = [n for n in nodes if is_shared(n)] or [
        n for n in nodes if node_offers(n, by_node.get(name_of(n), ()), config.dra_drivers)
    ]
    shown.sort(key=name_of)
    for node in shown[:MAX_PRE_NODES]:
        own = by_node.get(name_of(node), [])
        checks.append(judge_runtime(node))
        checks.append(judge_cdi_nri(node, own))
        checks.append(judge_devices(node, own, config.dra_drivers))
        checks.append(
            judge_delivery(node, config, facts.runtime_class, node_env_vars(node, own, config))
        )
    if len(shown) > MAX_PRE_NODES:
        checks.append(
            Check(
                "more nodes",
                None,
                f"{len(shown) - MAX_PRE_NODES} more node(s) not checked one by one",
                "sdg doctor --pre checks the first "
                f"{MAX_PRE_NODES} by name; label fewer, or check those after install",
            )
        )
    checks.append(judge_runtime_class(config, facts.nodes, facts.runtime_class))
    return checks

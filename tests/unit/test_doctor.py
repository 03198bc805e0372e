"""``sdg doctor``'s judges on hand-made objects: every verdict, its detail and its fix.

The names doctor looks for are proven to be the ones config/ installs, and the probe's
"reached SDG" test is proven against the pod webhook's own denial text, so neither can
drift silently. The real API server's answers are in tests/e2e/test_doctor.py.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from api.constants import LEASE_NAME, MANAGER_NAMESPACE
from cli import main as cli
from cli.doctor.collect import manager_config, manager_flags
from cli.doctor.facts import (
    CERT_MANAGER_INSTALL,
    CRD_NAME,
    MANAGER_CONTAINER,
    MANAGER_DEPLOYMENT,
    MANAGER_POD_SELECTOR,
    POLICIES,
    SERVING_CERTIFICATE,
    WEBHOOK_CONFIGURATIONS,
    WEBHOOK_SERVICE,
    Check,
    Facts,
    ManagerConfig,
    Probe,
    Unreadable,
)
from cli.doctor.judge import (
    exit_code,
    judge,
    judge_books,
    judge_cert_manager,
    judge_crd,
    judge_delivery,
    judge_devices,
    judge_foreign,
    judge_holders,
    judge_lease,
    judge_manager,
    judge_policies,
    judge_probe,
    judge_resource_slices,
    judge_runtime_class,
    judge_shared_nodes,
    judge_taint,
    judge_webhook_configurations,
    node_env_vars,
    probe_pod,
    probe_reached_sdg,
)
from cli.doctor.render import render_json, render_text
from controllers.inventory import node_offers
from controllers.settings import Settings
from tests import factories
from tests.factories import GPU, resource_slice
from webhooks.injection import Denial, build_injection

ROOT = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
TAINT = {"key": "deviceshare.io/mode", "value": "shared", "effect": "NoSchedule"}
Obj = dict[str, Any]


def docs(*parts: str) -> list[Obj]:
    out: list[Obj] = []
    for path in sorted((ROOT / "config").joinpath(*parts).glob("*.yaml")):
        out += [x for x in yaml.safe_load_all(path.read_text()) if x]
    return out


def node(
    name: str,
    gpus: int = 0,
    *,
    shared: bool = True,
    taints: list[Obj] | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
) -> Obj:
    """A node as doctor reads it: ``gpus`` allocatable, no conditions (doctor reads none)."""
    return factories.node(
        name,
        {GPU: gpus} if gpus else None,
        shared=shared,
        taints=taints,
        labels=labels,
        annotations=annotations or {},
        allocatable={"cpu": "8", "memory": "32Gi"},
        ready=None,
    )


def pod(
    name: str,
    node_name: str | None = "gpu-1",
    *,
    env: dict[str, str] | None = None,
    group: str | None = None,
    ns: str = "ml",
    phase: str = "Running",
) -> Obj:
    """A running pod on gpu-1 in ml, its scheduler left unset (doctor does not read it)."""
    return factories.pod(
        name,
        group,
        namespace=ns,
        node=node_name,
        phase=phase,
        env=env,
        containers=("c",),
        image="cuda",
        scheduler=None,
    )


def crd(established: str = "True", served: bool = True) -> Obj:
    return {
        "spec": {"versions": [{"name": "v1alpha1", "served": served, "storage": True}]},
        "status": {
            "conditions": [
                {"type": "NamesAccepted", "status": "True"},
                {"type": "Established", "status": established, "reason": "Installing"},
            ]
        },
    }


def webhook_config(name: str, hook: str, ca: bool = True) -> Obj:
    client_config = {"caBundle": "Q0E="} if ca else {"service": {"name": "x"}}
    return {"metadata": {"name": name}, "webhooks": [{"name": hook, "clientConfig": client_config}]}


def all_webhooks(ca: bool = True) -> dict[str, Any]:
    return {
        "deviceshare-mutating-webhook-configuration": webhook_config(
            "deviceshare-mutating-webhook-configuration", "mpod.deviceshare.io", ca
        ),
        "deviceshare-validating-webhook-configuration": webhook_config(
            "deviceshare-validating-webhook-configuration", "vsdg.deviceshare.io", ca
        ),
    }


def sdg_denial(group: str) -> str:
    """What the API server answers when SDG's pod webhook denies the probe."""
    verdict = build_injection(probe_pod(group), None)
    assert isinstance(verdict, Denial)
    return f'admission webhook "mpod.deviceshare.io" denied the request: {verdict.message}'


REACHED = Probe("sdg-doctor-probe-1", "default", False, 403, sdg_denial("sdg-doctor-probe-1"))
ADMITTED = Probe("sdg-doctor-probe-1", "default", True)
UNREACHABLE = Probe(
    "sdg-doctor-probe-1",
    "default",
    False,
    500,
    'Internal error occurred: failed calling webhook "mpod.deviceshare.io": failed to call '
    'webhook: Post "https://deviceshare-webhook-service.deviceshare-system.svc:443/'
    'mutate-v1-pod?timeout=10s": dial tcp 10.0.0.7:443: connect: connection refused',
)


def lease(holder: str = "mgr-1", renewed: datetime = NOW, seconds: int = 15) -> Obj:
    return {
        "spec": {
            "holderIdentity": holder,
            "leaseDurationSeconds": seconds,
            "renewTime": renewed.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        }
    }


def deployment(
    args: list[str] | None = None,
    env: list[Obj] | None = None,
    *,
    replicas: int = 1,
    ready: int = 1,
    command: list[str] | None = None,
) -> Obj:
    container: Obj = {"name": "manager", "args": args or [], "env": env or []}
    if command:
        container["command"] = command
    return {
        "metadata": {"name": "deviceshare-manager", "namespace": "deviceshare-system"},
        "spec": {"replicas": replicas, "template": {"spec": {"containers": [container]}}},
        "status": {"readyReplicas": ready},
    }


# --- the names doctor looks for are config/'s ------------------------------------------------


def test_names_match_config() -> None:
    hooks = {x["kind"]: x["metadata"]["name"] for x in docs("webhook") if "webhooks" in x}
    assert hooks == dict(WEBHOOK_CONFIGURATIONS)
    service = next(x for x in docs("webhook") if x["kind"] == "Service")
    assert service["metadata"]["name"] == WEBHOOK_SERVICE
    policy_docs = docs("policy")
    for kind in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"):
        names = sorted(x["metadata"]["name"] for x in policy_docs if x["kind"] == kind)
        assert names == sorted(POLICIES)
    manager = next(x for x in docs("manager") if x["kind"] == "Deployment")
    assert (manager["metadata"]["name"], manager["metadata"]["namespace"]) == (
        MANAGER_DEPLOYMENT,
        MANAGER_NAMESPACE,
    )
    key, _, value = MANAGER_POD_SELECTOR.partition("=")
    assert manager["spec"]["template"]["metadata"]["labels"][key] == value
    assert manager["spec"]["template"]["spec"]["containers"][0]["name"] == MANAGER_CONTAINER
    cert = next(x for x in docs("certmanager") if x["kind"] == "Certificate")
    assert cert["metadata"]["name"] == SERVING_CERTIFICATE
    assert cert["spec"]["privateKey"]["algorithm"] == "ECDSA"  # as the chart's
    # The Lease config/'s manager takes (Settings() defaults to LEASE_NAME by definition,
    # so comparing those could not fail): a --leader-election-id there breaks this.
    assert manager_config(manager, MANAGER_NAMESPACE).lease_name == LEASE_NAME
    crd_doc = docs("crd")[0]
    assert crd_doc["metadata"]["name"] == CRD_NAME


def test_doctor_expects_the_manager_defaults_without_a_deployment() -> None:
    """A manager doctor cannot read (no Deployment) is judged by the manager's own
    defaults, except the Lease, which config/ turns on."""
    config = manager_config(None, "deviceshare-system")
    defaults = Settings()
    assert (config.delivery, config.runtime_class_name, config.device_ids) == (
        defaults.delivery,
        defaults.runtime_class_name,
        defaults.device_ids,
    )
    assert (config.lease_name, config.resource_slices, config.holders) == (
        defaults.leader_election_id,
        defaults.resource_slices,
        defaults.holders,
    )
    assert config.holder_priority_class == defaults.holder_priority_class
    assert config.leader_elect is True


def test_config_manager_runs_with_leader_election() -> None:
    manager = next(x for x in docs("manager") if x["kind"] == "Deployment")
    config = manager_config(manager, "deviceshare-system")
    assert config.leader_elect is True
    assert (config.lease_namespace, config.lease_name) == (
        "deviceshare-system",
        "deviceshare-manager",
    )
    assert (config.delivery, config.device_ids) == ("auto", "auto")  # config/ sets neither
    assert config.source == "Deployment deviceshare-system/deviceshare-manager"


# --- manager settings from the Deployment --------------------------------------------------


def test_manager_flags_forms_and_precedence() -> None:
    dep = deployment(
        ["--leader-elect", "--delivery", "runtimeclass", "--device-env=x.com/acc=X_DEVICES"],
        [
            {"name": "SDG_DELIVERY", "value": "cdi"},
            {"name": "SDG_RUNTIME_CLASS_NAME", "value": "nvidia-cdi"},
            {"name": "SDG_CLAIMS_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "x"}}},
            {"name": "POD_NAMESPACE", "value": "ignored"},
        ],
        command=["sdg-manager", "--leader-election-id=sdg-lease"],
    )
    flags = manager_flags(dep)
    assert flags == {
        "delivery": "runtimeclass",  # the flag wins over SDG_DELIVERY
        "runtime_class_name": "nvidia-cdi",  # env, no flag
        "leader_elect": True,
        "leader_election_id": "sdg-lease",
        "device_env": ["x.com/acc=X_DEVICES"],
    }
    config = manager_config(dep, "sdg")
    assert config.env_table["x.com/acc"] == "X_DEVICES"
    assert config.env_table[GPU] == "NVIDIA_VISIBLE_DEVICES"
    assert (config.lease_name, config.lease_namespace) == ("sdg-lease", "sdg")


def test_manager_flags_no_leader_elect_and_env_bool() -> None:
    assert manager_flags(deployment(["--no-leader-elect"]))["leader_elect"] is False
    assert manager_flags(deployment(["--leader-elect=false"]))["leader_elect"] is False
    env = [{"name": "SDG_LEADER_ELECT", "value": "true"}]
    assert manager_flags(deployment([], env))["leader_elect"] is True
    # the manager's default is off: a Deployment that does not ask for it has none
    assert manager_config(deployment([]), "ns").leader_elect is False


def test_manager_flags_are_read_as_the_manager_reads_them() -> None:
    """Doctor reads the Deployment with the manager's own flag parser: words and flags the
    manager does not know are skipped, a dangling flag leaves the environment's value."""
    dep = deployment(["--zap-devel", "stray", "--holders", "off", "--metrics-secure"])
    assert manager_flags(dep) == {"holders": "off", "metrics_secure": True}
    env = [{"name": "SDG_DELIVERY", "value": "cdi"}]
    assert manager_flags(deployment(["--delivery"], env)) == {"delivery": "cdi"}


def test_manager_config_without_deployment_and_doctor_overrides() -> None:
    config = manager_config(None, "sdg-ns")
    assert (config.leader_elect, config.lease_namespace, config.source) == (
        True,
        "sdg-ns",
        "defaults",
    )
    assert (config.delivery, config.runtime_class_name) == ("auto", "nvidia")
    over = manager_config(
        deployment(["--delivery=env"]), "ns", delivery="runtimeclass", runtime_class_name="rc"
    )
    assert (over.delivery, over.runtime_class_name) == ("runtimeclass", "rc")
    assert over.delivery_source == "sdg doctor --delivery"
    lease_ns = manager_config(deployment(["--leader-election-namespace", "other"]), "ns")
    assert lease_ns.lease_namespace == "other"
    drivers = manager_config(deployment(["--dra-drivers=gpu.example.com=example.com/gpu"]), "n")
    assert drivers.dra_drivers["gpu.example.com"] == "example.com/gpu"


# --- CRD, webhooks, policies, cert-manager ------------------------------------------------


def test_crd() -> None:
    assert judge_crd(crd(), None, 3) == Check(
        "CRD",
        True,
        "shareddevicegroups.deviceshare.io Established, deviceshare.io/v1alpha1 served "
        "(3 group(s))",
    )
    missing = judge_crd(None)
    assert (missing.ok, missing.fix) == (False, "kubectl apply -k config/default")
    assert "is not installed" in missing.detail
    assert judge_crd(crd(established="False")).detail == (
        "shareddevicegroups.deviceshare.io: not Established (Installing)"
    )
    assert "version v1alpha1 is not served" in judge_crd(crd(served=False)).detail
    broken = judge_crd(crd(), "503 ServiceUnavailable the server is currently unable")
    assert broken.ok is False
    assert "listing shareddevicegroups fails: 503" in broken.detail
    assert judge_crd(Unreadable("403 Forbidden nope")).detail == (
        "cannot read CRD shareddevicegroups.deviceshare.io: 403 Forbidden nope"
    )


def test_webhook_configurations() -> None:
    ok = judge_webhook_configurations(all_webhooks())
    assert ok.ok is True
    assert ok.detail == (
        "registered: deviceshare-mutating-webhook-configuration (mpod.deviceshare.io), "
        "deviceshare-validating-webhook-configuration (vsdg.deviceshare.io)"
    )
    hooks = all_webhooks()
    hooks["deviceshare-mutating-webhook-configuration"] = None
    missing = judge_webhook_configurations(hooks)
    assert (missing.ok, missing.fix) == (False, "kubectl apply -k config/default")
    assert missing.detail == (
        "not registered: MutatingWebhookConfiguration deviceshare-mutating-webhook-configuration"
    )
    no_ca = judge_webhook_configurations(all_webhooks(ca=False))
    assert no_ca.ok is None
    assert "without a caBundle" in no_ca.detail
    assert (
        no_ca.fix == "kubectl -n deviceshare-system describe certificate deviceshare-serving-cert"
    )
    hooks = all_webhooks()
    hooks["deviceshare-validating-webhook-configuration"] = Unreadable("403 Forbidden no")
    assert judge_webhook_configurations(hooks).ok is False


def test_probe_pod_names_the_group_and_is_restricted() -> None:
    p = probe_pod("sdg-doctor-probe-x")
    assert p["metadata"] == {
        "name": "sdg-doctor-probe-x",
        "annotations": {"deviceshare.io/group": "sdg-doctor-probe-x"},
    }
    c = p["spec"]["containers"][0]
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["resources"]["limits"] and p["spec"]["securityContext"]["runAsNonRoot"]


def test_probe_reached_sdg_only_on_its_own_verdict() -> None:
    assert probe_reached_sdg(REACHED)
    assert not probe_reached_sdg(ADMITTED)
    assert not probe_reached_sdg(UNREACHABLE)
    other_group = Probe("sdg-doctor-probe-2", "default", False, 403, REACHED.message)
    assert not probe_reached_sdg(other_group)


def test_judge_probe() -> None:
    ok = judge_probe(REACHED, "deviceshare-system")
    assert ok == Check(
        "pod webhook",
        True,
        "reachable: a dry-run pod in default naming the missing group sdg-doctor-probe-1 was "
        "denied by SDG",
    )
    admitted = judge_probe(ADMITTED, "deviceshare-system")
    assert (admitted.ok, admitted.fix) == (False, "kubectl apply -k config/default")
    assert "was admitted: SDG's pod webhook is not registered" in admitted.detail
    down = judge_probe(UNREACHABLE, "sdg")
    assert down.ok is False
    assert down.detail.startswith("registered, but the API server cannot call it: Internal")
    assert "connect: connection refused" in down.detail
    assert down.fix.splitlines() == [
        "kubectl -n sdg rollout status deploy/deviceshare-manager",
        "kubectl -n sdg get endpointslices -l "
        "kubernetes.io/service-name=deviceshare-webhook-service",
    ]
    x509 = Probe(
        "p",
        "default",
        False,
        500,
        'failed calling webhook "mpod.deviceshare.io": tls: failed to verify certificate: '
        "x509: certificate signed by unknown authority",
    )
    assert judge_probe(x509, "sdg").fix.splitlines()[-1] == (
        "kubectl -n sdg describe certificate deviceshare-serving-cert"
    )
    rbac = Probe(
        "p",
        "team",
        False,
        403,
        'pods is forbidden: User "bob" cannot create resource "pods" in API group "" in the '
        'namespace "team"',
    )
    forbidden = judge_probe(rbac, "sdg")
    assert forbidden.ok is None
    assert forbidden.detail.startswith("cannot dry-run a pod in namespace team")
    quota = Probe("p", "team", False, 422, 'Pod "p" is invalid: spec.containers: Required value')
    refused = judge_probe(quota, "sdg")
    assert refused.ok is False
    assert "refused, but not by SDG's verdict" in refused.detail
    pss = Probe("p", "team", False, 403, 'pods "p" is forbidden: violates PodSecurity "x"')
    assert judge_probe(pss, "sdg").ok is False
    assert judge_probe(Unreadable("boom"), "sdg").ok is False


def test_policies() -> None:
    present = {p: {"metadata": {"name": p}} for p in POLICIES}
    assert judge_policies(present, present).ok is True
    bindings = {**present, "deviceshare-group-membership": None}
    missing = judge_policies(present, bindings)
    assert missing.ok is False
    assert missing.detail.startswith(
        "missing: ValidatingAdmissionPolicyBinding deviceshare-group-membership "
    )
    assert missing.fix.startswith("kubectl apply -k config/default")


@pytest.mark.parametrize(
    ("cm_crd", "cert", "probe", "ok", "needle"),
    [
        (None, None, REACHED, None, "the webhook answers, so its certificate comes from elsewhere"),
        (None, None, UNREACHABLE, False, "and the webhook cannot be called"),
        (None, None, ADMITTED, None, "install it before applying it"),
        (
            {},
            {"status": {"conditions": [{"type": "Ready", "status": "True"}]}},
            REACHED,
            True,
            "Ready",
        ),
        (
            {},
            {"status": {"conditions": [{"type": "Ready", "status": "False", "message": "no CA"}]}},
            UNREACHABLE,
            False,
            "is not Ready: no CA",
        ),
        ({}, None, REACHED, True, "the webhook's comes from elsewhere"),
        ({}, None, UNREACHABLE, False, "there is no Certificate deviceshare-system/"),
        (
            {},
            None,
            ADMITTED,
            None,
            "no Certificate deviceshare-system/deviceshare-serving-cert yet",
        ),
    ],
)
def test_cert_manager(
    cm_crd: Obj | None, cert: Obj | None, probe: Probe, ok: bool | None, needle: str
) -> None:
    check = judge_cert_manager(cm_crd, cert, probe, "deviceshare-system")
    assert check.ok is ok
    assert needle in check.detail
    if ok is not True:
        assert check.fix


def test_cert_manager_missing_fix_installs_it() -> None:
    check = judge_cert_manager(None, None, UNREACHABLE, "deviceshare-system")
    assert check.fix.splitlines() == [CERT_MANAGER_INSTALL, "kubectl apply -k config/default"]


# --- nodes ------------------------------------------------------------------------------------


def test_shared_nodes() -> None:
    assert judge_shared_nodes([node("a", 1), node("b", shared=False)]) == Check(
        "shared nodes", True, "1 labelled deviceshare.io/mode=shared: a"
    )
    none = judge_shared_nodes([node("cpu", shared=False), node("gpu-7", 2, shared=False)])
    assert none.ok is False
    assert none.detail.endswith("every group stays Pending; nodes with devices: gpu-7")
    assert none.fix == "kubectl label node gpu-7 deviceshare.io/mode=shared"
    assert judge_shared_nodes([]).fix == "kubectl label node NODE deviceshare.io/mode=shared"
    assert judge_shared_nodes(Unreadable("403 x")).ok is False


def test_taint() -> None:
    assert judge_taint(node("a", taints=[TAINT])) == Check(
        "node a: taint", True, "tainted deviceshare.io/mode=shared:NoSchedule"
    )
    untainted = judge_taint(node("a", taints=[{"key": "other", "effect": "NoSchedule"}]))
    assert untainted == Check(
        "node a: taint",
        False,
        "not tainted deviceshare.io/mode=shared:NoSchedule: pods outside any group can be "
        "scheduled here and use its devices unseen",
        "kubectl taint node a deviceshare.io/mode=shared:NoSchedule",
    )
    # Group pods tolerate the shared taint with every effect: NoExecute also keeps others off.
    no_execute = judge_taint(node("a", taints=[{**TAINT, "effect": "NoExecute"}]))
    assert no_execute.ok is True
    other_value = judge_taint(node("a", taints=[{**TAINT, "value": "yes"}]))
    assert other_value.ok is False
    assert other_value.detail.startswith("tainted deviceshare.io/mode=yes:NoSchedule, not ")
    assert other_value.fix.splitlines() == [
        "kubectl taint node a deviceshare.io/mode-",
        "kubectl taint node a deviceshare.io/mode=shared:NoSchedule",
    ]


def test_devices_sources() -> None:
    from_slice = judge_devices(node("a", 2), [resource_slice("a", 4)])
    assert from_slice == Check(
        "node a: devices", True, "nvidia.com/gpu: 4 from ResourceSlice (0-3)"
    )
    annotated = node(
        "a", 2, annotations={"deviceshare.io/devices.nvidia.com_gpu": "0=G0,1=G1:unhealthy,3=G3"}
    )
    assert judge_devices(annotated) == Check(
        "node a: devices", True, "nvidia.com/gpu: 2 from annotation (0,3), unhealthy 1"
    )
    counted = judge_devices(node("a", 3))
    assert counted.ok is None
    assert counted.detail == "nvidia.com/gpu: 3 from count (0-2), IDs are guessed from a count"
    assert counted.fix.splitlines()[0].startswith(
        'kubectl annotate node a deviceshare.io/devices.nvidia.com_gpu="$(nvidia-smi '
    )
    # a slice of an unknown driver is not an inventory source
    assert (
        judge_devices(node("a", 3), [resource_slice("a", 4, driver="gpu.example.com")]).ok is None
    )
    drivers = {"gpu.example.com": "example.com/gpu"}
    other = judge_devices(node("a"), [resource_slice("a", 2, driver="gpu.example.com")], drivers)
    assert other.detail == "example.com/gpu: 2 from ResourceSlice (0-1)"


def test_devices_problems() -> None:
    none = judge_devices(node("a"))
    assert none.ok is False
    assert none.detail.startswith("advertises no devices")
    malformed = node("a", annotations={"deviceshare.io/devices.nvidia.com_gpu": "0=G0,0=G1"})
    bad = judge_devices(malformed)
    assert bad.ok is False
    assert "nvidia.com/gpu: 0 from annotation, node annotation" in bad.detail
    huge = {"metadata": {"name": "a"}, "status": {"allocatable": {"example.com/mem": "4096"}}}
    over = judge_devices(huge)
    assert over.ok is False
    assert (
        over.detail == "example.com/mem: advertises 4096, more than SDG addresses, so offers none"
    )


def test_resource_slices() -> None:
    config = ManagerConfig()
    assert judge_resource_slices(None, config).detail.startswith(
        "resource.k8s.io/v1 is not served (Kubernetes 1.34+): skipped"
    )
    served = judge_resource_slices(
        [resource_slice("a", 1), resource_slice("b", 1, driver="x.io")], config
    )
    assert served == Check(
        "ResourceSlices", True, "resource.k8s.io/v1 served: 1 of a known driver on a (2 in all)"
    )
    assert judge_resource_slices(Unreadable("403 no"), config).ok is None
    off = ManagerConfig(resource_slices="off")
    assert "--resource-slices=off" in judge_resource_slices([], off).detail


def test_foreign_pods() -> None:
    n = node("gpu-1", 2, taints=[TAINT])
    member = pod("member", env={"NVIDIA_VISIBLE_DEVICES": "0,1"}, group="g")
    quiet = pod("quiet", env={"NVIDIA_VISIBLE_DEVICES": "void"})
    done = pod("done", env={"NVIDIA_VISIBLE_DEVICES": "all"}, phase="Succeeded")
    assert judge_foreign(n, [member, quiet, done]) == Check(
        "node gpu-1: foreign device pods", True, "none"
    )
    thief = pod("thief", env={"NVIDIA_VISIBLE_DEVICES": "all"})
    check = judge_foreign(n, [member, thief])
    assert check == Check(
        "node gpu-1: foreign device pods",
        False,
        "1 pod(s) outside any group use devices here: ml/thief (sets NVIDIA_VISIBLE_DEVICES); "
        "SDG hands out no more of them here",
        "kubectl delete pod -n ml thief   (or run them on a node that is not shared)",
    )


def test_foreign_pods_cut_at_five_and_taint_fix_on_untainted_node() -> None:
    n = node("gpu-1", 2)
    thieves = [pod(f"t{i}", env={"NVIDIA_VISIBLE_DEVICES": "all"}) for i in range(7)]
    check = judge_foreign(n, thieves)
    assert check.detail.startswith("7 pod(s) outside any group use devices here: ml/t0 (")
    assert "ml/t4 (sets NVIDIA_VISIBLE_DEVICES) + 2 more;" in check.detail
    fix = check.fix.splitlines()
    assert fix[:5] == [f"kubectl delete pod -n ml t{i}" for i in range(4)] + [
        "kubectl delete pod -n ml t4   (or run them on a node that is not shared)"
    ]
    assert fix[5] == (
        "kubectl taint node gpu-1 deviceshare.io/mode=shared:NoSchedule   (keeps new ones off)"
    )
    assert len(fix) == 6
    assert judge_foreign(n, Unreadable("403 no")).ok is False


def test_runtime_class() -> None:
    nodes = [node("a"), node("b", labels={"deviceshare.io/delivery": "runtimeclass"}, shared=False)]
    assert judge_runtime_class(ManagerConfig(delivery="env"), nodes, None) == Check(
        "RuntimeClass",
        True,
        "not needed (delivery env; no shared node labelled deviceshare.io/delivery=runtimeclass)",
    )
    # auto (the default) looks for it: missing is fine, present names the nodes it is for.
    assert judge_runtime_class(ManagerConfig(), nodes, None) == Check(
        "RuntimeClass",
        True,
        "RuntimeClass nvidia does not exist, so delivery auto chooses it on no node",
    )
    runs = [with_handlers(node("a"), "", "nvidia"), node("c")]
    assert judge_runtime_class(ManagerConfig(), runs, {"handler": "nvidia"}) == Check(
        "RuntimeClass",
        True,
        "RuntimeClass nvidia (handler nvidia) exists; delivery auto chooses it where the node "
        "lists handler nvidia in status.runtimeHandlers: node(s) a",
    )
    assert judge_runtime_class(ManagerConfig(), runs, Unreadable("403 no")).ok is None
    by_manager = ManagerConfig(
        delivery="runtimeclass", source="Deployment s/m", delivery_source="Deployment s/m"
    )
    missing = judge_runtime_class(by_manager, nodes, None)
    assert missing.ok is False
    assert missing.detail == (
        "RuntimeClass nvidia does not exist, but the manager (delivery runtimeclass: "
        "Deployment s/m) deliver devices through it: group pods naming it are refused"
    )
    assert missing.fix.startswith(
        'kubectl apply -f - <<< \'{"apiVersion":"node.k8s.io/v1","kind":"RuntimeClass",'
        '"metadata":{"name":"nvidia"},"handler":"nvidia"}\''
    )
    labelled = [node("c", labels={"deviceshare.io/delivery": "runtimeclass"})]
    by_node = judge_runtime_class(ManagerConfig(runtime_class_name="rc"), labelled, None)
    assert "but node(s) c (deviceshare.io/delivery=runtimeclass)" in by_node.detail
    present = judge_runtime_class(by_manager, labelled, {"handler": "nvidia"})
    assert present.ok is True
    assert present.detail.startswith("RuntimeClass nvidia (handler nvidia) exists, for the manager")
    assert judge_runtime_class(by_manager, nodes, Unreadable("403")).ok is False


def with_handlers(n: Obj, *handlers: str) -> Obj:
    n["status"]["runtimeHandlers"] = [{"name": h} for h in handlers]
    return n


def test_delivery_per_node_by_the_webhooks_rule() -> None:
    """The choice and its reason per shared node; unverified env is a warning naming what
    settles it, a label SDG cannot read a failure."""
    config = ManagerConfig()
    rc = {"metadata": {"name": "nvidia"}, "handler": "nvidia"}
    runs = with_handlers(node("k3s-1", 2), "", "nvidia")
    assert judge_delivery(runs, config, rc) == Check(
        "node k3s-1: delivery",
        True,
        "runtimeclass (RuntimeClass nvidia exists and node k3s-1 lists its handler nvidia in "
        "status.runtimeHandlers)",
    )
    bare = judge_delivery(node("gpu-1", 2), config, None)
    assert bare.ok is None
    assert bare.detail.startswith(
        "env, unverified: nothing tells how node gpu-1's runtime takes devices (no "
        "RuntimeClass nvidia; no label deviceshare.io/default-runtime; no label "
        "deviceshare.io/delivery)"
    )
    assert bare.fix.startswith(
        "if NVIDIA's runtime is the node's default runtime, kubectl label node gpu-1 "
        "deviceshare.io/default-runtime=nvidia"
    )
    labelled = node("gpu-2", 2, labels={"deviceshare.io/default-runtime": "nvidia"})
    assert judge_delivery(labelled, config, None).ok is True
    bad = judge_delivery(node("x", labels={"deviceshare.io/delivery": "docker"}), config, None)
    assert bad.ok is False
    assert "has label deviceshare.io/delivery='docker'" in bad.detail
    # The manager's own mode is verified by its operator; AMD is judged for AMD.
    assert judge_delivery(node("gpu-1", 2), ManagerConfig(delivery="env"), None).ok is True
    amd = node("amd-1", labels={})
    amd["status"]["allocatable"]["amd.com/gpu"] = "2"
    env_vars = node_env_vars(amd, (), config)
    assert env_vars == ["AMD_VISIBLE_DEVICES"]
    check = judge_delivery(with_handlers(amd, "nvidia"), config, rc, env_vars)
    assert check.ok is None
    assert "deviceshare.io/delivery=cdi" in check.fix
    # A RuntimeClass doctor may not read: the choice cannot be told.
    assert judge_delivery(runs, config, Unreadable("403 no")).ok is None


# --- the manager ------------------------------------------------------------------------------


def test_lease() -> None:
    config = ManagerConfig()
    fresh = judge_lease(lease(renewed=NOW - timedelta(seconds=4)), config, NOW)
    assert fresh == Check("leader Lease", True, "held by mgr-1, renewed 4s ago (lasts 15s)")
    stale = judge_lease(lease(renewed=NOW - timedelta(seconds=90)), config, NOW)
    assert stale.ok is False
    assert "last renewed 90s ago (it lasts 15s)" in stale.detail
    assert stale.fix == "kubectl -n deviceshare-system logs deploy/deviceshare-manager"
    # a leader's clock ahead of ours is not "stale"
    assert judge_lease(lease(renewed=NOW + timedelta(seconds=3)), config, NOW).ok is True
    released = judge_lease(lease(holder=""), config, NOW)
    assert (
        released.detail
        == "Lease deviceshare-system/deviceshare-manager was released and nobody took it over"
    )
    missing = judge_lease(None, config, NOW)
    assert missing.ok is False
    assert missing.detail.startswith("no Lease deviceshare-system/deviceshare-manager")
    no_time = {"spec": {"holderIdentity": "x"}}
    assert judge_lease(no_time, config, NOW).ok is False


def test_lease_without_leader_election() -> None:
    off = ManagerConfig(leader_elect=False, source="Deployment s/m")
    assert judge_lease(None, off, NOW, replicas=1) == Check(
        "leader Lease", True, "not used: leader election is off (Deployment s/m)"
    )
    racing = judge_lease(None, off, NOW, replicas=2)
    assert racing.ok is None
    assert "with 2 replicas: each schedules" in racing.detail


def test_manager() -> None:
    assert judge_manager(deployment(replicas=2, ready=1), "s", None) == Check(
        "manager", True, "Deployment s/deviceshare-manager: 1/2 replicas Ready"
    )
    down = judge_manager(deployment(ready=0), "s", True)
    assert down == Check(
        "manager",
        False,
        "Deployment s/deviceshare-manager: 0/1 replicas Ready",
        "kubectl -n s get pods -l app.kubernetes.io/name=shared-device-group\n"
        "kubectl -n s rollout status deploy/deviceshare-manager",
    )
    scaled = judge_manager(deployment(replicas=0, ready=0), "s", None)
    assert scaled.fix == "kubectl -n s scale deploy/deviceshare-manager --replicas=1"
    elsewhere = judge_manager(None, "s", True)
    assert elsewhere.ok is True
    assert "a manager runs elsewhere (it holds the leader Lease)" in elsewhere.detail
    nothing = judge_manager(None, "s", False)
    assert (nothing.ok, nothing.fix) == (False, "kubectl apply -k config/default")
    # A Lease we may not read says nothing about whether a manager runs: a warning, no fix.
    unknown = judge_manager(None, "s", False, lease_unreadable=True)
    assert (unknown.ok, unknown.fix) == (None, "")
    assert "whether a manager runs elsewhere is unknown" in unknown.detail


# --- everything, rendered -------------------------------------------------------------------


def healthy_facts() -> Facts:
    return Facts(
        now=NOW,
        crd=crd(),
        group_count=1,
        webhooks=all_webhooks(),
        policies={p: {} for p in POLICIES},
        bindings={p: {} for p in POLICIES},
        probe=REACHED,
        cert_manager_crd={},
        certificate={"status": {"conditions": [{"type": "Ready", "status": "True"}]}},
        nodes=[
            with_handlers(node("gpu-1", 2, taints=[TAINT]), "", "nvidia"),
            node("cpu-1", shared=False),
        ],
        runtime_class={"metadata": {"name": "nvidia"}, "handler": "nvidia"},
        slices=[resource_slice("gpu-1", 2)],
        pods={"gpu-1": [pod("member", env={"NVIDIA_VISIBLE_DEVICES": "0,1"}, group="g")]},
        deployment=deployment(["--leader-elect"]),
        lease=lease(renewed=NOW - timedelta(seconds=2)),
        config=manager_config(deployment(["--leader-elect"]), "deviceshare-system"),
        priority_class={"metadata": {"name": "deviceshare-holder"}, "value": 1000000000},
    )


def test_judge_healthy_cluster() -> None:
    checks = judge(healthy_facts())
    assert [(c.name, c.ok) for c in checks] == [
        ("CRD", True),
        ("cert-manager", True),
        ("webhook configurations", True),
        ("pod webhook", True),
        ("admission policies", True),
        ("manager", True),
        ("leader Lease", True),
        ("shared nodes", True),
        ("ResourceSlices", True),
        ("node gpu-1: taint", True),
        ("node gpu-1: devices", True),
        ("node gpu-1: foreign device pods", True),
        ("node gpu-1: delivery", True),
        ("RuntimeClass", True),
        ("holder pods", True),
    ]
    assert exit_code(checks) == 0


def test_judge_broken_cluster() -> None:
    facts = healthy_facts()
    facts.probe = ADMITTED
    facts.webhooks = {name: None for name in facts.webhooks}
    facts.nodes = [node("gpu-1", 2)]
    facts.pods = {"gpu-1": [pod("thief", env={"NVIDIA_VISIBLE_DEVICES": "all"})]}
    checks = judge(facts)
    facts.priority_class = None
    checks = judge(facts)
    # Untainted is fine with holder pods (the default); a missing PriorityClass is not.
    assert {c.name for c in checks if c.ok is False} == {
        "webhook configurations",
        "pod webhook",
        "node gpu-1: foreign device pods",
        "holder pods",
    }
    assert exit_code(checks) == 1
    # the foreign pods' fix also taints the node, since it is not
    foreign = next(c for c in checks if c.name == "node gpu-1: foreign device pods")
    assert foreign.fix.splitlines()[-1].startswith("kubectl taint node gpu-1 ")


def test_judge_ignores_slices_when_the_manager_does() -> None:
    facts = healthy_facts()
    facts.config = ManagerConfig(resource_slices="off")
    devices = next(c for c in judge(facts) if c.name == "node gpu-1: devices")
    assert devices.ok is None  # the count, as the manager sees it
    assert "from count" in devices.detail


def test_warnings_do_not_fail() -> None:
    assert exit_code([Check("a", True, ""), Check("b", None, "")]) == 0
    assert exit_code([Check("a", False, "")]) == 1


CHECKS = [
    Check("CRD", True, "fine", "never shown"),
    Check("pod webhook", False, "admitted", "kubectl apply -k config/default"),
    Check("node a: devices", None, "guessed", "kubectl annotate node a x=y\nor the driver"),
]


def test_render_text() -> None:
    assert render_text(CHECKS) == (
        "✓ CRD              fine\n"
        "✗ pod webhook      admitted\n"
        "    fix: kubectl apply -k config/default\n"
        "! node a: devices  guessed\n"
        "    fix: kubectl annotate node a x=y\n"
        "         or the driver\n"
        "\n"
        "1 problem(s), 1 warning(s) in 3 checks\n"
    )
    assert render_text(CHECKS[:1]).endswith("\nall 1 checks passed\n")
    colored = render_text(CHECKS, color=True)
    assert colored.startswith("\033[32m✓\033[0m CRD")
    assert "\033[31m✗\033[0m pod webhook" in colored


def test_render_json() -> None:
    assert json.loads(render_json(CHECKS)) == [
        {"name": "CRD", "status": "ok", "ok": True, "detail": "fine", "fix": "never shown"},
        {
            "name": "pod webhook",
            "status": "fail",
            "ok": False,
            "detail": "admitted",
            "fix": "kubectl apply -k config/default",
        },
        {
            "name": "node a: devices",
            "status": "warning",
            "ok": None,
            "detail": "guessed",
            "fix": "kubectl annotate node a x=y\nor the driver",
        },
    ]


def test_cli_parses_doctor() -> None:
    args = cli._parser().parse_args(
        ["doctor", "-o", "json", "-n", "team", "--manager-namespace", "sdg", "--delivery", "cdi"]
    )
    assert (args.command, args.output, args.namespace, args.manager_namespace) == (
        "doctor",
        "json",
        "team",
        "sdg",
    )
    assert (args.delivery, args.runtime_class_name) == ("cdi", None)
    assert cli._parser().parse_args(["doctor"]).output == "text"
    with pytest.raises(SystemExit):
        cli._parser().parse_args(["doctor", "-o", "yaml"])


def test_holder_pods_need_their_priority_class_and_recent_kubelets() -> None:
    on = manager_config(deployment([]), "deviceshare-system")
    pc = {"metadata": {"name": "deviceshare-holder"}}
    missing = judge_holders(on, [], None)
    assert missing.ok is False and "config/holders" in missing.fix
    old = node("gpu-1", 2)
    old["status"]["nodeInfo"] = {"kubeletVersion": "v1.35.4"}
    recent = node("gpu-2", 2)
    recent["status"]["nodeInfo"] = {"kubeletVersion": "v1.36.0"}
    check = judge_holders(on, [old, recent], pc)
    assert check.ok is None and "gpu-1 (kubelet 1.35)" in check.detail
    assert "gpu-2" not in check.detail
    assert judge_holders(on, [recent], pc).ok is True
    off = manager_config(deployment(["--holders=off"]), "deviceshare-system")
    assert judge_holders(off, [old], None).ok is True


def test_an_untainted_shared_node_is_fine_only_with_holder_pods() -> None:
    bare = node("gpu-1", 2)
    assert judge_taint(bare, holders=True).ok is True
    assert judge_taint(bare, holders=False).ok is False


def _record(node: str, claims: dict[str, dict[str, str]], name: str | None = None) -> Any:
    return {
        "metadata": {
            "name": name or f"sdg-claims.{node}",
            "namespace": "deviceshare-system",
            "resourceVersion": "1",
            "labels": {"deviceshare.io/claims": "node"},
        },
        "data": {"node": node, "claims": json.dumps(claims)},
    }


def _bound(name: str, node: str, ids: str) -> Any:
    return {
        "metadata": {"name": name},
        "status": {"phase": "Bound", "nodeName": node, "selectedDevices": {GPU: ids}},
    }


def _books(records: Any, groups: Any, pods: Any = ()) -> Check:
    offers = {"n1": node_offers(node("n1", 4))}
    return judge_books(records, groups, offers, list(pods), Facts())


def test_books_agree() -> None:
    check = _books([_record("n1", {"a": {GPU: "0,1"}})], [_bound("a", "n1", "0,1")])
    assert check.ok is True and "1 Bound group(s)" in check.detail


def test_books_name_a_decoy_record_and_a_device_held_twice() -> None:
    """A decoy names the node: the manager's ledger blocks it, and so does doctor; a plain
    pod the kubelet gave a group's GPU is a second holder."""
    decoy = _books(
        [_record("n1", {"a": {GPU: "0"}}), _record("n1", {"x": {GPU: "2"}}, name="decoy")],
        [_bound("a", "n1", "0")],
    )
    assert decoy.ok is False and "decoy" in decoy.detail and "node n1" in decoy.detail
    rogue = {
        "metadata": {"name": "rogue", "namespace": "ml"},
        "spec": {
            "nodeName": "n1",
            "containers": [{"name": "c", "resources": {"limits": {GPU: "1"}}}],
        },
        "status": {
            "phase": "Running",
            "containerStatuses": [
                {
                    "name": "c",
                    "allocatedResourcesStatus": [
                        {"name": GPU, "resources": [{"resourceID": "0", "health": "Healthy"}]}
                    ],
                }
            ],
        },
    }
    twice = _books([_record("n1", {"a": {GPU: "0"}})], [_bound("a", "n1", "0")], [rogue])
    assert twice.ok is False and "nvidia.com/gpu 0 is held by" in twice.detail
    assert "group a" in twice.detail and "pod ml/rogue" in twice.detail


def test_books_warn_about_a_status_that_is_not_its_claim() -> None:
    check = _books([_record("n1", {"a": {GPU: "0"}})], [_bound("a", "n1", "1")])
    assert check.ok is None and "not its claim" in check.detail


def test_books_unreadable_says_so() -> None:
    check = _books(Unreadable("403 Forbidden configmaps"), [])
    assert check.ok is None and "403" in check.detail

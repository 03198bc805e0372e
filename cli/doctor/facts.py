"""What ``sdg doctor`` reads and says: the names of SDG's installed objects (tests
prove they match config/), the facts collected, and a check's verdict."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any, Final

from api.constants import (
    DEFAULT_ENV_TABLE,
    DEFAULT_RUNTIME_CLASS,
    DELIVERY_AUTO,
    GROUP,
    LEASE_NAME,
    MANAGER_NAMESPACE,
    PLURAL,
)
from controllers.inventory import (
    DEFAULT_DRA_DRIVERS,
)
from sdgruntime.kinds import (
    MUTATING_WEBHOOKS,
    VALIDATING_WEBHOOKS,
    Kind,
    Obj,
)

# --- names (tests/unit/test_doctor.py proves they match config/) ---------------------------

CRD_NAME: Final = f"{PLURAL}.{GROUP}"
MANAGER_DEPLOYMENT: Final = "deviceshare-manager"
MANAGER_CONTAINER: Final = "manager"
MANAGER_POD_SELECTOR: Final = "app.kubernetes.io/name=shared-device-group"
DEFAULT_LEASE_SECONDS: Final = 15
WEBHOOK_SERVICE: Final = "deviceshare-webhook-service"
#: config/webhook/manifests.yaml: configuration kind -> name.
WEBHOOK_CONFIGURATIONS: Final = MappingProxyType(
    {
        "MutatingWebhookConfiguration": "deviceshare-mutating-webhook-configuration",
        "ValidatingWebhookConfiguration": "deviceshare-validating-webhook-configuration",
    }
)
#: config/policy: each ValidatingAdmissionPolicy has a Binding of the same name.
POLICIES: Final = (
    "deviceshare-group-membership",
    "deviceshare-ephemeral-container-devices",
    "deviceshare-group-pods",
)
CERT_MANAGER_CRD: Final = "certificates.cert-manager.io"
SERVING_CERTIFICATE: Final = "deviceshare-serving-cert"
CERT_MANAGER_INSTALL: Final = (
    "kubectl apply -f "
    "https://github.com/cert-manager/cert-manager/releases/latest/download/cert-manager.yaml"
)
INSTALL: Final = "kubectl apply -k config/default"
PROBE_PREFIX: Final = "sdg-doctor-probe-"
#: Foreign pods named per node (the count says how many more).
MAX_FOREIGN_SHOWN: Final = 5
#: Node names listed in one detail line before "+ N more".
MAX_NAMES_SHOWN: Final = 10

DEPLOYMENTS: Final = Kind("apps", "v1", "Deployment", "deployments", namespaced=True)
PRIORITYCLASSES: Final = Kind(
    "scheduling.k8s.io", "v1", "PriorityClass", "priorityclasses", namespaced=False
)
POLICY_KIND: Final = Kind(
    "admissionregistration.k8s.io",
    "v1",
    "ValidatingAdmissionPolicy",
    "validatingadmissionpolicies",
    False,
)
BINDING_KIND: Final = Kind(
    "admissionregistration.k8s.io",
    "v1",
    "ValidatingAdmissionPolicyBinding",
    "validatingadmissionpolicybindings",
    False,
)
CERTIFICATES: Final = Kind("cert-manager.io", "v1", "Certificate", "certificates", True)
WEBHOOK_KINDS: Final = {
    "MutatingWebhookConfiguration": MUTATING_WEBHOOKS,
    "ValidatingWebhookConfiguration": VALIDATING_WEBHOOKS,
}


# --- results -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Check:
    """One verdict: ``ok`` True (✓), False (✗, fails the run) or None (!, a warning or
    something doctor could not decide); ``fix`` is the command(s) to run, one per line."""

    name: str
    ok: bool | None
    detail: str
    fix: str = ""

    @property
    def status(self) -> str:
        return {True: "ok", False: "fail", None: "warning"}[self.ok]

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "ok": self.ok,
            "detail": self.detail,
            "fix": self.fix,
        }


@dataclass(frozen=True, slots=True)
class Unreadable:
    """A read that failed with something other than 404 (Forbidden, a 5xx, ...)."""

    error: str


#: What a read found: the object, None (404), or why it could not be read.
Fetched = Obj | None | Unreadable


@dataclass(frozen=True, slots=True)
class Probe:
    """The answer to the dry-run CREATE of a pod naming the missing group ``group``."""

    group: str
    namespace: str
    admitted: bool
    code: int = 0  # HTTP status of a refusal
    message: str = ""


@dataclass(frozen=True, slots=True)
class ManagerConfig:
    """The manager settings the checks depend on, as its Deployment runs it (doctor's
    flags override); defaults are the manager's own."""

    delivery: str = DELIVERY_AUTO
    runtime_class_name: str = DEFAULT_RUNTIME_CLASS
    device_ids: str = "auto"
    leader_elect: bool = True
    lease_name: str = LEASE_NAME
    lease_namespace: str = MANAGER_NAMESPACE
    env_table: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_ENV_TABLE))
    dra_drivers: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_DRA_DRIVERS))
    resource_slices: str = "auto"
    holders: str = "auto"
    holder_priority_class: str = "deviceshare-holder"
    #: Where these came from, for the detail lines ("Deployment ns/name", "defaults").
    source: str = "defaults"
    delivery_source: str = "defaults"


@dataclass
class Facts:
    """Everything ``judge`` looks at, as read from the cluster."""

    manager_namespace: str = MANAGER_NAMESPACE
    now: datetime = field(default_factory=lambda: datetime.now(UTC))
    crd: Fetched = None
    #: Why listing SharedDeviceGroups failed (None: listed fine), and how many there are.
    groups_error: str | None = None
    group_count: int = 0
    groups: list[Obj] = field(default_factory=list)
    #: The claim records in the manager's namespace (None: not read, groups unreadable).
    records: list[Obj] | Unreadable | None = None
    webhooks: dict[str, Fetched] = field(default_factory=dict)  # configuration name -> it
    policies: dict[str, Fetched] = field(default_factory=dict)
    bindings: dict[str, Fetched] = field(default_factory=dict)
    probe: Probe | Unreadable | None = None
    cert_manager_crd: Fetched = None
    certificate: Fetched = None
    nodes: list[Obj] | Unreadable = field(default_factory=list)
    #: Every ResourceSlice; None when resource.k8s.io/v1 is not served.
    slices: list[Obj] | Unreadable | None = field(default_factory=list)
    #: Shared node -> the pods bound to it (only the manager's namespace's when
    #: ``pods_refused``).
    pods: dict[str, list[Obj] | Unreadable] = field(default_factory=dict)
    #: Why pods could not be listed in every namespace (None: they could, or no shared
    #: node needed it): the deviceshare-doctor role does not, as pods carry env values.
    pods_refused: str | None = None
    runtime_class: Fetched = None  # read when delivery auto looks for it or some needs it
    #: The holder pods' PriorityClass (read when holders are on and name one).
    priority_class: Fetched = None
    deployment: Fetched = None
    lease: Fetched = None
    config: ManagerConfig = field(default_factory=ManagerConfig)


# --- sdg doctor --pre: before installing ------------------------------------------------------

#: The oldest Kubernetes SDG installs on: the pod webhook's ``matchConditions`` and the
#: admission policies (``ValidatingAdmissionPolicy`` v1) are GA in 1.30.
MIN_KUBERNETES: Final = (1, 30)
#: resource.k8s.io/v1 (DRA's ResourceSlices, the best device inventory) is served from 1.34.
DRA_V1_KUBERNETES: Final = (1, 34)
#: Nodes given their own checks under --pre (the others are counted).
MAX_PRE_NODES: Final = 50


@dataclass
class PreFacts:
    """What ``sdg doctor --pre`` reads: only reads, nothing of SDG needs to be installed."""

    version: Fetched = None
    nodes: list[Obj] | Unreadable = field(default_factory=list)
    slices: list[Obj] | Unreadable | None = field(default_factory=list)
    runtime_class: Fetched = None
    config: ManagerConfig = field(default_factory=ManagerConfig)

"""Names shared by every part of SDG: the API group, annotations, labels and condition types.

Everything that appears on the wire (annotation keys, label values, condition types) is
defined once here so the scheduler, webhooks, CRD tests and docs cannot drift apart.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Final

from sdgruntime.kinds import Kind

GROUP: Final = "deviceshare.io"
VERSION: Final = "v1alpha1"
#: GROUP/VERSION, spelled out so that it is a Literal type (v1alpha1.SharedDeviceGroup.api_version).
API_VERSION: Final = "deviceshare.io/v1alpha1"
KIND: Final = "SharedDeviceGroup"
PLURAL: Final = "shareddevicegroups"
SHORT_NAME: Final = "sdg"

#: The SharedDeviceGroup resource; cluster-scoped, so groups are shared across namespaces.
SDG_KIND: Final = Kind(GROUP, VERSION, KIND, PLURAL, namespaced=False)

#: Pod annotation naming the group a pod joins.
GROUP_ANNOTATION: Final = "deviceshare.io/group"

#: Nodes opt in to sharing with this label (key=value).
NODE_MODE_LABEL: Final = "deviceshare.io/mode"
NODE_MODE_SHARED: Final = "shared"

#: The taint that keeps shared nodes SDG's alone:
#: ``kubectl taint node N deviceshare.io/mode=shared:NoSchedule``. Group pods get the
#: matching toleration from the pod webhook; group placement ignores this one taint.
SHARED_TAINT_KEY: Final = NODE_MODE_LABEL
SHARED_TAINT_VALUE: Final = NODE_MODE_SHARED

#: The most devices of one resource a node may offer. A larger count (an extended
#: resource counted in bytes, a typo) is not a device count: the node offers none of it,
#: and placement says why. It also bounds every per-device loop and allocation.
MAX_DEVICES_PER_RESOURCE: Final = 1024

#: ``status.allocatedPods`` lists at most this many pods (``podCount`` stays exact), so
#: a group's object stays far below etcd's size limit.
MAX_ALLOCATED_PODS: Final = 1000

#: Condition messages are cut to this many characters (the API allows 32768).
MAX_CONDITION_MESSAGE: Final = 4096

#: Taint effects that keep pods (and groups, which tolerate nothing) off a node.
FILTERING_TAINT_EFFECTS: Final = frozenset({"NoSchedule", "NoExecute"})

#: schedulerName pods of a group must use; the webhook sets it when absent/default.
SCHEDULER_NAME: Final = "deviceshare-scheduler"
DEFAULT_SCHEDULER_NAME: Final = "default-scheduler"

#: Finalizer that holds a group while pods still use it (like kubernetes.io/pvc-protection).
FINALIZER: Final = "deviceshare.io/protection"

# --- Phases -----------------------------------------------------------------------------
PHASE_PENDING: Final = "Pending"
PHASE_BOUND: Final = "Bound"

# --- Condition types ----------------------------------------------------------------------
#: ``Scheduled``: the group has a node and concrete device IDs.
#:   True/``Bound`` once bound; False/``Unschedulable`` with the per-node-class message
#:   ("0/5 nodes are available: ...") while Pending.
CONDITION_SCHEDULED: Final = "Scheduled"
#: ``NodeHealthy``: the bound node still exists, is Ready, is not cordoned and still
#:   offers the selected devices. False/``NodeNotFound``|``NodeNotReady``|``DevicesMissing``.
#:   Unknown while the group is not bound.
CONDITION_NODE_HEALTHY: Final = "NodeHealthy"
#: ``Ready``: summary a user waits on (``kubectl wait --for=condition=Ready sdg/x``):
#:   True iff Scheduled and NodeHealthy are both True.
CONDITION_READY: Final = "Ready"

# --- Condition reasons (CamelCase, as Kubernetes API conventions require) ----------------
REASON_BOUND: Final = "Bound"
REASON_UNSCHEDULABLE: Final = "Unschedulable"
REASON_NODE_READY: Final = "NodeReady"
REASON_NODE_NOT_FOUND: Final = "NodeNotFound"
REASON_NODE_NOT_READY: Final = "NodeNotReady"
REASON_DEVICES_MISSING: Final = "DevicesMissing"
REASON_NOT_BOUND: Final = "NotBound"
REASON_READY: Final = "Ready"
REASON_NOT_READY: Final = "NotReady"
#: Ready=False reasons that mean the group's devices are disputed. While a group carries
#: one, the pod webhook admits no new pod into it and the pod scheduler binds none.
REASON_CLAIM_CONFLICT: Final = "ClaimConflict"
REASON_DEVICES_CONFLICT: Final = "DevicesConflict"
REASON_RECOVERY_CONFLICT: Final = "RecoveryConflict"
REASON_FOREIGN_DEVICE_PODS: Final = "ForeignDevicePods"
CONFLICT_REASONS: Final = frozenset(
    {
        REASON_CLAIM_CONFLICT,
        REASON_DEVICES_CONFLICT,
        REASON_RECOVERY_CONFLICT,
        REASON_FOREIGN_DEVICE_PODS,
    }
)

# --- Device env vars ----------------------------------------------------------------------
#: Default device resource -> env var table. Keys are fnmatch-style globs matched against
#: the whole resource name (case-sensitive); an exact key wins over a glob, and among globs
#: the longest pattern wins. Extend it with the manager flag ``DEVICE_ENV_FLAG``.
DEFAULT_ENV_TABLE: Final = MappingProxyType(
    {
        "nvidia.com/gpu": "NVIDIA_VISIBLE_DEVICES",
        "amd.com/gpu": "AMD_VISIBLE_DEVICES",
        "huawei.com/Ascend*": "ASCEND_VISIBLE_DEVICES",
    }
)

#: The manager command-line flag that adds/overrides env table entries, repeated as
#: ``--device-env RESOURCE_GLOB=ENV_VAR`` (parsed by ``api.envvars.parse_env_table``).
DEVICE_ENV_FLAG: Final = "--device-env"

# --- Device delivery ----------------------------------------------------------------------
#: Pod annotation the pod webhook stamps on every group pod: the device IDs it was given,
#: as compact JSON (``{"nvidia.com/gpu":"0,1"}``), whatever the delivery mode. It is the
#: one record of a pod's devices (env values may be UUIDs or ``void``); the API server's
#: policy (config/policy) keeps it from changing after creation.
DEVICES_ANNOTATION: Final = "deviceshare.io/devices"

#: Node label overriding the manager's delivery mode for the pods of groups on that node.
DELIVERY_LABEL: Final = "deviceshare.io/delivery"
#: How a group pod is given its devices (the ``--delivery`` flag and the node label):
#: ``env`` vendor env vars; ``runtimeclass`` the same plus ``spec.runtimeClassName``;
#: ``cdi`` per-container CDI device annotations, with the vendor env var set to ``void``.
DELIVERY_ENV: Final = "env"
DELIVERY_RUNTIMECLASS: Final = "runtimeclass"
DELIVERY_CDI: Final = "cdi"
DELIVERY_MODES: Final = (DELIVERY_ENV, DELIVERY_RUNTIMECLASS, DELIVERY_CDI)

#: How devices are named to the runtime (``--device-ids``): ``index`` the IDs placement
#: booked (what nvidia-smi numbers them); ``uuid`` the group's ``status.physicalDevices``
#: where known, else the IDs.
DEVICE_IDS_INDEX: Final = "index"
DEVICE_IDS_UUID: Final = "uuid"
DEVICE_IDS_FORMATS: Final = (DEVICE_IDS_INDEX, DEVICE_IDS_UUID)

#: The GPU Operator's RuntimeClass (handler ``nvidia``).
DEFAULT_RUNTIME_CLASS: Final = "nvidia"
#: NRI device-injector's per-container CDI annotation: ``<prefix><container name>``.
DEFAULT_CDI_ANNOTATION_PREFIX: Final = "cdi-devices.nri.io/container."
#: The annotation families NRI's device-injector reads CDI devices from (current and
#: deprecated; a more specific key of either wins, then ``<family>/pod``, then
#: ``<family>``). In cdi mode the webhook owns every key of these on a group pod.
CDI_ANNOTATION_FAMILIES: Final = ("cdi-devices.noderesource.dev", "cdi-devices.nri.io")
#: The env value that makes NVIDIA's legacy runtime hook expose no GPU (as runc would).
VOID_DEVICES: Final = "void"

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

#: ``spec.devices`` pins at most this many devices of one resource (the CRD's maxItems):
#: pinning is for a handful of GPUs; a larger group lets SDG choose.
MAX_PINNED_DEVICES: Final = 64
#: The longest pinned device (a UUID such as NVIDIA's ``GPU-<36 hex and dashes>``).
MAX_PIN_LENGTH: Final = 128

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

#: The manager's namespace where none is given (config/ installs it there; the claim
#: records and the leader Lease live in it), and the name of its leader Lease.
MANAGER_NAMESPACE: Final = "deviceshare-system"
LEASE_NAME: Final = "deviceshare-manager"

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
#: Scheduled=False while a Pending group's stale claim is given back (it is placed anew).
REASON_CLAIM_GIVEN_BACK: Final = "ClaimGivenBack"
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
#: A Bound group whose holder pod is gone, refused or holds other devices: the kubelet's
#: books no longer keep its devices from plain pods (``controllers.holders``).
REASON_HOLDER_LOST: Final = "HolderLost"
CONFLICT_REASONS: Final = frozenset(
    {
        REASON_CLAIM_CONFLICT,
        REASON_DEVICES_CONFLICT,
        REASON_RECOVERY_CONFLICT,
        REASON_FOREIGN_DEVICE_PODS,
        REASON_HOLDER_LOST,
    }
)
#: Scheduled=False reason while the kubelet has not yet given a new group's holder pod
#: its devices: the group is placed and binds in a moment (the pod webhook waits for it).
REASON_WAITING_FOR_HOLDER: Final = "WaitingForHolder"
#: NodeHealthy=False while the group's node is cordoned.
REASON_NODE_UNSCHEDULABLE: Final = "NodeUnschedulable"
#: Ready=False reasons of the group scheduler and recovery: a status it cannot read, a
#: node's claim record it cannot read, a record recovery could not write back.
REASON_INVALID_STATUS: Final = "InvalidStatus"
REASON_RECORD_MALFORMED: Final = "ClaimRecordMalformed"
REASON_RECOVERY_FAILED: Final = "RecoveryFailed"
#: ``PodsListed``: present (False/``Truncated``) only while ``status.allocatedPods`` lists
#: fewer pods than ``podCount`` counts.
CONDITION_PODS_LISTED: Final = "PodsListed"
REASON_TRUNCATED: Final = "Truncated"

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
#: one record of a pod's devices (env values may be UUIDs or empty); the API server's
#: policy (config/policy) keeps it from changing after creation.
DEVICES_ANNOTATION: Final = "deviceshare.io/devices"
#: Pod annotation the pod webhook stamps beside ``DEVICES_ANNOTATION``: how the devices
#: were delivered, as space-separated tokens the API server's policy
#: (config/policy/group_pods.yaml) checks the stored pod against, so a mutating webhook
#: running after SDG's cannot change them unseen: ``mode=<mode>``;
#: ``env:<VAR>=<value>`` per device variable every container carries exactly (the value
#: may be empty); ``off:<VAR>`` per other vendor's variable, which may name no device;
#: ``domain:<vendor domain>`` per domain of the env table, whose resources no container
#: or the pod may request (nor may it have DRA claims);
#: ``runtimeClassName=<name>`` (mode runtimeclass); ``cdi:<prefix>=<value>`` (mode cdi:
#: every container's ``<prefix><name>`` annotation is ``<value>``, and no other CDI,
#: device-node or mount annotation of NRI's device-injector is set).
DELIVERED_ANNOTATION: Final = "deviceshare.io/delivered"
#: Pod annotation the pod webhook stamps only on pods of a group with
#: ``spec.allowHostAccess: true`` (value ``HOST_ACCESS_ALLOWED``): the API server's policy
#: then admits privileged containers, SYS_ADMIN, hostPath under /dev and hostPID. Set by
#: anyone else on a pod of a group without it, the webhook refuses the pod.
HOST_ACCESS_ANNOTATION: Final = "deviceshare.io/host-access"
HOST_ACCESS_ALLOWED: Final = "allowed"

#: Node label overriding the manager's delivery mode for the pods of groups on that node.
DELIVERY_LABEL: Final = "deviceshare.io/delivery"
#: How a group pod is given its devices (the node label's values, and ``--delivery``):
#: ``env`` vendor env vars; ``runtimeclass`` the same plus ``spec.runtimeClassName``;
#: ``cdi`` per-container CDI device annotations, with the vendor env var set empty.
DELIVERY_ENV: Final = "env"
DELIVERY_RUNTIMECLASS: Final = "runtimeclass"
DELIVERY_CDI: Final = "cdi"
DELIVERY_MODES: Final = (DELIVERY_ENV, DELIVERY_RUNTIMECLASS, DELIVERY_CDI)
#: ``--delivery auto`` (the default): per node, from what the cluster says of its runtime
#: (``webhooks.delivery.choose_delivery``).
DELIVERY_AUTO: Final = "auto"
DELIVERY_SETTINGS: Final = (DELIVERY_AUTO, *DELIVERY_MODES)
#: Node label naming the vendor whose runtime is the node's default container runtime
#: (``nvidia``: NVIDIA Container Runtime set as containerd's/CRI-O's default): under
#: ``--delivery auto`` the env var alone then verifiably reaches it. Neither the GPU
#: Operator nor NFD labels nodes with this, so SDG has its own. The value ``<vendor>``
#: covers the resources whose variable is ``<VENDOR>_VISIBLE_DEVICES``.
DEFAULT_RUNTIME_LABEL: Final = "deviceshare.io/default-runtime"
#: Event reason on a group whose pods get env delivery nothing on the node confirms.
REASON_DELIVERY_UNVERIFIED: Final = "DeliveryUnverified"

#: How devices are named to the runtime (``--device-ids``): ``auto`` (the default) UUIDs
#: where the group's ``status.physicalDevices`` has them and the vendor's runtime takes
#: them (``UUID_ENV_VARS``), else the IDs; ``index`` the IDs placement booked (what
#: nvidia-smi numbers them); ``uuid`` the group's ``status.physicalDevices`` where known,
#: for every vendor, else the IDs.
DEVICE_IDS_AUTO: Final = "auto"
DEVICE_IDS_INDEX: Final = "index"
DEVICE_IDS_UUID: Final = "uuid"
DEVICE_IDS_FORMATS: Final = (DEVICE_IDS_AUTO, DEVICE_IDS_INDEX, DEVICE_IDS_UUID)
#: Device variables whose runtime takes UUIDs, in the env and as CDI names: NVIDIA's
#: (``NVIDIA_VISIBLE_DEVICES=GPU-...``; ``nvidia-ctk cdi generate`` names each GPU by
#: index and by UUID). AMD's CDI names are ``amd.com/gpu=<N>`` only and Ascend's runtime
#: reads indices, so ``auto`` tells those by index.
UUID_ENV_VARS: Final = frozenset({"NVIDIA_VISIBLE_DEVICES"})

#: The GPU Operator's RuntimeClass (handler ``nvidia``).
DEFAULT_RUNTIME_CLASS: Final = "nvidia"

# --- NRI's device-injector ------------------------------------------------------------------
# The annotation families containerd/nri's plugins/device-injector reads from a pod
# (plugins/device-injector/device-injector.go, v0.12.2: deviceKey/oldDeviceKey,
# mountKey/oldMountKey, cdiDeviceKey/oldCDIDeviceKey, and getAnnotation). For each
# container it takes the first key present of ``<current>/container.<name>``,
# ``<deprecated>/container.<name>``, ``<current>/pod``, ``<deprecated>/pod``,
# ``<current>``, ``<deprecated>``. On a group pod SDG owns every key of these families
# (``<family>`` itself and every ``<family>/...``): see webhooks/delivery.py.

#: CDI device names (a YAML list, ``["nvidia.com/gpu=0"]``): current, then deprecated.
CDI_ANNOTATION_FAMILIES: Final = ("cdi-devices.noderesource.dev", "cdi-devices.nri.io")
#: Raw device nodes (``- path: /dev/nvidia3, type: c, major: 195, minor: 3``).
DEVICE_NODE_ANNOTATION_FAMILIES: Final = ("devices.noderesource.dev", "devices.nri.io")
#: Mounts (``- source: /dev, destination: /dev, type: bind``).
MOUNT_ANNOTATION_FAMILIES: Final = ("mounts.noderesource.dev", "mounts.nri.io")
#: Every family through which the device-injector hands a container devices.
INJECTOR_ANNOTATION_FAMILIES: Final = (
    CDI_ANNOTATION_FAMILIES + DEVICE_NODE_ANNOTATION_FAMILIES + MOUNT_ANNOTATION_FAMILIES
)
#: The device-injector's per-container CDI annotation, current family:
#: ``<prefix><container name>``. The deprecated ``cdi-devices.nri.io/container.`` is still
#: read by the injector, so SDG still owns (and strips) it on group pods.
DEFAULT_CDI_ANNOTATION_PREFIX: Final = "cdi-devices.noderesource.dev/container."

#: The value SDG gives the vendor env var under ``cdi``: empty, i.e. no device, for every
#: vendor's runtime. nvidia-container-toolkit treats a variable that is set but empty as
#: ``void`` (internal/config/image/cuda_image.go, devicesFromEnvvars, v1.20.0), even for
#: legacy CUDA images where unset means ``all``; ascend-docker-runtime adds no device for
#: an empty ASCEND_VISIBLE_DEVICES but fails container creation on a value its
#: parseDevices cannot read, such as ``void`` (runtime/main.go checkVisibleDevice and
#: hook/main.go doPrestartHook, v5.0.0-RC3.2); ROCm's container toolkit skips entries
#: that are neither indices nor unique IDs (internal/gpu-tracker/gpu-tracker.go,
#: parseGPUsList, v1.3.0). The pod's env overrides
#: the image's (``NVIDIA_VISIBLE_DEVICES=all`` of CUDA images): the kubelet sets the
#: variable to "" (pkg/kubelet/kubelet_pods.go, makeEnvironmentVariables, v1.37.2) and
#: containerd appends the container's env after the image's, replacing by name
#: (internal/cri/server/container_create.go and pkg/oci/spec_opts.go WithEnv, v2.4.2).
#: The API server stores such an entry without ``value`` (omitempty): ``{"name": ...}``.
NO_DEVICES: Final = ""
#: What SDG gave the vendor env var under ``cdi`` before (NVIDIA's "no GPU" word): pods
#: admitted then still carry it, and it is still read as "no device".
VOID_DEVICES: Final = "void"

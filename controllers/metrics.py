"""``sdg_*`` domain metrics, in the manager's one registry (served on /metrics)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from sdgruntime.metrics import REGISTRY

_LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)

GROUPS_BY_PHASE = Gauge("sdg_groups", "SharedDeviceGroups by phase", ["phase"], registry=REGISTRY)
DEVICES_ALLOCATED = Gauge(
    "sdg_devices_allocated",
    "Device IDs held by groups, per node and resource",
    ["node", "resource"],
    registry=REGISTRY,
)
DEVICES_FREE = Gauge(
    "sdg_devices_free",
    "Device IDs free for new groups, per node and resource (held or disputed IDs are not free)",
    ["node", "resource"],
    registry=REGISTRY,
)
DEVICES_MISSING = Gauge(
    "sdg_devices_missing",
    "Devices held by groups that the node no longer offers (gone from its inventory or "
    "unhealthy), per node and resource; the groups holding them show DevicesMissing",
    ["node", "resource"],
    registry=REGISTRY,
)
SCHEDULING_ATTEMPTS = Counter(
    "sdg_scheduling_attempts_total",
    "Scheduling decisions by kind (group|pod) and result",
    ["kind", "result"],
    registry=REGISTRY,
)
DECISION_LATENCY = Histogram(
    "sdg_scheduling_decision_seconds",
    "Time from the start of a scheduling decision to its outcome written, by kind",
    ["kind"],
    buckets=_LATENCY_BUCKETS,
    registry=REGISTRY,
)
BIND_LATENCY = Histogram(
    "sdg_pod_bind_seconds",
    "Latency of the pods/binding call",
    buckets=_LATENCY_BUCKETS,
    registry=REGISTRY,
)
FOREIGN_DEVICE_PODS = Gauge(
    "sdg_foreign_device_pods",
    "Pods outside any group that use devices (device plugin request or a device env var "
    "set by hand), per node; while any run, SDG places no new group of that resource there",
    ["node"],
    registry=REGISTRY,
)
DEVICE_HOLDER = Gauge(
    "sdg_device_holder",
    "1 per device a group holds, by node, resource, device ID, UUID (empty when the "
    "inventory knows none) and group: join DCGM's DCGM_FI_DEV_* on UUID for per-group "
    "utilisation (at most 1024 devices per node and resource)",
    ["node", "resource", "device", "uuid", "group"],
    registry=REGISTRY,
)

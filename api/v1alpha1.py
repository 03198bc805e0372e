"""``deviceshare.io/v1alpha1`` SharedDeviceGroup: pydantic models and dict-friendly readers.

The models are for construction, docs and validation at the edges (CLI, examples, tests).
Hot paths (caches, scheduler, webhooks) read plain decoded JSON with the small readers at
the bottom, which never raise on a partially filled object.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    field_serializer,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from api.conditions import rfc3339
from api.constants import API_VERSION, KIND, MAX_ALLOCATED_PODS, PHASE_BOUND, PHASE_PENDING
from api.validation import validate_spec
from sdgruntime.kinds import meta_of, spec_of, status_of

Strategy = Literal["binpack", "spread"]
Phase = Literal["Pending", "Bound"]


class _Model(BaseModel):
    """camelCase on the wire, snake_case in Python; unknown fields ignored (forward compat)."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        extra="ignore",
    )


class Condition(_Model):
    """A ``metav1.Condition``."""

    type: str = Field(min_length=1, max_length=316)
    status: Literal["True", "False", "Unknown"]
    reason: str = Field(min_length=1, max_length=1024)
    message: str = Field(default="", max_length=32768)
    last_transition_time: datetime
    observed_generation: int | None = Field(default=None, ge=0)

    @field_serializer("last_transition_time")
    def _ser_time(self, value: datetime) -> str:
        return rfc3339(value)


class SharedDeviceGroupSpec(_Model):
    """What the group wants: device counts, a strategy, and where it may land."""

    resources: dict[str, StrictInt]
    scheduling_strategy: Strategy = "binpack"
    node_selector: dict[str, str] | None = None
    #: Pinned devices per resource: IDs (``"3"``) or UUIDs (``"GPU-6f1c..."``), exactly as
    #: many as requested; the group binds only where exactly these are free.
    devices: dict[str, list[str]] | None = None
    #: The group's pods may be privileged, add SYS_ADMIN, mount /dev or use hostPID: they
    #: can reach every device of the node, so SDG's device promise is left to the user.
    allow_host_access: StrictBool | None = None

    @model_validator(mode="after")
    def _check(self) -> SharedDeviceGroupSpec:
        errors = validate_spec(self.model_dump(exclude_none=True))
        if errors:
            raise ValueError("; ".join(errors))
        return self


class SharedDeviceGroupStatus(_Model):
    """What the system decided: node, concrete device IDs, member pods, conditions."""

    phase: Phase | None = None
    node_name: str | None = None
    #: resource -> comma-separated device IDs, e.g. ``{"nvidia.com/gpu": "0,1"}``.
    selected_devices: dict[str, str] = Field(default_factory=dict)
    #: ``namespace/name`` of the pods using the group, sorted; the first
    #: ``MAX_ALLOCATED_PODS`` of them (``pod_list_update``).
    allocated_pods: list[str] = Field(default_factory=list, max_length=MAX_ALLOCATED_PODS)
    #: How many pods use the group, exact (also beyond the list): the PODS printer column.
    pod_count: int = Field(default=0, ge=0)
    #: ``--allocated-pods counts``: namespace -> pods of the group in it (then
    #: ``allocated_pods`` is empty); None otherwise.
    allocated_pod_counts: dict[str, int] | None = None
    conditions: list[Condition] = Field(default_factory=list)
    observed_generation: int | None = Field(default=None, ge=0)

    @field_validator("allocated_pods")
    @classmethod
    def _sorted_pods(cls, value: list[str]) -> list[str]:
        return sorted(set(value))

    @field_validator("selected_devices")
    @classmethod
    def _valid_ids(cls, value: dict[str, str]) -> dict[str, str]:
        return {res: format_ids(parse_ids(ids)) for res, ids in value.items()}


class ObjectMeta(_Model):
    """The metadata fields SDG reads; everything else is kept verbatim."""

    model_config = ConfigDict(extra="allow")

    name: str | None = None
    generate_name: str | None = None
    uid: str | None = None
    resource_version: str | None = None
    generation: int | None = None
    creation_timestamp: str | None = None
    deletion_timestamp: str | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    finalizers: list[str] | None = None


class SharedDeviceGroup(_Model):
    api_version: Literal["deviceshare.io/v1alpha1"] = API_VERSION
    kind: Literal["SharedDeviceGroup"] = KIND
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: SharedDeviceGroupSpec
    status: SharedDeviceGroupStatus | None = None

    @classmethod
    def from_dict(cls, obj: Mapping[str, Any]) -> SharedDeviceGroup:
        return cls.model_validate(obj)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object to send to the API server (no nulls)."""
        return self.model_dump(mode="json", exclude_none=True)


# --- device ID lists ----------------------------------------------------------------------


def format_ids(ids: Iterable[int]) -> str:
    """``[1, 0] -> "0,1"``: sorted, the form stored in ``status.selectedDevices``."""
    out = sorted(ids)
    for i, dev in enumerate(out):
        if isinstance(dev, bool) or not isinstance(dev, int) or dev < 0:
            raise ValueError(f"device IDs must be non-negative integers, got {dev!r}")
        if i and out[i - 1] == dev:
            raise ValueError(f"device ID {dev} listed twice")
    return ",".join(str(d) for d in out)


#: ID lists up to this long (16 GPUs take 37 characters) are parsed once and remembered
#: (``_parsed_ids``): binds, status writes and admissions read the same few lists again and
#: again; longer ones are parsed each time, so the memo holds well under 1 MiB.
_MEMO_IDS_LEN = 64


def parse_ids(text: str) -> list[int]:
    """``"0,1" -> [0, 1]`` (sorted). ``""`` is no devices. Raises ValueError when malformed."""
    if not isinstance(text, str):
        raise ValueError(f"device IDs must be a string like '0,1', got {text!r}")
    if len(text) <= _MEMO_IDS_LEN:
        return list(_parsed_ids(text))
    return list(_parse_ids(text))


@functools.lru_cache(maxsize=1024)
def _parsed_ids(text: str) -> tuple[int, ...]:
    return _parse_ids(text)


def _parse_ids(text: str) -> tuple[int, ...]:
    if not text.strip():
        return ()
    ids: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part.isascii() or not part.isdigit():
            raise ValueError(f"malformed device ID list {text!r}: {part!r} is not an integer")
        ids.append(int(part))
    if len(set(ids)) != len(ids):
        raise ValueError(f"malformed device ID list {text!r}: an ID is listed twice")
    return tuple(sorted(ids))


# --- dict readers for hot paths -------------------------------------------------------------


def group_name(group: Mapping[str, Any]) -> str:
    return str(meta_of(group).get("name") or "")


def group_resources(group: Mapping[str, Any]) -> dict[str, int]:
    """``spec.resources`` (empty if missing)."""
    return dict(spec_of(group).get("resources") or {})


def spec_pins(spec: Mapping[str, Any]) -> dict[str, tuple[str, ...]]:
    """``spec.devices``: resource -> the pinned IDs or UUIDs (empty: nothing pinned).
    Entries that are not lists of strings are skipped (the CRD refuses them)."""
    raw = spec.get("devices")
    if not isinstance(raw, Mapping):
        return {}
    return {
        str(res): tuple(pins)
        for res, pins in raw.items()
        if isinstance(pins, list) and pins and all(isinstance(p, str) for p in pins)
    }


def group_strategy(group: Mapping[str, Any]) -> str:
    return str(spec_of(group).get("schedulingStrategy") or "binpack")


def allows_host_access(group: Mapping[str, Any]) -> bool:
    """``spec.allowHostAccess`` is true: the group's pods may reach the host's devices."""
    return spec_of(group).get("allowHostAccess") is True


def group_phase(group: Mapping[str, Any]) -> str:
    """``status.phase``; a group nobody has scheduled yet is Pending."""
    return str(status_of(group).get("phase") or PHASE_PENDING)


def is_bound(group: Mapping[str, Any]) -> bool:
    status = status_of(group)
    return status.get("phase") == PHASE_BOUND and bool(status.get("nodeName"))


def group_node(group: Mapping[str, Any]) -> str | None:
    return status_of(group).get("nodeName") or None


def selected_devices(group: Mapping[str, Any]) -> dict[str, list[int]]:
    """``status.selectedDevices`` parsed to ID lists. Raises ValueError when malformed."""
    raw = status_of(group).get("selectedDevices") or {}
    return {res: parse_ids(ids) for res, ids in raw.items()}


def group_pod_count(group: Mapping[str, Any]) -> int:
    """How many pods use the group: ``status.podCount``, which stays exact when
    ``allocatedPods`` is cut (never fewer than the pods listed)."""
    status = status_of(group)
    count = status.get("podCount")
    listed = len(status.get("allocatedPods") or ())
    return max(count, listed) if isinstance(count, int) and not isinstance(count, bool) else listed


def pod_counts(group: Mapping[str, Any]) -> dict[str, int] | None:
    """``status.allocatedPodCounts`` (namespace -> active pods) when the manager runs with
    ``--allocated-pods counts`` (then ``allocatedPods`` names no pod); else None."""
    counts = status_of(group).get("allocatedPodCounts")
    if not isinstance(counts, Mapping):
        return None
    return {str(ns): n for ns, n in counts.items() if isinstance(n, int) and n > 0}


def pods_truncated(group: Mapping[str, Any]) -> bool:
    """True when ``status.allocatedPods`` lists fewer pods than use the group (never in
    counts mode, where it lists none by design)."""
    if pod_counts(group) is not None:
        return False
    return group_pod_count(group) > len(status_of(group).get("allocatedPods") or ())


@dataclass(frozen=True, slots=True)
class PodListUpdate:
    """The next ``allocatedPods``/``podCount`` and what changed, for the status controller."""

    #: The new ``status.allocatedPods``: the sorted first ``limit`` active pods.
    listed: list[str]
    #: The new ``status.podCount``: every active pod.
    count: int
    #: Pods known to be new, sorted (see ``pod_list_update``).
    joined: list[str]
    #: Pods listed before that are no longer active, sorted.
    left: list[str]

    @property
    def truncated(self) -> bool:
        return self.count > len(self.listed)


def pod_list_update(
    before: Sequence[str],
    before_count: int,
    active: Iterable[str],
    limit: int = MAX_ALLOCATED_PODS,
) -> PodListUpdate:
    """``allocatedPods`` keeps the sorted first ``limit`` pod keys, so the object stays far
    below etcd's size limit however many pods join; ``podCount`` stays exact.

    A cut old list (``before_count`` above its length) does not say which pods sorting
    after its last entry were there already, so only pods up to that entry are reported
    as joined: events never claim a pod is new when it may not be.
    """
    keys = sorted(set(active))
    previous = set(before)
    horizon: str | None = None
    if before_count > len(previous):
        horizon = max(previous) if previous else ""
    joined = [k for k in keys if k not in previous and (horizon is None or k <= horizon)]
    left = sorted(previous.difference(keys))
    return PodListUpdate(keys[:limit], len(keys), joined, left)

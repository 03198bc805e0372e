"""What a bound group's pods say, in one pass: how many are active (they hold the group
against deletion and are counted for PodsListed) and which run elsewhere or with other
devices than the group holds (DevicesConflict).

The group scheduler asks this on every reconcile of a bound group; a pod event wakes it
only where the answer may change (``odd_pod``, the count). The pods are walked once and
the devices a pod was given are compared as the annotation text our webhook wrote (the
group's devices in the same canonical form) before anything is parsed. Pure: plain pods
in, facts out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from api.constants import DEVICES_ANNOTATION
from api.pods import delivered_devices, devices_annotation, is_active, pod_key
from sdgruntime.kinds import meta_of, spec_of

Devices = Mapping[str, list[int]]


@dataclass(frozen=True)
class PodSurvey:
    """The facts about a group's pods the group scheduler decides on."""

    #: Pods not Succeeded or Failed (terminating ones included: they may still run).
    active: int = 0
    #: Active pods bound elsewhere or given other devices: "ns/name on node with ...".
    odd: list[str] = field(default_factory=list)


def survey(
    pods: Iterable[Mapping[str, Any]],
    node: str,
    devices: Devices,
    resources: Mapping[str, Any],
    env_table: Mapping[str, str],
) -> PodSurvey:
    """One pass over the pods of a group bound to ``node`` with ``devices`` (each ID list
    sorted, as ``selected_devices`` gives them). A pod whose given devices cannot be told
    (no annotation, no complete env) is odd only when it runs on another node."""
    expected = _expected(devices)
    active = 0
    odd: list[str] = []
    for pod in pods:
        if not is_active(pod):
            continue
        active += 1
        why = _odd(pod, node, devices, expected, resources, env_table)
        if why is not None:
            odd.append(why)
    return PodSurvey(active, sorted(odd))


def odd_pod(
    pod: Mapping[str, Any],
    node: str,
    devices: Devices,
    resources: Mapping[str, Any],
    env_table: Mapping[str, str],
) -> str | None:
    """What ``survey`` says of one active pod: "ns/name on node with ..." if it is odd for
    a group bound to ``node`` with ``devices``, else None (also when not bound yet)."""
    return _odd(pod, node, devices, _expected(devices), resources, env_table)


def _odd(
    pod: Mapping[str, Any],
    node: str,
    devices: Devices,
    expected: str,
    resources: Mapping[str, Any],
    env_table: Mapping[str, str],
) -> str | None:
    where = spec_of(pod).get("nodeName")
    if not where:
        return None  # not bound yet: it runs nowhere
    annotations = meta_of(pod).get("annotations") or {}
    if annotations.get(DEVICES_ANNOTATION) == expected:
        return None if where == node else f"{pod_key(pod)} on {where} with {dict(devices)}"
    seen = delivered_devices(pod, resources, env_table)
    if where != node or (seen is not None and seen != devices):
        return f"{pod_key(pod)} on {where} with {seen}"
    return None


def _expected(devices: Devices) -> str:
    """The annotation our webhook writes for ``devices`` (each ID list sorted)."""
    return _annotation(tuple((r, tuple(ids)) for r, ids in sorted(devices.items())))


@lru_cache(maxsize=1024)
def _annotation(devices: tuple[tuple[str, tuple[int, ...]], ...]) -> str:
    """``devices_annotation``, remembered: every reconcile of a bound group asks it for the
    same few device sets."""
    return devices_annotation({r: list(ids) for r, ids in devices})

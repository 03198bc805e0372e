"""What a bound group's pods say, in one pass: how many are active (they hold the group
against deletion and are counted for PodsListed) and which run elsewhere or with other
devices than the group holds (DevicesConflict).

The group scheduler asks this on every reconcile of a bound group, and pod churn makes
those frequent, so the pods are walked once and the devices a pod was given are compared
as the annotation text our webhook wrote (the group's devices in the same canonical
form) before anything is parsed. Pure: plain pods in, facts out.
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
    expected = _annotation(tuple((r, tuple(ids)) for r, ids in sorted(devices.items())))
    active = 0
    odd: list[str] = []
    for pod in pods:
        if not is_active(pod):
            continue
        active += 1
        where = spec_of(pod).get("nodeName")
        if not where:
            continue  # not bound yet: it runs nowhere
        annotations = meta_of(pod).get("annotations") or {}
        if annotations.get(DEVICES_ANNOTATION) == expected:
            if where != node:
                odd.append(f"{pod_key(pod)} on {where} with {dict(devices)}")
            continue
        seen = delivered_devices(pod, resources, env_table)
        if where != node or (seen is not None and seen != devices):
            odd.append(f"{pod_key(pod)} on {where} with {seen}")
    return PodSurvey(active, sorted(odd))


@lru_cache(maxsize=1024)
def _annotation(devices: tuple[tuple[str, tuple[int, ...]], ...]) -> str:
    """``devices_annotation``, remembered: every reconcile of a bound group asks it for the
    same few device sets."""
    return devices_annotation({r: list(ids) for r, ids in devices})

"""Shared Device Group's objects as its unit tests build them: ``node``, ``group``, ``pod``,
``record`` (a node's claim record) and ``resource_slice``, plus sdgruntime's shared test
helpers (``settle``, ``configmap``, ``as_client``, ``running_cache``). One builder per
kind, so a test says only what matters to it, by keyword; the defaults are what a small
healthy cluster has."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

from api.constants import (
    API_VERSION,
    FINALIZER,
    GROUP_ANNOTATION,
    KIND,
    MANAGER_NAMESPACE,
    SCHEDULER_NAME,
)
from controllers.ledger.records import RECORD_LABEL, RECORD_LABEL_VALUE, record_name
from tests.runtime.helpers import as_client, configmap, running_cache, settle

__all__ = [
    "CUDA_IMAGE",
    "GPU",
    "T0",
    "as_client",
    "configmap",
    "group",
    "node",
    "pod",
    "record",
    "resource_slice",
    "running_cache",
    "settle",
]

Obj = dict[str, Any]
GPU: Final = "nvidia.com/gpu"
T0: Final = "2026-01-01T00:00:00Z"
CUDA_IMAGE: Final = "nvidia/cuda:12.4.1-base-ubuntu22.04"
#: ``pod(scheduler=...)``'s default: our scheduler for a pod in a group, none otherwise.
OURS_IF_GROUPED: Final = "<ours if grouped>"
_BASE_ALLOCATABLE: Final = {"cpu": "8", "memory": "32Gi", "pods": "110"}


def node(
    name: str = "n1",
    devices: Mapping[str, int] | None = None,
    *,
    shared: bool = True,
    ready: bool | str | None = True,
    unschedulable: bool = False,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    taints: Sequence[Obj] | None = None,
    allocatable: Mapping[str, str] | None = None,
) -> Obj:
    """A Node labelled ``deviceshare.io/mode=shared`` (unless ``shared=False``) with 8 CPUs,
    32Gi and ``devices`` (resource -> count) allocatable; ``allocatable`` replaces that
    whole map. ``ready``: True (KubeletReady), False (Unknown, as a lost kubelet), a
    status string, or None for no Ready condition at all."""
    all_labels = {"kubernetes.io/hostname": name, **(labels or {})}
    if shared:
        all_labels["deviceshare.io/mode"] = "shared"
    alloc = dict(_BASE_ALLOCATABLE if allocatable is None else allocatable)
    alloc.update({res: str(n) for res, n in (devices or {}).items()})
    meta: Obj = {"name": name, "labels": all_labels}
    if annotations is not None:
        meta["annotations"] = dict(annotations)
    spec: Obj = {}
    if unschedulable:
        spec["unschedulable"] = True
    if taints:
        spec["taints"] = list(taints)
    status: Obj = {"allocatable": alloc}
    if ready is True:
        status["conditions"] = [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]
    elif ready is False:
        status["conditions"] = [
            {"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown"}
        ]
    elif ready is not None:
        status["conditions"] = [{"type": "Ready", "status": ready}]
    return {"metadata": meta, "spec": spec, "status": status}


def group(
    name: str = "g",
    resources: Mapping[str, int] | None = None,
    *,
    node: str | None = None,
    devices: Mapping[str, str] | None = None,
    phase: str | None = None,
    pods: Sequence[str] | None = None,
    conditions: Sequence[Obj] | None = None,
    selector: Mapping[str, str] | None = None,
    strategy: str = "binpack",
    uid: str | None = None,
    rv: int | str | None = None,
    generation: int | None = None,
    finalizers: Sequence[str] | None = None,
    deleting: bool = False,
    status: Mapping[str, Any] | None = None,
) -> Obj:
    """A SharedDeviceGroup asking for ``resources`` (default one GPU), as the API server
    holds it (``schedulingStrategy`` defaulted). Bound to ``node`` on ``devices``
    (resource -> "0,1") when a node is given, else Pending; ``phase`` says otherwise.
    ``pods`` sets allocatedPods and podCount; ``deleting`` marks it deleted with our
    finalizer holding it (unless ``finalizers`` are given); ``status`` is merged in last."""
    meta: Obj = {"name": name}
    if uid is not None:
        meta["uid"] = uid
    if rv is not None:
        meta["resourceVersion"] = str(rv)
    if generation is not None:
        meta["generation"] = generation
    if deleting:
        meta["deletionTimestamp"] = T0
        meta["finalizers"] = [FINALIZER]
    if finalizers is not None:
        meta["finalizers"] = list(finalizers)
    spec: Obj = {"resources": dict(resources or {GPU: 1}), "schedulingStrategy": strategy}
    if selector:
        spec["nodeSelector"] = dict(selector)
    st: Obj = {"phase": phase or ("Bound" if node else "Pending")}
    if node:
        st.update({"nodeName": node, "selectedDevices": dict(devices or {})})
    if pods:
        st.update({"allocatedPods": list(pods), "podCount": len(pods)})
    if conditions:
        st["conditions"] = list(conditions)
    st.update(status or {})
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": meta, "spec": spec, "status": st}


def pod(
    name: str = "p",
    group: str | None = None,
    *,
    namespace: str = "ns",
    node: str | None = None,
    phase: str | None = "Pending",
    env: Mapping[str, str] | None = None,
    containers: Sequence[str] = ("cuda",),
    image: str = CUDA_IMAGE,
    scheduler: str | None = OURS_IF_GROUPED,
    annotations: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    uid: str | None = None,
    cpu: str | None = None,
    limits: Mapping[str, str] | None = None,
    conditions: Sequence[Obj] | None = None,
    waiting: tuple[str, str] | None = None,
) -> Obj:
    """A Pod ``name`` (or ``"namespace/name"``), in ``group`` by annotation when given, one
    container per name in ``containers``, each with ``env``, a ``cpu`` request and
    ``limits``. ``scheduler`` defaults to ours for a group pod and to none otherwise;
    ``waiting`` is the first container's (reason, message); ``phase=None``: no status."""
    if "/" in name:
        namespace, name = name.split("/", 1)
    all_annotations = dict(annotations or {})
    if group:
        all_annotations[GROUP_ANNOTATION] = group
    meta: Obj = {"namespace": namespace, "name": name, "annotations": all_annotations}
    if labels is not None:
        meta["labels"] = dict(labels)
    if uid is not None:
        meta["uid"] = uid
    spec_containers = []
    for c in containers:
        container: Obj = {"name": c, "image": image}
        if env:
            container["env"] = [{"name": k, "value": v} for k, v in env.items()]
        resources: Obj = {}
        if cpu:
            resources["requests"] = {"cpu": cpu}
        if limits:
            resources["limits"] = dict(limits)
        if resources:
            container["resources"] = resources
        spec_containers.append(container)
    spec: Obj = {"containers": spec_containers}
    if scheduler == OURS_IF_GROUPED:
        scheduler = SCHEDULER_NAME if group else None
    if scheduler:
        spec["schedulerName"] = scheduler
    if node:
        spec["nodeName"] = node
    obj: Obj = {"metadata": meta, "spec": spec}
    if phase is not None:
        obj["status"] = {"phase": phase}
        if conditions:
            obj["status"]["conditions"] = list(conditions)
        if waiting:
            obj["status"]["containerStatuses"] = [
                {
                    "name": containers[0],
                    "state": {"waiting": {"reason": waiting[0], "message": waiting[1]}},
                }
            ]
    return obj


def record(
    node: str | None,
    claims: Mapping[str, Any] | str,
    *,
    name: str | None = None,
    namespace: str | None = MANAGER_NAMESPACE,
    rv: int | str | None = 1,
    uids: Mapping[str, str] | str | None = None,
    labelled: bool = False,
) -> Obj:
    """Node ``node``'s claim record: a ConfigMap ``sdg-claims.<node>`` in the manager's
    namespace, unless ``name``/``namespace`` say otherwise. ``claims`` (group ->
    resource -> "0,1") is stored as JSON, or a string as given, malformed ones too;
    ``node=None`` leaves the node out of the data. ``rv`` is its resourceVersion, what
    the ledger orders a record's versions by; ``labelled`` adds the label the manager's
    informer selects records by."""
    if name is None:
        if node is None:
            raise ValueError("record(None, ...) needs a name: there is no node to name it by")
        name = record_name(node)
    data: Obj = {"claims": claims if isinstance(claims, str) else json.dumps(claims)}
    if node is not None:
        data["node"] = node
    if uids is not None:
        data["uids"] = uids if isinstance(uids, str) else json.dumps(uids)
    labels = {RECORD_LABEL: RECORD_LABEL_VALUE} if labelled else None
    return configmap(name, namespace, data=data, labels=labels, rv=rv)


def resource_slice(
    node: str,
    devices: int | Sequence[Obj],
    *,
    driver: str = "gpu.nvidia.com",
    generation: int = 1,
    slices: int | None = None,
) -> Obj:
    """A ResourceSlice of ``driver`` on ``node``: ``devices`` as given, or that many GPUs
    ``gpu-<i>`` with ``index`` i and ``uuid`` U<i> (what the drivers publish varies; pass
    the devices when it matters). ``slices`` sets the pool's resourceSliceCount."""
    listed = (
        [
            {"name": f"gpu-{i}", "attributes": {"index": {"int": i}, "uuid": {"string": f"U{i}"}}}
            for i in range(devices)
        ]
        if isinstance(devices, int)
        else list(devices)
    )
    pool: Obj = {"name": node, "generation": generation}
    if slices is not None:
        pool["resourceSliceCount"] = slices
    return {
        "metadata": {"name": f"{node}-{driver}"},
        "spec": {"driver": driver, "nodeName": node, "pool": pool, "devices": listed},
    }

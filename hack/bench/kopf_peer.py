"""The S4 yardstick: SDG's status controller written as an idiomatic kopf operator.

It keeps what SDG's status controller keeps, ``status.allocatedPods`` (``namespace/name`` of
the group's active pods, at most 1000 listed) and ``status.podCount`` of every
SharedDeviceGroup, from pods annotated ``deviceshare.io/group``:

- an in-memory kopf index of those pods by group (kopf maintains it from its pod watch);
- an event handler on the same pods that writes the group's status from the index with a
  JSON merge patch through the official ``kubernetes`` client (a sync handler, so kopf
  runs it in its thread pool), skipping writes that would not change what was last
  written, one writer per group at a time so the last write holds the newest index.

Run as its own process, as a kopf operator is:

    KUBECONFIG=... python -m kopf run --standalone --all-namespaces hack/bench/kopf_peer.py

Part of the comparison benchmark (``hack/bench/compare.py``), not of SDG.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from typing import Any

import kopf
import kubernetes

GROUP_ANNOTATION = "deviceshare.io/group"
MAX_LISTED = 1000

_locks: defaultdict[str, threading.Lock] = defaultdict(threading.Lock)
_written: dict[str, tuple[list[str], int]] = {}
_api: kubernetes.client.CustomObjectsApi | None = None


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    global _api
    settings.posting.level = 40  # k8s Events only for errors (logging.ERROR)
    kubernetes.config.load_kube_config()
    _api = kubernetes.client.CustomObjectsApi()


@kopf.index("pods", annotations={GROUP_ANNOTATION: kopf.PRESENT})
def pods_by_group(
    namespace: str, name: str, annotations: kopf.Annotations, status: kopf.Status, **_: Any
) -> dict[str, str] | None:
    if status.get("phase") in ("Succeeded", "Failed"):
        return None
    return {annotations[GROUP_ANNOTATION]: f"{namespace}/{name}"}


@kopf.on.event("pods", annotations={GROUP_ANNOTATION: kopf.PRESENT})
def sync_group_status(
    annotations: kopf.Annotations, pods_by_group: kopf.Index[str, str], **_: Any
) -> None:
    group = annotations[GROUP_ANNOTATION]
    with _locks[group]:
        pods = sorted(pods_by_group.get(group, ()))
        want = (pods[:MAX_LISTED], len(pods))
        if _written.get(group) == want:
            return
        assert _api is not None
        try:
            _api.patch_cluster_custom_object_status(
                "deviceshare.io",
                "v1alpha1",
                "shareddevicegroups",
                group,
                {"status": {"allocatedPods": want[0], "podCount": want[1]}},
            )
        except kubernetes.client.ApiException as e:
            if e.status == 404:
                return
            raise
        _written[group] = want

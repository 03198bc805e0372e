"""The fenced, authoritative record of which group holds which device IDs on each node.

One ConfigMap per node (``sdg-claims.<node>`` in the manager's namespace) holds that node's
claims as ``{"group": {"nvidia.com/gpu": "0,1"}}``. Every change is a conditional write
(the ConfigMap's resourceVersion), so two managers with different views (a stale leader
after failover, a forced split brain) get 409 Conflict instead of both succeeding: a
per-group status write alone would not fence, since two writers could bind two different
groups to the same device on the same node.

Why a ConfigMap and not a Node annotation: writing Nodes needs ``nodes/patch``, a right
that can also change taints and labels that steer every scheduler in the cluster; a
ConfigMap in our own namespace needs only a namespaced Role. Why not a CRD of our own:
a ConfigMap is readable with plain kubectl and adds no API surface to version.

``ClaimBook`` mirrors the records (fed by the ConfigMap informer and by our own writes,
newest resourceVersion wins) into a ``DeviceTracker`` that placement reads in memory.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from controllers.tracker import Conflict, Devices, DeviceTracker, decode_claims, encode_claims
from sdgruntime import errors
from sdgruntime.client import Client
from sdgruntime.kinds import CONFIGMAPS

log = logging.getLogger(__name__)

RECORD_LABEL = "deviceshare.io/claims"
RECORD_LABEL_VALUE = "node"
DATA_NODE = "node"
DATA_CLAIMS = "claims"


def record_name(node: str) -> str:
    """``sdg-claims.<node>``; a hash keeps names of very long node names within 253 chars."""
    name = f"sdg-claims.{node}"
    if len(name) <= 253:
        return name
    return f"sdg-claims.{hashlib.sha256(node.encode()).hexdigest()[:40]}"


def _rv(obj: Mapping[str, Any]) -> int:
    try:
        return int((obj.get("metadata") or {}).get("resourceVersion") or 0)
    except ValueError:
        return 0


@dataclass
class Record:
    """One node's claims as last seen, with the resourceVersion that fences the next write."""

    node: str
    claims: dict[str, Devices] = field(default_factory=dict)
    obj: dict[str, Any] | None = None  # the ConfigMap; None while it does not exist

    @property
    def resource_version(self) -> int:
        return _rv(self.obj) if self.obj else 0


class ClaimBook:
    """Mirror of the per-node claim records, and the only writer of them."""

    def __init__(
        self,
        client: Client,
        namespace: str,
        tracker: DeviceTracker | None = None,
        on_change: Callable[[str], None] | None = None,
    ) -> None:
        #: Called with a node's name whenever its mirrored claims change (metrics).
        self.on_change = on_change
        self.client = client
        self.namespace = namespace
        self.tracker = tracker or DeviceTracker()
        self.records: dict[str, Record] = {}
        #: Conflicts found while mirroring (a corrupt record, or one group on two nodes).
        self.conflicts: dict[str, list[Conflict]] = {}

    # --- mirroring -------------------------------------------------------------------
    def observe(self, cm: Mapping[str, Any]) -> str | None:
        """Take a ConfigMap seen by the informer or returned by a write; returns its node
        when the view changed. An older resourceVersion than the one held is ignored, so
        a late informer event cannot undo our own newer write."""
        data = cm.get("data") or {}
        node = data.get(DATA_NODE)
        if not node:
            return None
        held = self.records.get(node)
        if held is not None and held.obj is not None and _rv(cm) <= held.resource_version:
            return None
        try:
            claims = decode_claims(data.get(DATA_CLAIMS, ""))
        except ValueError as err:
            log.error("claim record %s is malformed: %s", record_name(node), err)
            claims = {}
        self.records[node] = Record(node, claims, dict(cm))
        self._mirror(node, claims)
        return node

    def forget(self, cm: Mapping[str, Any]) -> str | None:
        """The ConfigMap was deleted (by a human): its node's claims are gone from the view."""
        node = (cm.get("data") or {}).get(DATA_NODE)
        if not node or node not in self.records:
            return None
        del self.records[node]
        self._mirror(node, {})
        return node

    def _mirror(self, node: str, claims: Mapping[str, Devices]) -> None:
        for group in list(self.tracker.claims_on(node)):
            self.tracker.release(group)
        found: list[Conflict] = []
        for group, devices in sorted(claims.items()):
            found += self.tracker.add_claim(group, node, devices)
        if self.on_change is not None:
            self.on_change(node)
        if found:
            self.conflicts[node] = found
            log.error("claim record of node %s conflicts: %s", node, "; ".join(map(str, found)))
        else:
            self.conflicts.pop(node, None)

    def refresh_tracker(self, node: str) -> None:
        """Re-mirror one node's record into the tracker (drops tentative allocations)."""
        record = self.records.get(node)
        self._mirror(node, record.claims if record else {})

    def claim_of(self, group: str) -> tuple[str, Devices] | None:
        """Where ``group`` holds devices according to the records (None: nowhere)."""
        for node, record in self.records.items():
            if group in record.claims:
                return node, record.claims[group]
        return None

    def nodes_claiming(self, group: str) -> list[str]:
        return sorted(n for n, r in self.records.items() if group in r.claims)

    # --- fenced writes ---------------------------------------------------------------
    async def write(self, node: str, group: str, devices: Devices | None) -> None:
        """Set (or, with ``devices=None``, remove) ``group``'s claim in ``node``'s record.

        Conditional on the record's resourceVersion (or on its absence, for a create).
        Raises ``errors.Conflict`` after refreshing the view when someone else wrote first:
        the caller re-decides from the fresh view; it never retries blindly.
        """
        record = self.records.get(node) or Record(node)
        claims = {g: d for g, d in record.claims.items() if g != group}
        if devices is not None:
            claims[group] = devices
        if claims == record.claims:
            return
        body = {DATA_NODE: node, DATA_CLAIMS: encode_claims(claims)}
        try:
            if record.obj is None:
                cm = {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {
                        "name": record_name(node),
                        "namespace": self.namespace,
                        "labels": {RECORD_LABEL: RECORD_LABEL_VALUE},
                    },
                    "data": body,
                }
                written = await self.client.create(CONFIGMAPS, cm, self.namespace)
            else:
                cm = {**record.obj, "data": body}
                written = await self.client.update(CONFIGMAPS, cm)
        except (errors.Conflict, errors.AlreadyExists) as err:
            await self.refresh(node)
            raise errors.Conflict(
                f"claim record of node {node} changed concurrently; re-deciding", code=409
            ) from err
        self.observe(written)

    async def refresh(self, node: str) -> None:
        """Read a node's record from the API server (after a conflict)."""
        try:
            cm = await self.client.get(CONFIGMAPS, record_name(node), self.namespace)
        except errors.NotFound:
            if node in self.records:
                del self.records[node]
                self._mirror(node, {})
            return
        self.observe(cm)

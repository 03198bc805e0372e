"""In-memory device bookkeeping: which group holds which device ID on which node.

Pure and synchronous. ``controllers.ledger.book.Ledger`` owns the manager's tracker and
mirrors every holder into it (``release`` then ``add_claim``); a reservation picks its IDs
with ``lowest_free``, and placement reads free counts and capacity. Invariant (checked by
``check_invariants`` and the tests): every (node, resource, device ID) is held by at most
one holder, and each holder holds devices on one node. Every public method keeps it or
changes nothing; conflicting inputs are reported, never merged.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from api.constants import MAX_DEVICES_PER_RESOURCE
from api.v1alpha1 import format_ids, parse_ids

__all__ = [
    "AllocationError",
    "Claim",
    "Conflict",
    "DeviceTracker",
    "Holding",
    "InsufficientDevices",
    "format_ids",
    "lowest_free_ids",
    "parse_ids",
]

#: Devices per resource, e.g. ``{"nvidia.com/gpu": [0, 1]}``.
Devices = dict[str, list[int]]
#: The default of a read that finds nothing (never written; no dict built per miss).
_NONE: Mapping[Any, Any] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Claim:
    """The devices one group holds; always on a single node. IDs are sorted tuples."""

    node: str
    devices: Mapping[str, tuple[int, ...]]

    def as_dict(self) -> Devices:
        return {res: list(ids) for res, ids in sorted(self.devices.items())}

    def counts(self) -> dict[str, int]:
        return {res: len(ids) for res, ids in self.devices.items()}


@dataclass(frozen=True, slots=True)
class Holding:
    """One held device, reported when capacity shrinks below it."""

    node: str
    resource: str
    device: int
    group: str

    def __str__(self) -> str:
        return f"{self.resource} {self.device} on node {self.node} held by group {self.group}"


@dataclass(frozen=True, slots=True)
class Conflict:
    """A claim that was rejected because it overlaps one already recorded.

    ``holder`` is the group that keeps the device; when it equals ``group`` the group
    was already recorded with a different claim (e.g. another node) and ``device`` is None.
    """

    group: str
    node: str
    resource: str | None
    device: int | None
    holder: str

    def __str__(self) -> str:
        if self.holder == self.group:
            return (
                f"group {self.group} already holds other devices; "
                f"its claim on node {self.node} was not recorded"
            )
        return (
            f"group {self.group} claims {self.resource} {self.device} on node {self.node}, "
            f"already held by group {self.holder}"
        )


class AllocationError(ValueError):
    """An allocation that cannot be made; nothing was changed."""


class InsufficientDevices(AllocationError):
    def __init__(self, node: str, resource: str, free: int, need: int) -> None:
        self.node, self.resource, self.free, self.need = node, resource, free, need
        super().__init__(f"node {node} has {free} free {resource} (need {need})")


def _check_capacity(resource: str, total: object) -> None:
    if isinstance(total, bool) or not isinstance(total, int) or total < 0:
        raise ValueError(f"capacity of {resource} must be a non-negative integer, got {total!r}")
    if total > MAX_DEVICES_PER_RESOURCE:
        raise ValueError(
            f"capacity of {resource} is {total}, more than the {MAX_DEVICES_PER_RESOURCE} "
            "devices SDG addresses per node"
        )


def lowest_free_ids(capacity: int, taken: Container[int], n: int) -> list[int]:
    """The ``n`` lowest IDs in ``0..capacity-1`` not in ``taken`` (fewer if there are not
    that many). Walks upwards and stops after ``n`` free ones, so it costs O(n + taken
    below the last one returned), never O(capacity) for a small ``n``."""
    out: list[int] = []
    i = 0
    while len(out) < n and i < capacity:
        if i not in taken:
            out.append(i)
        i += 1
    return out


def normalize_devices(devices: Mapping[str, Iterable[int] | str]) -> dict[str, tuple[int, ...]]:
    """Validate a claim's devices: known shape, non-empty, no duplicate IDs."""
    if not devices:
        raise ValueError("a claim must hold at least one device")
    out: dict[str, tuple[int, ...]] = {}
    for res, ids in devices.items():
        if not isinstance(res, str) or not res:
            raise ValueError(f"bad resource name {res!r}")
        parsed = parse_ids(ids) if isinstance(ids, str) else parse_ids(format_ids(ids))
        if not parsed:
            raise ValueError(f"claim on {res} lists no device IDs")
        out[res] = tuple(parsed)
    return out


class DeviceTracker:
    """Device IDs ``0..capacity-1`` per node and resource, and the group holding each."""

    def __init__(self) -> None:
        self._capacity: dict[str, dict[str, int]] = {}
        # node -> resource -> device ID -> group
        self._held: dict[str, dict[str, dict[int, str]]] = {}
        self._claims: dict[str, Claim] = {}

    # --- queries -----------------------------------------------------------------------

    def capacity(self, node: str, resource: str) -> int:
        return self._capacity.get(node, {}).get(resource, 0)

    def capacities(self, node: str) -> dict[str, int]:
        """Every device resource ``node`` offers, with its count."""
        return dict(self._capacity.get(node, {}))

    def lowest_free(self, node: str, resource: str, n: int) -> list[int]:
        """The ``n`` lowest IDs below capacity that no group holds (fewer if there are
        not that many), in O(n + held): only held IDs are ever skipped."""
        return lowest_free_ids(
            self.capacity(node, resource), self._held.get(node, {}).get(resource, {}), n
        )

    def free_ids(self, node: str, resource: str, limit: int | None = None) -> list[int]:
        """Free IDs below capacity, lowest first; at most ``limit`` of them if given.

        Without a limit this lists every free ID (bounded by the capacity, which
        ``node_device_capacity`` caps); callers that need ``k`` IDs use ``lowest_free``.
        """
        return self.lowest_free(
            node, resource, self.capacity(node, resource) if limit is None else limit
        )

    def free(self, node: str, resource: str) -> int:
        """How many IDs below capacity no group holds, in O(held).

        Placement calls this once per node for every group, so it reads the dicts
        directly and counts in C unless some held ID is at or beyond capacity (a node that
        shrank)."""
        cap = self._capacity.get(node, _NONE).get(resource, 0)
        held = self._held.get(node, _NONE).get(resource)
        if not held:
            return cap
        if max(held) < cap:
            return cap - len(held)
        return cap - sum(1 for i in held if i < cap)

    def holder(self, node: str, resource: str, device: int) -> str | None:
        return self._held.get(node, {}).get(resource, {}).get(device)

    def holders_on(self, node: str) -> Mapping[str, Mapping[int, str]]:
        """``{resource: {device ID: holder}}`` on ``node``, read-only, in O(1): what a
        per-node reader needs without walking every claim as ``claims_on`` does."""
        return MappingProxyType(self._held.get(node, _NONE))

    def claims_of(self, group: str) -> Claim | None:
        return self._claims.get(group)

    def claims_on(self, node: str) -> dict[str, Devices]:
        """The node's holdings: ``{group: {resource: [ids]}}``."""
        return {g: c.as_dict() for g, c in sorted(self._claims.items()) if c.node == node}

    def groups(self) -> list[str]:
        return sorted(self._claims)

    def nodes(self) -> list[str]:
        """Nodes with a capacity or a holding."""
        return sorted(set(self._capacity) | {c.node for c in self._claims.values()})

    def stranded(self, node: str | None = None) -> list[Holding]:
        """Held devices at or beyond their node's current capacity (node shrank or vanished)."""
        out: list[Holding] = []
        for n, per_res in sorted(self._held.items()):
            if node is not None and n != node:
                continue
            for res, ids in sorted(per_res.items()):
                cap = self.capacity(n, res)
                out.extend(Holding(n, res, i, g) for i, g in sorted(ids.items()) if i >= cap)
        return out

    # --- capacity ----------------------------------------------------------------------

    def set_capacity(self, node: str, resource: str, total: int) -> list[Holding]:
        """Set a node's device count; returns holdings now beyond it (they are kept).

        At most ``MAX_DEVICES_PER_RESOURCE``: ``node_device_capacity`` already offers
        nothing for a larger count, and refusing it here keeps every per-device loop over
        a capacity bounded whatever a caller feeds in.
        """
        _check_capacity(resource, total)
        per_node = self._capacity.setdefault(node, {})
        if total:
            per_node[resource] = total
        else:
            per_node.pop(resource, None)
        if not per_node:
            del self._capacity[node]
        held = self._held.get(node, {}).get(resource, {})
        return [Holding(node, resource, i, g) for i, g in sorted(held.items()) if i >= total]

    def set_node_capacity(self, node: str, capacities: Mapping[str, int]) -> list[Holding]:
        """Replace all of a node's capacities (resources not listed become 0)."""
        for res, total in capacities.items():
            _check_capacity(res, total)
        resources = set(self._capacity.get(node, {})) | set(capacities)
        resources |= set(self._held.get(node, {}))
        out: list[Holding] = []
        for res in sorted(resources):
            out.extend(self.set_capacity(node, res, capacities.get(res, 0)))
        return out

    def remove_node(self, node: str) -> list[Holding]:
        """The node is gone: capacity 0 everywhere; returns the holdings left stranded."""
        return self.set_node_capacity(node, {})

    # --- changes -----------------------------------------------------------------------

    def add_claim(
        self, group: str, node: str, devices: Mapping[str, Iterable[int] | str]
    ) -> list[Conflict]:
        """Record specific devices for ``group`` (from a claim record or a group status).

        All or nothing: on any overlap nothing is recorded and the conflicts are returned.
        Capacity is not checked (nodes may not be known yet); see ``stranded``.
        Recording the group's identical existing claim again is a no-op.
        """
        normalized = normalize_devices(devices)
        existing = self._claims.get(group)
        if existing is not None:
            if existing.node == node and dict(existing.devices) == normalized:
                return []
            return [Conflict(group, node, None, None, group)]
        conflicts = [
            Conflict(group, node, res, i, holder)
            for res, ids in sorted(normalized.items())
            for i in ids
            if (holder := self.holder(node, res, i)) is not None
        ]
        if not conflicts:
            self._record(group, node, normalized)
        return conflicts

    def release(self, group: str) -> Claim | None:
        """Free everything ``group`` holds; returns what it held (None if nothing)."""
        claim = self._claims.pop(group, None)
        if claim is None:
            return None
        per_node = self._held[claim.node]
        for res, ids in claim.devices.items():
            held = per_node[res]
            for i in ids:
                del held[i]
            if not held:
                del per_node[res]
        if not per_node:
            del self._held[claim.node]
        return claim

    def _record(self, group: str, node: str, devices: Mapping[str, tuple[int, ...]]) -> None:
        per_node = self._held.setdefault(node, {})
        for res, ids in devices.items():
            held = per_node.setdefault(res, {})
            for i in ids:
                assert i not in held, "invariant: a device is held by at most one group"
                held[i] = group
        self._claims[group] = Claim(node, MappingProxyType(dict(sorted(devices.items()))))

    def check_invariants(self) -> None:
        """Raise AssertionError if the holder index and the claims disagree (for tests)."""
        seen: dict[tuple[str, str, int], str] = {}
        for group, claim in self._claims.items():
            for res, ids in claim.devices.items():
                assert list(ids) == sorted(set(ids)), f"{group}: unsorted/duplicate IDs"
                for i in ids:
                    key = (claim.node, res, i)
                    assert key not in seen, f"{key} held by {seen.get(key)} and {group}"
                    seen[key] = group
        indexed = {
            (n, r, i): g
            for n, per_res in self._held.items()
            for r, ids in per_res.items()
            for i, g in ids.items()
        }
        assert indexed == seen, "holder index out of sync with claims"
        assert all(self._held.values()) and all(
            ids for per_res in self._held.values() for ids in per_res.values()
        ), "empty index entries left behind"


def overlaps(held: Mapping[str, Iterable[int]], devices: Mapping[str, Iterable[int]]) -> bool:
    """Whether two holdings on one node share any device ID."""
    return any(set(held.get(res, ())) & set(ids) for res, ids in devices.items())

"""Who holds each device, typed: the ledger's merge as readers see it.

``Ledger._mirror`` puts every holding of a node into the tracker under a holder name;
this module is the one home of those names (``key``) and of reading them back
(``parse``), so no reader tests a string prefix. ``NodeView`` is one node's holdings as
typed holders, what ``Ledger.view`` returns to metrics, the CLI and the e2e tests.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from controllers.ledger.tracker import Devices


@dataclass(frozen=True)
class Group:
    """A SharedDeviceGroup, by its record, its Bound status or a decision in flight."""

    name: str


@dataclass(frozen=True)
class ResourceClaim:
    """A ResourceClaim DRA allocated the device to (not a group's own claim)."""

    namespace: str
    name: str


@dataclass(frozen=True)
class Pod:
    """A pod outside any group that the kubelet gave the device (device-plugin books)."""

    namespace: str
    name: str


@dataclass(frozen=True)
class SameDevice:
    """Held under another resource name of the same physical device (one device env var:
    ``huawei.com/Ascend910`` and ``-2c``)."""

    holder: Holder


@dataclass(frozen=True)
class Conflict:
    """Two or more holders claim the device: it is nobody's until one lets go."""

    holders: tuple[Holder, ...]


@dataclass(frozen=True)
class Malformed:
    """The node's claim record cannot be read: nothing on it is given out."""


@dataclass(frozen=True)
class Unavailable:
    """Missing or unhealthy in the node's inventory (below its highest ID)."""


Holder = Group | ResourceClaim | Pod | SameDevice | Conflict | Malformed | Unavailable

_CLAIM: Final = "!claim:"
_POD: Final = "!pod:"
_SAME: Final = "!same-device:"
_CONFLICT: Final = "!conflict:"
_MALFORMED: Final = "!malformed-record"
_UNAVAILABLE: Final = "!unavailable"


def key(holder: Holder) -> str:
    """The tracker's name of ``holder`` (group names are DNS subdomains: no ``!``, no
    ``,``; so every name parses back to the holder it was made from)."""
    match holder:
        case Group(name):
            return name
        case ResourceClaim(namespace, name):
            return f"{_CLAIM}{namespace}/{name}"
        case Pod(namespace, name):
            return f"{_POD}{namespace}/{name}"
        case SameDevice(inner):
            return f"{_SAME}{key(inner)}"
        case Conflict(holders):
            return _CONFLICT + ",".join(sorted(key(h) for h in holders))
        case Malformed():
            return _MALFORMED
        case Unavailable():
            return _UNAVAILABLE
    raise TypeError(f"not a holder: {holder!r}")


def parse(name: str) -> Holder:
    """The holder ``key`` named ``name``."""
    if name.startswith(_CONFLICT):
        return Conflict(tuple(parse(p) for p in name[len(_CONFLICT) :].split(",")))
    if name.startswith(_SAME):
        return SameDevice(parse(name[len(_SAME) :]))
    for prefix, kind in ((_CLAIM, ResourceClaim), (_POD, Pod)):
        if name.startswith(prefix):
            namespace, _, obj = name[len(prefix) :].partition("/")
            return kind(namespace, obj)
    if name == _MALFORMED:
        return Malformed()
    if name == _UNAVAILABLE:
        return Unavailable()
    return Group(name)


def conflict(keys: set[str]) -> str:
    """The tracker's name of the conflict between the holders named ``keys``."""
    return key(Conflict(tuple(parse(k) for k in keys)))


def groups_in(holder: Holder) -> set[str]:
    """The groups ``holder`` names (a conflict may name several)."""
    match holder:
        case Group(name):
            return {name}
        case SameDevice(inner):
            return groups_in(inner)
        case Conflict(holders):
            return set().union(*(groups_in(h) for h in holders))
    return set()


def describe(holder: Holder) -> str:
    """``holder`` for a person: ``group g``, ``ResourceClaim ns/c``, ``pod ns/p``, ..."""
    match holder:
        case Group(name):
            return f"group {name}"
        case ResourceClaim(namespace, name):
            return f"ResourceClaim {namespace}/{name}"
        case Pod(namespace, name):
            return f"pod {namespace}/{name}"
        case SameDevice(inner):
            return f"{describe(inner)} (under a sibling resource name)"
        case Conflict(holders):
            return "conflict: " + ", ".join(describe(h) for h in holders)
        case Malformed():
            return "malformed claim record"
        case Unavailable():
            return "unavailable (missing or unhealthy)"
    raise TypeError(f"not a holder: {holder!r}")


@dataclass(frozen=True)
class NodeView:
    """One node's devices as the ledger sees them: capacity per resource and the holder
    of every device that is not free."""

    node: str
    capacity: Mapping[str, int] = field(default_factory=dict)
    #: (resource, device ID) -> its holder; absent: free.
    holders: Mapping[tuple[str, int], Holder] = field(default_factory=dict)
    #: Why the node's record is unreadable (nothing is given out there), if it is.
    broken: str | None = None

    def free(self, resource: str) -> list[int]:
        return [
            i for i in range(self.capacity.get(resource, 0)) if (resource, i) not in self.holders
        ]

    def held_by(self, group: str) -> Devices:
        """The devices ``group`` alone holds here."""
        out: Devices = {}
        for (res, i), holder in sorted(self.holders.items()):
            if holder == Group(group):
                out.setdefault(res, []).append(i)
        return out

    def conflicts(self) -> dict[tuple[str, int], Conflict]:
        return {d: h for d, h in self.holders.items() if isinstance(h, Conflict)}

"""What each node's pods take, kept as pods come and go, so a fit check reads totals.

kube-scheduler keeps a NodeInfo per node with its pods' summed requests and host ports,
updated per pod event; a fit check then costs the same beside ten pods or a thousand.
``NodeBook`` is that for SDG's pod scheduler. It counts the active pods the pod cache
shows bound to a node (its informer's handlers feed it) and the pods this process has
bound that the cache does not show there yet ("assumed", as kube-scheduler does). An
assumed pod stops counting as assumed when the cache shows it bound (it then counts as
cached), when it is deleted, when its bind fails, or ``ttl`` seconds after the bind.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from api.pods import is_active, pod_key
from controllers.podfit import NodeUsage, Share, share_of
from sdgruntime.kinds import spec_of

#: An assumed pod is dropped after this long even if the cache never showed it bound.
ASSUME_TTL = 30.0

_NONE = NodeUsage()


class _Entry(NamedTuple):
    node: str
    share: Share
    assumed_at: float | None  # None: the cache shows it there


#: The spec fields a pod's ``Share`` is computed from.
_TAKE_FIELDS = ("containers", "initContainers", "resources", "overhead")


def _same_take(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether ``new`` takes what ``old`` took (the fields of its share are equal)."""
    a, b = spec_of(old), spec_of(new)
    return all(a.get(f) == b.get(f) for f in _TAKE_FIELDS)


class NodeBook:
    """Per node, what its active pods take (``NodeUsage``): the pod cache's and the
    assumed ones. Every change is O(the pod's own size); memory is one entry per active
    bound pod plus the binds of the last ``ttl`` seconds."""

    def __init__(
        self, ttl: float = ASSUME_TTL, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.ttl = ttl
        self._clock = clock
        self._entries: dict[str, _Entry] = {}  # pod key -> where it counts, and how much
        self._nodes: dict[str, NodeUsage] = {}
        #: Assumed pod keys -> when, oldest first (re-assuming moves a key to the end).
        self._assumed: dict[str, float] = {}

    def __len__(self) -> int:
        """Pods counted on some node."""
        return len(self._entries)

    @property
    def assumed(self) -> int:
        """Pods counted because this process bound them, not yet shown by the cache."""
        return len(self._assumed)

    # --- the pod informer's handlers -----------------------------------------------------

    def pod_added(self, pod: Mapping[str, Any]) -> None:
        self._observe(pod_key(pod), pod)

    def pod_updated(self, old: Mapping[str, Any], new: Mapping[str, Any]) -> None:
        key = pod_key(new)
        entry = self._entries.get(key)
        if entry is not None and is_active(new) and _same_take(old, new):
            if entry.assumed_at is None:
                return  # a status change of a counted pod (not Succeeded/Failed)
            if spec_of(new).get("nodeName") == entry.node:
                # The cache shows the bind: the pod counts as cached from now on, with the
                # share its assumption computed (what it takes has not changed since).
                del self._assumed[key]
                self._entries[key] = entry._replace(assumed_at=None)
                return
        self._observe(key, new)

    def pod_deleted(self, pod: Mapping[str, Any]) -> None:
        self._drop(pod_key(pod))

    def _observe(self, key: str, pod: Mapping[str, Any]) -> None:
        node = spec_of(pod).get("nodeName")
        if not node:
            # Not bound (yet): an assumed bind of it keeps counting, with what it takes now
            # (a finished pod takes nothing).
            entry = self._entries.get(key)
            if entry is not None and entry.assumed_at is not None:
                if not is_active(pod):
                    self._drop(key)
                    return
                share = share_of(pod, lenient=True)
                if share != entry.share:
                    usage = self._nodes[entry.node]
                    usage.add(entry.share, -1)
                    usage.add(share)
                    self._entries[key] = entry._replace(share=share)
            return
        if is_active(pod):
            # a pod the API server let in counts, whatever of it does not parse
            self._put(key, node, share_of(pod, lenient=True), None)
        else:
            self._drop(key)

    # --- the pod scheduler's binds -------------------------------------------------------

    def assume(self, key: str, node: str, share: Share) -> None:
        """Count a pod this process is binding to ``node`` (before the POST is sent)."""
        now = self._clock()
        self._expire(now)
        entry = self._entries.get(key)
        if entry is not None and entry.assumed_at is None and entry.node == node:
            return  # the cache shows it there already
        self._put(key, node, share, now)

    def forget(self, key: str) -> None:
        """The bind of ``key`` failed: it no longer counts, unless the cache shows it."""
        if key in self._assumed:
            self._drop(key)

    def usage(self, node: str, but: str | None = None) -> NodeUsage:
        """What ``node``'s active pods take, other than the pod ``but`` (a key). Read
        only: the book's own totals when nothing is left out."""
        self._expire(self._clock())
        usage = self._nodes.get(node, _NONE)
        entry = self._entries.get(but) if but is not None else None
        if entry is not None and entry.node == node:
            return usage.without(entry.share)
        return usage

    # --- the books -----------------------------------------------------------------------

    def _put(self, key: str, node: str, share: Share, assumed_at: float | None) -> None:
        self._drop(key)
        self._entries[key] = _Entry(node, share, assumed_at)
        usage = self._nodes.get(node)
        if usage is None:
            usage = self._nodes[node] = NodeUsage()
        usage.add(share)
        if assumed_at is not None:
            self._assumed[key] = assumed_at

    def _drop(self, key: str) -> None:
        entry = self._entries.pop(key, None)
        if entry is None:
            return
        self._assumed.pop(key, None)
        usage = self._nodes[entry.node]
        usage.add(entry.share, -1)
        if not usage.pods:
            del self._nodes[entry.node]

    def _expire(self, now: float) -> None:
        """Drop the assumed binds older than ``ttl`` (the oldest come first)."""
        assumed = self._assumed
        while assumed:
            key, at = next(iter(assumed.items()))
            if now - at <= self.ttl:
                return
            self._drop(key)

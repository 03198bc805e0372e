"""Giving devices back: the one place that decides to remove a claim from a record.

:func:`should_release` judges a claim against a *live* read of its group (UID checked),
never the cache; :class:`ClaimReleaser` removes the claims it agrees on. Invariants: a
removal is conditional on the claim as judged (a bind that adopted it meanwhile makes it
fail), and no claim is removed while active pods of that group are bound to its node.
The cases and why: docs/design.md, "Only fresh reads release devices".
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from api.constants import PHASE_BOUND, SDG_KIND
from api.pods import POD_GROUP_INDEX, cached_pod, is_active, pod_group, pod_key
from api.v1alpha1 import group_phase, is_bound
from controllers.ledger.book import Ledger
from sdgruntime import errors
from sdgruntime.cache import Cache
from sdgruntime.client import Client
from sdgruntime.kinds import PODS, Obj, meta_of, spec_of

log = logging.getLogger(__name__)

#: Bumps a Pending group's resourceVersion before its claim on a node is given back
#: (``GroupWriter.fence``): the group as written, or None when someone wrote it first.
Fence = Callable[[Obj, str], Awaitable[Obj | None]]


async def live_group(client: Client, name: str) -> dict[str, Any] | None:
    """Group ``name`` as the API server has it now (None: it does not exist)."""
    try:
        return await client.get(SDG_KIND, name)
    except errors.NotFound:
        return None


def bound_pods(cache: Cache, name: str) -> list[Obj]:
    """Active pods naming group ``name`` that are bound to a node (cache, read-only)."""
    return [
        p
        for p in cache.list(PODS, index=POD_GROUP_INDEX, value=name, copy=False)
        if is_active(p) and spec_of(p).get("nodeName")
    ]


def should_release(live: Obj | None, node: str, claim_uid: str, *, adoptable: bool = False) -> bool:
    """Whether the claim of group ``live``'s name on ``node`` (recorded with
    ``claim_uid``, "" if none was) is stale, judged on a live read (pure; the caller
    still keeps it while pods of that name run on the node)."""
    if live is None:
        return True
    uid = meta_of(live).get("uid") or ""
    if claim_uid and claim_uid != uid:
        return True  # an earlier group of the same name made it
    if is_bound(live):
        return bool(live["status"]["nodeName"] != node)
    return not adoptable


def _same_pending_group(live: Obj | None, claim_uid: str) -> bool:
    """The claim is this very group's (same UID, or none recorded) and it is not Bound:
    the one case where a bind of it may be in flight elsewhere."""
    if live is None:
        return False
    uid = meta_of(live).get("uid") or ""
    if claim_uid and claim_uid != uid:
        return False
    return group_phase(live) != PHASE_BOUND


class ClaimReleaser:
    """Removes claims only after ``should_release`` agrees on a live read."""

    def __init__(self, claims: Ledger, cache: Cache, client: Client, fence: Fence) -> None:
        self.claims = claims
        self.cache = cache
        self.client = client
        self.fence = fence

    async def release_stale(
        self, name: str, *, adoptable_on: str | None = None, live: Obj | None = None
    ) -> Obj | None:
        """Remove every claim of ``name`` that a live read shows to be stale; returns the
        live group (None if it does not exist, or when no claim needed a read).
        ``adoptable_on`` names the node whose claim a Pending group may still adopt."""
        nodes = self.claims.nodes_claiming(name)
        if not nodes:
            return live  # nothing to give back: no read needed
        # The claims as judged, taken before the live read: each is given back only if it
        # is still exactly this one (a bind that adopts a claim renews it first).
        seen = {node: self.claims.claim(node, name) for node in nodes}
        if live is None:
            live = await live_group(self.client, name)
        running = {spec_of(p).get("nodeName") for p in bound_pods(self.cache, name)}
        for node in nodes:
            stale = should_release(
                live,
                node,
                self.claims.uid_of(node, name),
                adoptable=node == adoptable_on,
            )
            if stale and node in running:
                log.warning(
                    "keeping the stale claim of %s on node %s: pods of that name run there",
                    name,
                    node,
                )
            elif stale:
                if _same_pending_group(live, self.claims.uid_of(node, name)):
                    assert live is not None
                    fenced = await self.fence(live, node)
                    if fenced is None:
                        return None  # someone wrote the group first: its event follows
                    live = fenced
                log.info("releasing the claim of %s on node %s (live read)", name, node)
                await self.claims.writer.write(node, name, None, expect=seen[node])
        return live

    async def _live_members(self, name: str, node: str) -> list[str]:
        """Active pods of group ``name`` on ``node``, read live (one page per node: a
        node runs at most a few hundred pods)."""
        found, _ = await self.client.list_all(
            PODS, None, field_selector=f"spec.nodeName={node}", transform=cached_pod
        )
        return sorted(pod_key(p) for p in found if is_active(p) and pod_group(p) == name)

    async def release_deleted(self, group: Obj) -> bool:
        """A group being deleted whose pods are gone: give back all of its claims, after a
        live read confirms it is that same group, still being deleted. Returns whether the
        finalizer may go."""
        name = group["metadata"]["name"]
        seen = {node: self.claims.claim(node, name) for node in self.claims.nodes_claiming(name)}
        live = await live_group(self.client, name)
        if live is None or live["metadata"].get("uid") != group["metadata"].get("uid"):
            return False  # gone already, or recreated: its reconcile will judge
        if not live["metadata"].get("deletionTimestamp"):
            return False
        for node in seen:
            # The pod cache may lag a pod created with nodeName already set (it needs no
            # binding): the node's pods are read live before its devices are given back.
            running = await self._live_members(name, node)
            if running:
                log.info(
                    "keeping the claims of group %s: its pods %s run on node %s (live read)",
                    name,
                    ", ".join(running[:5]),
                    node,
                )
                return False
        for node, claim in seen.items():
            if claim is not None and claim.uid and claim.uid != live["metadata"].get("uid"):
                continue  # an earlier group's claim: the orphan path judges it
            await self.claims.writer.write(node, name, None, expect=claim)
        return True

"""The one writer of the claim records: fenced, coalesced per node.

:class:`RecordWriter` makes every change a conditional write (the record's
resourceVersion, or its absence for a create) that is also conditional on the claim of
that group the caller saw (``expect``), so two managers with different views conflict
instead of both succeeding. Writes of one node's record are serialised and coalesced
(:mod:`controllers.ledger.coalesce`); what a write returns goes back to the book at once
(``Ledger.written``). Why both fences: docs/design.md, "Claims are fenced".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from api.constants import SDG_KIND
from api.v1alpha1 import is_bound, parse_ids
from controllers.ledger.coalesce import Abandoned, Coalescer
from controllers.ledger.records import (
    RECORD_LABEL,
    RECORD_LABEL_VALUE,
    Claim,
    Record,
    describe_claim,
    record_data,
    record_name,
)
from controllers.ledger.tracker import Devices, overlaps
from sdgruntime import errors
from sdgruntime.client import Client
from sdgruntime.kinds import CONFIGMAPS, meta_of


class Books(Protocol):
    """What the writer reads of, and feeds back to, the ledger (``book.Ledger``; the
    ledger makes its writer, so the writer knows it only by this)."""

    @property
    def broken(self) -> Mapping[str, str]: ...
    @property
    def records(self) -> Mapping[str, Record]: ...
    def claim(self, node: str, group: str) -> Claim | None: ...
    def bound_on(self, node: str) -> dict[str, Devices]: ...
    def was_deleted(self, node: str) -> bool: ...
    def written(self, node: str, cm: Mapping[str, Any]) -> None: ...
    def record_gone(self, node: str) -> None: ...
    def observe(self, cm: Mapping[str, Any]) -> str | None: ...


class ClaimRecordBroken(Exception):
    """A node's claim record is malformed: nothing is written there until it is fixed."""


class RecordWriter:
    """Fenced, coalesced writes of the claim records; each result goes to ``book``."""

    def __init__(self, book: Books, client: Client | None, namespace: str) -> None:
        self.book = book
        self._client = client
        self.namespace = namespace
        #: Record writes, serialised and coalesced per node.
        self._commits: Coalescer[str, _Change] = Coalescer(self._flush)

    @property
    def client(self) -> Client:
        if self._client is None:
            raise RuntimeError("a ledger of listed objects (no client) cannot write")
        return self._client

    async def write(
        self,
        node: str,
        group: str,
        devices: Devices | None,
        *,
        expect: Claim | None,
        uid: str = "",
        version: str = "",
    ) -> None:
        """Set (or, with ``devices=None``, remove) ``group``'s claim in ``node``'s record,
        recording ``uid`` (the claiming group's) and ``version`` (the resourceVersion of
        the group object it was decided on) with it.

        Conditional twice: on the record's resourceVersion (or on its absence, for a
        create), and on ``group``'s claim in it being ``expect`` (what the caller decided
        on, from ``claim``; None: no claim of the group there). Removing a claim that is
        already gone succeeds. Raises ``errors.Conflict`` after refreshing the view when
        either differs: the caller re-decides from the fresh view; it never retries
        blindly. Removing a claim is the caller's decision to make on a live read of the
        group (``controllers.ledger.release``); this method only fences the write.

        Writes to one node are serialised, and changes that arrive while one is in flight
        go together in the next (``controllers.ledger.coalesce``): concurrent binds onto one node
        cost one write, not a 409 each. Each caller still gets its own outcome: a change
        that overlaps a claim already recorded fails alone; a failed write (409, or any
        error) fails every change it carried, so each caller gives back what it reserved.
        """
        try:
            await self._commits.submit(node, _Change(group, devices, uid, version, expect))
        except Abandoned as err:
            raise errors.TransportError(
                f"claim record of node {node}: the write was cancelled ({err})"
            ) from err

    async def claim_for(self, node: str, group: Mapping[str, Any], devices: Devices) -> None:
        """Set ``group``'s claim on ``node`` to ``devices``, conditional on its claim there
        as seen now, stamped with the group object's UID and resourceVersion: adopting a
        claim (renewing it), or restoring one from a status or from pods."""
        meta = meta_of(group)
        name = str(meta.get("name") or "")
        await self.write(
            node,
            name,
            devices,
            expect=self.book.claim(node, name),
            uid=str(meta.get("uid") or ""),
            version=str(meta.get("resourceVersion") or ""),
        )

    async def _flush(self, node: str, changes: list[_Change]) -> list[BaseException | None]:
        """One conditional write of ``node``'s record with every change that fits it; one
        outcome per change."""
        why = self.book.broken.get(node)
        if why is not None:
            return [ClaimRecordBroken(why)] * len(changes)
        record = self.book.records.get(node) or Record(node)
        claims, uids = dict(record.claims), dict(record.uids)
        versions = dict(record.versions)
        outcomes: list[BaseException | None] = []
        # Bound statuses hold devices too (a record deleted by hand must not free them):
        # known ones always; on re-creating a record that was deleted (nothing to fence
        # on), read live, so a view that lags another manager's bind cannot create a
        # record that overlaps it. (A node's first record needs no such read: a bind
        # writes the record before the status, so no group is Bound there without one.)
        bound = self.book.bound_on(node)
        if record.obj is None and self.book.was_deleted(node) and any(c.devices for c in changes):
            try:
                bound.update(await self._bound_live(node))
            except errors.ApiError as err:
                return [err] * len(changes)
        for change in changes:
            group, devices = change.group, change.devices
            if devices is None and group not in claims:
                outcomes.append(None)  # given back already
                continue
            now = Record(node, claims, None, uids, versions).claim(group)
            if now != change.expect:
                # The group's claim is not the one the caller decided on: another manager
                # (or a bind of the same group elsewhere) wrote it meanwhile.
                why = (
                    f"node {node}: the claim of {group} is {describe_claim(now)}, "
                    f"not {describe_claim(change.expect)} as when decided"
                )
                outcomes.append(errors.Conflict(why, code=409))
                continue
            overlap = sorted(
                {
                    g
                    for source in (claims, bound)
                    for g, held in source.items()
                    if g != group and overlaps(held, devices or {})
                }
            )
            if overlap:
                # The record we fence on already gives some of these IDs to another
                # group: our view was wrong. Never write a device twice.
                why = f"node {node}: {devices} overlap the claims of {overlap}"
                outcomes.append(errors.Conflict(why, code=409))
                continue
            claims.pop(group, None)
            uids.pop(group, None)
            versions.pop(group, None)
            if devices is not None:
                claims[group] = devices
                if change.uid:
                    uids[group] = change.uid
                if change.version:
                    versions[group] = change.version
            outcomes.append(None)
        if claims != record.claims or uids != record.uids or versions != record.versions:
            try:
                self.book.written(node, await self._put(node, record, claims, uids, versions))
            except (errors.Conflict, errors.AlreadyExists) as err:
                await self.refresh(node)
                conflict = errors.Conflict(
                    f"claim record of node {node} changed concurrently; re-deciding", code=409
                )
                conflict.__cause__ = err
                return [conflict if o is None else o for o in outcomes]
            except Exception as err:
                return [err if o is None else o for o in outcomes]
        if any(o is not None for o in outcomes):
            await self.refresh(node)
        return outcomes

    async def _bound_live(self, node: str) -> dict[str, Devices]:
        """Groups Bound on ``node`` as the API server says now -> their devices."""
        groups, _ = await self.client.list_all(SDG_KIND)
        out: dict[str, Devices] = {}
        for g in groups:
            if not is_bound(g) or g["status"]["nodeName"] != node:
                continue
            try:
                devices = {
                    r: parse_ids(i) for r, i in (g["status"].get("selectedDevices") or {}).items()
                }
            except ValueError:
                continue
            out[str(meta_of(g).get("name") or "")] = devices
        return out

    async def _put(
        self,
        node: str,
        record: Record,
        claims: dict[str, Devices],
        uids: dict[str, str],
        versions: dict[str, str],
    ) -> dict[str, Any]:
        """Create or update ``node``'s record as ``claims``/``uids``/``versions``,
        conditionally."""
        body = record_data(node, claims, uids, versions)
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
            return await self.client.create(CONFIGMAPS, cm, self.namespace)
        return await self.client.update(CONFIGMAPS, {**record.obj, "data": body})

    async def refresh(self, node: str) -> None:
        """Read a node's record from the API server by its name (after a conflict)."""
        name = record_name(node)
        try:
            cm = await self.client.get(CONFIGMAPS, name, self.namespace)
        except errors.NotFound:
            self.book.record_gone(node)
            return
        self.book.observe(cm)


@dataclass(frozen=True)
class _Change:
    """One caller's change to a node's record: ``devices`` None removes the claim;
    ``expect`` is the group's claim it was decided on."""

    group: str
    devices: Devices | None
    uid: str
    version: str
    expect: Claim | None

"""The claim book's fenced writes under concurrency: serialised and coalesced per node,
each caller told its own outcome, and the view refreshed after any 409."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any

import anyio
import pytest

from api.constants import SDG_KIND
from controllers.ledger.book import Ledger
from controllers.ledger.records import record_name
from controllers.ledger.writer import ClaimRecordBroken
from sdgruntime import errors
from sdgruntime.envtest import FakeClient
from sdgruntime.kinds import CONFIGMAPS, Kind
from tests.factories import as_client, group, settle

pytestmark = pytest.mark.anyio

GPU = "nvidia.com/gpu"
Obj = dict[str, Any]


class Records(FakeClient):
    """The API server (a FakeClient: conditional updates, AlreadyExists), each ConfigMap
    write waiting for ``gate`` first; ``fail`` is raised once, instead of a write. Groups
    added with ``add(SDG_KIND, ...)`` are what a record's create reads live."""

    def __init__(self) -> None:
        super().__init__()
        self.written: list[tuple[str, Obj]] = []
        self.in_flight = 0
        self.most_in_flight: dict[str, int] = {}
        self.gate = anyio.Event()
        self.gate.set()
        self.fail: Exception | None = None

    async def _held(self, verb: str, obj: Mapping[str, Any]) -> None:
        name = obj["metadata"]["name"]
        self.written.append((verb, copy.deepcopy(obj["data"])))
        self.in_flight += 1
        self.most_in_flight[name] = max(self.most_in_flight.get(name, 0), self.in_flight)
        try:
            await self.gate.wait()
        finally:
            self.in_flight -= 1
        if self.fail is not None:
            err, self.fail = self.fail, None
            raise err

    async def create(
        self, kind: Kind, obj: Mapping[str, Any], namespace: str | None = None, **kw: Any
    ) -> Obj:
        await self._held("create", obj)
        return await super().create(kind, obj, namespace, **kw)

    async def update(
        self, kind: Kind, obj: Mapping[str, Any], *, subresource: str | None = None
    ) -> Obj:
        await self._held("update", obj)
        return await super().update(kind, obj, subresource=subresource)

    def record(self, node: str) -> Obj | None:
        """Node ``node``'s record as stored, or None."""
        try:
            return self.stored(CONFIGMAPS, record_name(node), "ns")
        except errors.NotFound:
            return None

    def claims_of(self, node: str) -> Any:
        return json.loads(self.stored(CONFIGMAPS, record_name(node), "ns")["data"]["claims"])


def book(api: Records, *nodes: str) -> Ledger:
    b = Ledger(as_client(api), "ns")
    for node in nodes:
        b.set_capacity(node, {GPU: 8})
    return b


async def write(
    b: Ledger, out: dict[str, object], node: str, group: str, ids: list[int] | None
) -> None:
    try:
        devices = None if ids is None else {GPU: ids}
        await b.writer.write(node, group, devices, expect=b.claim(node, group), uid=f"uid-{group}")
        out[group] = "ok"
    except Exception as err:
        out[group] = err


async def test_claims_arriving_during_a_write_go_together_in_the_next_one() -> None:
    api = Records()
    b = book(api, "n0")
    out: dict[str, object] = {}
    api.gate = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(write, b, out, "n0", "a", [0])
        await settle()
        for i, g in enumerate(("b", "c", "d"), start=1):
            tg.start_soon(write, b, out, "n0", g, [i])
        await settle()
        api.gate.set()
    assert out == {"a": "ok", "b": "ok", "c": "ok", "d": "ok"}
    assert [verb for verb, _ in api.written] == ["create", "update"]  # 4 claims, 2 writes
    assert api.most_in_flight[record_name("n0")] == 1  # never two writes of one record
    assert api.claims_of("n0") == {
        "a": {GPU: "0"},
        "b": {GPU: "1"},
        "c": {GPU: "2"},
        "d": {GPU: "3"},
    }
    assert b.claim_on("n0", "d") == {GPU: [3]} and b.uid_of("n0", "d") == "uid-d"
    assert b.nodes_claiming("c") == ["n0"] and b.claim_of("c") == ("n0", {GPU: [2]})


async def test_different_nodes_are_written_side_by_side() -> None:
    api = Records()
    b = book(api, "n0", "n1")
    out: dict[str, object] = {}
    api.gate = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(write, b, out, "n0", "a", [0])
        tg.start_soon(write, b, out, "n1", "b", [0])
        await settle()
        assert api.in_flight == 2
        api.gate.set()
    assert out == {"a": "ok", "b": "ok"}


async def test_a_claim_overlapping_the_record_fails_alone() -> None:
    api = Records()
    b = book(api, "n0")
    await b.writer.write("n0", "a", {GPU: [0]}, expect=b.claim("n0", "a"), uid="uid-a")
    out: dict[str, object] = {}
    api.gate = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(write, b, out, "n0", "first", [5])
        await settle()
        tg.start_soon(write, b, out, "n0", "b", [1])
        tg.start_soon(write, b, out, "n0", "c", [1])  # b got 1 just before it in the batch
        tg.start_soon(write, b, out, "n0", "d", [0])  # a holds 0
        await settle()
        api.gate.set()
    assert out["first"] == out["b"] == "ok"
    assert isinstance(out["c"], errors.Conflict) and isinstance(out["d"], errors.Conflict)
    assert api.claims_of("n0") == {"a": {GPU: "0"}, "first": {GPU: "5"}, "b": {GPU: "1"}}
    assert len(api.written) == 3  # a; first; b (c and d left out, not a write of their own)


async def test_a_conflict_fails_the_whole_batch_and_refreshes_the_view() -> None:
    api = Records()
    b = book(api, "n0")
    await b.writer.write("n0", "a", {GPU: [0]}, expect=b.claim("n0", "a"), uid="uid-a")
    # Another manager writes the record: our view of it is now one version behind.
    theirs = api.record("n0")
    assert theirs is not None
    theirs["data"]["claims"] = '{"a":{"nvidia.com/gpu":"0"},"x":{"nvidia.com/gpu":"1"}}'
    api.add(CONFIGMAPS, theirs)
    out: dict[str, object] = {}
    async with anyio.create_task_group() as tg:
        tg.start_soon(write, b, out, "n0", "b", [1])
        tg.start_soon(write, b, out, "n0", "c", [2])
    assert isinstance(out["b"], errors.Conflict) and isinstance(out["c"], errors.Conflict)
    assert b.claim_on("n0", "x") == {GPU: [1]}  # refreshed: the next decision sees x
    assert b.claim_on("n0", "b") is None and b.claim_on("n0", "c") is None
    await b.writer.write(
        "n0", "c", {GPU: [2]}, expect=b.claim("n0", "c"), uid="uid-c"
    )  # decided again: fenced on the new view
    assert set(api.claims_of("n0")) == {"a", "x", "c"}


async def test_any_write_error_fails_every_change_it_carried() -> None:
    api = Records()
    b = book(api, "n0")
    await b.writer.write("n0", "a", {GPU: [0]}, expect=b.claim("n0", "a"), uid="uid-a")
    out: dict[str, object] = {}
    api.gate = anyio.Event()
    refused = errors.Forbidden("quota", code=403)
    async with anyio.create_task_group() as tg:
        tg.start_soon(write, b, out, "n0", "first", [3])
        await settle()
        tg.start_soon(write, b, out, "n0", "b", [1])
        tg.start_soon(write, b, out, "n0", "a", None)  # a release rides in the same batch
        await settle()
        first_gate, api.gate = api.gate, anyio.Event()
        first_gate.set()  # "first" is written; the batch of b and a's release waits
        await settle()
        api.fail = refused
        api.gate.set()
    assert out == {"first": "ok", "b": refused, "a": refused}
    assert b.claim_on("n0", "a") == {GPU: [0]} and b.claim_on("n0", "b") is None


async def test_a_release_and_a_claim_in_one_batch() -> None:
    api = Records()
    b = book(api, "n0")
    await b.writer.write("n0", "a", {GPU: [0]}, expect=b.claim("n0", "a"), uid="uid-a")
    out: dict[str, object] = {}
    api.gate = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(write, b, out, "n0", "first", [4])
        await settle()
        tg.start_soon(write, b, out, "n0", "a", None)
        tg.start_soon(write, b, out, "n0", "b", [1])
        await settle()
        api.gate.set()
    assert out == {"first": "ok", "a": "ok", "b": "ok"}
    assert api.claims_of("n0") == {"first": {GPU: "4"}, "b": {GPU: "1"}}
    assert b.nodes_claiming("a") == [] and b.claim_of("a") is None and b.uid_of("n0", "a") == ""


async def test_nothing_is_written_to_a_malformed_record() -> None:
    api = Records()
    b = book(api, "n0")
    b.observe(
        {
            "metadata": {"name": record_name("n0"), "resourceVersion": "9"},
            "data": {"node": "n0", "claims": "["},
        }
    )
    with pytest.raises(ClaimRecordBroken):
        await b.writer.write("n0", "a", {GPU: [0]}, expect=b.claim("n0", "a"), uid="uid-a")
    assert api.written == []


async def test_a_change_that_changes_nothing_writes_nothing() -> None:
    api = Records()
    b = book(api, "n0")
    await b.writer.write("n0", "a", {GPU: [0]}, expect=b.claim("n0", "a"), uid="uid-a")
    await b.writer.write("n0", "a", {GPU: [0]}, expect=b.claim("n0", "a"), uid="uid-a")
    await b.writer.write("n0", "ghost", None, expect=None)
    assert len(api.written) == 1


async def test_a_bind_that_did_not_see_the_groups_claim_never_replaces_it() -> None:
    # Two managers: ours binds "a" onto 0 and the other, whose view has no claim of "a"
    # yet, decides on 3. Its write must not silently move a's claim (our status may
    # already say Bound on 0, and 0 would then look free to everyone).
    api = Records()
    ours, theirs = book(api, "n0"), book(api, "n0")
    await ours.writer.write("n0", "a", {GPU: [0]}, expect=None, uid="uid-a", version="5")
    theirs.observe(api.stored(CONFIGMAPS, record_name("n0"), "ns"))
    with pytest.raises(errors.Conflict, match="claim of a is"):
        await theirs.writer.write("n0", "a", {GPU: [3]}, expect=None, uid="uid-a", version="5")
    assert api.claims_of("n0") == {"a": {GPU: "0"}}
    assert len(api.written) == 1  # refused before any write


async def test_a_release_decided_on_a_claim_renewed_since_fails() -> None:
    api = Records()
    b = book(api, "n0")
    await b.writer.write("n0", "a", {GPU: [0]}, expect=None, uid="uid-a", version="5")
    judged = b.claim("n0", "a")
    assert judged is not None and judged.version == "5"
    # A bind adopts the claim, renewing it with the group version it writes Bound on.
    await b.writer.write("n0", "a", {GPU: [0]}, expect=judged, uid="uid-a", version="8")
    assert json.loads(api.stored(CONFIGMAPS, record_name("n0"), "ns")["data"]["versions"]) == {
        "a": "8"
    }
    with pytest.raises(errors.Conflict, match=r"group version 5\) as when decided"):
        await b.writer.write("n0", "a", None, expect=judged)
    assert api.claims_of("n0") == {"a": {GPU: "0"}}
    # Giving back a claim that is gone already is done, whatever was judged.
    await b.writer.write("n0", "a", None, expect=b.claim("n0", "a"))
    await b.writer.write("n0", "a", None, expect=judged)
    assert api.claims_of("n0") == {}


async def test_a_record_created_anew_never_overlaps_a_live_bound_group() -> None:
    """The node's record was deleted by hand and this book has not seen another manager's
    bind of 'a' on GPUs 0,1: the re-create reads the groups live and refuses the overlap
    (a create cannot fence on a resourceVersion, so it must not decide on a stale view)."""
    api = Records()
    api.add(SDG_KIND, group("a", {GPU: 2}, node="n1", devices={GPU: "0,1"}))
    b = book(api, "n1")
    deleted = {
        "metadata": {"name": record_name("n1"), "resourceVersion": "1"},
        "data": {"node": "n1", "claims": json.dumps({"a": {GPU: "0,1"}})},
    }
    b.observe(deleted)
    b.forget(deleted)  # deleted by hand: the next write is a create on nothing to fence
    out: dict[str, object] = {}
    await write(b, out, "n1", "b", [1, 2])
    assert isinstance(out["b"], errors.Conflict), out
    assert "overlap" in str(out["b"]) and "'a'" in str(out["b"])
    assert api.record("n1") is None  # nothing was written
    await write(b, out, "n1", "b", [2, 3])
    assert out["b"] == "ok"
    assert api.claims_of("n1") == {"b": {GPU: "2,3"}}


async def test_a_write_never_overlaps_a_bound_status_the_book_knows() -> None:
    b = book(Records(), "n1")
    b.observe_group(
        {
            "metadata": {"name": "a"},
            "status": {"phase": "Bound", "nodeName": "n1", "selectedDevices": {GPU: "0"}},
        }
    )
    out: dict[str, object] = {}
    await write(b, out, "n1", "b", [0])
    assert isinstance(out["b"], errors.Conflict), out

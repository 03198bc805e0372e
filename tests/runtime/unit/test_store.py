"""The cache's store: keys, indexes, relist differences, copies, transforms."""

from __future__ import annotations

import copy
import random
from typing import Any

import pytest

from sdgruntime.cache import (
    Store,
    drop_managed_fields,
    field_indexer,
    intern_strings,
    json_copy,
    make_key,
    object_key,
)

GROUP = "metadata.annotations['deviceshare.io/group']"


def pod(
    name: str,
    ns: str = "default",
    *,
    rv: str = "1",
    node: str | None = None,
    group: str | None = None,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": ns, "resourceVersion": rv}
    if group is not None:
        meta["annotations"] = {"deviceshare.io/group": group}
    if labels:
        meta["labels"] = labels
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "x", "env": []}]}
    if node is not None:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def names(objs: list[dict[str, Any]]) -> list[str]:
    return sorted(o["metadata"]["name"] for o in objs)


def test_keys_are_namespace_slash_name_or_name() -> None:
    assert object_key(pod("a", "ns1")) == "ns1/a"
    assert object_key({"metadata": {"name": "node-1"}}) == "node-1"
    assert make_key("a", "ns1") == "ns1/a"
    assert make_key("node-1") == "node-1"
    store = Store()
    store.upsert(pod("a", "ns1"))
    store.upsert({"metadata": {"name": "node-1"}})
    assert sorted(store.keys()) == ["node-1", "ns1/a"]
    assert store.get("ns1/a")["metadata"]["name"] == "a"  # type: ignore[index]
    assert store.get("ns2/a") is None
    assert "node-1" in store and len(store) == 2


def test_field_indexer_paths() -> None:
    obj = pod("a", node="n1", group="g1", labels={"app": "web"})
    obj["spec"]["ports"] = [80, 443]
    obj["spec"]["hostNetwork"] = True
    assert field_indexer("spec.nodeName")(obj) == ["n1"]
    assert field_indexer(GROUP)(obj) == ["g1"]
    assert field_indexer('metadata.annotations["deviceshare.io/group"]')(obj) == ["g1"]
    assert field_indexer("metadata.labels[app]")(obj) == ["web"]
    assert field_indexer("spec.ports")(obj) == ["80", "443"]
    assert field_indexer("spec.hostNetwork")(obj) == ["true"]
    assert field_indexer("spec.missing.deeper")(obj) == []
    assert field_indexer("spec")(obj) == []  # an object is not an index value
    for bad in ("", "spec..nodeName", "metadata.labels[", "a['x']b"):
        with pytest.raises(ValueError):
            field_indexer(bad)


def test_indexes_follow_adds_updates_and_deletes() -> None:
    store = Store(indexers={"node": field_indexer("spec.nodeName"), "group": field_indexer(GROUP)})
    store.upsert(pod("a", node="n1", group="g1"))
    store.upsert(pod("b", node="n1", group="g2"))
    store.upsert(pod("c", node="n2"))
    assert names(store.by_index("node", "n1")) == ["a", "b"]
    assert names(store.by_index("group", "g1")) == ["a"]
    assert store.by_index("group", "nope") == []

    old, new = store.upsert(pod("a", rv="2", node="n2", group="g1"))  # moved node
    assert old is not None and old["spec"]["nodeName"] == "n1"
    assert new["spec"]["nodeName"] == "n2"
    assert names(store.by_index("node", "n1")) == ["b"]
    assert names(store.by_index("node", "n2")) == ["a", "c"]

    gone = store.delete("default/b")
    assert gone is not None and gone["metadata"]["name"] == "b"
    assert store.delete("default/b") is None
    assert store.by_index("node", "n1") == []
    assert sorted(store.index_values("node")) == ["n2"]  # empty buckets are dropped
    with pytest.raises(KeyError):
        store.by_index("nope", "x")


def test_indexes_match_a_fresh_index_after_any_sequence_of_writes() -> None:
    """Random upserts (values kept, changed, added or dropped; several per object) and
    deletes: each index holds exactly what indexing the stored objects afresh gives, and
    no empty bucket."""
    rng = random.Random(11)
    indexers = {"node": field_indexer("spec.nodeName"), "ports": field_indexer("spec.ports")}
    store = Store(indexers=indexers)
    for step in range(3000):
        name = f"p{rng.randrange(30)}"
        if rng.random() < 0.2:
            store.delete(f"default/{name}")
            continue
        obj = pod(name, rv=str(step), node=rng.choice([None, "n1", "n2"]))
        obj["spec"]["ports"] = rng.sample(["80", "443", "8080"], rng.randrange(3))
        store.upsert(obj)
        for index, fn in indexers.items():
            fresh: dict[str, set[str]] = {}
            for obj in store.list(copy=False):
                for value in fn(obj):
                    fresh.setdefault(value, set()).add(object_key(obj))
            assert {v: set(store.index_keys(index, v)) for v in store.index_values(index)} == fresh


def test_index_added_later_covers_existing_objects_and_names_are_unique() -> None:
    store = Store()
    store.upsert(pod("a", group="g1"))
    store.add_indexer("group", field_indexer(GROUP))
    assert names(store.by_index("group", "g1")) == ["a"]
    with pytest.raises(ValueError, match="already exists"):
        store.add_indexer("group", field_indexer(GROUP))


def test_multi_valued_index() -> None:
    store = Store(indexers={"port": field_indexer("spec.ports")})
    a = pod("a")
    a["spec"]["ports"] = ["80", "443", "80"]
    store.upsert(a)
    assert names(store.by_index("port", "80")) == ["a"]
    assert names(store.by_index("port", "443")) == ["a"]


def test_replace_reports_what_vanished_changed_and_appeared() -> None:
    store = Store(indexers={"node": field_indexer("spec.nodeName")})
    store.upsert(pod("stays", rv="1", node="n1"))
    store.upsert(pod("changes", rv="1", node="n1"))
    store.upsert(pod("vanishes", rv="7", node="n1", group="g"))

    result = store.replace(
        [pod("stays", rv="1", node="n1"), pod("changes", rv="2", node="n2"), pod("new", rv="3")]
    )

    assert [o["metadata"]["name"] for o in result.added] == ["new"]
    assert [(o["metadata"]["resourceVersion"], n["metadata"]["resourceVersion"])
            for o, n in result.updated] == [("1", "2")]  # fmt: skip
    # the vanished object comes back in its last known state
    assert result.deleted == [pod("vanishes", rv="7", node="n1", group="g")]
    assert sorted(store.keys()) == ["default/changes", "default/new", "default/stays"]
    assert names(store.by_index("node", "n1")) == ["stays"]
    assert names(store.by_index("node", "n2")) == ["changes"]


def test_index_count_follows_moves_and_deletes_without_a_list() -> None:
    store = Store(indexers={"node": field_indexer("spec.nodeName")})
    for name in ("a", "b", "c"):
        store.upsert(pod(name, node="n1"))
    store.upsert(pod("b", rv="2", node="n2"))  # moved
    store.delete("default/c")
    assert [store.index_count("node", n) for n in ("n1", "n2", "n3")] == [1, 1, 0]
    with pytest.raises(KeyError, match="no index 'zone'"):
        store.index_count("zone", "z1")


def test_replace_without_resource_versions_compares_content() -> None:
    store = Store()
    store.upsert({"metadata": {"name": "a"}, "data": {"x": "1"}})
    store.upsert({"metadata": {"name": "b"}, "data": {"x": "1"}})
    result = store.replace(
        [{"metadata": {"name": "a"}, "data": {"x": "1"}}, {"metadata": {"name": "b"}, "data": {}}]
    )
    assert result.added == [] and result.deleted == []
    assert [n["metadata"]["name"] for _, n in result.updated] == ["b"]


def _snapshot(store: Store) -> tuple[Any, ...]:
    return (
        {object_key(o): o for o in store.list()},
        {v: sorted(store.index_keys("node", v)) for v in store.index_values("node")},
    )


def test_replace_is_all_or_nothing_when_the_transform_or_an_indexer_raises() -> None:
    def fragile_transform(obj: dict[str, Any]) -> dict[str, Any]:
        if obj["metadata"]["name"] == "bad":
            raise KeyError("spec")
        return obj

    def fragile_indexer(obj: dict[str, Any]) -> list[str]:
        if obj["metadata"]["name"] == "bad":
            raise TypeError("not indexable")
        return [obj["spec"].get("nodeName", "")]

    for store in (
        Store(indexers={"node": field_indexer("spec.nodeName")}, transform=fragile_transform),
        Store(indexers={"node": fragile_indexer}),
    ):
        store.upsert(pod("a", node="n1"))
        store.upsert(pod("gone", node="n1"))
        before = _snapshot(store)
        with pytest.raises((KeyError, TypeError)):
            store.replace([pod("a", rv="2", node="n2"), pod("bad"), pod("c", node="n3")])
        assert _snapshot(store) == before  # no partial prefix: "gone" can still be deleted
        result = store.replace([pod("a", rv="2", node="n2")])
        assert names(result.deleted) == ["gone"]
        assert names(store.by_index("node", "n2")) == ["a"]
        assert store.index_values("node") == ["n2"]


def test_replace_with_a_key_twice_keeps_the_last_and_its_index_only() -> None:
    store = Store(indexers={"node": field_indexer("spec.nodeName")})
    result = store.replace([pod("a", rv="1", node="n1"), pod("a", rv="2", node="n2")])
    assert names(result.added) == ["a"] and store.get("default/a") == pod("a", rv="2", node="n2")
    assert store.index_values("node") == ["n2"]


def test_upsert_with_a_failing_indexer_changes_nothing() -> None:
    def fragile(obj: dict[str, Any]) -> list[str]:
        if obj["metadata"]["resourceVersion"] == "2":
            raise TypeError("not indexable")
        return [obj["spec"]["nodeName"]]

    store = Store(indexers={"node": fragile})
    store.upsert(pod("a", rv="1", node="n1"))
    with pytest.raises(TypeError):
        store.upsert(pod("a", rv="2", node="n2"))
    assert store.get("default/a") == pod("a", rv="1", node="n1")
    assert names(store.by_index("node", "n1")) == ["a"]


def test_reads_return_copies_that_cannot_change_the_store() -> None:
    store = Store(indexers={"node": field_indexer("spec.nodeName")})
    store.upsert(pod("a", node="n1", labels={"app": "web"}))
    pristine = copy.deepcopy(store.get("default/a"))

    got = store.get("default/a")
    assert got is not None
    got["metadata"]["labels"]["app"] = "evil"
    got["spec"]["containers"][0]["env"].append({"name": "X"})
    got["spec"]["nodeName"] = "n9"
    store.list()[0]["metadata"]["name"] = "renamed"
    store.by_index("node", "n1")[0]["spec"]["containers"].clear()

    assert store.get("default/a") == pristine
    assert names(store.by_index("node", "n1")) == ["a"]


def test_copy_false_returns_the_stored_object_and_updates_never_mutate_it() -> None:
    store = Store()
    store.upsert(pod("a", rv="1"))
    shared = store.get("default/a", copy=False)
    assert shared is store.get("default/a", copy=False)
    assert store.list(copy=False)[0] is shared
    store.upsert(pod("a", rv="2"))  # a reader holding the old object keeps a consistent view
    assert shared is not None and shared["metadata"]["resourceVersion"] == "1"
    assert store.get("default/a", copy=False)["metadata"]["resourceVersion"] == "2"  # type: ignore[index]


def test_json_copy_is_deep_and_equal() -> None:
    tree = {"a": [1, 2.5, {"b": [True, None, "s"]}], "c": {"d": {"e": []}}}
    out = json_copy(tree)
    assert out == tree
    assert out is not tree and out["a"] is not tree["a"] and out["a"][2] is not tree["a"][2]
    assert out["c"]["d"]["e"] is not tree["c"]["d"]["e"]
    assert json_copy([{"x": 1}]) == [{"x": 1}] and json_copy("s") == "s"


def test_transform_runs_before_storing_and_indexing() -> None:
    def strip_and_tag(obj: dict[str, Any]) -> dict[str, Any]:
        obj = drop_managed_fields(obj)
        obj["metadata"].setdefault("labels", {})["cached"] = "yes"
        return obj

    store = Store(
        transform=strip_and_tag, indexers={"cached": field_indexer("metadata.labels.cached")}
    )
    a = pod("a", rv="1")
    a["metadata"]["managedFields"] = [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}]
    _, stored = store.upsert(a)
    assert "managedFields" not in stored["metadata"]
    assert stored["metadata"]["labels"] == {"cached": "yes"}
    assert names(store.by_index("cached", "yes")) == ["a"]

    b = pod("b", rv="1")
    b["metadata"]["managedFields"] = []
    result = store.replace([b])
    assert "managedFields" not in result.added[0]["metadata"]
    assert names(store.by_index("cached", "yes")) == ["b"]


def test_drop_managed_fields_keeps_everything_else() -> None:
    obj = pod("a", labels={"x": "y"})
    obj["metadata"]["managedFields"] = [{"manager": "m"}]
    expected = pod("a", labels={"x": "y"})
    assert drop_managed_fields(obj) == expected
    assert drop_managed_fields({"kind": "Status"}) == {"kind": "Status"}


def test_intern_strings_shares_short_values_and_keeps_the_object_equal() -> None:
    def obj(i: int) -> dict:
        # Fresh strings per object, as a JSON decoder makes them.
        ns, node = "".join(["team-", "a"]), "".join(["gpu-", "node-1"])
        return {
            "metadata": {"name": f"p{i}", "namespace": ns},
            "spec": {"nodeName": node, "tolerations": [{"key": "".join(["k", "1"])}]},
            "big": "x" * 65 + str(i % 1),
        }

    a, b = intern_strings(obj(1)), intern_strings(obj(2))
    assert a == obj(1)
    assert a["metadata"]["namespace"] is b["metadata"]["namespace"]
    assert a["spec"]["nodeName"] is b["spec"]["nodeName"]
    assert a["spec"]["tolerations"][0]["key"] is b["spec"]["tolerations"][0]["key"]
    assert a["big"] is not b["big"]  # longer than INTERN_MAX_LEN: left alone
    deep: dict = {}
    cur = deep
    for _ in range(10_000):  # iterative: no recursion limit to hit
        cur["d"] = {}
        cur = cur["d"]
    intern_strings(deep)

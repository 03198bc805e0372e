"""controllerutil rules that need no API server: owner references (one controller per
object, namespaces, identity), finalizers, merge patches, and the label-selector predicate
(matchLabels, matchExpressions, label removal)."""

from __future__ import annotations

from typing import Any

import pytest

from sdgruntime.controllerutil import (
    AlreadyOwnedError,
    add_finalizer,
    contains_finalizer,
    has_controller_reference,
    has_owner_reference,
    is_controlled_by,
    merge_patch,
    remove_controller_reference,
    remove_finalizer,
    remove_owner_reference,
    set_controller_reference,
    set_owner_reference,
)
from sdgruntime.predicate import LabelSelectorPredicate, label_selector_predicate


def obj(
    kind: str = "Secret",
    name: str = "s",
    namespace: str | None = "ns",
    uid: str | None = None,
    api_version: str = "v1",
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    if uid:
        meta["uid"] = uid
    if labels is not None:
        meta["labels"] = labels
    return {"apiVersion": api_version, "kind": kind, "metadata": meta}


def cm(name: str = "owner", uid: str = "uid-1", namespace: str | None = "ns") -> dict[str, Any]:
    return obj("ConfigMap", name, namespace, uid)


# --- owner references -----------------------------------------------------------------------


def test_controller_reference_is_what_owns_and_the_garbage_collector_follow() -> None:
    secret = obj()
    set_controller_reference(cm(), secret)
    assert secret["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "name": "owner",
            "uid": "uid-1",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert is_controlled_by(secret, cm())
    # Setting it again (each reconcile does) changes nothing.
    set_controller_reference(cm(), secret)
    assert len(secret["metadata"]["ownerReferences"]) == 1


def test_a_second_controller_is_refused_and_the_first_kept() -> None:
    secret = obj()
    set_controller_reference(cm("first", "uid-1"), secret)
    with pytest.raises(AlreadyOwnedError, match="already controlled by ConfigMap first") as info:
        set_controller_reference(cm("second", "uid-2"), secret)
    assert info.value.owner["name"] == "first"
    assert [r["name"] for r in secret["metadata"]["ownerReferences"]] == ["first"]
    # A plain reference from the second owner is fine: many owners, one controller.
    set_owner_reference(cm("second", "uid-2"), secret)
    refs = secret["metadata"]["ownerReferences"]
    assert [(r["name"], r.get("controller")) for r in refs] == [("first", True), ("second", None)]
    assert is_controlled_by(secret, cm("first", "uid-1"))
    assert not is_controlled_by(secret, cm("second", "uid-2"))
    assert has_owner_reference(secret, cm("second", "uid-2"))


def test_the_same_owner_in_a_new_version_is_the_same_reference() -> None:
    """References match by group, kind and name: an owner read in another version of its
    API replaces its reference instead of counting as a second controller."""
    secret = obj()
    set_controller_reference(obj("Widget", "w", "ns", "u", "example.com/v1beta1"), secret)
    set_controller_reference(obj("Widget", "w", "ns", "u", "example.com/v1"), secret)
    assert [r["apiVersion"] for r in secret["metadata"]["ownerReferences"]] == ["example.com/v1"]


def test_is_controlled_by_compares_uids_so_a_recreated_owner_is_not_the_old_one() -> None:
    secret = obj()
    set_controller_reference(cm("owner", "uid-old"), secret)
    assert not is_controlled_by(secret, cm("owner", "uid-new"))
    assert not is_controlled_by(obj(), cm())  # no references at all


def test_owner_namespace_rules() -> None:
    with pytest.raises(ValueError, match="cross-namespace owner references are disallowed"):
        set_controller_reference(cm(namespace="a"), obj(namespace="b"))
    with pytest.raises(ValueError, match="cannot own a cluster-scoped object"):
        set_owner_reference(cm(namespace="a"), obj("Node", "n", namespace=None))
    # A cluster-scoped owner may own namespaced and cluster-scoped objects.
    node = obj("Node", "n", namespace=None, uid="node-uid")
    secret = obj()
    set_controller_reference(node, secret)
    assert is_controlled_by(secret, node)


def test_an_owner_not_yet_created_or_built_by_hand_is_refused_with_what_is_missing() -> None:
    with pytest.raises(ValueError, match=r"no metadata\.uid: use the object as read"):
        set_controller_reference(obj("ConfigMap", "o"), obj())
    with pytest.raises(ValueError, match="no apiVersion, kind"):
        set_owner_reference({"metadata": {"name": "o", "uid": "u", "namespace": "ns"}}, obj())


def test_remove_owner_reference() -> None:
    secret = obj()
    set_owner_reference(cm("a", "ua"), secret)
    set_controller_reference(cm("b", "ub"), secret)
    assert remove_owner_reference(cm("b", "ub"), secret) is True
    assert [r["name"] for r in secret["metadata"]["ownerReferences"]] == ["a"]
    assert remove_owner_reference(cm("b", "ub"), secret) is False
    # Without a controller reference now, another owner may become the controller.
    set_controller_reference(cm("c", "uc"), secret)
    assert is_controlled_by(secret, cm("c", "uc"))


def test_block_owner_deletion_can_be_turned_off_or_on_as_in_controller_runtime() -> None:
    secret = obj()
    set_controller_reference(cm(), secret, block_owner_deletion=False)
    (ref,) = secret["metadata"]["ownerReferences"]
    assert ref["controller"] is True and ref["blockOwnerDeletion"] is False
    plain = obj()
    set_owner_reference(cm(), plain)
    assert "blockOwnerDeletion" not in plain["metadata"]["ownerReferences"][0]
    set_owner_reference(cm(), plain, block_owner_deletion=True)
    assert plain["metadata"]["ownerReferences"][0]["blockOwnerDeletion"] is True


def test_remove_controller_reference_refuses_what_another_controls() -> None:
    secret = obj()
    with pytest.raises(ValueError, match="has no controller reference"):
        remove_controller_reference(cm(), secret)
    set_owner_reference(cm("a", "ua"), secret)
    assert not has_controller_reference(secret)
    with pytest.raises(ValueError, match="has no controller reference"):
        remove_controller_reference(cm("a", "ua"), secret)  # a plain owner is no controller
    set_controller_reference(cm("b", "ub"), secret)
    assert has_controller_reference(secret)
    with pytest.raises(ValueError, match=r"ConfigMap a is not the controller .* ConfigMap b is"):
        remove_controller_reference(cm("a", "ua"), secret)
    assert [r["name"] for r in secret["metadata"]["ownerReferences"]] == ["a", "b"]
    remove_controller_reference(cm("b", "ub"), secret)
    assert [r["name"] for r in secret["metadata"]["ownerReferences"]] == ["a"]
    assert not has_controller_reference(secret)


# --- finalizers -------------------------------------------------------------------------------


def test_finalizers_say_whether_they_changed_the_object() -> None:
    o = obj()
    assert not contains_finalizer(o, "example.com/cleanup")
    assert add_finalizer(o, "example.com/cleanup") is True
    assert add_finalizer(o, "example.com/cleanup") is False  # no second write needed
    assert add_finalizer(o, "other/keep") is True
    assert o["metadata"]["finalizers"] == ["example.com/cleanup", "other/keep"]
    assert remove_finalizer(o, "example.com/cleanup") is True
    assert remove_finalizer(o, "example.com/cleanup") is False
    assert o["metadata"]["finalizers"] == ["other/keep"]
    assert remove_finalizer(o, "other/keep") is True
    # An empty list, not a missing key, so a merge patch of the object carries the removal.
    assert o["metadata"]["finalizers"] == []
    assert remove_finalizer(obj(), "absent") is False


# --- merge patches ----------------------------------------------------------------------------


def test_merge_patch_carries_changes_removals_and_whole_lists_only() -> None:
    before = {
        "metadata": {"name": "x", "labels": {"a": "1", "b": "2"}, "finalizers": ["f1"]},
        "data": {"k": "v", "gone": "x"},
        "same": {"deep": [1, 2]},
    }
    after = {
        "metadata": {"name": "x", "labels": {"a": "1", "c": "3"}, "finalizers": ["f1", "f2"]},
        "data": {"k": "v2"},
        "same": {"deep": [1, 2]},
        "new": True,
    }
    assert merge_patch(before, after) == {
        "metadata": {"labels": {"b": None, "c": "3"}, "finalizers": ["f1", "f2"]},
        "data": {"k": "v2", "gone": None},
        "new": True,
    }
    assert merge_patch(before, before) == {}
    assert merge_patch({"n": 1}, {"n": 1.0}) == {"n": 1.0}  # JSON equality, not Python's


# --- label selector predicate -----------------------------------------------------------------


def labelled(**labels: str) -> dict[str, Any]:
    return obj(labels=labels)


def test_match_labels_and_every_expression_operator() -> None:
    p = label_selector_predicate(
        {
            "matchLabels": {"app": "web"},
            "matchExpressions": [
                {"key": "tier", "operator": "In", "values": ["front", "edge"]},
                {"key": "env", "operator": "NotIn", "values": ["prod"]},
                {"key": "team", "operator": "Exists"},
                {"key": "legacy", "operator": "DoesNotExist"},
            ],
        }
    )
    good = {"app": "web", "tier": "edge", "team": "a"}
    assert p.create(labelled(**good))
    assert p.create(labelled(**good, env="dev"))  # NotIn passes absent and other values
    assert not p.create(labelled(**good, env="prod"))
    assert not p.create(labelled(**{**good, "app": "db"}))
    assert not p.create(labelled(**{**good, "tier": "back"}))
    assert not p.create(labelled(app="web", tier="edge"))  # team missing
    assert not p.create(labelled(**good, legacy="yes"))
    assert not p.delete(obj())  # no labels at all
    assert p.delete(labelled(**good))
    assert LabelSelectorPredicate({}).create(obj())  # the empty selector matches everything


def test_an_update_passes_when_the_old_or_the_new_object_matches() -> None:
    """Removing the selecting label must reach the reconciler, or it never undoes its work
    (what the checks on the new object alone would miss)."""
    p = label_selector_predicate({"matchLabels": {"mirror": "true"}})
    on, off = labelled(mirror="true"), labelled()
    assert p.update(off, on)  # label added
    assert p.update(on, on)  # still selected
    assert p.update(on, off)  # label removed: the reconciler must clean up
    assert not p.update(off, off)  # never selected


@pytest.mark.parametrize(
    ("selector", "message"),
    [
        ({"matchExpressions": [{"key": "a", "operator": "in", "values": ["x"]}]}, "not one of"),
        ({"matchExpressions": [{"key": "a", "operator": "In"}]}, "In on key 'a' needs values"),
        (
            {"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]},
            "takes no values",
        ),
        ({"matchExpressions": [{"operator": "Exists"}]}, "without a key"),
        ({"matchLabel": {"a": "b"}}, "unknown fields"),
    ],
)
def test_a_malformed_selector_fails_when_the_predicate_is_made(
    selector: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        label_selector_predicate(selector)

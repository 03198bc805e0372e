"""Helpers every operator writes otherwise: owner references, create-or-update, finalizers.

As controller-runtime's ``controllerutil``, for plain decoded-JSON objects and the async
:class:`~sdgruntime.client.Client`: set, test and remove owner references, create or
update (or patch) an object through a ``mutate`` function, add and remove finalizers.
The last two say what they changed, so a reconciler writes only when needed. An owner and
its object must share a namespace, or the owner be cluster-scoped, because the garbage
collector resolves references in the object's namespace only.
"""

from __future__ import annotations

import enum
import inspect
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from sdgruntime import errors
from sdgruntime.cache.store import json_copy
from sdgruntime.kinds import Kind, MutableObj
from sdgruntime.webhook.jsonpatch import json_equal

if TYPE_CHECKING:
    from sdgruntime.client import Client

__all__ = [
    "AlreadyOwnedError",
    "OperationResult",
    "add_finalizer",
    "contains_finalizer",
    "create_or_patch",
    "create_or_update",
    "has_controller_reference",
    "has_owner_reference",
    "is_controlled_by",
    "merge_patch",
    "remove_controller_reference",
    "remove_finalizer",
    "remove_owner_reference",
    "set_controller_reference",
    "set_owner_reference",
]

MutateFn = Callable[[MutableObj], Awaitable[None] | None]


class OperationResult(enum.StrEnum):
    """What :func:`create_or_update` / :func:`create_or_patch` did (controller-runtime's
    names in its spelling: ``unchanged`` is its ``OperationResultNone``)."""

    UNCHANGED = "unchanged"
    CREATED = "created"
    UPDATED = "updated"
    UPDATED_STATUS = "updatedStatus"  # create_or_patch: the object and its status
    UPDATED_STATUS_ONLY = "updatedStatusOnly"  # create_or_patch: only the status


class AlreadyOwnedError(ValueError):
    """``obj`` already has another controller (``owner`` is that reference): an object has
    at most one, and taking it over silently would make two controllers fight."""

    def __init__(self, obj: Mapping[str, Any], owner: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        where = f"{meta.get('namespace')}/{meta.get('name')}" if meta.get("namespace") else ""
        super().__init__(
            f"{obj.get('kind', 'object')} {where or meta.get('name')} is already controlled "
            f"by {owner.get('kind')} {owner.get('name')} (uid {owner.get('uid')}); use "
            "set_owner_reference for a non-controlling reference, or remove that one first"
        )
        self.obj = obj
        self.owner = owner


# --- owner references ---------------------------------------------------------------------


def _group(api_version: str) -> str:
    group, sep, _ = api_version.rpartition("/")
    return group if sep else ""


def _reference(owner: Mapping[str, Any]) -> MutableObj:
    meta = owner.get("metadata") or {}
    missing = [f for f in ("apiVersion", "kind") if not owner.get(f)]
    missing += [f"metadata.{f}" for f in ("name", "uid") if not meta.get(f)]
    if missing:
        raise ValueError(
            f"the owner has no {', '.join(missing)}: use the object as read from the API "
            "server or the cache (a uid exists only once the owner is created)"
        )
    return {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": meta["name"],
        "uid": meta["uid"],
    }


def _same_object(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether two references name one object: group, kind and name (not the version, which
    a reference keeps across upgrades), as controller-runtime compares them."""
    return (
        _group(a.get("apiVersion", "")) == _group(b.get("apiVersion", ""))
        and a.get("kind") == b.get("kind")
        and a.get("name") == b.get("name")
    )


def _check_namespaces(owner: Mapping[str, Any], obj: Mapping[str, Any]) -> None:
    owner_ns = (owner.get("metadata") or {}).get("namespace") or ""
    if not owner_ns:
        return  # a cluster-scoped owner may own anything
    obj_ns = (obj.get("metadata") or {}).get("namespace") or ""
    if not obj_ns:
        raise ValueError(
            f"a namespaced owner (namespace {owner_ns}) cannot own a cluster-scoped object; "
            "if the object is namespaced, set its metadata.namespace first"
        )
    if obj_ns != owner_ns:
        raise ValueError(
            f"cross-namespace owner references are disallowed: the owner is in {owner_ns}, "
            f"the object in {obj_ns} (the garbage collector would never find the owner)"
        )


def _upsert(obj: MutableObj, ref: MutableObj) -> None:
    refs = obj.setdefault("metadata", {}).get("ownerReferences") or []
    for i, existing in enumerate(refs):
        if _same_object(existing, ref):
            refs[i] = ref
            break
    else:
        refs.append(ref)
    obj["metadata"]["ownerReferences"] = refs


def set_controller_reference(
    owner: Mapping[str, Any], obj: MutableObj, *, block_owner_deletion: bool = True
) -> None:
    """Make ``owner`` the controller of ``obj`` (in place): a reference with ``controller``
    true, which ``owns()`` watches and the garbage collector follows. Replaces an existing
    reference to the same owner.

    ``block_owner_deletion`` (controller-runtime's ``WithBlockOwnerDeletion``) sets the
    reference's ``blockOwnerDeletion``: true by default, so a foreground deletion of the
    owner waits for ``obj``; setting it true needs the ``update`` right on the owner's
    ``finalizers`` subresource (the OwnerReferencesPermissionEnforcement plugin), so pass
    False where the writer lacks it.

    Raises :class:`AlreadyOwnedError` if another object already controls ``obj``, and
    ``ValueError`` for an owner without apiVersion/kind/name/uid or in another namespace.
    """
    ref = _reference(owner)
    _check_namespaces(owner, obj)
    for existing in (obj.get("metadata") or {}).get("ownerReferences") or ():
        if existing.get("controller") and not _same_object(existing, ref):
            raise AlreadyOwnedError(obj, existing)
    _upsert(obj, {**ref, "controller": True, "blockOwnerDeletion": block_owner_deletion})


def set_owner_reference(
    owner: Mapping[str, Any], obj: MutableObj, *, block_owner_deletion: bool | None = None
) -> None:
    """Add ``owner`` to ``obj``'s owner references (in place), not as its controller: the
    object is garbage-collected once all its owners are gone. As in controller-runtime, an
    existing reference to the same owner is replaced (so a controller reference becomes a
    plain one). ``block_owner_deletion`` writes ``blockOwnerDeletion`` when given (unset
    by default, as controller-runtime's ``SetOwnerReference`` leaves it)."""
    ref = _reference(owner)
    _check_namespaces(owner, obj)
    if block_owner_deletion is not None:
        ref["blockOwnerDeletion"] = block_owner_deletion
    _upsert(obj, ref)


def is_controlled_by(obj: Mapping[str, Any], owner: Mapping[str, Any]) -> bool:
    """Whether ``owner`` is ``obj``'s controller. Compared by uid when the owner has one,
    so an owner deleted and re-created under the same name is not taken for the old one."""
    meta = owner.get("metadata") or {}
    wanted = {"apiVersion": owner.get("apiVersion", ""), "kind": owner.get("kind")}
    wanted["name"] = meta.get("name")
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or ():
        if ref.get("controller"):
            if meta.get("uid"):
                return bool(ref.get("uid") == meta["uid"])
            return _same_object(ref, wanted)
    return False


def has_owner_reference(obj: Mapping[str, Any], owner: Mapping[str, Any]) -> bool:
    """Whether ``obj`` has any reference (controller or not) to ``owner``."""
    ref = _reference(owner)
    return any(
        _same_object(r, ref) for r in (obj.get("metadata") or {}).get("ownerReferences") or ()
    )


def has_controller_reference(obj: Mapping[str, Any]) -> bool:
    """Whether any object controls ``obj`` (a reference with ``controller: true``)."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or ()
    return any(r.get("controller") for r in refs)


def remove_controller_reference(owner: Mapping[str, Any], obj: MutableObj) -> None:
    """Remove ``owner`` as ``obj``'s controller (in place), with every reference to it.

    Raises ``ValueError`` when ``obj`` has no controller, or when its controller is another
    object (as controller-runtime's ``RemoveControllerReference``): taking away what
    another controller holds would let two controllers fight over ``obj``.
    """
    refs = (obj.get("metadata") or {}).get("ownerReferences") or ()
    controller = next((r for r in refs if r.get("controller")), None)
    name = (obj.get("metadata") or {}).get("name")
    if controller is None:
        raise ValueError(f"{obj.get('kind', 'object')} {name} has no controller reference")
    ref = _reference(owner)
    if not _same_object(controller, ref):
        raise ValueError(
            f"{ref['kind']} {ref['name']} is not the controller of "
            f"{obj.get('kind', 'object')} {name}: {controller.get('kind')} "
            f"{controller.get('name')} is; use remove_owner_reference for a plain reference"
        )
    remove_owner_reference(owner, obj)


def remove_owner_reference(owner: Mapping[str, Any], obj: MutableObj) -> bool:
    """Remove ``obj``'s references to ``owner`` (in place); whether there was one."""
    meta = obj.get("metadata") or {}
    refs = meta.get("ownerReferences") or []
    ref = _reference(owner)
    kept = [r for r in refs if not _same_object(r, ref)]
    if len(kept) == len(refs):
        return False
    meta["ownerReferences"] = kept
    return True


# --- finalizers -----------------------------------------------------------------------------


def contains_finalizer(obj: Mapping[str, Any], finalizer: str) -> bool:
    return finalizer in ((obj.get("metadata") or {}).get("finalizers") or ())


def add_finalizer(obj: MutableObj, finalizer: str) -> bool:
    """Add ``finalizer`` (in place) unless present; whether ``obj`` changed (write it then)."""
    if contains_finalizer(obj, finalizer):
        return False
    meta = obj.setdefault("metadata", {})
    meta["finalizers"] = [*(meta.get("finalizers") or ()), finalizer]
    return True


def remove_finalizer(obj: MutableObj, finalizer: str) -> bool:
    """Remove ``finalizer`` (in place); whether ``obj`` changed. The list stays (possibly
    empty) so that an update or a merge patch of ``obj`` carries the removal."""
    if not contains_finalizer(obj, finalizer):
        return False
    meta = obj["metadata"]
    meta["finalizers"] = [f for f in meta["finalizers"] if f != finalizer]
    return True


# --- create or update -------------------------------------------------------------------------


def merge_patch(before: Any, after: Any) -> Any:
    """The JSON merge patch (RFC 7386) turning ``before`` into ``after``: changed keys with
    their new value, removed keys as ``null``, lists whole. ``{}`` when nothing changed."""
    if not (isinstance(before, dict) and isinstance(after, dict)):
        return json_copy(after)
    patch: dict[str, Any] = {key: None for key in before if key not in after}
    for key, value in after.items():
        if key not in before:
            patch[key] = json_copy(value)
        elif not json_equal(before[key], value):
            if isinstance(before[key], dict) and isinstance(value, dict):
                patch[key] = merge_patch(before[key], value)
            else:
                patch[key] = json_copy(value)
    return patch


async def _mutated(obj: MutableObj, mutate: MutateFn, name: str, namespace: str | None) -> None:
    result = mutate(obj)
    if inspect.isawaitable(result):
        await result
    meta = obj.get("metadata") or {}
    if meta.get("name") != name or (meta.get("namespace") or None) != namespace:
        raise ValueError(
            "mutate must not change the object's name or namespace: they are what "
            "create_or_update reads and writes by"
        )


def _skeleton(kind: Kind, name: str, namespace: str | None) -> MutableObj:
    meta: dict[str, Any] = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    return {"apiVersion": kind.api_version, "kind": kind.kind, "metadata": meta}


def _check_mutate(mutate: object) -> None:
    if not callable(mutate):
        raise TypeError(f"mutate must be a function of the object, not {mutate!r}")


async def create_or_update(
    client: Client,
    kind: Kind,
    name: str,
    namespace: str | None,
    mutate: MutateFn,
) -> tuple[OperationResult, MutableObj]:
    """Make object ``name`` (in ``namespace``) what ``mutate`` says, and say what happened.

    ``mutate(obj)`` (sync or async) edits ``obj`` in place towards the desired state: the
    stored object, or ``{apiVersion, kind, metadata: {name, namespace}}`` if there is none.
    It must not change the name or namespace. The object is then created (``CREATED``),
    updated with a PUT carrying the resourceVersion read (``UPDATED``), or left alone when
    ``mutate`` changed nothing (``UNCHANGED``). Returns the result and the object as stored.

    Like controller-runtime's, it does not retry: a concurrent write raises
    ``errors.Conflict`` (or ``AlreadyExists``), and the reconcile is retried as for any
    error. Reads go to the API server, not the cache, so the update is based on the newest
    version.
    """
    _check_mutate(mutate)
    namespace = namespace if kind.namespaced else None
    try:
        current = await client.get(kind, name, namespace)
    except errors.NotFound:
        obj = _skeleton(kind, name, namespace)
        await _mutated(obj, mutate, name, namespace)
        return OperationResult.CREATED, await client.create(kind, obj, namespace)
    obj = json_copy(current)
    await _mutated(obj, mutate, name, namespace)
    if json_equal(current, obj):
        return OperationResult.UNCHANGED, current
    return OperationResult.UPDATED, await client.update(kind, obj)


async def create_or_patch(
    client: Client,
    kind: Kind,
    name: str,
    namespace: str | None,
    mutate: MutateFn,
) -> tuple[OperationResult, MutableObj]:
    """As :func:`create_or_update`, but changes are sent as JSON merge patches of what
    ``mutate`` changed, without a resourceVersion: fields others wrote meanwhile are kept
    and there is no conflict (the last writer of a field wins).

    A changed ``status`` is patched through the ``status`` subresource (the main resource
    ignores it for kinds that have one): the result is ``UPDATED`` (only the object),
    ``UPDATED_STATUS`` (both) or ``UPDATED_STATUS_ONLY``. On create, a status set by
    ``mutate`` is written with a second call, because a create ignores it too.
    """
    _check_mutate(mutate)
    namespace = namespace if kind.namespaced else None
    try:
        current = await client.get(kind, name, namespace)
    except errors.NotFound:
        obj = _skeleton(kind, name, namespace)
        await _mutated(obj, mutate, name, namespace)
        status = obj.get("status")
        created = await client.create(kind, obj, namespace)
        if status is not None and not json_equal(created.get("status"), status):
            created = await client.patch(
                kind, name, {"status": status}, namespace, subresource="status"
            )
        return OperationResult.CREATED, created
    obj = json_copy(current)
    await _mutated(obj, mutate, name, namespace)
    before_status, after_status = current.get("status"), obj.pop("status", None)
    patch = merge_patch({k: v for k, v in current.items() if k != "status"}, obj)
    result, stored = OperationResult.UNCHANGED, current
    if patch:
        stored = await client.patch(kind, name, patch, namespace)
        result = OperationResult.UPDATED
    if not json_equal(before_status, after_status):
        status_patch = merge_patch({"status": before_status}, {"status": after_status})
        stored = await client.patch(kind, name, status_patch, namespace, subresource="status")
        result = (
            OperationResult.UPDATED_STATUS
            if result is OperationResult.UPDATED
            else OperationResult.UPDATED_STATUS_ONLY
        )
    return result, stored

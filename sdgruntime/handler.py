"""Event handlers: which requests a watch event makes.

A handler maps a create, update or delete of a watched object (a decoded dict) to the
requests to reconcile; the controller queues them, so a burst of events for one request
becomes one reconcile. Handlers are pure and synchronous: they run inline in the informer's
event dispatch and must not block.

As controller-runtime's ``handler`` package: the object itself
(:class:`EnqueueRequestForObject`), its owners (:class:`EnqueueRequestForOwner`), or any
mapping (:class:`EnqueueRequestsFromMapFunc`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from sdgruntime.kinds import Kind, Obj
from sdgruntime.reconcile import Request

__all__ = [
    "EnqueueRequestForObject",
    "EnqueueRequestForOwner",
    "EnqueueRequestsFromMapFunc",
    "EventHandler",
    "request_for",
]


def request_for(obj: Obj) -> Request:
    """The request naming ``obj`` itself."""
    meta = obj.get("metadata") or {}
    return Request(meta["name"], meta.get("namespace") or None)


class EventHandler:
    """Maps events to requests; the base class makes none.

    Update gets both versions: a handler whose answer depends on the object's content
    (owners, map functions) must reconcile what the object pointed at *before* the change
    too, or the old target never learns it lost the object.
    """

    def create(self, obj: Obj) -> Iterable[Request]:
        return ()

    def update(self, old: Obj, new: Obj) -> Iterable[Request]:
        return ()

    def delete(self, obj: Obj) -> Iterable[Request]:
        return ()


class EnqueueRequestForObject(EventHandler):
    """Reconcile the object the event is about (the handler of ``for_``)."""

    def create(self, obj: Obj) -> Iterable[Request]:
        return (request_for(obj),)

    def update(self, old: Obj, new: Obj) -> Iterable[Request]:
        return (request_for(new),)  # name and namespace never change

    def delete(self, obj: Obj) -> Iterable[Request]:
        return (request_for(obj),)


def _group(api_version: str) -> str:
    group, sep, _ = api_version.rpartition("/")
    return group if sep else ""


class EnqueueRequestForOwner(EventHandler):
    """Reconcile the owners of kind ``owner_kind`` named in the object's ``ownerReferences``.

    Owners match by API group and kind (any version, as an owner reference survives a
    version upgrade). ``only_controller`` keeps just the reference with ``controller:
    true`` (what ``owns`` in the builder uses). A namespaced owner is in the object's
    namespace (owner references never cross namespaces); a cluster-scoped one has none.
    """

    def __init__(self, owner_kind: Kind, *, only_controller: bool = False) -> None:
        self.owner_kind = owner_kind
        self.only_controller = only_controller

    def _owners(self, obj: Obj) -> Iterator[Request]:
        meta = obj.get("metadata") or {}
        namespace = (meta.get("namespace") or None) if self.owner_kind.namespaced else None
        if self.owner_kind.namespaced and namespace is None:
            return  # a cluster-scoped object cannot have a namespaced owner
        for ref in meta.get("ownerReferences") or ():
            if ref.get("kind") != self.owner_kind.kind:
                continue
            if _group(ref.get("apiVersion", "")) != self.owner_kind.group:
                continue
            if self.only_controller and not ref.get("controller"):
                continue
            yield Request(ref["name"], namespace)

    def create(self, obj: Obj) -> Iterable[Request]:
        return dict.fromkeys(self._owners(obj)).keys()

    def update(self, old: Obj, new: Obj) -> Iterable[Request]:
        return dict.fromkeys([*self._owners(old), *self._owners(new)]).keys()

    def delete(self, obj: Obj) -> Iterable[Request]:
        return dict.fromkeys(self._owners(obj)).keys()


class EnqueueRequestsFromMapFunc(EventHandler):
    """Reconcile whatever ``fn(obj)`` names: e.g. every group that may now fit on a node
    whose allocatable changed. On update, ``fn`` sees both versions."""

    def __init__(self, fn: Callable[[Obj], Iterable[Request]]) -> None:
        self.fn = fn

    def create(self, obj: Obj) -> Iterable[Request]:
        return dict.fromkeys(self.fn(obj)).keys()

    def update(self, old: Obj, new: Obj) -> Iterable[Request]:
        return dict.fromkeys([*self.fn(old), *self.fn(new)]).keys()

    def delete(self, obj: Obj) -> Iterable[Request]:
        return dict.fromkeys(self.fn(obj)).keys()

"""Predicates: which watch events are worth a reconcile.

A predicate sees each create, update and delete event of a watch (decoded objects, before
any request is made) and returns whether to pass it on. All predicates of a watch must
pass. The defaults pass everything, so a predicate only overrides what it filters.

As controller-runtime's ``predicate`` package; filtering saves reconciles, it never
replaces idempotence (a filtered event's object is still reconciled on its next event or
resync).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

__all__ = [
    "And",
    "AnnotationChangedPredicate",
    "Funcs",
    "GenerationChangedPredicate",
    "LabelChangedPredicate",
    "Not",
    "Or",
    "Predicate",
    "ResourceVersionChangedPredicate",
]

Obj = Mapping[str, Any]


def _meta(obj: Obj) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


class Predicate:
    """Passes every event; subclasses override the events they filter."""

    def create(self, obj: Obj) -> bool:
        return True

    def update(self, old: Obj, new: Obj) -> bool:
        return True

    def delete(self, obj: Obj) -> bool:
        return True


class Funcs(Predicate):
    """A predicate from plain functions; an event without a function passes."""

    def __init__(
        self,
        create: Callable[[Obj], bool] | None = None,
        update: Callable[[Obj, Obj], bool] | None = None,
        delete: Callable[[Obj], bool] | None = None,
    ) -> None:
        self._create = create
        self._update = update
        self._delete = delete

    def create(self, obj: Obj) -> bool:
        return self._create is None or bool(self._create(obj))

    def update(self, old: Obj, new: Obj) -> bool:
        return self._update is None or bool(self._update(old, new))

    def delete(self, obj: Obj) -> bool:
        return self._delete is None or bool(self._delete(obj))


class GenerationChangedPredicate(Predicate):
    """Updates pass only when ``metadata.generation`` changed: spec changes, not status or
    metadata-only writes (the API server bumps generation for spec changes of kinds with a
    status subresource). Creates and deletes pass."""

    def update(self, old: Obj, new: Obj) -> bool:
        return _meta(old).get("generation") != _meta(new).get("generation")


class ResourceVersionChangedPredicate(Predicate):
    """Updates pass only when the object really changed (drops resync re-deliveries)."""

    def update(self, old: Obj, new: Obj) -> bool:
        return _meta(old).get("resourceVersion") != _meta(new).get("resourceVersion")


class LabelChangedPredicate(Predicate):
    """Updates pass only when ``metadata.labels`` changed (absent equals empty)."""

    def update(self, old: Obj, new: Obj) -> bool:
        return (_meta(old).get("labels") or {}) != (_meta(new).get("labels") or {})


class AnnotationChangedPredicate(Predicate):
    """Updates pass only when ``metadata.annotations`` changed (absent equals empty)."""

    def update(self, old: Obj, new: Obj) -> bool:
        return (_meta(old).get("annotations") or {}) != (_meta(new).get("annotations") or {})


class And(Predicate):
    """Passes an event when every predicate does."""

    def __init__(self, *predicates: Predicate) -> None:
        self.predicates = predicates

    def create(self, obj: Obj) -> bool:
        return all(p.create(obj) for p in self.predicates)

    def update(self, old: Obj, new: Obj) -> bool:
        return all(p.update(old, new) for p in self.predicates)

    def delete(self, obj: Obj) -> bool:
        return all(p.delete(obj) for p in self.predicates)


class Or(Predicate):
    """Passes an event when any predicate does (e.g. generation *or* labels changed)."""

    def __init__(self, *predicates: Predicate) -> None:
        if not predicates:
            raise ValueError("Or needs at least one predicate")
        self.predicates = predicates

    def create(self, obj: Obj) -> bool:
        return any(p.create(obj) for p in self.predicates)

    def update(self, old: Obj, new: Obj) -> bool:
        return any(p.update(old, new) for p in self.predicates)

    def delete(self, obj: Obj) -> bool:
        return any(p.delete(obj) for p in self.predicates)


class Not(Predicate):
    """Passes exactly the events ``predicate`` filters out."""

    def __init__(self, predicate: Predicate) -> None:
        self.predicate = predicate

    def create(self, obj: Obj) -> bool:
        return not self.predicate.create(obj)

    def update(self, old: Obj, new: Obj) -> bool:
        return not self.predicate.update(old, new)

    def delete(self, obj: Obj) -> bool:
        return not self.predicate.delete(obj)

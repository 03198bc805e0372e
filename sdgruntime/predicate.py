"""Predicates: which watch events are worth a reconcile.

A predicate sees each create, update and delete event of a watch (decoded objects, before
any request is made) and returns whether to pass it on. All predicates of a watch must
pass. The defaults pass everything, so a predicate only overrides what it filters.

As controller-runtime's ``predicate`` package; filtering saves reconciles, it never
replaces idempotence (a filtered event's object is still reconciled on its next event or
resync).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sdgruntime.kinds import Obj

__all__ = [
    "And",
    "AnnotationChangedPredicate",
    "Funcs",
    "GenerationChangedPredicate",
    "LabelChangedPredicate",
    "LabelSelectorPredicate",
    "Not",
    "Or",
    "Predicate",
    "ResourceVersionChangedPredicate",
    "label_selector_matcher",
    "label_selector_predicate",
]


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


_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")


def label_selector_matcher(selector: Mapping[str, Any]) -> Callable[[Mapping[str, str]], bool]:
    """A function telling whether labels match a ``metav1.LabelSelector``
    (``matchLabels`` and ``matchExpressions``; all must hold, ``{}`` matches everything).

    Checked here as the API server checks it, so a typo fails when the watch is declared,
    not silently at every event: an unknown operator, ``In``/``NotIn`` without values or
    ``Exists``/``DoesNotExist`` with values raise ``ValueError``.
    """
    unknown = set(selector) - {"matchLabels", "matchExpressions"}
    if unknown:
        raise ValueError(f"label selector: unknown fields {sorted(unknown)}")
    required = dict(selector.get("matchLabels") or {})
    expressions: list[tuple[str, str, frozenset[str]]] = []
    for expr in selector.get("matchExpressions") or ():
        key, op = expr.get("key"), expr.get("operator")
        values: Sequence[str] = expr.get("values") or ()
        if not key:
            raise ValueError(f"label selector: expression without a key: {dict(expr)}")
        if op not in _OPERATORS:
            raise ValueError(
                f"label selector: operator {op!r} of key {key!r} is not one of "
                f"{', '.join(_OPERATORS)}"
            )
        if op in ("In", "NotIn") and not values:
            raise ValueError(f"label selector: {op} on key {key!r} needs values")
        if op in ("Exists", "DoesNotExist") and values:
            raise ValueError(f"label selector: {op} on key {key!r} takes no values")
        expressions.append((key, op, frozenset(values)))

    def matches(labels: Mapping[str, str]) -> bool:
        if any(labels.get(k) != v for k, v in required.items()):
            return False
        for key, op, values in expressions:
            present = key in labels
            if op == "In" and not (present and labels[key] in values):
                return False
            if op == "NotIn" and present and labels[key] in values:
                return False
            if op == "Exists" and not present:
                return False
            if op == "DoesNotExist" and present:
                return False
        return True

    return matches


class LabelSelectorPredicate(Predicate):
    """Passes events of objects whose labels match ``selector`` (a ``metav1.LabelSelector``).

    An update passes when the old **or** the new object matches: when the label that
    selected an object is removed, the reconciler still hears of it and can undo what it
    did. (controller-runtime's LabelSelectorPredicate looks at the new object only and
    misses that update.)
    """

    def __init__(self, selector: Mapping[str, Any]) -> None:
        self.selector = selector
        self._matches = label_selector_matcher(selector)

    def _labels(self, obj: Obj) -> Mapping[str, str]:
        return _meta(obj).get("labels") or {}

    def create(self, obj: Obj) -> bool:
        return self._matches(self._labels(obj))

    def update(self, old: Obj, new: Obj) -> bool:
        return self._matches(self._labels(old)) or self._matches(self._labels(new))

    def delete(self, obj: Obj) -> bool:
        return self._matches(self._labels(obj))


def label_selector_predicate(selector: Mapping[str, Any]) -> LabelSelectorPredicate:
    """``LabelSelectorPredicate(selector)``, named as controller-runtime's function."""
    return LabelSelectorPredicate(selector)


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

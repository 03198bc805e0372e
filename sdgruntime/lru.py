"""A bounded least-recently-used mapping: what a cache keyed by client or user input uses
so that its memory stays bounded whatever arrives.

Invariant: after every ``put``, ``len(lru) <= max_items`` and, with ``max_weight``, the
weights of the entries held sum to at most ``max_weight``; the least recently put or
read (``get``) entries went first. Membership (``in``) and ``peek`` do not count as use.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterator
from typing import Generic, TypeVar

__all__ = ["LRU"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LRU(Generic[K, V]):
    """At most ``max_items`` entries and, if given, ``max_weight`` of summed weights."""

    __slots__ = ("_items", "max_items", "max_weight", "weight")

    def __init__(self, max_items: int, max_weight: int | None = None) -> None:
        if max_items < 1:
            raise ValueError(f"max_items must be at least 1, got {max_items}")
        if max_weight is not None and max_weight < 1:
            raise ValueError(f"max_weight must be at least 1, got {max_weight}")
        self.max_items = max_items
        self.max_weight = max_weight
        #: The summed weights of the entries held.
        self.weight = 0
        self._items: OrderedDict[K, tuple[V, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __iter__(self) -> Iterator[K]:
        """Keys, the least recently used first."""
        return iter(self._items)

    def get(self, key: K) -> V | None:
        """The value under ``key`` (None if absent), which becomes the most recently used."""
        item = self._items.get(key)
        if item is None:
            return None
        self._items.move_to_end(key)
        return item[0]

    def peek(self, key: K) -> V | None:
        """The value under ``key`` (None if absent), its place unchanged."""
        item = self._items.get(key)
        return None if item is None else item[0]

    def put(self, key: K, value: V, weight: int = 1) -> bool:
        """Hold ``value`` under ``key`` as the most recently used, the oldest entries going
        until both bounds hold. False (nothing held, an old value under ``key`` dropped)
        if ``weight`` alone is over ``max_weight``."""
        self.pop(key)
        if self.max_weight is not None and weight > self.max_weight:
            return False
        self._items[key] = (value, weight)
        self.weight += weight
        items = self._items
        while len(items) > self.max_items or (
            self.max_weight is not None and self.weight > self.max_weight
        ):
            self.weight -= items.popitem(last=False)[1][1]
        return True

    def pop(self, key: K) -> V | None:
        """Drop ``key``; its value, or None if it was not held."""
        item = self._items.pop(key, None)
        if item is None:
            return None
        self.weight -= item[1]
        return item[0]

    def clear(self) -> None:
        self._items.clear()
        self.weight = 0

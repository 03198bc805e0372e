"""``sdgruntime.lru.LRU``: a mapping bounded in entries and in summed weight."""

from __future__ import annotations

import pytest

from sdgruntime.lru import LRU


def test_the_least_recently_used_goes_first_and_get_counts_as_use() -> None:
    lru: LRU[str, int] = LRU(max_items=2)
    lru.put("a", 1)
    lru.put("b", 2)
    assert lru.get("a") == 1  # a is now the most recent
    lru.put("c", 3)
    assert "b" not in lru and list(lru) == ["a", "c"]


def test_peek_and_membership_leave_the_order_alone() -> None:
    lru: LRU[str, int] = LRU(max_items=2)
    lru.put("a", 1)
    lru.put("b", 2)
    assert lru.peek("a") == 1 and "a" in lru
    lru.put("c", 3)
    assert list(lru) == ["b", "c"]
    assert lru.peek("a") is None and lru.get("a") is None


def test_weight_is_bounded_too_and_counts_each_key_once() -> None:
    lru: LRU[str, str] = LRU(max_items=10, max_weight=10)
    assert lru.put("a", "x", weight=4) and lru.put("b", "y", weight=4)
    assert lru.put("a", "z", weight=5)  # replaced: its old weight no longer counts
    assert lru.weight == 9 and len(lru) == 2
    lru.put("c", "w", weight=3)  # 12 > 10: the oldest, b, goes
    assert list(lru) == ["a", "c"] and lru.weight == 8


def test_a_value_heavier_than_the_bound_alone_is_not_kept() -> None:
    lru: LRU[str, str] = LRU(max_items=10, max_weight=10)
    lru.put("a", "old", weight=2)
    assert lru.put("a", "huge", weight=11) is False
    assert "a" not in lru and lru.weight == 0  # the old value under the key went too


def test_pop_and_clear_give_the_weight_back() -> None:
    lru: LRU[str, int] = LRU(max_items=3, max_weight=100)
    lru.put("a", 1, weight=40)
    lru.put("b", 2, weight=50)
    assert lru.pop("a") == 1 and lru.pop("a") is None and lru.weight == 50
    lru.clear()
    assert len(lru) == 0 and lru.weight == 0


@pytest.mark.parametrize(("items", "weight"), [(0, None), (1, 0)])
def test_bounds_below_one_are_refused(items: int, weight: int | None) -> None:
    with pytest.raises(ValueError, match="must be at least 1"):
        LRU(max_items=items, max_weight=weight)

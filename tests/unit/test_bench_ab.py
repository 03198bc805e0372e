"""``hack/bench/ab.py``: which of SDG's phases an A/B run measures."""

from __future__ import annotations

import pytest

from hack.bench.ab import phases


def test_both_phases_unless_one_is_named() -> None:
    assert phases(None) == (True, True)
    assert phases("s1") == (True, False)
    assert phases("s4") == (False, True)


def test_an_unknown_phase_is_refused() -> None:
    with pytest.raises(ValueError, match="s1 or s4"):
        phases("s2")

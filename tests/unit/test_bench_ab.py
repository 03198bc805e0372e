"""``hack/bench/ab.py``: which of SDG's phases an A/B run measures."""

from __future__ import annotations

import pytest

from hack.bench.ab import phases


def test_s1_and_s4_unless_one_phase_is_named() -> None:
    assert phases(None) == (True, True, False)
    assert phases("s1") == (True, False, False)
    assert phases("s4") == (False, True, False)
    assert phases("s8") == (False, False, True)


def test_an_unknown_phase_is_refused() -> None:
    with pytest.raises(ValueError, match="s1, s4 or s8"):
        phases("s2")

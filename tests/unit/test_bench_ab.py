"""``hack/bench/ab.py``: which of SDG's phases an A/B run measures."""

from __future__ import annotations

import pytest

from hack.bench.ab import per_bench, phases


def test_s1_and_s4_unless_one_phase_is_named() -> None:
    assert phases(None) == (True, True, False, False)
    assert phases("s1") == (True, False, False, False)
    assert phases("s4") == (False, True, False, False)
    assert phases("s8") == (False, False, True, False)
    assert phases("s2") == (False, False, False, True)


def test_an_unknown_phase_is_refused() -> None:
    with pytest.raises(ValueError, match="s1, s2, s4 or s8"):
        phases("s3")


def test_cpu_is_also_given_per_cpu_second_of_the_bench() -> None:
    """The bench's fixed work is the yardstick of how fast the host ran in that phase."""
    assert per_bench({"manager": 8.0, "kube-apiserver": 30.0, "bench": 2.5}) == {
        "manager": 3.2,
        "kube-apiserver": 12.0,
    }
    assert per_bench({"manager": 8.0}) == {}
    assert per_bench({"manager": 8.0, "bench": 0.0}) == {}

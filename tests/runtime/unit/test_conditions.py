"""Status conditions as apimachinery's meta helpers keep them: one per type,
lastTransitionTime moved only by a change of status, and a setter that says whether it
changed anything."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from sdgruntime.conditions import (
    find_status_condition,
    is_status_condition_false,
    is_status_condition_present_and_equal,
    is_status_condition_true,
    remove_status_condition,
    set_status_condition,
)

T0 = datetime(2024, 5, 1, 12, 0, 0, 123456, tzinfo=UTC)
T1 = T0 + timedelta(minutes=5)


def test_a_new_condition_gets_every_field_and_the_time_in_whole_seconds() -> None:
    conditions: list[dict[str, Any]] = []
    assert set_status_condition(
        conditions, "Ready", True, "Written", "all good", observed_generation=3, now=T0
    )
    assert conditions == [
        {
            "type": "Ready",
            "status": "True",
            "reason": "Written",
            "message": "all good",
            "observedGeneration": 3,
            "lastTransitionTime": "2024-05-01T12:00:00Z",
        }
    ]


def test_the_same_condition_again_changes_nothing() -> None:
    conditions: list[dict[str, Any]] = []
    set_status_condition(conditions, "Ready", "True", "Written", now=T0)
    assert not set_status_condition(conditions, "Ready", "True", "Written", now=T1)
    assert conditions[0]["lastTransitionTime"] == "2024-05-01T12:00:00Z"


def test_the_transition_time_moves_only_when_the_status_does() -> None:
    conditions: list[dict[str, Any]] = []
    set_status_condition(conditions, "Ready", False, "Pending", "waiting", now=T0)
    # reason, message and generation change; the status does not: the time stays
    assert set_status_condition(
        conditions, "Ready", False, "Stuck", "still waiting", observed_generation=2, now=T1
    )
    assert conditions[0]["lastTransitionTime"] == "2024-05-01T12:00:00Z"
    assert (conditions[0]["reason"], conditions[0]["observedGeneration"]) == ("Stuck", 2)
    assert set_status_condition(conditions, "Ready", True, "Written", now=T1)
    assert conditions[0]["lastTransitionTime"] == "2024-05-01T12:05:00Z"
    assert conditions[0]["message"] == ""  # the new condition's, not the old one kept
    assert conditions[0]["observedGeneration"] == 2  # not given: left as it was


def test_times_are_written_in_utc() -> None:
    conditions: list[dict[str, Any]] = []
    set_status_condition(
        conditions, "Ready", True, "Ok", now=T0.astimezone(timezone(timedelta(hours=2)))
    )
    assert conditions[0]["lastTransitionTime"] == "2024-05-01T12:00:00Z"
    set_status_condition(conditions, "Synced", True, "Ok")  # now
    stamp = datetime.strptime(conditions[1]["lastTransitionTime"], "%Y-%m-%dT%H:%M:%SZ")
    assert abs(stamp.replace(tzinfo=UTC) - datetime.now(UTC)) < timedelta(seconds=5)


def test_conditions_are_kept_per_type_in_order() -> None:
    conditions: list[dict[str, Any]] = []
    set_status_condition(conditions, "Ready", True, "Ok", now=T0)
    set_status_condition(conditions, "Degraded", False, "Ok", now=T0)
    set_status_condition(conditions, "Ready", False, "Broken", now=T1)
    assert [c["type"] for c in conditions] == ["Ready", "Degraded"]
    ready = find_status_condition(conditions, "Ready")
    assert ready is conditions[0] and ready["status"] == "False"
    assert find_status_condition(conditions, "Missing") is None
    assert find_status_condition(None, "Ready") is None  # status.conditions absent
    assert is_status_condition_false(conditions, "Ready")
    assert not is_status_condition_true(conditions, "Ready")
    assert not is_status_condition_true(None, "Ready")
    assert is_status_condition_present_and_equal(conditions, "Degraded", "False")
    assert remove_status_condition(conditions, "Ready")
    assert not remove_status_condition(conditions, "Ready")
    assert [c["type"] for c in conditions] == ["Degraded"]


def test_a_condition_the_api_server_would_refuse_is_refused_here() -> None:
    conditions: list[dict[str, Any]] = []
    with pytest.raises(ValueError, match="needs a type"):
        set_status_condition(conditions, "", True, "Ok")
    with pytest.raises(ValueError, match="status 'yes' is not one of"):
        set_status_condition(conditions, "Ready", "yes", "Ok")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="a reason is required"):
        set_status_condition(conditions, "Ready", True, "")
    assert conditions == []


def test_an_existing_condition_without_a_time_gets_one() -> None:
    conditions = [{"type": "Ready", "status": "True", "reason": "Ok", "message": ""}]
    assert set_status_condition(conditions, "Ready", True, "Ok", now=T0)
    assert conditions[0]["lastTransitionTime"] == "2024-05-01T12:00:00Z"

"""Status conditions: ``status.conditions`` as a list of ``metav1.Condition`` dicts.

As apimachinery's ``meta.SetStatusCondition`` and friends. ``lastTransitionTime`` changes
only when ``status`` does, so it says since when a condition holds; rewriting the same
condition changes nothing, and the setters say whether they changed anything, so a
reconciler writes the status only then. Pass the list itself
(``obj.setdefault("status", {}).setdefault("conditions", [])``), not a copy: the setters
edit it in place.
"""

from __future__ import annotations

from collections.abc import MutableSequence, Sequence
from datetime import UTC, datetime
from typing import Any, Literal

__all__ = [
    "find_status_condition",
    "is_status_condition_false",
    "is_status_condition_present_and_equal",
    "is_status_condition_true",
    "remove_status_condition",
    "set_status_condition",
]

Condition = dict[str, Any]
Status = Literal["True", "False", "Unknown"]
_STATUSES = ("True", "False", "Unknown")


def _rfc3339(when: datetime | None) -> str:
    when = (when or datetime.now(UTC)).astimezone(UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def set_status_condition(
    conditions: MutableSequence[Condition],
    condition_type: str,
    status: Status | bool,
    reason: str,
    message: str = "",
    *,
    observed_generation: int | None = None,
    now: datetime | None = None,
) -> bool:
    """Add the condition ``condition_type``, or update the one there; return whether it changed.

    ``lastTransitionTime`` is ``now`` (default: the current time) for a new condition and
    when ``status`` changes, and kept otherwise. ``status`` may be a bool;
    ``observed_generation=None`` leaves the one there as it is. Raises
    ``ValueError`` for an empty ``type`` or ``reason`` or another status, which the API
    server would refuse for a ``metav1.Condition``.
    """
    if isinstance(status, bool):
        status = "True" if status else "False"
    name = condition_type
    if not name:
        raise ValueError("a condition needs a type")
    if status not in _STATUSES:
        raise ValueError(f"condition {name}: status {status!r} is not one of {_STATUSES}")
    if not reason:
        raise ValueError(f"condition {name}: a reason is required (CamelCase, e.g. 'Ready')")
    wanted: Condition = {"type": name, "status": status, "reason": reason, "message": message}
    if observed_generation is not None:
        wanted["observedGeneration"] = observed_generation
    existing = find_status_condition(conditions, name)
    if existing is None:
        conditions.append({**wanted, "lastTransitionTime": _rfc3339(now)})
        return True
    changed = False
    if existing.get("status") != status or "lastTransitionTime" not in existing:
        existing["lastTransitionTime"] = _rfc3339(now)
        changed = True
    for key, value in wanted.items():
        if existing.get(key) != value:
            existing[key] = value
            changed = True
    return changed


def find_status_condition(
    conditions: Sequence[Condition] | None, condition_type: str
) -> Condition | None:
    """The condition ``condition_type`` (the list's own dict, not a copy), or ``None``."""
    for condition in conditions or ():
        if condition.get("type") == condition_type:
            return condition
    return None


def remove_status_condition(conditions: MutableSequence[Condition], condition_type: str) -> bool:
    """Remove the condition ``condition_type``; return whether there was one."""
    for i, condition in enumerate(conditions):
        if condition.get("type") == condition_type:
            del conditions[i]
            return True
    return False


def is_status_condition_present_and_equal(
    conditions: Sequence[Condition] | None, condition_type: str, status: Status
) -> bool:
    """Whether the condition ``condition_type`` is there with ``status``."""
    condition = find_status_condition(conditions, condition_type)
    return condition is not None and condition.get("status") == status


def is_status_condition_true(conditions: Sequence[Condition] | None, condition_type: str) -> bool:
    """Whether the condition ``condition_type`` is there and ``"True"``."""
    return is_status_condition_present_and_equal(conditions, condition_type, "True")


def is_status_condition_false(conditions: Sequence[Condition] | None, condition_type: str) -> bool:
    """Whether the condition ``condition_type`` is there and ``"False"``."""
    return is_status_condition_present_and_equal(conditions, condition_type, "False")

"""Pure helpers for ``status.conditions`` following Kubernetes API conventions.

``lastTransitionTime`` only moves when ``status`` changes, so ``kubectl wait`` and
dashboards see real transitions, and rewriting the same condition is a no-op diff.
Messages are cut to ``MAX_CONDITION_MESSAGE`` characters: a message built from many nodes
or pods must never make the API server refuse the whole status write.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, Final, Literal

from api.constants import MAX_CONDITION_MESSAGE

ConditionStatus = Literal["True", "False", "Unknown"]

#: Ends a message that ``cap_message`` cut.
TRUNCATED_MARKER: Final = "… (truncated)"


def cap_message(message: str, limit: int = MAX_CONDITION_MESSAGE) -> str:
    """``message`` if it has at most ``limit`` characters, else its start and
    ``TRUNCATED_MARKER``, ``limit`` characters in all (the start says the most: a
    kube-scheduler style message lists the largest groups of nodes first)."""
    if len(message) <= limit:
        return message
    if limit <= len(TRUNCATED_MARKER):
        return message[: max(limit, 0)]
    return message[: limit - len(TRUNCATED_MARKER)] + TRUNCATED_MARKER


def rfc3339(when: datetime | None = None) -> str:
    """A Kubernetes ``metav1.Time`` string (seconds precision, UTC, ``Z`` suffix)."""
    when = when or datetime.now(UTC)
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def find_condition(
    conditions: Iterable[Mapping[str, Any]] | None, type_: str
) -> Mapping[str, Any] | None:
    for cond in conditions or ():
        if cond.get("type") == type_:
            return cond
    return None


def is_condition_true(conditions: Iterable[Mapping[str, Any]] | None, type_: str) -> bool:
    cond = find_condition(conditions, type_)
    return cond is not None and cond.get("status") == "True"


def set_condition(
    conditions: Iterable[Mapping[str, Any]] | None,
    type_: str,
    status: ConditionStatus,
    reason: str,
    message: str,
    *,
    observed_generation: int | None = None,
    now: str | None = None,
) -> list[dict[str, Any]]:
    """Return a new condition list with ``type_`` set (others kept, order kept).

    ``message`` is capped (``cap_message``). ``now`` is injectable for deterministic
    tests; ``lastTransitionTime`` is kept from the old condition when its status is
    unchanged.
    """
    out: list[dict[str, Any]] = []
    replaced = False
    for cond in conditions or ():
        if cond.get("type") != type_:
            out.append(dict(cond))
            continue
        if replaced:  # drop duplicates of the same type: the list is a map keyed by type
            continue
        replaced = True
        out.append(_make(type_, status, reason, message, observed_generation, now, cond))
    if not replaced:
        out.append(_make(type_, status, reason, message, observed_generation, now, None))
    return out


def _make(
    type_: str,
    status: str,
    reason: str,
    message: str,
    observed_generation: int | None,
    now: str | None,
    old: Mapping[str, Any] | None,
) -> dict[str, Any]:
    if old is not None and old.get("status") == status and old.get("lastTransitionTime"):
        transition = old["lastTransitionTime"]
    else:
        transition = now or rfc3339()
    cond: dict[str, Any] = {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": cap_message(message),
        "lastTransitionTime": transition,
    }
    if observed_generation is not None:
        cond["observedGeneration"] = observed_generation
    return cond

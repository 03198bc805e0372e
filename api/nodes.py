"""Node facts read by the manager and the CLI alike: a node's name and labels, whether it
is a shared node (labelled ``deviceshare.io/mode=shared``), and the RFC 3339 times of API
objects. One home, so the manager and ``sdg`` never disagree on which nodes are shared."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any, Final

from api.constants import NODE_MODE_LABEL, NODE_MODE_SHARED

_EMPTY: Final[Mapping[str, Any]] = MappingProxyType({})


def node_name(node: Mapping[str, Any]) -> str:
    return str((node.get("metadata") or _EMPTY).get("name") or "")


def node_labels(node: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return ((node or _EMPTY).get("metadata") or _EMPTY).get("labels") or _EMPTY


def has_shared_label(labels: Mapping[str, Any]) -> bool:
    """Whether these labels make a node shared (for callers holding the labels already)."""
    return labels.get(NODE_MODE_LABEL) == NODE_MODE_SHARED


def is_shared(node: Mapping[str, Any] | None) -> bool:
    """Whether a node opted in to SDG with the label ``deviceshare.io/mode=shared``."""
    return has_shared_label(node_labels(node))


def parse_time(text: Any) -> datetime | None:
    """An RFC 3339 time of the API (``2026-01-01T12:00:00Z``); None when unset or
    unreadable; a time without a zone is taken as UTC."""
    if not isinstance(text, str) or not text:
        return None
    try:
        t = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=UTC)

"""Text and data layouts every ``sdg`` command prints: kubectl's tables and
``describe`` blocks, ``-o json|yaml``."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from api.v1alpha1 import (
    format_ids,
)
from sdgruntime.kinds import Obj

NONE = "<none>"
#: Pods listed in one table cell before "+ N more...".
MAX_PODS_IN_CELL = 3


# --- text layout ------------------------------------------------------------------------------


def table(headers: Sequence[str], rows: Iterable[Sequence[object]], indent: str = "") -> str:
    """kubectl's table layout: left-aligned columns three spaces apart, no trailing blanks."""
    cells = [[str(h) for h in headers], *([str(c) for c in row] for row in rows)]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join(
        indent + "   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
        for r in cells
    )


def fields(pairs: Sequence[tuple[str, str]]) -> str:
    """``kubectl describe``'s ``Key:   value`` block, values aligned."""
    width = max(len(k) for k, _ in pairs) + 2
    return "\n".join(f"{k + ':':<{width}}{v}".rstrip() for k, v in pairs)


def join_sections(*sections: str | None) -> str:
    return "\n\n".join(s for s in sections if s) + "\n"


def devices_text(devices: Mapping[str, Iterable[int]]) -> str:
    return ", ".join(f"{res} {format_ids(ids)}" for res, ids in sorted(devices.items())) or NONE


def pods_cell(pods: Sequence[str]) -> str:
    if not pods:
        return NONE
    shown = ",".join(pods[:MAX_PODS_IN_CELL])
    more = len(pods) - MAX_PODS_IN_CELL
    return f"{shown} + {more} more..." if more > 0 else shown


# --- -o json | yaml ---------------------------------------------------------------------------


def without_managed_fields(obj: Obj) -> dict[str, Any]:
    """The object as ``kubectl get -o yaml`` shows it: no metadata.managedFields."""
    out = dict(obj)
    if isinstance(out.get("metadata"), Mapping) and "managedFields" in out["metadata"]:
        out["metadata"] = {k: v for k, v in out["metadata"].items() if k != "managedFields"}
    return out


def object_list(items: Iterable[Obj]) -> dict[str, Any]:
    """kubectl's ``-o json`` of several objects: a v1 List."""
    return {
        "apiVersion": "v1",
        "kind": "List",
        "items": [without_managed_fields(i) for i in items],
        "metadata": {"resourceVersion": ""},
    }


def render_data(data: Any, output: str) -> str:
    """``data`` as ``-o json`` (2-space indent) or ``-o yaml`` (block style, key order kept)."""
    if output == "json":
        return json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    if output == "yaml":
        import yaml

        return str(yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=100))
    raise ValueError(f"unknown output format {output!r}")

"""``sdg get``: groups with the columns of ``kubectl get sdg``, once or a row per
change (``-w``)."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any, Final

import anyio

from api.conditions import find_condition
from api.constants import (
    CONDITION_READY,
    SDG_KIND,
)
from api.nodes import parse_time
from api.v1alpha1 import (
    group_name,
)
from cli.kube import CliError, Write, get_or_none, informers_running, list_groups
from cli.render import object_list, render_data, table, without_managed_fields
from sdgruntime.cache.informer import Informer
from sdgruntime.client import Client
from sdgruntime.kinds import Obj, meta_of, status_of

# --- sdg get ----------------------------------------------------------------------------------

GROUP_HEADERS: Final = ("NAME", "PHASE", "READY", "NODE", "DEVICES", "PODS", "AGE")


def human_age(seconds: float) -> str:
    """kubectl's AGE (apimachinery's HumanDuration): 90s, 5m3s, 42m, 3h12m, 4d6h, 2y15d."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    m = s // 60
    if m < 10:
        return f"{m}m{s % 60}s" if s % 60 else f"{m}m"
    if m < 180:
        return f"{m}m"
    h = m // 60
    if h < 8:
        return f"{h}h{m % 60}m" if m % 60 else f"{h}h"
    if h < 48:
        return f"{h}h"
    if h < 24 * 8:
        return f"{h // 24}d{h % 24}h" if h % 24 else f"{h // 24}d"
    d = h // 24
    if h < 24 * 365 * 2:
        return f"{d}d"
    if h < 24 * 365 * 8:
        return f"{d // 365}y{d % 365}d" if d % 365 else f"{d // 365}y"
    return f"{d // 365}y"


def group_row(group: Obj, now: datetime) -> tuple[str, ...]:
    """One ``sdg get`` row: the columns of ``kubectl get sdg`` (blank where unset)."""
    status = status_of(group)
    ready = find_condition(status.get("conditions"), CONDITION_READY)
    summary = status.get("deviceSummary")
    if summary is None and status.get("selectedDevices"):
        summary = " ".join(f"{r}={ids}" for r, ids in sorted(status["selectedDevices"].items()))
    created = parse_time(meta_of(group).get("creationTimestamp"))
    count = status.get("podCount")
    return (
        group_name(group),
        str(status.get("phase") or ""),
        str((ready or {}).get("status") or ""),
        str(status.get("nodeName") or ""),
        str(summary or ""),
        "" if count is None else str(count),
        human_age((now - created).total_seconds()) if created else "<unknown>",
    )


def column_widths(
    rows: Iterable[Sequence[str]], headers: Sequence[str] = GROUP_HEADERS
) -> list[int]:
    """The widths :func:`table` gives these columns (a watch keeps them for later rows)."""
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    return widths


def table_line(row: Sequence[str], widths: Sequence[int]) -> str:
    """One row laid out like :func:`table` with ``widths`` (wider cells push on)."""
    return "   ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()


def groups_table(groups: Iterable[Obj], now: datetime) -> str:
    """``sdg get``: one row per group, by name, as ``kubectl get sdg`` prints them."""
    rows = [group_row(g, now) for g in sorted(groups, key=group_name)]
    return table(GROUP_HEADERS, rows) + "\n"


# --- sdg get ----------------------------------------------------------------------------------


def _now() -> datetime:
    return datetime.now(UTC)


async def run(client: Client, args: argparse.Namespace, write: Write) -> int:
    if args.watch:
        return await _watch_groups(client, args, write)
    if args.name:
        group = await get_or_none(client, SDG_KIND, args.name)
        if group is None:
            await list_groups(client)  # says so when the API itself is missing
            raise CliError(f'SharedDeviceGroup "{args.name}" not found')
        groups = [group]
    else:
        groups = await list_groups(client)
    if args.output:
        data = without_managed_fields(groups[0]) if args.name else object_list(groups)
        write(render_data(data, args.output))
    elif groups:
        write(groups_table(groups, _now()))
    else:
        print("No SharedDeviceGroups found.", file=sys.stderr)
    return 0


async def _watch_groups(client: Client, args: argparse.Namespace, write: Write) -> int:
    """kubectl get -w: the list, then a row (or an object) per change, until cancelled."""
    await list_groups(client)  # a clear error when the API is missing
    selector = f"metadata.name={args.name}" if args.name else None
    informer = Informer(client, SDG_KIND, field_selector=selector)
    send, receive = anyio.create_memory_object_stream[tuple[str, dict[str, Any]]](math.inf)
    async with informers_running([informer]):
        initial = sorted(informer.store.list(), key=group_name)
        if args.name and not initial:
            raise CliError(f'SharedDeviceGroup "{args.name}" not found')
        rows = {group_name(g): group_row(g, _now()) for g in initial}
        widths = column_widths(rows.values())
        docs = 0

        def show(obj: dict[str, Any]) -> None:
            nonlocal docs
            data = without_managed_fields(obj)
            sep = "---\n" if args.output == "yaml" and docs else ""
            write(sep + render_data(data, str(args.output)))
            docs += 1

        if args.output:
            for g in initial:
                show(g)
        else:
            write(table_line(GROUP_HEADERS, widths) + "\n")
            for row in rows.values():
                write(table_line(row, widths) + "\n")
        live = False  # add_handler replays the stored objects as adds: those are shown

        def added(obj: dict[str, Any]) -> None:
            if live:
                send.send_nowait(("ADDED", obj))

        informer.add_handler(
            on_add=added,
            on_update=lambda _old, new: send.send_nowait(("MODIFIED", new)),
            on_delete=lambda obj: send.send_nowait(("DELETED", obj)),
        )
        live = True
        async for event, obj in receive:
            if args.output:
                show(obj)
                continue
            name, row = group_name(obj), group_row(obj, _now())
            if event != "DELETED" and rows.get(name, ())[:-1] == row[:-1]:
                continue  # nothing kubectl get sdg shows has changed
            rows[name] = row
            if event == "DELETED":
                rows.pop(name)
            widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
            write(table_line(row, widths) + "\n")
    return 0

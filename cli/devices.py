"""``sdg devices``: the device map (node -> device ID -> group -> pods) as a table, a
grid or data, once or after every change (``-w``)."""

from __future__ import annotations

import argparse
import math
import shutil
import sys
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from types import MappingProxyType
from typing import Any, Final

import anyio

from api.constants import (
    NODE_MODE_LABEL,
    NODE_MODE_SHARED,
    SDG_KIND,
)
from api.nodes import is_shared, node_name
from api.pods import cached_pod
from api.v1alpha1 import (
    format_ids,
    group_name,
    is_bound,
)
from cli.claims import (
    SOURCE_NAMES,
    ClaimView,
    allocated_pods,
    claim_view,
    cross_check,
    inventory_entries,
    inventory_line,
    node_problems,
    slices_of,
    too_many_text,
)
from cli.kube import (
    RECORDS_SELECTOR,
    WATCH_SETTLE,
    Write,
    claim_records,
    informers_running,
    list_groups,
    list_objects,
    resource_slices,
    use_color,
)
from cli.render import (
    NONE,
    join_sections,
    pods_cell,
    render_data,
    table,
)
from controllers.draclaims import RESOURCECLAIMS
from controllers.inventory import (
    RESOURCESLICES,
    node_offers,
)
from controllers.ledger.view import Pod, ResourceClaim, describe
from controllers.placement import (
    unaddressable_devices,
)
from sdgruntime import errors
from sdgruntime.cache.informer import Informer
from sdgruntime.client import Client
from sdgruntime.kinds import CONFIGMAPS, NODES, PODS, Obj

#: ANSI: cursor home + clear screen, before each map a watch draws on a terminal.
CLEAR = "\033[H\033[2J"


# --- sdg devices ------------------------------------------------------------------------------


def device_map(
    nodes: Iterable[Obj],
    groups: Iterable[Obj],
    configmaps: Iterable[Obj],
    slices: Iterable[Obj] = (),
    pods: Iterable[Obj] = (),
    claims: Iterable[Obj] = (),
) -> dict[str, Any]:
    """The device map as data (``sdg devices -o json``), what every view of it draws.

    ``nodes``: every shared node and any node holding claims, by name, each with its
    ``resources``; each resource with its inventory ``source`` (``allocatable``: a count,
    IDs guessed; ``annotation``; ``resourceslices``; null when the node offers none) and
    its ``devices``: ``id``, ``uuid`` (null when unknown), ``groups`` holding it (none when
    free, two or more on a conflict), ``heldBy`` (who else holds it: a pod the kubelet
    gave it, a ResourceClaim; null), ``state`` (see :func:`devices_view`) and ``pods``
    (the holding group's status.allocatedPods, or the pod holding it; null when free, on
    a conflict or when the group does not exist). Then ``pendingGroups``, ``inventory``
    and ``warnings``. ``pods`` and ``claims`` (every pod, every ResourceClaim) let the
    map show what the kubelet's and DRA's books give outside any group.
    """
    nodes, groups, slices = list(nodes), list(groups), list(slices)
    by_slices = slices_of(slices)
    by_node = {node_name(n): n for n in nodes}
    by_group = {group_name(g): g for g in groups}
    all_offers = {name: node_offers(obj, by_slices.get(name, ())) for name, obj in by_node.items()}
    view = claim_view(groups, configmaps, all_offers, pods, claims)
    shown = sorted({n for n, obj in by_node.items() if is_shared(obj)} | view.nodes())

    out_nodes: list[dict[str, Any]] = []
    warnings = list(view.warnings)
    for node in shown:
        obj = by_node.get(node)
        offers = all_offers.get(node, {})
        held_by = view.ledger.view(node).holders
        capacity = {r: o.capacity for r, o in offers.items()}
        if obj is None:
            warnings.append(f"node {node}: not found, but devices are recorded on it")
        else:
            if not is_shared(obj):
                warnings.append(
                    f"node {node}: not labelled {NODE_MODE_LABEL}={NODE_MODE_SHARED}; its "
                    "groups keep their devices, new groups will not bind there"
                )
            warnings += [f"node {node}: {p}" for p in node_problems(obj)]
            warnings += [
                f"node {node}: {too_many_text(res, count)}"
                for res, count in sorted(unaddressable_devices(obj).items())
            ]
        too_many = set(unaddressable_devices(obj)) if obj else set()
        resources = []
        for res in sorted(set(capacity) | view.resources_on(node) | too_many):
            offer = offers.get(res)
            usable = set(offer.usable()) if offer else set()
            listed_ids = {d.id for d in offer.devices} if offer else set()
            held = view.held_ids(node, res)
            beyond = sorted(i for i in held if i not in usable)
            if beyond and obj is not None:
                warnings.append(
                    f"node {node}: offers {len(usable)} {res}, but {res} {format_ids(beyond)} "
                    "is still held"
                )
            if offer is not None and offer.problem:
                warnings.append(f"node {node}: {offer.problem}")
            devices = []
            for i in sorted(listed_ids | held):
                device = offer.device(i) if offer else None
                holders, state, users = _device_state(view, by_group, node, res, i, usable)
                other = held_by.get((res, i))
                if not holders and isinstance(other, ResourceClaim | Pod):
                    state = "in-use"
                    users = [f"{other.namespace}/{other.name}"] if isinstance(other, Pod) else None
                devices.append(
                    {
                        "id": i,
                        "uuid": (device.uuid if device else "") or None,
                        "groups": holders,
                        "heldBy": describe(other) if state == "in-use" and other else None,
                        "state": state,
                        "pods": users,
                    }
                )
            source = SOURCE_NAMES.get(offer.source, offer.source) if offer else None
            resources.append({"resource": res, "source": source, "devices": devices})
        out_nodes.append(
            {
                "name": node,
                "found": obj is not None,
                "shared": obj is not None and is_shared(obj),
                "problems": node_problems(obj) if obj else [],
                "resources": resources,
            }
        )
    warnings += cross_check(view, by_group)
    return {
        "nodes": out_nodes,
        "pendingGroups": sorted(name for name, g in by_group.items() if not is_bound(g)),
        "inventory": inventory_entries(by_node.values(), slices),
        "warnings": warnings,
    }


def _device_state(
    view: ClaimView, by_group: Mapping[str, Obj], node: str, res: str, i: int, usable: set[int]
) -> tuple[list[str], str, list[str] | None]:
    """The groups holding one device ID, its STATE, and the pods of its one group."""
    holders = view.holders.get((node, res, i)) or {}
    holders = {g: s for g, s in holders.items() if s}
    if not holders:
        return [], "free" if i in usable else "unhealthy", None
    if len(holders) > 1:
        return sorted(holders), "conflict", None
    ((group, sources),) = holders.items()
    if i not in usable:
        state = "missing"
    elif sources == {"record", "status"}:
        state = "held"
    elif sources == {"record"}:
        state = "record-only"
    else:
        state = "status-only"
    return [group], state, allocated_pods(by_group[group]) if group in by_group else None


def _pending_line(data: Mapping[str, Any]) -> str | None:
    pending = data["pendingGroups"]
    if not pending:
        return None
    return "Pending groups (hold no devices; sdg explain GROUP says why): " + ", ".join(pending)


def _warnings_section(warnings: Sequence[str]) -> str | None:
    return "Warnings:\n" + "\n".join(f"  {w}" for w in warnings) if warnings else None


def devices_view(
    nodes: Iterable[Obj],
    groups: Iterable[Obj],
    configmaps: Iterable[Obj],
    slices: Iterable[Obj] = (),
) -> str:
    """The device map: every device ID of every shared node (and of any node holding
    claims) -> the group holding it -> that group's pods; free IDs marked ``-``/``free``.

    STATE is ``held`` when the claim record and the group's status agree, ``free``,
    ``record-only`` / ``status-only`` when only one of them says so, ``conflict`` when two
    groups hold one ID, ``missing`` when the node no longer offers a held ID (gone from its
    inventory or unhealthy), ``unhealthy`` for a free device the inventory marks so,
    ``in-use`` for one the kubelet gave a pod outside any group or DRA allocated to a
    ResourceClaim (GROUP then names it). A UUID
    column appears when the inventory identifies devices; the Inventory section says, per
    node and resource, where the devices come from (IDs counted from allocatable are
    guessed).
    """
    return render_device_table(device_map(nodes, groups, configmaps, slices))


def render_device_table(data: Mapping[str, Any]) -> str:
    """:func:`devices_view`'s text from :func:`device_map`'s data."""
    rows: list[tuple[str, ...]] = []
    for node in data["nodes"]:
        if not node["resources"]:
            rows.append((node["name"], NONE, "-", "", "-", "-", "-"))
        for r in node["resources"]:
            for d in r["devices"]:
                pods = "-" if d["pods"] is None else pods_cell(d["pods"])
                group = ",".join(d["groups"]) or d.get("heldBy") or "-"
                cells = (str(d["id"]), d["uuid"] or "", group, d["state"], pods)
                rows.append((node["name"], r["resource"], *cells))
    headers = ["NODE", "RESOURCE", "ID", "UUID", "GROUP", "STATE", "PODS"]
    if not any(r[3] for r in rows):
        # No device is identified: no UUID column (count-only inventories).
        headers.remove("UUID")
        rows = [(*r[:3], *r[4:]) for r in rows]
    inventory = [inventory_line(e) for e in data["inventory"]]
    return join_sections(
        table(headers, rows)
        if rows
        else f"No shared nodes: label a node {NODE_MODE_LABEL}={NODE_MODE_SHARED} to offer "
        "its devices.",
        _pending_line(data),
        "Inventory:\n" + "\n".join(f"  {line}" for line in inventory) if inventory else None,
        _warnings_section(data["warnings"]),
    )


# --- sdg devices --grid -----------------------------------------------------------------------

#: Letters of the groups in the grid, given in the order of their names (no ``x``: that
#: marks a missing device); groups beyond these share :data:`MORE_GROUPS`.
GROUP_GLYPHS: Final = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwyz0123456789"
MORE_GROUPS: Final = "+"
#: Glyph and meaning of every cell that is not a group letter, in legend order.
CELL_KEY: Final = MappingProxyType(
    {
        ".": "free",
        "x": "missing or unhealthy",
        "!": "conflict (two groups)",
        "?": "only the claim record or only the status holds it",
        "o": "in use outside any group (a pod the kubelet gave it, a ResourceClaim)",
        "_": "no device with this ID",
    }
)
#: Devices per block of cells (a space between blocks, to count IDs by).
GRID_BLOCK: Final = 8
#: ANSI SGR styles: group backgrounds (red is kept for problems), then the cell states.
GROUP_STYLES: Final = (
    "30;42",
    "30;43",
    "97;44",
    "97;45",
    "30;46",
    "30;102",
    "30;103",
    "30;104",
    "30;105",
    "30;106",
    "30;47",
    "97;100",
)
_STATE_STYLES: Final = MappingProxyType({".": "2", "x": "1;31", "!": "1;97;41", "o": "1", "_": "2"})


def _paint(text: str, style: str | None, color: bool) -> str:
    return f"\033[{style}m{text}\033[0m" if color and style else text


def _wrap_words(words: Sequence[tuple[str, int]], width: int, label: str) -> list[str]:
    """``label`` then ``(text, visible length)`` items two spaces apart, wrapped at
    ``width``; continued lines are indented under the first item."""
    indent = " " * len(label)
    lines: list[str] = []
    line, used = label, len(label)
    for text, size in words:
        if used > len(indent) and used + 2 + size > width:
            lines.append(line)
            line, used = indent, len(indent)
        if used > len(indent):
            line, used = line + "  ", used + 2
        line, used = line + text, used + size
    lines.append(line)
    return lines


def devices_grid(data: Mapping[str, Any], *, width: int = 80, color: bool = False) -> str:
    """The device map as a grid: per node and resource a row of cells, one per device ID
    in ID order, each the letter of the group holding it (coloured by group when ``color``)
    or a mark for free, missing/unhealthy, conflict and one-source devices (the legend
    says which). Rows wrap at ``width`` in blocks of :data:`GRID_BLOCK`; a continued line
    starts with the ID of its first cell. Without ``color``: plain text, no ANSI codes."""
    holding = sorted(
        {
            g
            for n in data["nodes"]
            for r in n["resources"]
            for d in r["devices"]
            if d["state"] == "held"
            for g in d["groups"]
        }
    )
    letters = {
        g: GROUP_GLYPHS[i] if i < len(GROUP_GLYPHS) else MORE_GROUPS for i, g in enumerate(holding)
    }
    styles = {g: GROUP_STYLES[i % len(GROUP_STYLES)] for i, g in enumerate(holding)}

    def cell(d: Mapping[str, Any]) -> tuple[str, str | None]:
        state = d["state"]
        if state in ("free", "unhealthy", "missing", "conflict", "in-use"):
            glyph = {"free": ".", "conflict": "!", "in-use": "o"}.get(state, "x")
            return glyph, _STATE_STYLES[glyph]
        group = d["groups"][0]
        return ("?" if state != "held" else letters[group]), styles.get(group)

    rows: list[tuple[str, str, list[tuple[str, str | None]]]] = []
    for node in data["nodes"]:
        listed = [r for r in node["resources"] if r["devices"]]
        if not node["resources"]:
            rows.append((node["name"], NONE, []))
        for r in listed:
            by_id = {d["id"]: d for d in r["devices"]}
            cells = [
                cell(by_id[i]) if i in by_id else ("_", _STATE_STYLES["_"])
                for i in range(max(by_id) + 1)
            ]
            rows.append((node["name"], r["resource"], cells))
    if not rows:
        return join_sections(
            f"No shared nodes: label a node {NODE_MODE_LABEL}={NODE_MODE_SHARED} to offer "
            "its devices.",
            _pending_line(data),
        )

    wn = max(len("NODE"), *(len(n) for n, _, _ in rows))
    wr = max(len("RESOURCE"), *(len(r) for _, r, _ in rows))
    prefix = wn + 3 + wr + 3
    per_line = max(1, (width - prefix + 1) // (GRID_BLOCK + 1)) * GRID_BLOCK
    lines = [f"{'NODE':<{wn}}   {'RESOURCE':<{wr}}   DEVICES"]
    used: set[str] = set()
    for node_text, res, cells in rows:
        head = f"{node_text:<{wn}}   {res:<{wr}}   "
        if not cells:
            lines.append(head.rstrip())
        for start in range(0, len(cells), per_line):
            chunk = cells[start : start + per_line]
            used.update(g for g, _ in chunk)
            blocks = []
            for b in range(0, len(chunk), GRID_BLOCK):
                runs: list[tuple[str, str | None]] = []
                for glyph, style in chunk[b : b + GRID_BLOCK]:
                    if runs and runs[-1][1] == style:
                        runs[-1] = (runs[-1][0] + glyph, style)
                    else:
                        runs.append((glyph, style))
                blocks.append("".join(_paint(t, s, color) for t, s in runs))
            lead = head if start == 0 else f"{start}: ".rjust(prefix)
            lines.append(lead + " ".join(blocks))

    groups_key = [
        (_paint(letters[g], styles[g], color) + " " + g, len(g) + 2)
        for g in holding
        if letters[g] != MORE_GROUPS
    ]
    if len(holding) > len(GROUP_GLYPHS):
        rest = len(holding) - len(GROUP_GLYPHS)
        more = f"{MORE_GROUPS} {rest} more groups (sdg devices lists them)"
        groups_key.append((more, len(more)))
    cells_key = [
        (_paint(glyph, _STATE_STYLES.get(glyph), color) + " " + text, len(text) + 2)
        for glyph, text in CELL_KEY.items()
        if glyph in used
    ]
    legend = []
    if groups_key:
        legend += _wrap_words(groups_key, width, "Groups: ")
    if cells_key:
        legend += _wrap_words(cells_key, width, "Cells:  ")
    return join_sections(
        "\n".join(lines),
        "\n".join(legend),
        _pending_line(data),
        _warnings_section(data["warnings"]),
    )


# --- sdg devices ------------------------------------------------------------------------------


def _render_devices(args: argparse.Namespace, data: dict[str, Any]) -> str:
    if args.output:
        return render_data(data, args.output)
    if args.grid:
        return devices_grid(data, width=shutil.get_terminal_size().columns, color=use_color())
    return render_device_table(data)


async def run(client: Client, args: argparse.Namespace, write: Write) -> int:
    if args.watch:
        return await _watch_devices(client, args, write)
    nodes = await list_objects(client, NODES)
    groups = await list_groups(client)
    records = await claim_records(client, args.claims_namespace)
    slices = await resource_slices(client) or []
    unread: list[tuple[str, str]] = []
    pods = await _readable(client, PODS, unread, field_selector=_ACTIVE_PODS, transform=cached_pod)
    claims = await _readable(client, RESOURCECLAIMS, unread) if slices else []
    data = device_map(nodes, groups, records, slices, pods, claims)
    data["warnings"] += [
        f"{what} not readable ({why}): devices they hold outside any group are not shown"
        for what, why in unread
    ]
    write(_render_devices(args, data))
    return 0


#: Pods that may hold devices (the API server filters out finished ones).
_ACTIVE_PODS = "status.phase!=Succeeded,status.phase!=Failed"


async def _readable(
    client: Client, kind: Any, unread: list[tuple[str, str]], **kw: Any
) -> list[dict[str, Any]]:
    """Every ``kind`` object, or none when this user may not list them (or the server does
    not serve them), noted in ``unread``."""
    try:
        return await list_objects(client, kind, **kw)
    except (errors.NotFound, errors.Forbidden) as err:
        unread.append((kind.plural, str(err).splitlines()[0][:120]))
        return []


async def _watch_devices(client: Client, args: argparse.Namespace, write: Write) -> int:
    """The device map, drawn again after every change that changes it, until cancelled:
    on a terminal over the previous one (text and grid), else one after the other."""
    await list_groups(client)
    kinds = [
        Informer(client, NODES),
        Informer(client, SDG_KIND),
        Informer(
            client, CONFIGMAPS, namespace=args.claims_namespace, label_selector=RECORDS_SELECTOR
        ),
    ]
    if await resource_slices(client) is not None:
        kinds.append(Informer(client, RESOURCESLICES))
    send, receive = anyio.create_memory_object_stream[None](math.inf)
    redraw = sys.stdout.isatty() and not args.output
    async with informers_running(kinds):
        for informer in kinds:
            informer.add_handler(
                on_add=lambda _obj: send.send_nowait(None),
                on_update=lambda _old, _new: send.send_nowait(None),
                on_delete=lambda _obj: send.send_nowait(None),
            )
        last = None
        while True:
            data = device_map(*(i.store.list(copy=False) for i in kinds))
            text = _render_devices(args, data)
            if text != last:
                if redraw:
                    stamp = datetime.now().strftime("%H:%M:%S")
                    write(f"{CLEAR}sdg devices --watch (Ctrl-C stops), {stamp}\n\n{text}")
                elif last is not None:  # one map after the other; YAML as a stream
                    write({"json": "", "yaml": "---\n"}.get(args.output, "\n") + text)
                else:
                    write(text)
                last = text
            await receive.receive()
            await anyio.sleep(WATCH_SETTLE)
            while True:
                try:
                    receive.receive_nowait()
                except anyio.WouldBlock:
                    break
    return 0

"""``sdg get``, ``sdg devices --grid`` and ``-o json|yaml``: exact output on known states.

The states are test_cli.py's (a healthy cluster, one where records, statuses and nodes
disagree); the views are pure, so what an operator would see is asserted whole.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Any

import pytest
import yaml

from cli import main as cli
from cli.devices import GROUP_GLYPHS, device_map, devices_grid, devices_view, render_device_table
from cli.explain import explain_group, explain_group_data, explain_pod_data
from cli.get import group_row, groups_table, human_age
from cli.render import object_list, render_data
from tests.unit.test_cli import (
    GPU,
    GROUPS,
    NODES,
    PODS,
    RECORDS,
    T0,
    TROUBLE_GROUPS,
    TROUBLE_NODES,
    TROUBLE_RECORDS,
    cond,
    group,
    node,
    pod,
    record,
)

ANSI = re.compile(r"\033\[[0-9;]*m")


# --- sdg devices -o json: the map as data -----------------------------------------------------


def test_device_map_data_is_what_the_table_shows() -> None:
    data = device_map(NODES, GROUPS, RECORDS)
    assert [n["name"] for n in data["nodes"]] == ["amd-1", "gpu-a", "gpu-b"]
    (gpu_a,) = (n for n in data["nodes"] if n["name"] == "gpu-a")
    assert (gpu_a["found"], gpu_a["shared"], gpu_a["problems"]) == (True, True, [])
    (res,) = gpu_a["resources"]
    assert (res["resource"], res["source"]) == (GPU, "allocatable")
    assert res["devices"] == [
        {
            "id": 0,
            "uuid": None,
            "groups": ["train"],
            "heldBy": None,
            "state": "held",
            "pods": ["ml/w1", "ml/w2"],
        },
        {
            "id": 1,
            "uuid": None,
            "groups": ["train"],
            "heldBy": None,
            "state": "held",
            "pods": ["ml/w1", "ml/w2"],
        },
        {"id": 2, "uuid": None, "groups": [], "heldBy": None, "state": "free", "pods": None},
        {"id": 3, "uuid": None, "groups": ["infer"], "heldBy": None, "state": "held", "pods": []},
    ]
    assert data["pendingGroups"] == ["big"]
    assert data["inventory"][1] == {
        "node": "gpu-a",
        "resource": GPU,
        "devices": 4,
        "unhealthy": 0,
        "source": "allocatable",
        "problem": None,
    }
    assert data["warnings"] == []
    # The table is drawn from this data, and the data survives JSON.
    assert render_device_table(json.loads(render_data(data, "json"))) == devices_view(
        NODES, GROUPS, RECORDS
    )


def test_device_map_data_names_every_state_and_warning() -> None:
    data = device_map(TROUBLE_NODES, TROUBLE_GROUPS, TROUBLE_RECORDS)
    states = {
        (n["name"], d["id"]): (d["groups"], d["state"], d["pods"])
        for n in data["nodes"]
        for r in n["resources"]
        for d in r["devices"]
    }
    assert states == {
        ("gone-1", 0): (["lost"], "missing", []),
        ("gpu-a", 0): (["ghost"], "record-only", None),  # no such group: no pods to list
        ("gpu-a", 1): (["starting"], "record-only", []),
        ("gpu-b", 0): (["alpha"], "held", ["a/p"]),
        ("gpu-b", 1): (["alpha", "beta"], "conflict", None),
        ("gpu-c", 0): (["moving"], "status-only", []),
        ("gpu-c", 1): (["moving"], "record-only", []),
        ("gpu-old", 0): (["legacy"], "held", []),
        ("gpu-small", 0): (["shrunk"], "held", []),
        ("gpu-small", 1): (["shrunk"], "missing", []),
    }
    by_name = {n["name"]: n for n in data["nodes"]}
    assert (by_name["gone-1"]["found"], by_name["gone-1"]["resources"][0]["source"]) == (
        False,
        None,
    )
    assert by_name["gpu-old"]["shared"] is False
    assert by_name["gpu-c"]["problems"] == ["not Ready (NodeStatusUnknown)"]
    assert by_name["empty-1"]["resources"] == []
    assert "node gpu-b: cordoned (spec.unschedulable)" in data["warnings"]


def test_yaml_output_is_the_same_data() -> None:
    data = device_map(TROUBLE_NODES, TROUBLE_GROUPS, TROUBLE_RECORDS)
    assert yaml.safe_load(render_data(data, "yaml")) == data
    assert json.loads(render_data(data, "json")) == data


# --- sdg devices --grid -----------------------------------------------------------------------


def test_grid_of_a_healthy_cluster() -> None:
    assert devices_grid(device_map(NODES, GROUPS, RECORDS)) == (
        """\
NODE    RESOURCE         DEVICES
amd-1   amd.com/gpu      BB
gpu-a   nvidia.com/gpu   CC.A
gpu-b   nvidia.com/gpu   ..

Groups: A infer  B rocm  C train
Cells:  . free

Pending groups (hold no devices; sdg explain GROUP says why): big
"""
    )


def test_grid_marks_free_held_missing_conflict_and_one_source_devices_apart() -> None:
    text = devices_grid(device_map(TROUBLE_NODES, TROUBLE_GROUPS, TROUBLE_RECORDS), width=80)
    grid, legend, pending, warnings = text.split("\n\n")
    assert grid == (
        """\
NODE        RESOURCE         DEVICES
empty-1     <none>
gone-1      nvidia.com/gpu   x
gpu-a       nvidia.com/gpu   ??
gpu-b       nvidia.com/gpu   A!
gpu-c       nvidia.com/gpu   ??
gpu-old     nvidia.com/gpu   B
gpu-small   nvidia.com/gpu   Cx"""
    )
    # Letters go to the groups holding a device for sure; the legend lists only the marks
    # the grid uses, wrapped at the width.
    assert legend == (
        """\
Groups: A alpha  B legacy  C shrunk
Cells:  x missing or unhealthy  ! conflict (two groups)
        ? only the claim record or only the status holds it"""
    )
    assert pending.startswith("Pending groups")
    assert warnings.startswith(
        "Warnings:\n  node broken: claim record deviceshare-system/sdg-claims.broken:"
    )
    assert "\033" not in text


def test_grid_shows_holes_in_the_ids_an_inventory_lists() -> None:
    annotated = node("gpu-h", {GPU: 3})
    annotated["metadata"]["annotations"] = {
        "deviceshare.io/devices.nvidia.com_gpu": "0=GPU-a,2=GPU-c,3=GPU-d"
    }
    text = devices_grid(device_map([annotated], [], []))
    assert "gpu-h   nvidia.com/gpu   ._..\n" in text
    assert "Cells:  . free  _ no device with this ID\n" in text


def wide_cluster(devices: int, groups: int, per_group: int) -> tuple[list, list, list]:
    """One node of ``devices`` GPUs; ``groups`` groups g00, g01... holding ``per_group``
    consecutive IDs each, from 0."""
    held = {}
    for i in range(groups):
        held[f"g{i:02d}"] = ",".join(str(j) for j in range(i * per_group, (i + 1) * per_group))
    gs = [group(n, {GPU: per_group}, node="big-1", devices={GPU: ids}) for n, ids in held.items()]
    recs = [record("big-1", {n: {GPU: ids} for n, ids in held.items()})]
    return [node("big-1", {GPU: devices})], gs, recs


@pytest.mark.parametrize("width", [40, 80, 132, 300])
def test_grid_wraps_1024_devices_at_the_width_in_blocks_labelled_by_first_id(width: int) -> None:
    nodes, gs, recs = wide_cluster(1024, 4, 100)
    text = devices_grid(device_map(nodes, gs, recs), width=width)
    rows = text.split("\n\n")[0].splitlines()[1:]
    assert all(len(line) <= width for line in rows)
    blocks = [b for line in rows for b in line[25:].split(" ")]
    assert all(len(b) == 8 for b in blocks)  # 1024 = 128 blocks of 8
    assert "".join(blocks) == "A" * 100 + "B" * 100 + "C" * 100 + "D" * 100 + "." * 624
    per_line = len(rows[0][25:].replace(" ", ""))
    assert rows[0].startswith(f"big-1   {GPU}   ")
    assert [line[:25] for line in rows[1:]] == [
        f"{start}: ".rjust(25) for start in range(per_line, 1024, per_line)
    ]


def test_grid_at_80_columns() -> None:
    nodes, gs, recs = wide_cluster(100, 3, 10)
    assert devices_grid(device_map(nodes, gs, recs), width=80).split("\n\n")[0] == (
        """\
NODE    RESOURCE         DEVICES
big-1   nvidia.com/gpu   AAAAAAAA AABBBBBB BBBBCCCC CCCCCC.. ........ ........
                     48: ........ ........ ........ ........ ........ ........
                     96: ...."""
    )


def test_grid_letters_run_out_into_one_shared_mark() -> None:
    count = len(GROUP_GLYPHS) + 3
    nodes, gs, recs = wide_cluster(count, count, 1)
    text = devices_grid(device_map(nodes, gs, recs), width=1000)
    cells = GROUP_GLYPHS + "+++"
    blocks = " ".join(cells[i : i + 8] for i in range(0, len(cells), 8))
    assert text.splitlines()[1] == f"big-1   {GPU}   {blocks}"
    assert "+ 3 more groups (sdg devices lists them)" in text
    assert "x" not in GROUP_GLYPHS  # x marks a missing device


def test_grid_colours_by_group_only_when_asked_and_says_the_same_without() -> None:
    states = [(NODES, GROUPS, RECORDS), (TROUBLE_NODES, TROUBLE_GROUPS, TROUBLE_RECORDS)]
    for nodes, gs, recs in states:
        data = device_map(nodes, gs, recs)
        plain = devices_grid(data, width=80)
        coloured = devices_grid(data, width=80, color=True)
        assert "\033" not in plain
        assert ANSI.sub("", coloured) == plain
    coloured = devices_grid(device_map(NODES, GROUPS, RECORDS), color=True)
    # one colour per group, the same in the grid and the legend; free cells dimmed
    assert "gpu-a   nvidia.com/gpu   \033[97;44mCC\033[0m\033[2m.\033[0m\033[30;42mA\033[0m\n" in (
        coloured
    )
    assert (
        "Groups: \033[30;42mA\033[0m infer  \033[30;43mB\033[0m rocm  \033[97;44mC\033[0m train"
        in (coloured)
    )


def test_grid_without_shared_nodes_says_how_to_offer_devices() -> None:
    nodes, groups = [node("cpu-1", shared=False)], [group("big", {GPU: 4})]
    assert devices_grid(device_map(nodes, groups, [])) == devices_view(nodes, groups, [])


# --- sdg get ----------------------------------------------------------------------------------

NOW = datetime(2026, 1, 1, 0, 5, 3, tzinfo=UTC)


def created(g: dict[str, Any], when: str = T0) -> dict[str, Any]:
    return {**g, "metadata": {**g["metadata"], "creationTimestamp": when}}


@pytest.mark.parametrize(
    ("seconds", "age"),
    [
        (-5, "<invalid>"),
        (-1, "0s"),
        (0, "0s"),
        (119, "119s"),
        (120, "2m"),
        (303, "5m3s"),
        (600, "10m"),
        (179 * 60, "179m"),
        (3 * 3600, "3h"),
        (3 * 3600 + 12 * 60, "3h12m"),
        (8 * 3600, "8h"),
        (47 * 3600, "47h"),
        (4 * 86400 + 6 * 3600, "4d6h"),
        (8 * 86400, "8d"),
        (729 * 86400, "729d"),
        (2 * 365 * 86400 + 15 * 86400, "2y15d"),
        (9 * 365 * 86400, "9y"),
    ],
)
def test_age_is_kubectls(seconds: int, age: str) -> None:
    assert human_age(seconds) == age


def test_get_table_has_kubectl_get_sdg_columns() -> None:
    groups = [created(g) for g in GROUPS]
    groups[0]["status"]["deviceSummary"] = "nvidia.com/gpu=0,1"  # what the manager writes
    assert groups_table(groups, NOW) == (
        """\
NAME    PHASE     READY   NODE    DEVICES              PODS   AGE
big     Pending                                               5m3s
infer   Bound             gpu-a   nvidia.com/gpu=3            5m3s
rocm    Bound             amd-1   amd.com/gpu=0,1      5      5m3s
train   Bound     True    gpu-a   nvidia.com/gpu=0,1   2      5m3s
"""
    )


def test_get_row_prefers_the_device_summary_and_reads_ready() -> None:
    g = group("multi", {GPU: 1, "amd.com/gpu": 1}, node="n", devices={GPU: "0", "amd.com/gpu": "1"})
    g["status"]["conditions"] = [cond("Ready", "False", "NodeNotReady")]
    row = ("multi", "Bound", "False", "n", "amd.com/gpu=1 nvidia.com/gpu=0", "", "63s")
    assert group_row(created(g, "2026-01-01T00:04:00Z"), NOW) == row
    g["status"]["deviceSummary"] = "as the manager wrote it"
    assert group_row(g, NOW)[4:] == ("as the manager wrote it", "", "<unknown>")


def test_object_list_is_kubectls_and_drops_managed_fields() -> None:
    g = created(GROUPS[0])
    g["metadata"]["managedFields"] = [{"manager": "kubectl"}]
    listed = object_list([g])
    assert listed["apiVersion"] == "v1" and listed["kind"] == "List"
    assert listed["metadata"] == {"resourceVersion": ""}
    assert "managedFields" not in listed["items"][0]["metadata"]
    assert listed["items"][0]["metadata"]["name"] == "train"
    assert "managedFields" in g["metadata"]  # the object itself is left alone


# --- sdg explain -o json ----------------------------------------------------------------------


def test_explain_bound_group_facts() -> None:
    facts = explain_group_data("train", GROUPS, NODES, RECORDS, PODS)
    assert {k: facts[k] for k in ("group", "phase", "node", "devices", "problems", "nodes")} == {
        "group": "train",
        "phase": "Bound",
        "node": "gpu-a",
        "devices": {GPU: [0, 1]},
        "problems": [],
        "nodes": None,
    }
    assert facts["summary"] == "Bound to node gpu-a with nvidia.com/gpu 0,1; 2 pod(s) use it."
    assert facts["pods"] == [
        {"pod": "ml/w1", "phase": "Running", "node": "gpu-a", "note": None},
        {
            "pod": "ml/w2",
            "phase": "Pending",
            "node": "gpu-a",
            "note": "container cuda: ErrImagePull (not found)",
        },
    ]
    assert [c["type"] for c in facts["conditions"]] == ["Scheduled", "Ready"]


def test_explain_facts_carry_the_problems_and_per_node_verdicts() -> None:
    facts = explain_group_data("shrunk", TROUBLE_GROUPS, TROUBLE_NODES, TROUBLE_RECORDS, [])
    assert facts["problems"] == [
        "node gpu-small no longer offers nvidia.com/gpu 1 (gone) (counted in status.allocatable: "
        "IDs are guessed); the group holds nvidia.com/gpu 0,1"
    ]
    assert "Problems:" not in facts["summary"]
    assert "\nProblems:\n  " + facts["problems"][0] + "\n" in explain_group(
        "shrunk", TROUBLE_GROUPS, TROUBLE_NODES, TROUBLE_RECORDS, []
    )
    pending = explain_group_data("big", GROUPS, NODES, RECORDS, PODS)
    assert (pending["node"], pending["devices"]) == (None, {})
    assert pending["nodes"] == [
        {"node": "amd-1", "fits": False, "reason": "have no nvidia.com/gpu"},
        {"node": "gpu-a", "fits": False, "reason": "have 1 free nvidia.com/gpu (need 4)"},
        {"node": "gpu-b", "fits": False, "reason": "have 2 free nvidia.com/gpu (need 4)"},
    ]
    missing = explain_group_data("nope", GROUPS, NODES, RECORDS, PODS)
    assert missing == {"group": "nope", "found": False, "groups": ["big", "infer", "rocm", "train"]}


def test_explain_pod_facts() -> None:
    wrong = pod(
        "ml/w3", "train", node="gpu-a", phase="Running", env={"NVIDIA_VISIBLE_DEVICES": "2"}
    )
    facts = explain_pod_data(wrong, GROUPS, NODES, PODS)
    assert {k: facts[k] for k in ("pod", "group", "groupPhase", "groupNode", "node", "phase")} == {
        "pod": "ml/w3",
        "group": "train",
        "groupPhase": "Bound",
        "groupNode": "gpu-a",
        "node": "gpu-a",
        "phase": "Running",
    }
    assert facts["verdict"].startswith("Running on gpu-a, the node of group train")
    assert facts["env"] == [
        {"container": "cuda", "variable": "NVIDIA_VISIBLE_DEVICES", "value": "2", "want": "0,1"}
    ]
    assert facts["warnings"] == [
        "container cuda: NVIDIA_VISIBLE_DEVICES is 2, the group holds nvidia.com/gpu 0,1"
    ]
    lone = explain_pod_data(pod("ml/x", None), GROUPS, NODES)
    assert (lone["group"], lone["groupFound"], lone["env"]) == (None, False, [])


# --- the command line -------------------------------------------------------------------------


def test_output_and_watch_flags_parse() -> None:
    parser = cli._parser()
    args = parser.parse_args(["get", "train", "-o", "yaml", "-w"])
    assert (args.command, args.name, args.output, args.watch) == ("get", "train", "yaml", True)
    args = parser.parse_args(["get"])
    assert (args.name, args.output, args.watch) == (None, None, False)
    args = parser.parse_args(["devices", "--grid", "--watch"])
    assert (args.grid, args.output, args.watch) == (True, None, True)
    assert parser.parse_args(["explain", "pod/w1", "-o", "json"]).output == "json"


@pytest.mark.parametrize(
    "argv", [["devices", "--grid", "-o", "json"], ["get", "-o", "wide"], ["explain", "g", "-w"]]
)
def test_contradictory_or_unknown_output_flags_are_usage_errors(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_ctrl_c_ends_a_watch_with_130_and_no_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    async def interrupted(*_: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_run", interrupted)
    assert cli.main(["get", "-w"]) == 130
    assert capsys.readouterr().err == ""

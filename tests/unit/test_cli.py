"""``sdg devices`` and ``sdg explain``: exact output on known states, and the CLI's parsing.

The views are pure (cli/); these states are what an operator meets: a
healthy node map, and one where records, statuses and nodes disagree.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from api.constants import MANAGER_NAMESPACE, SCHEDULER_NAME
from cli import main as cli
from cli.devices import device_map, devices_view, render_device_table
from cli.explain import explain_group, explain_pod
from cli.kube import context_namespace
from cli.render import table
from tests.factories import GPU, T0, group, node, pod, record

Obj = dict[str, Any]


# --- builders ---------------------------------------------------------------------------------


def cond(type_: str, status: str, reason: str, message: str = "") -> Obj:
    return {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": T0,
    }


# --- a healthy cluster ------------------------------------------------------------------------

SCHEDULED_TRAIN = cond("Scheduled", "True", "Bound", "bound to gpu-a: nvidia.com/gpu 0,1")
PENDING_BIG = cond(
    "Scheduled",
    "False",
    "Unschedulable",
    "0/4 nodes are available: 1 have 1 free nvidia.com/gpu (need 4), "
    "1 have 2 free nvidia.com/gpu (need 4), 1 have no nvidia.com/gpu, "
    "1 not labelled deviceshare.io/mode=shared.",
)

NODES = [
    node("gpu-a", {GPU: 4}),
    node("gpu-b", {GPU: 2}),
    node("amd-1", {"amd.com/gpu": 2}),
    node("cpu-1", shared=False),
]
GROUPS = [
    group(
        "train",
        {GPU: 2},
        node="gpu-a",
        devices={GPU: "0,1"},
        pods=["ml/w1", "ml/w2"],
        conditions=[SCHEDULED_TRAIN, cond("Ready", "True", "Ready", "bound, node healthy")],
    ),
    group("infer", {GPU: 1}, node="gpu-a", devices={GPU: "3"}),
    group(
        "rocm",
        {"amd.com/gpu": 2},
        node="amd-1",
        devices={"amd.com/gpu": "0,1"},
        pods=["lab/p1", "lab/p2", "lab/p3", "lab/p4", "lab/p5"],
    ),
    group("big", {GPU: 4}, conditions=[PENDING_BIG]),
]
RECORDS = [
    record("gpu-a", {"train": {GPU: "0,1"}, "infer": {GPU: "3"}}),
    record("amd-1", {"rocm": {"amd.com/gpu": "0,1"}}),
]
ENV01 = {"NVIDIA_VISIBLE_DEVICES": "0,1"}
PODS = [
    pod("ml/w1", "train", node="gpu-a", phase="Running", env=ENV01),
    pod("ml/w2", "train", node="gpu-a", env=ENV01, waiting=("ErrImagePull", "not found")),
    pod("ml/other", node="gpu-a", phase="Running", scheduler=SCHEDULER_NAME),
]


def test_device_map_of_a_healthy_cluster() -> None:
    assert devices_view(NODES, GROUPS, RECORDS) == (
        """\
NODE    RESOURCE         ID   GROUP   STATE   PODS
amd-1   amd.com/gpu      0    rocm    held    lab/p1,lab/p2,lab/p3 + 2 more...
amd-1   amd.com/gpu      1    rocm    held    lab/p1,lab/p2,lab/p3 + 2 more...
gpu-a   nvidia.com/gpu   0    train   held    ml/w1,ml/w2
gpu-a   nvidia.com/gpu   1    train   held    ml/w1,ml/w2
gpu-a   nvidia.com/gpu   2    -       free    -
gpu-a   nvidia.com/gpu   3    infer   held    <none>
gpu-b   nvidia.com/gpu   0    -       free    -
gpu-b   nvidia.com/gpu   1    -       free    -

Pending groups (hold no devices; sdg explain GROUP says why): big

Inventory:
  amd-1 amd.com/gpu: 2 device(s), counted in status.allocatable: IDs are guessed
  gpu-a nvidia.com/gpu: 4 device(s), counted in status.allocatable: IDs are guessed
  gpu-b nvidia.com/gpu: 2 device(s), counted in status.allocatable: IDs are guessed
"""
    )


# --- a cluster where records, statuses and nodes disagree -------------------------------------

TROUBLE_NODES = [
    node("gpu-a", {GPU: 2}),
    node("gpu-b", {GPU: 2}, unschedulable=True),
    node("gpu-c", {GPU: 2}, ready=False),
    node("gpu-old", {GPU: 1}, shared=False),
    node("gpu-small", {GPU: 1}),
    node("empty-1"),
]
TROUBLE_GROUPS = [
    group("alpha", {GPU: 2}, node="gpu-b", devices={GPU: "0,1"}, pods=["a/p"]),
    group("beta", {GPU: 1}, node="gpu-b", devices={GPU: "1"}),
    group("moving", {GPU: 1}, node="gpu-c", devices={GPU: "0"}),
    group("legacy", {GPU: 1}, node="gpu-old", devices={GPU: "0"}),
    group("shrunk", {GPU: 2}, node="gpu-small", devices={GPU: "0,1"}),
    group("lost", {GPU: 1}, node="gone-1", devices={GPU: "0"}),
    group("starting", {GPU: 1}),
]
TROUBLE_RECORDS = [
    record("gpu-a", {"ghost": {GPU: "0"}, "starting": {GPU: "1"}}),
    record("gpu-b", {"alpha": {GPU: "0,1"}}),
    record("gpu-c", {"moving": {GPU: "1"}}),
    record("gpu-old", {"legacy": {GPU: "0"}}),
    record("gpu-small", {"shrunk": {GPU: "0,1"}}),
    record("gone-1", {"lost": {GPU: "0"}}),
    record("broken", "{not json"),
]


def test_device_map_shows_every_disagreement() -> None:
    """Held by two groups, held by a deleted group, recorded but not in the status (and the
    reverse), held beyond what the node still offers, on a node that is gone, unlabelled,
    cordoned or not Ready, and a record nobody can parse: each is visible."""
    assert devices_view(TROUBLE_NODES, TROUBLE_GROUPS, TROUBLE_RECORDS) == (
        """\
NODE        RESOURCE         ID   GROUP        STATE         PODS
empty-1     <none>           -    -            -             -
gone-1      nvidia.com/gpu   0    lost         missing       <none>
gpu-a       nvidia.com/gpu   0    ghost        record-only   -
gpu-a       nvidia.com/gpu   1    starting     record-only   <none>
gpu-b       nvidia.com/gpu   0    alpha        held          a/p
gpu-b       nvidia.com/gpu   1    alpha,beta   conflict      -
gpu-c       nvidia.com/gpu   0    moving       status-only   <none>
gpu-c       nvidia.com/gpu   1    moving       record-only   <none>
gpu-old     nvidia.com/gpu   0    legacy       held          <none>
gpu-small   nvidia.com/gpu   0    shrunk       held          <none>
gpu-small   nvidia.com/gpu   1    shrunk       missing       <none>

Pending groups (hold no devices; sdg explain GROUP says why): starting

Inventory:
  gpu-a nvidia.com/gpu: 2 device(s), counted in status.allocatable: IDs are guessed
  gpu-b nvidia.com/gpu: 2 device(s), counted in status.allocatable: IDs are guessed
  gpu-c nvidia.com/gpu: 2 device(s), counted in status.allocatable: IDs are guessed
  gpu-small nvidia.com/gpu: 1 device(s), counted in status.allocatable: IDs are guessed

Warnings:
  node broken: claim record deviceshare-system/sdg-claims.broken: claim record is not \
JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)
  node gone-1: not found, but devices are recorded on it
  node gpu-b: cordoned (spec.unschedulable)
  node gpu-c: not Ready (NodeStatusUnknown)
  node gpu-old: not labelled deviceshare.io/mode=shared; its groups keep their devices, \
new groups will not bind there
  node gpu-small: offers 1 nvidia.com/gpu, but nvidia.com/gpu 1 is still held
  group beta: Bound on gpu-b (nvidia.com/gpu 1), but no claim record lists it
  group ghost: does not exist, but the claim record of node gpu-a still holds \
nvidia.com/gpu 0 for it
  group moving: status says gpu-c (nvidia.com/gpu 0), the claim record says gpu-c \
(nvidia.com/gpu 1)
  group starting: Pending, but the claim record of node gpu-a holds nvidia.com/gpu 1 for \
it (binding in progress, or its status was lost)
"""
    )


def test_device_map_without_shared_nodes_says_how_to_offer_devices() -> None:
    assert devices_view([node("cpu-1", shared=False)], [group("big", {GPU: 4})], []) == (
        """\
No shared nodes: label a node deviceshare.io/mode=shared to offer its devices.

Pending groups (hold no devices; sdg explain GROUP says why): big
"""
    )


def test_table_aligns_like_kubectl() -> None:
    assert table(["NAME", "X"], [("a", "1"), ("longer", "")], indent="  ") == (
        "  NAME     X\n  a        1\n  longer"
    )


# --- sdg explain GROUP ------------------------------------------------------------------------


def test_explain_bound_group() -> None:
    assert explain_group("train", GROUPS, NODES, RECORDS, PODS) == (
        """\
Name:          train
Phase:         Bound
Node:          gpu-a
Devices:       nvidia.com/gpu 0,1 (NVIDIA_VISIBLE_DEVICES=0,1)
Device UUIDs:  nvidia.com/gpu unknown (counted in status.allocatable: IDs are guessed)
Told by:       nvidia.com/gpu by index: the inventory knows no UUID for every one; counted in \
status.allocatable: IDs are guessed
Delivery:      env, unverified: nothing tells how node gpu-a's runtime takes devices (no \
RuntimeClass nvidia; no label deviceshare.io/default-runtime; no label deviceshare.io/delivery), \
and NVIDIA_VISIBLE_DEVICES alone works only where the vendor's runtime is the node's default
To settle it:  if NVIDIA's runtime is the node's default runtime, kubectl label node gpu-a \
deviceshare.io/default-runtime=nvidia; if its runtime has a handler for NVIDIA's, create \
RuntimeClass nvidia with that handler (as the GPU Operator and k3s do); or name the mode: \
kubectl label node gpu-a deviceshare.io/delivery=<env|runtimeclass|cdi>
Strategy:      binpack
Resources:     nvidia.com/gpu: 2
Node Selector: <none>

Bound to node gpu-a with nvidia.com/gpu 0,1; 2 pod(s) use it.

Pods:
  POD     PHASE     NODE    NOTE
  ml/w1   Running   gpu-a
  ml/w2   Pending   gpu-a   container cuda: ErrImagePull (not found)

Conditions:
  TYPE        STATUS   REASON   MESSAGE
  Scheduled   True     Bound    bound to gpu-a: nvidia.com/gpu 0,1
  Ready       True     Ready    bound, node healthy
"""
    )


def test_explain_pending_group_gives_the_reason_per_node() -> None:
    assert explain_group("big", GROUPS, NODES, RECORDS, PODS) == (
        """\
Name:          big
Phase:         Pending
Strategy:      binpack
Resources:     nvidia.com/gpu: 4
Node Selector: <none>

Pending: 0/4 nodes are available: 1 have 1 free nvidia.com/gpu (need 4), 1 have 2 free \
nvidia.com/gpu (need 4), 1 have no nvidia.com/gpu, 1 not labelled deviceshare.io/mode=shared.

Nodes now (0/4 fit):
  NODE    FITS   REASON
  amd-1   no     have no nvidia.com/gpu
  gpu-a   no     have 1 free nvidia.com/gpu (need 4)
  gpu-b   no     have 2 free nvidia.com/gpu (need 4)
  1 other node(s) are not labelled deviceshare.io/mode=shared

Pods: <none>

Conditions:
  TYPE        STATUS   REASON          MESSAGE
  Scheduled   False    Unschedulable   0/4 nodes are available: 1 have 1 free nvidia.com/gpu \
(need 4), 1 have 2 free nvidia.com/gpu (need 4), 1 have no nvidia.com/gpu, 1 not labelled \
deviceshare.io/mode=shared.
"""
    )


def test_explain_pending_group_that_fits_now_points_at_the_manager() -> None:
    stale = cond("Scheduled", "False", "Unschedulable", "0/4 nodes are available: (stale)")
    groups = [*GROUPS, group("small", {GPU: 1}, selector={"gpu-type": "a100"}, conditions=[stale])]
    nodes = [*NODES, node("gpu-x", {GPU: 2}, labels={"gpu-type": "a100"})]
    text = explain_group("small", groups, nodes, RECORDS, [])
    assert "Node Selector: gpu-type=a100\n" in text
    assert (
        """\
Nodes now (1/5 fit):
  NODE    FITS   REASON
  amd-1   no     didn't match the group's nodeSelector
  gpu-a   no     didn't match the group's nodeSelector
  gpu-b   no     didn't match the group's nodeSelector
  gpu-x   yes    1 device(s) would stay free
  1 other node(s) are not labelled deviceshare.io/mode=shared
  gpu-x fits now; the scheduler retries when nodes or groups change (if it stays Pending, \
check that the manager is running).
"""
        in text
    )


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("moving", "  node gpu-c is not Ready (NodeStatusUnknown)\n"),
        (
            "moving",
            "  the claim record of node gpu-c says nvidia.com/gpu 1, "
            "the status says nvidia.com/gpu 0\n",
        ),
        (
            "shrunk",
            "  node gpu-small no longer offers nvidia.com/gpu 1 (gone) (counted in "
            "status.allocatable: IDs are guessed); the group holds nvidia.com/gpu 0,1\n",
        ),
        ("lost", "  node gone-1 does not exist any more; its pods cannot run\n"),
        ("beta", "  the claim record of node gpu-b does not list the group\n"),
        ("alpha", "  node gpu-b is cordoned (spec.unschedulable)\n"),
    ],
)
def test_explain_bound_group_lists_its_problems(name: str, problem: str) -> None:
    text = explain_group(name, TROUBLE_GROUPS, TROUBLE_NODES, TROUBLE_RECORDS, [])
    assert "\nProblems:\n" in text
    assert problem in text


def test_explain_group_being_deleted_says_what_holds_it() -> None:
    old = group("old", {GPU: 1}, node="gpu-a", devices={GPU: "2"}, pods=["ml/x"], deleting=True)
    text = explain_group(
        "old",
        [old],
        NODES,
        [record("gpu-a", {"old": {GPU: "2"}})],
        [pod("ml/x", "old", node="gpu-a", phase="Running")],
    )
    assert (
        "\n\nBeing deleted: the finalizer deviceshare.io/protection holds it until its 1 pod(s) "
        "are gone; delete them to release the devices.\n\nPods:\n"
    ) in text


def test_explain_group_flags_pods_the_status_does_not_count_yet() -> None:
    extra = pod("ml/w3", "train", node="gpu-a", phase="Running", env=ENV01)
    text = explain_group("train", GROUPS, NODES, RECORDS, [*PODS, extra])
    assert "  ml/w3   Running   gpu-a   not yet in status.allocatedPods\n" in text
    gone = [p for p in PODS if p["metadata"]["name"] != "w2"]
    text = explain_group("train", GROUPS, NODES, RECORDS, gone)
    assert "  ml/w2   -         -       in status.allocatedPods, but no such pod\n" in text


def test_explain_unknown_group_lists_the_groups() -> None:
    assert explain_group("nope", GROUPS, NODES, RECORDS, PODS) == (
        'SharedDeviceGroup "nope" not found. Groups: big, infer, rocm, train\n'
    )


# --- sdg explain POD --------------------------------------------------------------------------


def test_explain_running_pod_shows_its_env() -> None:
    running = pod(
        "ml/w1", "train", node="gpu-a", phase="Running", env=ENV01, containers=("cuda", "sidecar")
    )
    assert explain_pod(running, GROUPS, NODES, PODS) == (
        """\
Pod:       ml/w1
Group:     train (Bound on gpu-a)
Scheduler: deviceshare-scheduler
Node:      gpu-a
Phase:     Running

Running on gpu-a, the node of group train, with nvidia.com/gpu 0,1.

Env:
  CONTAINER   VARIABLE                 VALUE
  cuda        NVIDIA_VISIBLE_DEVICES   0,1
  sidecar     NVIDIA_VISIBLE_DEVICES   0,1

Conditions: <none>
"""
    )


def test_explain_unschedulable_pod_gives_the_scheduler_and_the_node_now() -> None:
    hungry = pod(
        "ml/hungry",
        "train",
        env=ENV01,
        cpu="16",
        conditions=[
            cond(
                "PodScheduled",
                "False",
                "Unschedulable",
                "0/1 nodes are available: group node gpu-a: Insufficient cpu",
            )
        ],
    )
    assert explain_pod(hungry, GROUPS, NODES, PODS) == (
        """\
Pod:       ml/hungry
Group:     train (Bound on gpu-a)
Scheduler: deviceshare-scheduler
Node:      <none>
Phase:     Pending

Not scheduled yet onto gpu-a, the node of group train.
Scheduler says: 0/1 nodes are available: group node gpu-a: Insufficient cpu
Node gpu-a now: Insufficient cpu (requested 16, free 8)

Env:
  CONTAINER   VARIABLE                 VALUE
  cuda        NVIDIA_VISIBLE_DEVICES   0,1

Conditions:
  TYPE           STATUS   REASON          MESSAGE
  PodScheduled   False    Unschedulable   0/1 nodes are available: group node gpu-a: \
Insufficient cpu
"""
    )


@pytest.mark.parametrize(
    ("subject", "verdict"),
    [
        (
            pod("ml/plain", scheduler="default-scheduler"),
            "Not a SharedDeviceGroup pod: it has no deviceshare.io/group annotation.\n",
        ),
        (
            pod("ml/lonely", scheduler=SCHEDULER_NAME),
            "Not a SharedDeviceGroup pod: it has no deviceshare.io/group annotation. It names "
            "schedulerName deviceshare-scheduler, which only schedules group pods, so it stays "
            "Pending: add deviceshare.io/group: <group> (recreate the pod) or use another "
            "scheduler.\n",
        ),
        (
            pod("ml/orphan", "nope"),
            "It cannot be scheduled: its group nope does not exist. Create the group, or "
            "delete the pod and recreate it with an existing group.\n",
        ),
        (
            pod("ml/waits", "big"),
            "Waiting for its group big, which is Pending: 0/4 nodes are available: 1 have 1 "
            "free nvidia.com/gpu (need 4), 1 have 2 free nvidia.com/gpu (need 4), 1 have no "
            "nvidia.com/gpu, 1 not labelled deviceshare.io/mode=shared.\n",
        ),
        (
            pod("ml/fresh", "train", env=ENV01),
            "Not scheduled yet onto gpu-a, the node of group train.\nNode gpu-a fits it now; "
            "waiting for deviceshare-scheduler (is the manager running?).\n",
        ),
        (
            pod("ml/default", "train", scheduler="default-scheduler", env=ENV01),
            "Not scheduled by deviceshare-scheduler: its schedulerName is default-scheduler "
            "(the pod webhook sets deviceshare-scheduler at creation; was it bypassed?), so "
            "another scheduler may place it on any node. Recreate the pod.\n",
        ),
        (
            pod("ml/w2", "train", node="gpu-a", env=ENV01, waiting=("ErrImagePull", "not found")),
            "Bound to gpu-a, the node of group train, with nvidia.com/gpu 0,1; phase Pending, "
            "container cuda: ErrImagePull (not found).\n",
        ),
        (
            pod(
                "ml/wrong",
                "train",
                node="gpu-b",
                phase="Running",
                env={"NVIDIA_VISIBLE_DEVICES": "1"},
            ),
            "Bound to node gpu-b, but group train is bound to gpu-a: its containers were given "
            "devices of another node. Delete the pod; its replacement lands on gpu-a.\n",
        ),
        (
            pod("ml/done", "train", node="gpu-a", phase="Succeeded", env=ENV01),
            "Finished (Succeeded) on node gpu-a; it no longer counts among the pods of group "
            "train.\n",
        ),
    ],
    ids=lambda v: v["metadata"]["name"] if isinstance(v, dict) else "",
)
def test_explain_pod_verdicts(subject: Obj, verdict: str) -> None:
    text = explain_pod(subject, GROUPS, NODES, PODS)
    assert f"\n\n{verdict}" in text


def test_explain_pod_warns_when_its_env_is_not_the_groups() -> None:
    wrong = pod(
        "ml/wrong", "train", node="gpu-b", phase="Running", env={"NVIDIA_VISIBLE_DEVICES": "1"}
    )
    assert explain_pod(wrong, GROUPS, NODES, PODS).endswith(
        """\
Env:
  CONTAINER   VARIABLE                 VALUE
  cuda        NVIDIA_VISIBLE_DEVICES   1
Warnings:
  container cuda: NVIDIA_VISIBLE_DEVICES is 1, the group holds nvidia.com/gpu 0,1

Conditions: <none>
"""
    )


def test_explain_pod_on_a_node_going_away() -> None:
    nodes = [
        node(
            "gpu-a",
            {GPU: 4},
            ready=False,
            taints=[{"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}],
        )
    ]
    running = pod("ml/w1", "train", node="gpu-a", phase="Running", env=ENV01)
    assert (
        "\n\nRunning on gpu-a, the node of group train, with nvidia.com/gpu 0,1.\n"
        "Node gpu-a is not Ready (NodeStatusUnknown).\n"
        "Node gpu-a has taint node.kubernetes.io/unreachable=:NoExecute, which the pod does "
        "not tolerate: it will be evicted.\n"
    ) in explain_pod(running, GROUPS, nodes, PODS)


# --- the command line -------------------------------------------------------------------------


def test_global_flags_work_before_and_after_the_command() -> None:
    parser = cli._parser()
    before = parser.parse_args(["--kubeconfig", "k", "--claims-namespace", "ns", "devices"])
    after = parser.parse_args(["devices", "--kubeconfig", "k", "--claims-namespace", "ns"])
    for args in (before, after):
        assert (args.command, args.kubeconfig, args.claims_namespace) == ("devices", "k", "ns")
    args = parser.parse_args(["explain", "pod/w1", "-n", "ml", "--context", "c"])
    assert (args.target, args.namespace, args.context) == ("pod/w1", "ml", "c")
    assert parser.parse_args(["devices"]).claims_namespace == "deviceshare-system"


def test_a_command_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main([])
    assert exc.value.code == 2
    assert "COMMAND" in capsys.readouterr().err


def test_unloadable_kubeconfig_is_one_line_and_exit_1(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["--kubeconfig", str(tmp_path / "missing"), "devices"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: cannot load the Kubernetes configuration:")
    assert err.count("\n") == 1


def test_unknown_target_type_is_rejected_before_any_request(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    assert cli.main(["--kubeconfig", str(kubeconfig), "explain", "svc/web"]) == 1
    assert capsys.readouterr().err == "error: unknown type 'svc': use sdg/NAME or pod/NAME\n"


def test_explain_pod_notices_the_webhook_never_ran() -> None:
    bare = pod("ml/bare", "train", node="gpu-a", phase="Running")
    assert (
        "  cuda        NVIDIA_VISIBLE_DEVICES   <none>\nWarnings:\n  container cuda: "
        "NVIDIA_VISIBLE_DEVICES is unset, the group holds nvidia.com/gpu 0,1 (the pod webhook "
        "did not inject it: was it installed and reachable when the pod was created?)\n"
    ) in explain_pod(bare, GROUPS, NODES, PODS)


# --- bounds: nodes over the device cap, cut pod lists -----------------------------------------

HUGE_NODES = [
    node("bytes-1", {GPU: 10**9}),
    node("gpu-a", {GPU: 4}),
    node("bytes-2", {GPU: 10**9}),
]
CAP = f"advertise 1000000000 {GPU}, more than the 1024 devices SDG addresses per node"


def test_explain_pending_group_names_nodes_over_the_device_cap() -> None:
    message = f"0/3 nodes are available: 2 {CAP}, 1 have 4 free {GPU} (need 8)."
    pending = group(
        "wide", {GPU: 8}, conditions=[cond("Scheduled", "False", "Unschedulable", message)]
    )
    text = explain_group("wide", [pending], HUGE_NODES, [], [])
    assert f"\n\nPending: {message}\n" in text
    assert (
        f"""\
Nodes now (0/3 fit):
  NODE      FITS   REASON
  bytes-1   no     {CAP}
  bytes-2   no     {CAP}
  gpu-a     no     have 4 free {GPU} (need 8)
"""
        in text
    )


def test_device_map_warns_about_nodes_over_the_device_cap() -> None:
    held = group("grown", {GPU: 1}, node="bytes-1", devices={GPU: "0"})
    text = devices_view(HUGE_NODES, [held], [record("bytes-1", {"grown": {GPU: "0"}})])
    assert f"bytes-1   {GPU}   0    grown   missing" in text
    assert "bytes-2" not in text.split("\n\n")[0]  # no row per "device" of a byte count
    assert (
        f"  node bytes-1: advertises 1000000000 {GPU}, more than the 1024 devices SDG "
        "addresses per node, so it offers none (not a device count)\n"
    ) in text
    explained = explain_group("grown", [held], HUGE_NODES, [], [])
    assert (
        f"  node bytes-1 advertises 1000000000 {GPU}, more than the 1024 devices SDG addresses "
        f"per node, so it offers none (not a device count); the group holds {GPU} 0\n"
    ) in explained


def test_explain_group_with_a_cut_pod_list_counts_every_pod() -> None:
    listed = [f"ml/p{i:04d}" for i in range(1000)]
    big = group("many", {GPU: 1}, node="gpu-a", devices={GPU: "2"}, pods=listed)
    big["status"]["podCount"] = 1200
    pods = [
        pod("ml/p0000", "many", node="gpu-a", phase="Running"),
        pod("ml/p0000a", "many", node="gpu-a", phase="Running"),  # sorts inside the list
        pod("ml/p1100", "many", node="gpu-a", phase="Running"),  # beyond the list's end
    ]
    text = explain_group("many", [big], NODES, [record("gpu-a", {"many": {GPU: "2"}})], pods)
    assert "; 1200 pod(s) use it.\nstatus.allocatedPods lists the first 1000 of 1200 pods" in text
    assert "  ml/p0000a   Running   gpu-a   not yet in status.allocatedPods\n" in text
    assert "  ml/p1100    Running   gpu-a\n" in text


def test_explain_group_in_counts_mode_reads_the_counts_not_the_names() -> None:
    # --allocated-pods counts: allocatedPods names no pod by design, so no pod is "missing".
    counted = group("counted", {GPU: 1}, node="gpu-a", devices={GPU: "2"})
    counted["status"].update(podCount=2, allocatedPods=[], allocatedPodCounts={"ml": 2})
    pods = [
        pod("ml/a", "counted", node="gpu-a", phase="Running"),
        pod("ml/b", "counted", node="gpu-a", phase="Running"),
    ]
    text = explain_group(
        "counted", [counted], NODES, [record("gpu-a", {"counted": {GPU: "2"}})], pods
    )
    assert "status.allocatedPodCounts (pods per namespace): ml 2." in text
    assert "not yet in status.allocatedPods" not in text
    assert "lists the first" not in text


def test_the_default_namespace_is_the_kubeconfig_contexts(tmp_path: Path) -> None:
    """As kubectl: -n defaults to the chosen context's namespace, else "default"."""
    config = tmp_path / "config"
    config.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: work\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts:\n"
        "- {name: work, context: {cluster: c, user: u, namespace: ml}}\n"
        "- {name: bare, context: {cluster: c, user: u}}\n"
    )
    assert context_namespace(str(config), None) == "ml"
    assert context_namespace(str(config), "bare") == "default"
    assert context_namespace(str(config), "unknown") == "default"
    assert context_namespace(str(tmp_path / "missing"), None) == "default"


def test_a_decoy_record_reads_the_same_in_the_cli_as_in_the_manager() -> None:
    """One reader of the record format (the claim book): a labelled ConfigMap under another
    name that names node n0 is no record of it, for `sdg devices` as for placement."""
    from cli.claims import claim_view
    from controllers.ledger.book import Ledger

    cms = [
        record("n0", {"a": {GPU: "0"}}),
        record("n0", {"b": {GPU: "1"}}, name="decoy"),
    ]
    view = claim_view([], cms)
    manager = Ledger(None, MANAGER_NAMESPACE)  # reads only
    for cm in cms:
        manager.observe(cm)
    assert (
        view.records
        == {"n0": {"a": {GPU: [0]}}}
        == {n: r.claims for n, r in manager.records.items()}
    )
    assert [w for w in view.warnings if "decoy" in w] == [f"node n0: {manager.broken['n0']}"]


def test_device_map_shows_what_the_kubelet_and_dra_gave_outside_any_group() -> None:
    """A plain pod the kubelet gave GPU 3 (it reports which), and on a DRA node a
    ResourceClaim allocated gpu-1: the map says who holds each, as the manager's ledger
    does, and neither is free."""
    plain = pod("ml/notebook", node="gpu-a", phase="Running", scheduler=SCHEDULER_NAME)
    plain["spec"]["containers"][0]["resources"] = {"limits": {GPU: "1"}}
    plain["status"]["containerStatuses"] = [
        {
            "name": "cuda",
            "allocatedResourcesStatus": [
                {"name": GPU, "resources": [{"resourceID": "3", "health": "Healthy"}]}
            ],
        }
    ]
    slice_ = {
        "metadata": {"name": "dra-1-gpus"},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": "dra-1",
            "pool": {"name": "dra-1", "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {
                    "name": f"gpu-{i}",
                    "attributes": {
                        "type": {"string": "gpu"},
                        "uuid": {"string": f"GPU-{i}"},
                        "resource.kubernetes.io/pciBusID": {"string": f"0000:0{i}:00.0"},
                    },
                }
                for i in range(2)
            ],
        },
    }
    claim = {
        "metadata": {"name": "mine", "namespace": "lab"},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "gpu",
                            "driver": "gpu.nvidia.com",
                            "pool": "dra-1",
                            "device": "gpu-1",
                        }
                    ]
                }
            }
        },
    }
    nodes = [node("gpu-a", {GPU: 4}), node("dra-1")]
    groups = [group("train", {GPU: 2}, node="gpu-a", devices={GPU: "0,1"}, pods=["ml/w1"])]
    records = [record("gpu-a", {"train": {GPU: "0,1"}})]
    data = device_map(nodes, groups, records, [slice_], [plain], [claim])
    devices = {
        (n["name"], d["id"]): d for n in data["nodes"] for r in n["resources"] for d in r["devices"]
    }
    assert devices[("gpu-a", 3)] | {"uuid": None} == {
        "id": 3,
        "uuid": None,
        "groups": [],
        "heldBy": "pod ml/notebook",
        "state": "in-use",
        "pods": ["ml/notebook"],
    }
    assert devices[("gpu-a", 2)]["state"] == "free"
    assert (devices[("dra-1", 1)]["state"], devices[("dra-1", 1)]["heldBy"]) == (
        "in-use",
        "ResourceClaim lab/mine",
    )
    assert devices[("dra-1", 0)]["state"] == "free"
    text = render_device_table(data)
    assert "pod ml/notebook" in text and "ResourceClaim lab/mine" in text

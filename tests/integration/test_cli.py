"""``sdg`` against the real API server: what it fetches is what it shows.

The exact rendering is tested in tests/unit/test_cli.py; here the I/O layer reads real
Nodes, groups (status written through the status subresource), claim-record ConfigMaps
and Pods. Other tests share this control plane, so rows are matched by this test's own
unique names, not by whole-table equality.
"""

from __future__ import annotations

import contextlib
import json
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from api.constants import SDG_KIND
from cli import main as cli
from sdgruntime.envtest.controlplane import ControlPlane
from sdgruntime.envtest.fakes import make_node

pytestmark = pytest.mark.integration

GPU = "nvidia.com/gpu"


def ok(r: Any, *codes: int) -> dict[str, Any]:
    assert r.status_code in (codes or (200, 201)), r.text
    return dict(r.json())


@pytest.fixture
def state(control_plane: ControlPlane, namespace: str) -> Iterator[dict[str, str]]:
    """A shared node with 2 GPUs; group G bound to it with both (record + status) and one
    Running pod; a second shared node with nothing on it."""
    api = control_plane.http
    suffix = uuid.uuid4().hex[:8]
    names = {
        "ns": namespace,
        "node": f"cli-gpu-{suffix}",
        "spare": f"cli-spare-{suffix}",
        "group": f"cli-g-{suffix}",
        "pod": "worker",
    }
    for n in (names["node"], names["spare"]):
        obj = make_node(n, labels={"deviceshare.io/mode": "shared"}, allocatable={GPU: 2})
        created = ok(api.post("/api/v1/nodes", json=obj))
        created["status"] = obj["status"]
        ok(api.put(f"/api/v1/nodes/{n}/status", json=created))
    group = ok(
        api.post(
            SDG_KIND.path(),
            json={
                "apiVersion": SDG_KIND.api_version,
                "kind": SDG_KIND.kind,
                "metadata": {"name": names["group"]},
                "spec": {"resources": {GPU: 2}},
            },
        )
    )
    key = f"{namespace}/{names['pod']}"
    group["status"] = {
        "phase": "Bound",
        "nodeName": names["node"],
        "selectedDevices": {GPU: "0,1"},
        "allocatedPods": [key],
        "podCount": 1,
    }
    ok(api.put(SDG_KIND.path(name=names["group"], subresource="status"), json=group))
    ok(
        api.post(
            f"/api/v1/namespaces/{namespace}/configmaps",
            json={
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {
                    "name": f"sdg-claims.{names['node']}",
                    "labels": {"deviceshare.io/claims": "node"},
                },
                "data": {
                    "node": names["node"],
                    "claims": f'{{"{names["group"]}":{{"{GPU}":"0,1"}}}}',
                },
            },
        )
    )
    pod = ok(
        api.post(
            f"/api/v1/namespaces/{namespace}/pods",
            json={
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": names["pod"],
                    "annotations": {"deviceshare.io/group": names["group"]},
                },
                "spec": {
                    "schedulerName": "deviceshare-scheduler",
                    "nodeName": names["node"],
                    "containers": [
                        {
                            "name": "cuda",
                            "image": "nvidia/cuda:12.4.1-base-ubuntu22.04",
                            "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "0,1"}],
                        }
                    ],
                },
            },
        )
    )
    pod["status"] = {"phase": "Running"}
    ok(api.put(f"/api/v1/namespaces/{namespace}/pods/{names['pod']}/status", json=pod))
    yield names
    api.delete(SDG_KIND.path(name=names["group"]))
    for n in (names["node"], names["spare"]):
        api.delete(f"/api/v1/nodes/{n}")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def rows(text: str, node: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines() if line.startswith(node + " ")]


def test_devices_shows_the_group_on_its_devices_and_the_free_node(
    state: dict[str, str], kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(
        capsys, "--kubeconfig", kubeconfig, "devices", "--claims-namespace", state["ns"]
    )
    assert (code, err) == (0, "")
    assert out.splitlines()[0].split() == ["NODE", "RESOURCE", "ID", "GROUP", "STATE", "PODS"]
    key = f"{state['ns']}/{state['pod']}"
    assert rows(out, state["node"]) == [
        [state["node"], GPU, "0", state["group"], "held", key],
        [state["node"], GPU, "1", state["group"], "held", key],
    ]
    assert rows(out, state["spare"]) == [
        [state["spare"], GPU, "0", "-", "free", "-"],
        [state["spare"], GPU, "1", "-", "free", "-"],
    ]


def test_devices_without_the_records_namespace_shows_status_only(
    state: dict[str, str], kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Pointed at a namespace without records, the map still shows the group (from its
    status) and says the record is missing: the cross-check is real, not assumed."""
    code, out, _ = run(
        capsys, "--kubeconfig", kubeconfig, "devices", "--claims-namespace", "default"
    )
    assert code == 0
    assert [r[4] for r in rows(out, state["node"])] == ["status-only", "status-only"]
    assert f"group {state['group']}: Bound on {state['node']} ({GPU} 0,1), but no claim record" in (
        out
    )


def test_explain_group_and_pod(
    state: dict[str, str], kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    ns = ["--claims-namespace", state["ns"]]
    code, out, _ = run(capsys, "--kubeconfig", kubeconfig, *ns, "explain", state["group"])
    assert code == 0
    assert f"\nBound to node {state['node']} with {GPU} 0,1; 1 pod(s) use it.\n" in out
    assert [f"{state['ns']}/{state['pod']}", "Running", state["node"]] in [
        line.split() for line in out.splitlines()
    ]
    assert "Problems:" not in out

    code, out, _ = run(
        capsys, "--kubeconfig", kubeconfig, "explain", f"pod/{state['pod']}", "-n", state["ns"]
    )
    assert code == 0
    assert (
        f"\nRunning on {state['node']}, the node of group {state['group']}, with {GPU} 0,1.\n"
        in out
    )
    assert ["cuda", "NVIDIA_VISIBLE_DEVICES", "0,1"] in [line.split() for line in out.splitlines()]


def test_explain_what_does_not_exist_fails_clearly(
    state: dict[str, str], kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "--kubeconfig", kubeconfig, "explain", "sdg/no-such-group")
    assert (code, out) == (1, "")
    assert err.startswith('error: SharedDeviceGroup "no-such-group" not found; groups: ')
    code, _, err = run(capsys, "--kubeconfig", kubeconfig, "explain", "pod/nope", "-n", state["ns"])
    assert code == 1
    assert err == f'error: pod "nope" not found in namespace {state["ns"]}\n'


# --- sdg get, -o json|yaml, --grid ------------------------------------------------------------


def test_get_prints_the_group_like_kubectl_and_as_objects(
    state: dict[str, str], kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "--kubeconfig", kubeconfig, "get", state["group"])
    assert (code, err) == (0, "")
    header, row = out.splitlines()
    assert header.split() == ["NAME", "PHASE", "READY", "NODE", "DEVICES", "PODS", "AGE"]
    # No Ready condition (no manager here): READY is blank, as kubectl get sdg shows it.
    assert row.split()[:5] == [state["group"], "Bound", state["node"], f"{GPU}=0,1", "1"]
    code, out, _ = run(capsys, "--kubeconfig", kubeconfig, "get")
    assert code == 0 and row.split()[:5] in [line.split()[:5] for line in out.splitlines()]

    code, out, _ = run(capsys, "--kubeconfig", kubeconfig, "get", state["group"], "-o", "json")
    obj = json.loads(out)
    assert (code, obj["kind"], obj["metadata"]["name"]) == (0, "SharedDeviceGroup", state["group"])
    assert obj["status"]["selectedDevices"] == {GPU: "0,1"}
    assert "managedFields" not in obj["metadata"]
    code, out, _ = run(capsys, "--kubeconfig", kubeconfig, "get", "-o", "yaml")
    listed = yaml.safe_load(out)
    assert (code, listed["kind"]) == (0, "List")
    assert state["group"] in [i["metadata"]["name"] for i in listed["items"]]

    for watch in ([], ["--watch"]):
        code, out, err = run(capsys, "--kubeconfig", kubeconfig, "get", "no-such-group", *watch)
        assert (code, out, err) == (1, "", 'error: SharedDeviceGroup "no-such-group" not found\n')


def test_devices_as_data_and_as_a_grid(
    state: dict[str, str], kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    ns = ["--claims-namespace", state["ns"]]
    code, out, _ = run(capsys, "--kubeconfig", kubeconfig, "devices", *ns, "-o", "json")
    assert code == 0
    nodes = {n["name"]: n for n in json.loads(out)["nodes"]}
    (res,) = nodes[state["node"]]["resources"]
    key = f"{state['ns']}/{state['pod']}"
    assert (res["resource"], res["source"]) == (GPU, "allocatable")
    assert res["devices"] == [
        {
            "id": i,
            "uuid": None,
            "groups": [state["group"]],
            "heldBy": None,
            "state": "held",
            "pods": [key],
        }
        for i in (0, 1)
    ]
    assert [d["state"] for d in nodes[state["spare"]]["resources"][0]["devices"]] == ["free"] * 2

    code, out, _ = run(capsys, "--kubeconfig", kubeconfig, "devices", *ns, "--grid")
    assert code == 0 and "\033" not in out  # not a terminal: plain letters
    grid = {line.split()[0]: line.split()[2:] for line in out.split("\n\n")[0].splitlines()}
    assert grid[state["spare"]] == [".."]
    (cells,) = grid[state["node"]]
    groups = out.split("\n\n")[1].split("\nCells:")[0].removeprefix("Groups:")
    letters = dict(entry.split(" ", 1) for entry in re.split(r"\s{2,}", groups.strip()))
    assert cells == 2 * cells[0] and letters[cells[0]] == state["group"]


def test_explain_as_facts(
    state: dict[str, str], kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    ns = ["--claims-namespace", state["ns"]]
    argv = ["--kubeconfig", kubeconfig, *ns, "explain", state["group"], "-o", "json"]
    code, out, _ = run(capsys, *argv)
    facts = json.loads(out)
    assert code == 0
    assert (facts["node"], facts["devices"], facts["problems"]) == (
        state["node"],
        {GPU: [0, 1]},
        [],
    )
    assert facts["pods"] == [
        {
            "pod": f"{state['ns']}/{state['pod']}",
            "phase": "Running",
            "node": state["node"],
            "note": None,
        }
    ]
    code, out, _ = run(
        capsys,
        "--kubeconfig",
        kubeconfig,
        "explain",
        f"pod/{state['pod']}",
        "-n",
        state["ns"],
        "-o",
        "yaml",
    )
    facts = yaml.safe_load(out)
    assert (code, facts["group"], facts["groupNode"], facts["warnings"]) == (
        0,
        state["group"],
        state["node"],
        [],
    )
    assert facts["env"] == [
        {"container": "cuda", "variable": "NVIDIA_VISIBLE_DEVICES", "value": "0,1", "want": "0,1"}
    ]


# --- --watch: a real process, stopped with Ctrl-C (SIGINT) ------------------------------------


class Watch:
    """``sdg ARGS`` as a process; its stdout lines as they come."""

    def __init__(self, *argv: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cli.main", *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=Path(__file__).resolve().parents[2],
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))

    def wait_for(self, predicate: Callable[[str], bool], timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                break
            self.seen.append(line)
            if predicate(line):
                return line
        raise AssertionError(f"no such line in {timeout}s; got: {self.seen}")

    def interrupt(self) -> tuple[int, str]:
        self.proc.send_signal(signal.SIGINT)
        _, err = self.proc.communicate(timeout=30)
        return self.proc.returncode, err


@contextlib.contextmanager
def watching(*argv: str) -> Iterator[Watch]:
    w = Watch(*argv)
    try:
        yield w
    finally:
        if w.proc.poll() is None:
            w.proc.kill()
            w.proc.wait()


def patch_status(control_plane: ControlPlane, group: str, status: dict[str, Any]) -> None:
    ok(
        control_plane.http.patch(
            SDG_KIND.path(name=group, subresource="status"),
            content=json.dumps({"status": status}),
            headers={"Content-Type": "application/merge-patch+json"},
        )
    )


def test_get_watch_prints_a_row_per_change_until_ctrl_c(
    state: dict[str, str], kubeconfig: str, control_plane: ControlPlane
) -> None:
    g = state["group"]
    with watching("--kubeconfig", kubeconfig, "get", g, "--watch") as w:
        assert w.wait_for(lambda line: line.startswith("NAME")).split()[:3] == [
            "NAME",
            "PHASE",
            "READY",
        ]
        assert w.wait_for(lambda line: line.startswith(g)).split()[4] == "1"
        patch_status(control_plane, g, {"podCount": 2})
        assert w.wait_for(lambda line: line.startswith(g)).split()[4] == "2"
        ok(control_plane.http.delete(SDG_KIND.path(name=g)))  # deleted: its last row
        assert w.wait_for(lambda line: line.startswith(g)).split()[:2] == [g, "Bound"]
        code, err = w.interrupt()
    assert (code, err) == (130, "")
    assert len([line for line in w.seen if line.startswith(g)]) == 3  # one per change


def test_devices_watch_draws_the_map_again_after_a_change(
    state: dict[str, str], kubeconfig: str, control_plane: ControlPlane
) -> None:
    node, g = state["node"], state["group"]
    argv = ["--kubeconfig", kubeconfig, "devices", "--claims-namespace", state["ns"]]
    with watching(*argv, "--grid", "-w") as w:
        first = w.wait_for(lambda line: line.startswith(node + " "))
        held = first.split()[2]
        assert held == 2 * held[0]
        # The group gives device 1 back: status and claim record both say so.
        patch_status(control_plane, g, {"selectedDevices": {GPU: "0"}})
        ok(
            control_plane.http.patch(
                f"/api/v1/namespaces/{state['ns']}/configmaps/sdg-claims.{node}",
                content=json.dumps({"data": {"claims": json.dumps({g: {GPU: "0"}})}}),
                headers={"Content-Type": "application/merge-patch+json"},
            )
        )
        again = w.wait_for(lambda line: line.startswith(node + " ") and line != first)
        assert again.split()[2] == held[0] + "."
        code, err = w.interrupt()
    assert (code, err) == (130, "")

"""sdgruntime.envtest.node after a crash: a harness killed mid-run leaves nothing behind
once the next node starts — its processes (kubelet, containerd, shims, containers),
mounts, cgroups, the pod bridge, the kubelet's sysctls and the fixed paths are all gone.
(A module of its own: one real node per machine, and test_node.py's runs per module.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from sdgruntime.envtest import ControlPlane
from sdgruntime.envtest.node import FIXED_PATHS, STATE_FILE, SYSCTLS, Node, leftovers
from tests.runtime.integration.test_node import ROOT, require_real_node

pytestmark = pytest.mark.integration

# Starts its own control plane and node, runs a pod, says READY and waits to be killed.
HARNESS = textwrap.dedent(
    """
    import time
    from sdgruntime.envtest import ControlPlane
    from sdgruntime.envtest.node import Node
    cp = ControlPlane()
    cp.start()
    node = Node(cp, name="doomed")
    node.start()
    pod = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "victim"},
        "spec": {"nodeName": "doomed", "containers": [{
            "name": "c", "image": "localhost/envtest/busybox:1",
            "imagePullPolicy": "Never", "command": ["sleep", "3600"]}]},
    }
    assert cp.http.post("/api/v1/namespaces/default/pods", json=pod).status_code == 201
    while cp.http.get("/api/v1/namespaces/default/pods/victim").json().get(
        "status", {}
    ).get("phase") != "Running":
        time.sleep(0.3)
    print("READY", node.work_dir, flush=True)
    time.sleep(3600)
    """
)


def _sysctls() -> dict[str, str]:
    return {n: (Path("/proc/sys") / n.replace(".", "/")).read_text().strip() for n in SYSCTLS}


def test_a_killed_harness_leaves_nothing_after_the_next_start() -> None:
    require_real_node()
    before = _sysctls()
    absent = [path for path in FIXED_PATHS if not path.exists()]
    proc = subprocess.Popen(
        [sys.executable, "-c", HARNESS],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    try:
        lines = []
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            lines.append(line)
            if line.startswith("READY") or not line:
                break
        assert lines and lines[-1].startswith("READY"), "".join(lines[-40:])
        work_dir = lines[-1].split()[1]
    finally:
        # The harness and its control plane (its session): what a crash kills. The node's
        # shims and containers are in sessions of their own and survive, as in a crash.
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    # What a crash leaves: the container, its shim, mounts, cgroups, the kubelet's sysctls.
    left = leftovers()
    assert left.get("processes in cgroups"), left
    assert left.get("mounts"), left
    assert left.get("cgroups"), left
    assert STATE_FILE.exists()
    assert _sysctls() != before  # the kubelet set its kernel tunables

    with ControlPlane() as cp, Node(cp, name="next") as node:
        assert node.work_dir != Path(work_dir)
        assert not Path(work_dir).exists()
        assert work_dir not in Path("/proc/self/mountinfo").read_text()
    assert leftovers() == {}
    assert _sysctls() == before
    assert not STATE_FILE.exists()
    for path in absent:
        assert not path.exists(), path

"""``make demo`` on a real node: gpu-node-1 is a kubelet with containerd and runc, the
Deployment's ReplicaSet (kube-controller-manager) makes its pods, and what their
containers print — the devices the group holds — is shown beside what was injected."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from sdgruntime.envtest.node import leftovers
from tests.e2e.harness import ROOT
from tests.realnode.conftest import require_real_node

pytestmark = pytest.mark.integration


def test_the_demo_runs_real_containers_on_a_real_node() -> None:
    require_real_node()
    proc = subprocess.run(
        [sys.executable, str(ROOT / "hack" / "demo.py"), "--node", "real"],
        capture_output=True,
        text=True,
        timeout=280,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = "\n".join(" ".join(line.split()) for line in proc.stdout.splitlines())
    assert out.startswith("Real node: gpu-node-1 is a kubelet with containerd and runc"), out
    assert "gpu-node-1: REAL, kubelet v1.37.2, containerd://2.4.2" in out, out
    # The ReplicaSet's pods (names from the controller-manager), bound to the real node.
    pods = re.findall(
        r"^(inference-[a-z0-9]+-[a-z0-9]{5}) inference-gpus gpu-node-1 Running "
        r"NVIDIA_VISIBLE_DEVICES=(\S+)$",
        out,
        re.M,
    )
    assert len(pods) == 3, out
    held = re.search(r"^inference-gpus Bound True gpu-node-1 nvidia.com/gpu=(\S+) 3", out, re.M)
    assert held, out
    # Told by UUID where the node's inventory knows them (--device-ids auto): the UUIDs
    # `sdg devices` shows for exactly the group's IDs, in their order.
    uuids = dict(
        re.findall(r"^gpu-node-1 nvidia\.com/gpu (\d+) (GPU-\S+) inference-gpus held ", out, re.M)
    )
    ids = held.group(1).split(",")
    told = ",".join(uuids[i] for i in ids) if uuids else held.group(1)
    assert not uuids or set(uuids) == set(ids), out
    for name, injected in pods:
        assert injected == told, out
        # What the container itself printed, read back through the kubelet.
        assert (
            f"$ kubectl logs {name} -c server # injected: NVIDIA_VISIBLE_DEVICES={injected}\n"
            f"serving on GPUs {injected}" in out
        ), out
    # The claim records only: the controller-manager's kube-root-ca.crt is no record.
    assert "kube-root-ca.crt" not in out, out
    assert "Stopped the manager and the control plane." in out
    assert leftovers() == {}

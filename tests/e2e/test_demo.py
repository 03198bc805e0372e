"""The README's main command works and shows what it promises."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sdgruntime.envtest.controlplane import pid_alive

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def test_demo_runs_end_to_end() -> None:
    """With simulated nodes only (tests/realnode/test_demo.py runs it on a real node)."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "hack" / "demo.py"), "--node", "fake"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # Tables are aligned with spaces: compare with runs of spaces folded to one.
    out = "\n".join(" ".join(line.split()) for line in proc.stdout.splitlines())
    for needle in (
        "Simulated nodes only (--node fake): a fake kubelet runs the pods.",
        "[6/6] result",
        "$ kubectl get sdg",
        "my-gpu-group Bound True gpu-node-3 nvidia.com/gpu=0,1 2",
        "inference-gpus Bound True gpu-node-1 nvidia.com/gpu=0,1 3",
        # Devices from a DRA ResourceSlice (v25.12, no index): IDs in PCI bus order (GPU 1
        # is unhealthy), UUIDs.
        "dra-gpus Bound True dra-node-1 nvidia.com/gpu=0,2 1",
        "Group dra-gpus holds physical devices nvidia.com/gpu: GPU-6f1c0d2e-0000,GPU-6f1c0d2e-0002",
        "dra-node-1 nvidia.com/gpu: 4 device(s), 1 unhealthy, from DRA ResourceSlices",
        # One pod per delivery mode: env (above), a RuntimeClass, CDI names.
        "trainer trainer-gpus gpu-node-2 Running NVIDIA_VISIBLE_DEVICES=0,1 "
        "runtimeClassName=nvidia",
        # CDI delivery: the vendor variable empty, the names under the current family, by
        # UUID (the slice publishes them: --device-ids auto).
        "dra-trainer dra-gpus dra-node-1 Running NVIDIA_VISIBLE_DEVICES= "
        'cdi=["nvidia.com/gpu=GPU-6f1c0d2e-0000","nvidia.com/gpu=GPU-6f1c0d2e-0002"]',
        "workload-1 my-gpu-group gpu-node-3 Running NVIDIA_VISIBLE_DEVICES=0,1",
        "workload-2 my-gpu-group gpu-node-3 Running NVIDIA_VISIBLE_DEVICES=0,1",
        "inference-demo-2 inference-gpus gpu-node-1 Running NVIDIA_VISIBLE_DEVICES=0,1",
        "AMD_VISIBLE_DEVICES=0,1",
        "$ sdg devices",
        "Group too-big-group is Pending: 0/6 nodes are available:",
        "1 not labelled deviceshare.io/mode=shared",
        "Denied pod/greedy",
        "the device plugin would hand it other devices",
        "Stopped the manager and the control plane.",
    ):
        assert needle in out, f"{needle!r} missing from the demo output:\n{out}"
    pid = int(out.split("manager ready (pid ")[1].split(",")[0])
    assert not pid_alive(pid)


def test_demo_keep_stays_up_until_interrupted() -> None:
    import signal

    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "hack" / "demo.py"), "--keep", "--node", "fake"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    assert proc.stdout is not None
    lines: list[str] = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("Ctrl-C stops everything"):
                break
        kubeconfig = next(
            ln.split("KUBECONFIG=", 1)[1].strip() for ln in lines if "KUBECONFIG=" in ln
        )
        # Still serving: the admin kubeconfig works against the kept control plane.
        out = subprocess.run(
            [
                str(Path(sys.executable).parent / "kubectl"),
                "--kubeconfig",
                kubeconfig,
                "get",
                "sdg",
                "my-gpu-group",
                "-o",
                "jsonpath={.status.phase}",
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert out.stdout == "Bound", out.stderr
    finally:
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert "Stopped the manager and the control plane." in rest

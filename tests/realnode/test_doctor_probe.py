"""``sdg doctor --probe`` on a real node: a kubelet with containerd and runc, 4 simulated
GPUs behind its device-plugin API (``gpusim``, strategy envvar + cdi-cri), SDG's holder
pods on. The probe's container really runs (busybox), prints what it sees, and that is
judged against what its throwaway group held.

On this node no NVIDIA runtime turns the variable into device nodes (there is no GPU), so
what a group pod's container sees is the variable itself: the probe passes with a warning
saying exactly that, naming the one GPU (UUID and ID) the group held, which is the GPU the
kubelet gave the group's holder pod. Labelled ``deviceshare.io/delivery=cdi`` with an NRI
plugin that injects the annotated CDI devices (``hack/node/cdiinject``, as NRI's
device-injector does), the container gets exactly the group's GPU as a device node from
the simulator's CDI spec: ✓. Labelled cdi without that plugin, the container sees no
device: exit 1, naming the node, the GPU expected and what was seen.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import pytest

from api.constants import SDG_KIND
from cli import main as cli
from cli.doctor.probe import PROBE_GROUP_PREFIX
from hack.node.nri import CdiInjector
from hack.node.simulators import DevicePluginSim, make_gpus
from sdgruntime.client import Client
from sdgruntime.envtest import ControlPlane
from sdgruntime.envtest.node import Node
from sdgruntime.kinds import NODES, PODS
from tests.e2e.harness import GPU, eventually, group, run_sdg, wait_bound

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

GPUS = make_gpus(4)
BUSYBOX = "localhost/envtest/busybox:1"
DELIVERY_LABEL = "deviceshare.io/delivery"


@pytest.fixture(scope="module")
def plugin(node: Node) -> Iterator[DevicePluginSim]:
    """4 simulated GPUs registered with the node's kubelet; the node annotated with their
    UUIDs, as a DaemonSet would."""
    sim = DevicePluginSim(
        GPUS, node.work_dir / "gpusim", cdi_dir=node.cdi_dir, strategy="envvar,cdi-cri"
    )
    sim.start(lambda: node.allocatable().get(GPU) == "4")
    node.annotate(sim.annotation())
    yield sim
    sim.stop()


@pytest.fixture
async def manager(real_cp: ControlPlane, plugin: DevicePluginSim) -> AsyncIterator[None]:
    async with run_sdg(real_cp, holders="auto"):
        yield


async def probe(real_cp: ControlPlane, namespace: str, capsys: Any) -> tuple[int, dict[str, Any]]:
    argv = [
        "--kubeconfig",
        str(real_cp.kubeconfig_path),
        "doctor",
        "--probe",
        "-n",
        namespace,
        "--probe-image",
        BUSYBOX,
        "--probe-image-pull-policy",
        "Never",
        "--probe-timeout",
        "90",
        "-o",
        "json",
    ]
    with anyio.fail_after(150):
        code = await anyio.to_thread.run_sync(cli.main, argv)
    out = capsys.readouterr()
    print(out.out, out.err)
    (check,) = json.loads(out.out)
    return code, check


async def nothing_left(client: Client, namespace: str) -> None:
    async def no_groups() -> bool:
        groups, _ = await client.list_all(SDG_KIND)
        return not groups

    await eventually(no_groups, within=60, interval=0.3, what="every group gone")
    groups, _ = await client.list_all(SDG_KIND)
    pods, _ = await client.list_all(PODS, namespace)
    left = [g["metadata"]["name"] for g in groups] + [p["metadata"]["name"] for p in pods]
    assert not [n for n in left if n.startswith(PROBE_GROUP_PREFIX)], left


async def test_the_container_sees_exactly_the_groups_gpu(
    manager: None,
    node: Node,
    real_cp: ControlPlane,
    rclient: Client,
    rns: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, check = await probe(real_cp, rns, capsys)
    assert check["name"] == f"node {node.name}: probe"
    assert code == 0, check
    assert check["status"] == "warning", check  # the variable only: no runtime hook here
    m = re.match(
        r'NVIDIA_VISIBLE_DEVICES="(GPU-[^"]+)" names exactly nvidia\.com/gpu (GPU-\S+) '
        r"\(ID (\d+)\) \(group sdg-doctor-probe-[0-9a-f]+, delivery env\), but the container "
        r"has no /dev/nvidiaN nor nvidia-smi: nothing shows that the runtime acted on it",
        check["detail"],
    )
    assert m, check["detail"]
    seen, held, index = m.group(1), m.group(2), int(m.group(3))
    # What the container printed is the one GPU the group held, and that is the simulated
    # GPU with that ID (the kubelet gave it to the group's holder pod).
    assert seen == held == GPUS[index].uuid
    await nothing_left(rclient, rns)


async def test_cdi_through_nri_gives_the_container_exactly_the_groups_gpu(
    manager: None,
    node: Node,
    real_cp: ControlPlane,
    rclient: Client,
    rns: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Another group holds two GPUs first, so the probe's is not simply the first one.
    await rclient.create(SDG_KIND, group("other", {GPU: 2}))
    other = await wait_bound(rclient, "other", within=30)
    taken = {int(i) for i in other["status"]["selectedDevices"][GPU].split(",")}
    await rclient.patch(NODES, node.name, {"metadata": {"labels": {DELIVERY_LABEL: "cdi"}}})
    try:
        with CdiInjector(node.work_dir / "cdiinject.log"):
            code, check = await probe(real_cp, rns, capsys)
    finally:
        await rclient.patch(NODES, node.name, {"metadata": {"labels": {DELIVERY_LABEL: None}}})
        await rclient.delete(SDG_KIND, "other")
    assert (code, check["status"]) == (0, "ok"), check
    m = re.match(
        r'/dev/nvidia(\d+) and NVIDIA_VISIBLE_DEVICES="": 1 device\(s\), as the group holds '
        r"nvidia\.com/gpu (GPU-\S+) \(ID (\d+)\) \(device node numbers are not IDs; group "
        r"sdg-doctor-probe-[0-9a-f]+, delivery cdi \(",
        check["detail"],
    )
    assert m, check["detail"]
    minor, held, index = int(m.group(1)), m.group(2), int(m.group(3))
    # The simulator's device node for a GPU is /dev/nvidia<index>: the very GPU held.
    assert held == GPUS[index].uuid and minor == GPUS[index].index
    assert index not in taken
    await nothing_left(rclient, rns)


async def test_a_delivery_that_does_not_reach_the_container_fails(
    manager: None,
    node: Node,
    real_cp: ControlPlane,
    rclient: Client,
    rns: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    await rclient.patch(NODES, node.name, {"metadata": {"labels": {DELIVERY_LABEL: "cdi"}}})
    try:
        code, check = await probe(real_cp, rns, capsys)
    finally:
        await rclient.patch(NODES, node.name, {"metadata": {"labels": {DELIVERY_LABEL: None}}})
    assert code == 1, check
    assert check["status"] == "fail"
    m = re.match(
        rf"node {node.name}: expected nvidia\.com/gpu (GPU-\S+) \(ID (\d+)\); the container "
        r'sees no device \(NVIDIA_VISIBLE_DEVICES="", no /dev/nvidiaN, no nvidia-smi; group '
        r"sdg-doctor-probe-[0-9a-f]+, delivery cdi \(cdi-devices\.noderesource\.dev/container"
        r"\.probe: ",
        check["detail"],
    )
    assert m, check["detail"]
    assert m.group(1) == GPUS[int(m.group(2))].uuid
    assert f"kubectl label node {node.name} {DELIVERY_LABEL}=" in check["fix"]
    await nothing_left(rclient, rns)

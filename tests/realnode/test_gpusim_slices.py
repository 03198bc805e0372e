"""``gpusim dra`` against the real API server, without a kubelet: the ResourceSlice it
publishes is the one NVIDIA's DRA driver publishes, field by field.

The shape is that of kubernetes-sigs/dra-driver-nvidia-gpu (formerly
NVIDIA/k8s-dra-driver-gpu) release v25.12.0, cmd/gpu-kubelet-plugin/deviceinfo.go
(``GpuInfo.CanonicalName``, ``GetDevice``) and partitions.go (``PartDevAttributes``): one
pool named after the node with one slice; devices ``gpu-<minor>``; the attributes ``type``,
``uuid``, ``productName``, ``brand``, ``architecture``, the version-typed
``cudaComputeCapability``, ``driverVersion`` and ``cudaDriverVersion``, and
``resource.kubernetes.io/pciBusID`` (``pcieRoot`` when it resolves); capacity ``memory``;
no ``index`` and no ``minor``. An unhealthy GPU carries the taint the driver's main branch
sets for a critical XID (device_health.go: ``gpu.nvidia.com/xid``, NoSchedule); with
``unhealthy="omit"`` it is left out, as v25.12.0 does (driver.go, deviceHealthEvents).

Needs no root and no kubelet (the registrar waits for a kubelet that never comes), so these
tests run wherever the control plane does; the real node's DRA tests are test_dra.py.
"""

from __future__ import annotations

import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from hack.node.simulators import DRA_DRIVER, DraDriverSim, SimGpu, make_gpus, pci_bus_id_for
from sdgruntime.envtest import ControlPlane

pytestmark = pytest.mark.integration

RESOURCE = "/apis/resource.k8s.io/v1"
ATTRIBUTES = {
    "type",
    "uuid",
    "productName",
    "brand",
    "architecture",
    "cudaComputeCapability",
    "driverVersion",
    "cudaDriverVersion",
    "resource.kubernetes.io/pciBusID",
}


@pytest.fixture
def node(control_plane: ControlPlane) -> Iterator[dict[str, Any]]:
    """A Node object (no kubelet behind it); it and its slices are deleted afterwards (no
    garbage collector runs here)."""
    name = f"gpusim-{uuid.uuid4().hex[:8]}"
    r = control_plane.http.post(
        "/api/v1/nodes", json={"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}
    )
    assert r.status_code == 201, r.text
    yield r.json()
    control_plane.http.delete(
        f"{RESOURCE}/resourceslices", params={"fieldSelector": f"spec.nodeName={name}"}
    )
    control_plane.http.delete(f"/api/v1/nodes/{name}")


@pytest.fixture
def work_dir() -> Iterator[Path]:
    # Short: the plugin's sockets go below it, and a Unix socket path has at most 107 bytes.
    path = Path(tempfile.mkdtemp(prefix="gpusim-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def simulator(
    cp: ControlPlane, node: dict[str, Any], work_dir: Path, gpus: list[SimGpu], **kwargs: Any
) -> DraDriverSim:
    return DraDriverSim(
        gpus,
        work_dir,
        kubeconfig=cp.kubeconfig_path,
        node_name=node["metadata"]["name"],
        kubelet_root_dir=work_dir / "kubelet",
        cdi_dir=work_dir / "cdi",
        **kwargs,
    )


def eventually(what: str, check: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def devices_of(sim: DraDriverSim) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in sim.resource_slices() for d in s["spec"].get("devices") or []}


def test_the_slice_has_the_nvidia_drivers_shape(
    control_plane: ControlPlane, node: dict[str, Any], work_dir: Path
) -> None:
    name = node["metadata"]["name"]
    gpus = make_gpus(3, seed=name)
    sim = simulator(control_plane, node, work_dir, gpus)
    sim.start()  # returns once the slice lists all three GPUs
    try:
        slices = sim.resource_slices()
        assert len(slices) == 1
        slice_ = slices[0]
        spec = slice_["spec"]
        assert spec["driver"] == DRA_DRIVER
        assert spec["nodeName"] == name
        assert spec["pool"]["name"] == name
        assert spec["pool"]["resourceSliceCount"] == 1
        (owner,) = slice_["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["uid"]) == (
            "Node",
            name,
            node["metadata"]["uid"],
        )

        assert [d["name"] for d in spec["devices"]] == ["gpu-0", "gpu-1", "gpu-2"]
        for device, gpu in zip(spec["devices"], gpus, strict=True):
            attrs = device["attributes"]
            assert set(attrs) == ATTRIBUTES  # no index, no minor, no pcieRoot (none set)
            assert attrs["type"] == {"string": "gpu"}
            assert attrs["uuid"] == {"string": gpu.uuid}
            assert attrs["productName"] == {"string": "NVIDIA A100-SXM4-40GB"}
            assert attrs["brand"] == {"string": "Nvidia"}
            assert attrs["architecture"] == {"string": "Ampere"}
            # Version-typed, semver-normalised as the driver's semver.MustParse(...).String().
            assert attrs["cudaComputeCapability"] == {"version": "8.0.0"}
            assert attrs["driverVersion"] == {"version": "550.54.15"}
            assert attrs["cudaDriverVersion"] == {"version": "12.4.0"}
            assert attrs["resource.kubernetes.io/pciBusID"] == {"string": pci_bus_id_for(gpu.index)}
            assert device["capacity"] == {"memory": {"value": "40Gi"}}
            assert "taints" not in device
        # The UUIDs are NVIDIA's form; PCI bus IDs increase with the index.
        assert all(len(g.uuid) == 40 and g.uuid.startswith("GPU-") for g in gpus)
        buses = [
            d["attributes"]["resource.kubernetes.io/pciBusID"]["string"] for d in spec["devices"]
        ]
        assert buses == sorted(buses)

        # Unhealthy: the taint of a critical XID; healthy again: no taint.
        sim.set_healthy(gpus[1].uuid, False)
        eventually("the taint", lambda: "taints" in devices_of(sim)["gpu-1"])
        (taint,) = devices_of(sim)["gpu-1"]["taints"]
        assert (taint["key"], taint["value"], taint["effect"]) == (
            "gpu.nvidia.com/xid",
            "79",
            "NoSchedule",
        )
        assert taint["timeAdded"]  # set by the API server
        assert "taints" not in devices_of(sim)["gpu-0"]
        sim.set_healthy(gpus[1].uuid, True)
        eventually("no taint", lambda: "taints" not in devices_of(sim)["gpu-1"])

        # The registrar socket waits for a kubelet; SIGTERM removes it and exits cleanly.
        assert sim.registrar_socket.is_socket()
        assert sim.plugin_socket.is_socket()
    finally:
        sim.stop()
    assert sim.returncode == 0, sim.log_tail()
    assert not sim.registrar_socket.exists()
    assert not sim.plugin_socket.exists()


def test_pcie_root_and_unhealthy_omitted(
    control_plane: ControlPlane, node: dict[str, Any], work_dir: Path
) -> None:
    """``unhealthy="omit"`` (v25.12.0's way) leaves an unhealthy GPU out of the slice; a
    configured PCIe root is the standard ``resource.kubernetes.io/pcieRoot``."""
    name = node["metadata"]["name"]
    gpus = make_gpus(2, seed=name, unhealthy=[1])
    gpus[0] = replace(gpus[0], pcie_root="pci0000:00")
    with simulator(control_plane, node, work_dir, gpus, unhealthy="omit") as sim:
        devices = devices_of(sim)
        assert list(devices) == ["gpu-0"]
        attrs = devices["gpu-0"]["attributes"]
        assert attrs["resource.kubernetes.io/pcieRoot"] == {"string": "pci0000:00"}
        assert set(attrs) == ATTRIBUTES | {"resource.kubernetes.io/pcieRoot"}
        sim.set_healthy(gpus[1].uuid, True)
        eventually("gpu-1 published", lambda: list(devices_of(sim)) == ["gpu-0", "gpu-1"])

"""Simulated NVIDIA GPUs for a real kubelet on a machine without GPUs.

Both run the ``gpusim`` binary (``hack/node/gpusim``, built once per machine into
``~/.cache/sdg/gpusim/``) behind the kubelet's real interfaces:

- :class:`DevicePluginSim`: ``gpusim device-plugin``, a device plugin for ``nvidia.com/gpu``
  as NVIDIA's k8s-device-plugin behaves (Register on ``kubelet.sock``, ListAndWatch,
  Allocate per device list strategy ``envvar`` / ``cdi-cri`` / ``cdi-annotations`` and ID
  strategy ``uuid`` / ``index``), with a CDI spec of kind ``nvidia.com/gpu``;
- :class:`DraDriverSim`: ``gpusim dra``, a DRA kubelet plugin publishing ResourceSlices of
  driver ``gpu.nvidia.com`` in the shape of NVIDIA's DRA driver, preparing claims as CDI
  specs of kind ``k8s.gpu.nvidia.com/claim``.

A container given a simulated GPU sees ``SIM_GPU_<index>=<uuid>`` (and, by DRA,
``NVIDIA_VISIBLE_DEVICES=<uuids>``) and a char device ``/dev/nvidia<index>`` (``/dev/null``
underneath). ``set_healthy`` rewrites the config; the binary re-reads it within half a
second and tells the kubelet (ListAndWatch) or republishes the slice (a device taint).

    gpus = make_gpus(2)
    with DevicePluginSim(gpus, work_dir, cdi_dir=node.cdi_dir) as plugin:
        plugin.set_healthy(gpus[1].uuid, False)
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import ssl
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal, Self

import httpx

from controllers.inventory import UNHEALTHY_SUFFIX, annotation_key
from sdgruntime.envtest.build import GoModule
from sdgruntime.envtest.controlplane import log_tail, spawn_logged, stop_process
from sdgruntime.rest.kubeconfig import kubeconfig_rest_config

SOURCE = Path(__file__).resolve().parent / "gpusim"
#: The device plugin's default directory: the kubelet keeps it whatever ``--root-dir`` says.
DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
DRA_DRIVER = "gpu.nvidia.com"
DEFAULT_PRODUCT = "NVIDIA A100-SXM4-40GB"

Strategy = Literal["envvar", "cdi-cri", "cdi-annotations"]
IdStrategy = Literal["uuid", "index"]


class SimulatorError(RuntimeError):
    """A simulator did not start, or died; the message carries its log."""


def gpusim_module() -> GoModule:
    """hack/node/gpusim as a :class:`GoModule`. Its first build takes about 2 minutes on 2
    cores with the modules downloaded (measured: 1m52s with a cold build cache)."""
    return GoModule(name="gpusim", source=SOURCE, targets={"gpusim": "."}, minutes={"gpusim": 2})


def ensure_gpusim() -> Path:
    """The ``gpusim`` binary, built once per machine."""
    return gpusim_module().ensure(["gpusim"]) / "gpusim"


@dataclass(frozen=True)
class SimGpu:
    """One simulated GPU. ``index`` is also its minor number (``/dev/nvidia<index>``, DRA
    device ``gpu-<index>``)."""

    index: int
    uuid: str
    healthy: bool = True
    product: str = DEFAULT_PRODUCT
    pci_bus_id: str = ""  # "" : derived from the index (pci_bus_id_for)
    pcie_root: str | None = None  # published as resource.kubernetes.io/pcieRoot when set

    @property
    def minor(self) -> int:
        return self.index

    @property
    def bus_id(self) -> str:
        return self.pci_bus_id or pci_bus_id_for(self.index)


def pci_bus_id_for(index: int) -> str:
    """A PCI bus ID for GPU ``index``, increasing with it: ``0000:07:00.0``, ``0000:0f:00.0``,
    ... (eight buses apart, as on a DGX A100), the next PCI domain every 31 GPUs."""
    domain, slot = divmod(index, 31)
    return f"{domain:04x}:{0x07 + 8 * slot:02x}:00.0"


def sim_uuid(seed: str, index: int) -> str:
    """A GPU UUID in NVIDIA's form ``GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx``, the same for
    the same seed and index."""
    h = hashlib.sha256(f"{seed}/{index}".encode()).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def make_gpus(
    count: int,
    *,
    seed: str = "sdg-gpusim",
    product: str = DEFAULT_PRODUCT,
    unhealthy: Iterable[int] = (),
) -> list[SimGpu]:
    """``count`` deterministic GPUs, indices 0..count-1 (those in ``unhealthy`` unhealthy)."""
    bad = set(unhealthy)
    return [
        SimGpu(i, sim_uuid(seed, i), i not in bad, product, pci_bus_id_for(i)) for i in range(count)
    ]


def device_annotation(gpus: Sequence[SimGpu], resource: str = "nvidia.com/gpu") -> dict[str, str]:
    """The node annotation SDG reads for a device plugin's GPUs, e.g.
    ``{"deviceshare.io/devices.nvidia.com_gpu": "GPU-a,GPU-b"}``: positions are the IDs when
    the indices are 0..N-1, else ``"0=GPU-a,3=GPU-d"``; an unhealthy GPU ends in
    ``:unhealthy`` (README, *Devices are real*)."""
    ordered = sorted(gpus, key=lambda g: g.index)
    positional = [g.index for g in ordered] == list(range(len(ordered)))
    entries = [
        (g.uuid if positional else f"{g.index}={g.uuid}") + ("" if g.healthy else UNHEALTHY_SUFFIX)
        for g in ordered
    ]
    return {annotation_key(resource): ",".join(entries)}


def _write_json(path: Path, data: Any) -> None:
    """Write atomically (a new file renamed over the old): the binary never reads half."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


class _Sim:
    """What both simulators share: the config file, the child process, its log."""

    command = ""

    def __init__(self, gpus: Sequence[SimGpu], work_dir: Path, binary: Path | None) -> None:
        self.gpus = list(gpus)
        self.work_dir = Path(work_dir)
        self.config_path = self.work_dir / f"gpusim-{self.command}.json"
        self.log_path = self.work_dir / f"gpusim-{self.command}.log"
        self._binary = binary
        self.proc: subprocess.Popen[bytes] | None = None
        self.returncode: int | None = None  # the last run's exit status, once stopped

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _config(self) -> dict[str, Any]:
        raise NotImplementedError

    def _args(self) -> list[str]:
        raise NotImplementedError

    def _serving(self) -> bool:
        raise NotImplementedError

    def start(self, ready: Callable[[], bool] | None = None, timeout: float = 60.0) -> None:
        """Write the config, start the binary and wait until it serves and ``ready()``, if
        given, is true. Raises :class:`SimulatorError` (with the log) when it does not."""
        if self.proc is not None:
            raise SimulatorError(f"gpusim {self.command} is already running")
        binary = self._binary or ensure_gpusim()
        self.work_dir.mkdir(parents=True, exist_ok=True)
        _write_json(self.config_path, self._config())
        self.proc = spawn_logged([str(binary), self.command, *self._args()], self.log_path)
        try:
            self._wait(lambda: self._serving() and (ready is None or ready()), timeout)
        except BaseException:
            self.stop()
            raise

    def _wait(self, cond: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise SimulatorError(
                    f"gpusim {self.command} exited with {self.proc.returncode}:\n{self.log_tail()}"
                )
            with contextlib.suppress(OSError, httpx.HTTPError):
                if cond():
                    return
            if time.monotonic() > deadline:
                raise SimulatorError(
                    f"gpusim {self.command} not serving after {timeout:.0f}s:\n{self.log_tail()}"
                )
            time.sleep(0.1)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, wait up to ``timeout``, then SIGKILL; :attr:`returncode` says how it
        ended (0: cleanly, its sockets removed)."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        stop_process(proc, timeout)
        self.returncode = proc.returncode

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def set_healthy(self, uuid: str, healthy: bool) -> None:
        """Mark one GPU (un)healthy: the config is rewritten, the binary picks it up within
        about half a second."""
        if not any(g.uuid == uuid for g in self.gpus):
            raise KeyError(f"no simulated GPU {uuid}")
        self.gpus = [replace(g, healthy=healthy) if g.uuid == uuid else g for g in self.gpus]
        _write_json(self.config_path, self._config())

    def log_tail(self, lines: int = 40) -> str:
        return log_tail(self.log_path, lines)


class DevicePluginSim(_Sim):
    """``gpusim device-plugin``: registers ``resource`` with the kubelet of ``plugin_dir``.

    ``start(ready)`` waits for the plugin's socket and then for ``ready()`` (e.g. "the Node's
    allocatable has nvidia.com/gpu"), since the socket exists before the kubelet knows it.
    """

    command = "device-plugin"

    def __init__(
        self,
        gpus: Sequence[SimGpu],
        work_dir: Path,
        *,
        plugin_dir: Path = DEVICE_PLUGIN_DIR,
        cdi_dir: Path | None = None,
        resource: str = "nvidia.com/gpu",
        strategy: Strategy | str = "envvar",
        id_strategy: IdStrategy = "uuid",
        device_nodes: bool = True,
        binary: Path | None = None,
    ) -> None:
        super().__init__(gpus, work_dir, binary)
        self.plugin_dir = Path(plugin_dir)
        self.cdi_dir = cdi_dir
        self.resource = resource
        self.strategy = strategy
        self.id_strategy = id_strategy
        self.device_nodes = device_nodes
        # NVIDIA's socket name: "nvidia-" + the resource's name part.
        self.socket = self.plugin_dir / f"nvidia-{resource.partition('/')[2]}.sock"

    def _config(self) -> dict[str, Any]:
        return {
            "resource": self.resource,
            "strategy": self.strategy,
            "idStrategy": self.id_strategy,
            "devices": [
                {"index": g.index, "uuid": g.uuid, "healthy": g.healthy} for g in self.gpus
            ],
        }

    def _args(self) -> list[str]:
        return [
            f"--config={self.config_path}",
            f"--plugin-dir={self.plugin_dir}",
            f"--cdi-dir={self.cdi_dir or ''}",
            f"--device-nodes={str(self.device_nodes).lower()}",
        ]

    def _serving(self) -> bool:
        return self.socket.is_socket()

    def annotation(self) -> dict[str, str]:
        """The node annotation SDG reads for these GPUs (:func:`device_annotation`)."""
        return device_annotation(self.gpus, self.resource)


class DraDriverSim(_Sim):
    """``gpusim dra``: the DRA kubelet plugin of driver ``gpu.nvidia.com`` for ``node_name``.

    ``start(ready)`` waits for the node's ResourceSlice with every published GPU, read through
    ``kubeconfig``, unless ``ready`` is given (then only for ``ready()``). Publishing needs
    the Node object to exist (the slice is owned by it), not the kubelet.
    """

    command = "dra"

    def __init__(
        self,
        gpus: Sequence[SimGpu],
        work_dir: Path,
        *,
        kubeconfig: Path,
        node_name: str,
        kubelet_root_dir: Path = Path("/var/lib/kubelet"),
        cdi_dir: Path = Path("/var/run/cdi"),
        unhealthy: Literal["taint", "omit"] = "taint",
        device_nodes: bool = True,
        binary: Path | None = None,
    ) -> None:
        super().__init__(gpus, work_dir, binary)
        self.kubeconfig = Path(kubeconfig)
        self.node_name = node_name
        self.kubelet_root_dir = Path(kubelet_root_dir)
        self.cdi_dir = Path(cdi_dir)
        self.unhealthy = unhealthy
        self.device_nodes = device_nodes
        self._ready: Callable[[], bool] | None = None

    def _config(self) -> dict[str, Any]:
        gpus = []
        for g in self.gpus:
            entry: dict[str, Any] = {
                "minor": g.minor,
                "uuid": g.uuid,
                "productName": g.product,
                "pciBusID": g.bus_id,
                "healthy": g.healthy,
            }
            if g.pcie_root:
                entry["pcieRoot"] = g.pcie_root
            gpus.append(entry)
        return {"gpus": gpus, "unhealthy": self.unhealthy}

    def _args(self) -> list[str]:
        return [
            f"--kubeconfig={self.kubeconfig}",
            f"--node-name={self.node_name}",
            f"--config={self.config_path}",
            f"--kubelet-root-dir={self.kubelet_root_dir}",
            f"--cdi-dir={self.cdi_dir}",
            f"--device-nodes={str(self.device_nodes).lower()}",
        ]

    def start(self, ready: Callable[[], bool] | None = None, timeout: float = 60.0) -> None:
        self._ready = ready
        super().start(None, timeout)

    def _serving(self) -> bool:
        if self._ready is not None:
            return self._ready()
        published = [g for g in self.gpus if g.healthy or self.unhealthy == "taint"]
        devices = [d for s in self.resource_slices() for d in s["spec"].get("devices") or []]
        return len(devices) == len(published)

    @property
    def registrar_socket(self) -> Path:
        """Where the kubelet finds the plugin (the kubeletplugin helper's default name)."""
        return self.kubelet_root_dir / "plugins_registry" / f"{DRA_DRIVER}-reg.sock"

    @property
    def plugin_socket(self) -> Path:
        return self.kubelet_root_dir / "plugins" / DRA_DRIVER / "dra.sock"

    def resource_slices(self) -> list[dict[str, Any]]:
        """The node's ResourceSlices of gpu.nvidia.com, read through the kubeconfig."""
        cfg = kubeconfig_rest_config(self.kubeconfig)
        context = ssl.create_default_context(cafile=cfg.ca_file)
        if cfg.cert_file:
            context.load_cert_chain(cfg.cert_file, cfg.key_file)
        if not cfg.verify:
            context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        headers = {"Authorization": auth} if (auth := cfg.authorization()) else {}
        selector = f"spec.driver={DRA_DRIVER},spec.nodeName={self.node_name}"
        with httpx.Client(base_url=cfg.host, verify=context, headers=headers, timeout=10) as c:
            r = c.get("/apis/resource.k8s.io/v1/resourceslices", params={"fieldSelector": selector})
            r.raise_for_status()
            items: list[dict[str, Any]] = r.json().get("items") or []
            return items

"""A real node for a local control plane: containerd + runc + a kubelet, run as root.

``Node(cp)`` builds (once per machine) and starts containerd and a kubelet registered with
the ``ControlPlane``; pods bound to it really run, with images made here
(``imagePullPolicy: Never``). It knows nothing of devices: the caller starts device
plugins and DRA drivers beside it. One node per machine, since the kubelet keeps some paths
whatever ``--root-dir`` says (``FIXED_PATHS``). Everything it changes on the machine is
written to ``STATE_FILE`` before it is changed, so ``cleanup()`` (which ``start()`` runs
first) undoes it after any crash. Details: docs/testing.md, "A real node".
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import yaml

from sdgruntime.envtest.build import ensure_node_binaries
from sdgruntime.envtest.controlplane import (
    ControlPlane,
    ControlPlaneError,
    free_port,
    log_tail,
    pid_alive,
    spawn_logged,
    stop_process,
)
from sdgruntime.envtest.images import PAUSE_IMAGE, Image, busybox_image, pause_image

log = logging.getLogger(__name__)

STATE_DIR = Path("/run/sdgruntime-envtest-node")
STATE_FILE = STATE_DIR / "state.json"
#: Paths the kubelet, containerd or CNI use whatever their flags say; removed on cleanup
#: when the node created them.
FIXED_PATHS = (
    Path("/var/lib/kubelet"),  # device-plugins/ ignores --root-dir
    Path("/var/log/containers"),
    Path("/var/log/pods"),
    Path("/var/lib/cni"),
    Path("/run/containerd"),
)
#: What the kubelet's setupKernelTunables may change; saved and restored.
SYSCTLS = (
    "vm.overcommit_memory",
    "vm.panic_on_oom",
    "kernel.panic",
    "kernel.panic_on_oops",
    "kernel.keys.root_maxkeys",
    "kernel.keys.root_maxbytes",
)
CGROUP_ROOT = "sdgruntime-envtest"  # the kubelet's cgroupRoot: every pod lives under it
BRIDGE = "sdgenv0"
POD_SUBNET = "10.244.0.0/24"  # on a bridge with no address on the host: nothing routes out
RUNC = ("/usr/sbin/runc", "/usr/bin/runc", "/usr/local/sbin/runc")
CNI_BIN_DIRS = ("/usr/lib/cni", "/opt/cni/bin")


class NodeError(RuntimeError):
    """The node cannot run here, or failed to start; the message says why."""


@dataclass
class _State:
    """What a node changes on this machine, written before it changes it. Its processes
    are found by their command lines, which name ``work_dir``."""

    work_dir: str
    sysctls: dict[str, str] = field(default_factory=dict)
    created_paths: list[str] = field(default_factory=list)

    def save(self) -> None:
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        tmp = STATE_FILE.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.__dict__))
        tmp.rename(STATE_FILE)

    @classmethod
    def load(cls) -> _State | None:
        try:
            return cls(**json.loads(STATE_FILE.read_text()))
        except (OSError, ValueError, TypeError):
            return None


def preflight() -> list[str]:
    """Why a real node cannot run on this machine (empty when it can)."""
    problems = []
    if os.geteuid() != 0:
        problems.append("not root (containerd and the kubelet need root)")
    if not any(Path(p).is_file() for p in RUNC):
        problems.append("no runc (apt-get install -y runc)")
    if not any((Path(d) / "bridge").is_file() for d in CNI_BIN_DIRS):
        problems.append("no CNI plugins (apt-get install -y containernetworking-plugins)")
    if shutil.which("ip") is None:
        problems.append("no ip command (apt-get install -y iproute2)")
    if not Path("/sys/fs/cgroup").is_dir():
        problems.append("no /sys/fs/cgroup")
    return problems


def _read_sysctl(name: str) -> str | None:
    try:
        return (Path("/proc/sys") / name.replace(".", "/")).read_text().strip()
    except OSError:
        return None


def _write_sysctl(name: str, value: str) -> None:
    with contextlib.suppress(OSError):
        (Path("/proc/sys") / name.replace(".", "/")).write_text(value)


def _cgroup_dirs() -> list[Path]:
    """The node's cgroup folder in every v1 hierarchy (and the v2 one), deepest first."""
    found: list[Path] = []
    base = Path("/sys/fs/cgroup")
    candidates = [base / CGROUP_ROOT, *(p / CGROUP_ROOT for p in base.iterdir() if p.is_dir())]
    for top in candidates:
        if top.is_dir():
            found += sorted(_subdirs(top), key=lambda p: -len(p.parts))
            found.append(top)
    return found


def _subdirs(top: Path) -> list[Path]:
    """Every folder under ``top``; one removed while it is walked (the kubelet or runc
    deleting a pod's cgroup) is skipped, not an error."""
    out: list[Path] = []
    for dirpath, dirnames, _ in os.walk(top, onerror=lambda _exc: None):
        out += (Path(dirpath) / d for d in dirnames)
    return out


def _make_cgroup_root() -> None:
    """The kubelet's cgroupRoot in every v1 hierarchy (it must exist); cpuset needs the
    parent's CPUs and memory nodes before a task may join."""
    for hierarchy in Path("/sys/fs/cgroup").iterdir():
        if not (hierarchy / "cgroup.procs").exists() or (hierarchy / "cgroup.controllers").exists():
            continue  # not a hierarchy, or the v2 one (not used on a v1 machine)
        top = hierarchy / CGROUP_ROOT
        top.mkdir(exist_ok=True)
        for name in ("cpuset.cpus", "cpuset.mems"):
            if (hierarchy / name).exists() and not (top / name).read_text().strip():
                (top / name).write_text((hierarchy / name).read_text())


def _pids_in(cgroup: Path) -> list[int]:
    with contextlib.suppress(OSError):
        return [int(x) for x in (cgroup / "cgroup.procs").read_text().split()]
    return []


def _mounts_under(prefixes: Sequence[Path]) -> list[str]:
    """Mount points under any of ``prefixes``, deepest first (from /proc/self/mountinfo)."""
    points = []
    roots = [str(p).rstrip("/") + "/" for p in prefixes]
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if any(point.startswith(r) or point + "/" == r for r in roots):
            points.append(point)
    return sorted(set(points), key=lambda p: -p.count("/"))


def _processes_named(word: str, argument: str) -> list[int]:
    """PIDs whose command line holds ``word`` in its program and ``argument`` anywhere."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and word.encode() in argv[0] and any(argument.encode() in a for a in argv):
            pids.append(int(entry.name))
    return pids


def _kill(pids: Sequence[int], *, grace: float) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(pid_alive(p) for p in pids):
        time.sleep(0.1)
    for pid in pids:
        if pid_alive(pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def _lock() -> IO[str]:
    """The machine's one-node lock, held while a node runs or is cleaned up."""
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    lock = open(STATE_DIR / "lock", "w")  # noqa: SIM115 - returned to the holder
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise NodeError(
            "another real node runs on this machine (one per machine: the kubelet keeps "
            f"fixed paths); see {STATE_FILE}"
        ) from None
    return lock


def cleanup() -> bool:
    """Undo what a node left on this machine (after a crash); True if there was one.

    Refuses (NodeError) while a node runs; safe to call more than once.
    """
    with _lock():
        return _cleanup()


def _cleanup() -> bool:
    """cleanup() under the lock. Order: the kubelet first (it would restart pods), then
    every process in the node's cgroups and the shims, containerd, mounts, cgroups, the
    bridge, sysctls, and the paths the node created."""
    state = _State.load()
    if state is None:
        return False
    work = Path(state.work_dir)
    log.info("cleaning up the real node of %s", work)
    # By command line, not by the recorded PIDs alone: a PID may have been reused since.
    _kill(_processes_named("kubelet", str(work)), grace=10)
    for _ in range(3):  # containers may fork while they are killed
        procs = [pid for cg in _cgroup_dirs() for pid in _pids_in(cg)]
        procs += _processes_named("containerd-shim", str(work))
        if not procs:
            break
        _kill(procs, grace=5)
    _kill(_processes_named("containerd", str(work)), grace=10)
    # Only mounts of the node's own folders (its netns mounts are in its state folder):
    # a fixed path that was there before may belong to another runtime.
    for point in _mounts_under([work, *map(Path, state.created_paths)]):
        subprocess.run(["umount", "-l", point], capture_output=True)
    for cg in _cgroup_dirs():
        with contextlib.suppress(OSError):
            cg.rmdir()
    if shutil.which("ip"):
        subprocess.run(["ip", "link", "delete", BRIDGE], capture_output=True)
    for name, value in state.sysctls.items():
        _write_sysctl(name, value)
    for path in state.created_paths:
        shutil.rmtree(path, ignore_errors=True)
    shutil.rmtree(work, ignore_errors=True)
    STATE_FILE.unlink(missing_ok=True)
    return True


def leftovers() -> dict[str, list[str]]:
    """What of a node is on this machine now (processes, mounts, cgroups, bridge); for tests
    and for the message of a failed cleanup."""
    found: dict[str, list[str]] = {}
    state = _State.load()
    marker = state.work_dir if state else "sdgruntime-envtest-node"
    procs = _processes_named("kubelet", marker) + _processes_named("containerd", marker)
    if procs:
        found["processes"] = [str(p) for p in procs]
    cg_procs = [str(p) for cg in _cgroup_dirs() for p in _pids_in(cg)]
    if cg_procs:
        found["processes in cgroups"] = cg_procs
    prefixes = [Path(marker), *map(Path, state.created_paths)] if state else list(FIXED_PATHS)
    mounts = _mounts_under(prefixes)
    if mounts:
        found["mounts"] = mounts
    cgroups = [str(p) for p in _cgroup_dirs()]
    if cgroups:
        found["cgroups"] = cgroups
    if Path(f"/sys/class/net/{BRIDGE}").exists():
        found["bridge"] = [BRIDGE]
    return found


class Node:
    """A kubelet and containerd registered as node ``name`` with ``cp``; root only.

    ``with Node(cp) as node:`` starts it and waits until the Node is Ready; leaving the
    block stops and cleans everything. ``images`` are imported besides pause and busybox.
    """

    def __init__(
        self,
        cp: ControlPlane,
        *,
        name: str = "envtest-node",
        labels: Mapping[str, str] | None = None,
        images: Sequence[Image] = (),
        start_timeout: float = 120.0,
        kubelet_flags: Sequence[str] = (),
    ) -> None:
        self.cp = cp
        self.name = name
        self.labels = dict(labels or {})
        self.extra_images = list(images)
        self.start_timeout = start_timeout
        self.kubelet_flags = list(kubelet_flags)
        self.work_dir = Path(tempfile.mkdtemp(prefix="sdgruntime-envtest-node-"))
        self.containerd_socket = self.work_dir / "containerd.sock"
        self.root_dir = self.work_dir / "kubelet"
        self.cdi_dir = self.work_dir / "cdi"
        self.device_plugin_dir = Path("/var/lib/kubelet/device-plugins")
        self.plugins_registry = self.root_dir / "plugins_registry"
        self.plugins_dir = self.root_dir / "plugins"
        self.binaries: dict[str, Path] = {}
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._lock: IO[str] | None = None

    # --- lifecycle -------------------------------------------------------------------
    def __enter__(self) -> Node:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        problems = preflight()
        if problems:
            raise NodeError("a real node cannot run here: " + "; ".join(problems))
        self._lock = _lock()
        if _cleanup():
            log.warning("removed what an earlier real node left behind")
        try:
            self.binaries = ensure_node_binaries()
            images = [pause_image(), busybox_image(), *self.extra_images]
            self._record_changes()
            self._start_containerd()
            for image in images:
                self.import_image(image)
            self._start_kubelet()
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop the kubelet, every container, containerd; undo every change; delete the
        Node object (as a decommissioned node's is)."""
        for proc in self._procs.values():
            if proc.poll() is None:
                proc.terminate()
        try:
            if self._procs:
                with contextlib.suppress(Exception):  # the API server may be gone already
                    self.cp.http.delete(f"/api/v1/nodes/{self.name}")
            _cleanup()
        finally:
            for proc in self._procs.values():
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=5)
            self._procs.clear()
            if self._lock is not None:
                self._lock.close()
                self._lock = None

    @property
    def pids(self) -> dict[str, int]:
        return {name: p.pid for name, p in self._procs.items()}

    def _record_changes(self) -> None:
        created = [str(p) for p in FIXED_PATHS if not p.exists()]
        sysctls = {n: v for n in SYSCTLS if (v := _read_sysctl(n)) is not None}
        _State(str(self.work_dir), sysctls, created).save()

    def _spawn(self, name: str, argv: list[str], env: Mapping[str, str] | None = None) -> None:
        proc = spawn_logged(argv, self.work_dir / f"{name}.log", env)
        self._procs[name] = proc

    def log_tail(self, name: str, lines: int = 40) -> str:
        return log_tail(self.work_dir / f"{name}.log", lines)

    def _check_running(self) -> None:
        for name, proc in self._procs.items():
            if proc.poll() is not None:
                raise NodeError(f"{name} exited with {proc.returncode}:\n{self.log_tail(name)}")

    # --- containerd ------------------------------------------------------------------
    def _containerd_config(self) -> str:
        runc = next(p for p in RUNC if Path(p).is_file())
        cni_bin = [d for d in CNI_BIN_DIRS if Path(d).is_dir()]
        cri_runtime = "plugins.'io.containerd.cri.v1.runtime'"
        lines = [
            "version = 3",
            f"root = '{self.work_dir / 'containerd' / 'root'}'",
            f"state = '{self.work_dir / 'containerd' / 'state'}'",
            "[grpc]",
            f"  address = '{self.containerd_socket}'",
            "[ttrpc]",
            f"  address = '{self.work_dir / 'containerd-ttrpc.sock'}'",
            f"[{cri_runtime}]",
            f"  cdi_spec_dirs = ['{self.cdi_dir}']",
            # Root here lacks CAP_SYS_RESOURCE: runc fails to lower oom_score_adj without.
            "  restrict_oom_score_adj = true",
            "  netns_mounts_under_state_dir = true",
            f"[{cri_runtime}.containerd]",
            "  default_runtime_name = 'runc'",
            f"[{cri_runtime}.containerd.runtimes.runc]",
            "  runtime_type = 'io.containerd.runc.v2'",
            f"[{cri_runtime}.containerd.runtimes.runc.options]",
            f"  BinaryName = '{runc}'",
            "  SystemdCgroup = false",
            f"[{cri_runtime}.cni]",
            f"  bin_dirs = {json.dumps(cni_bin)}",
            f"  conf_dir = '{self.work_dir / 'cni' / 'net.d'}'",
            "[plugins.'io.containerd.cri.v1.images']",
            "  snapshotter = 'overlayfs'",
            "[plugins.'io.containerd.cri.v1.images'.pinned_images]",
            f"  sandbox = '{PAUSE_IMAGE}'",
        ]
        return "\n".join(lines) + "\n"

    def _cni_config(self) -> dict[str, Any]:
        return {
            "cniVersion": "1.0.0",
            "name": "sdgruntime-envtest",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    "isGateway": False,
                    "ipMasq": False,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": POD_SUBNET}]],
                        "dataDir": str(self.work_dir / "cni" / "ipam"),
                    },
                }
            ],
        }

    def _start_containerd(self) -> None:
        config = self.work_dir / "containerd.toml"
        config.write_text(self._containerd_config())
        net_d = self.work_dir / "cni" / "net.d"
        net_d.mkdir(parents=True)
        (net_d / "10-sdgruntime-envtest.conflist").write_text(json.dumps(self._cni_config()))
        self.cdi_dir.mkdir(parents=True, exist_ok=True)
        folder = self.binaries["containerd"].parent
        path = f"{folder}{os.pathsep}{os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"
        self._spawn(
            "containerd",
            [str(self.binaries["containerd"]), f"--config={config}"],
            env={"PATH": path},
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            self._check_running()
            if self.ctr("version", check=False).returncode == 0:
                return
            time.sleep(0.2)
        raise NodeError(f"containerd did not answer within 30 s:\n{self.log_tail('containerd')}")

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """``ctr -n k8s.io ARGS`` against this node's containerd."""
        cmd = [str(self.binaries["ctr"]), f"--address={self.containerd_socket}", "-n", "k8s.io"]
        proc = subprocess.run([*cmd, *args], capture_output=True, text=True)
        if check and proc.returncode != 0:
            raise NodeError(f"ctr {' '.join(args)} failed: {proc.stderr.strip()}")
        return proc

    def import_image(self, image: Image) -> None:
        """Import a docker-archive or OCI tar; pods use it with ``imagePullPolicy: Never``."""
        self.ctr("images", "import", "--all-platforms", str(image.tar))

    # --- kubelet ---------------------------------------------------------------------
    def _kubelet_config(self) -> dict[str, Any]:
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            # This VM: cgroup v1, cgroupfs, and no iptables chains of the kubelet's own.
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": f"/{CGROUP_ROOT}",
            "makeIPTablesUtilChains": False,
            "failSwapOn": False,
            "port": free_port(),
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": free_port(),
            "readOnlyPort": 0,
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": False},
                "x509": {"clientCAFile": str(self.cp.work_dir / "pki" / "ca.crt")},
            },
            "authorization": {"mode": "AlwaysAllow"},
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            "podLogsDir": str(self.work_dir / "pod-logs"),
            "evictionHard": {
                "memory.available": "100Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
            },
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "serializeImagePulls": False,
            "resolvConf": "/etc/resolv.conf",
            "nodeStatusReportFrequency": "10s",
        }

    def _start_kubelet(self) -> None:
        user = f"system:node:{self.name}"
        kubeconfig = self.cp.user_kubeconfig(user, ["system:nodes"])
        self.cp.apply(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": f"envtest-node:{self.name}"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": "system:node",
                },
                "subjects": [{"kind": "User", "name": user}],
            }
        )
        config = self.work_dir / "kubelet.yaml"
        config.write_text(yaml.safe_dump(self._kubelet_config()))
        labels = ",".join(f"{k}={v}" for k, v in self.labels.items())
        self.root_dir.mkdir(parents=True, exist_ok=True)
        _make_cgroup_root()
        argv = [
            str(self.binaries["kubelet"]),
            f"--config={config}",
            f"--kubeconfig={kubeconfig}",
            f"--root-dir={self.root_dir}",
            f"--cert-dir={self.work_dir / 'kubelet-pki'}",
            f"--hostname-override={self.name}",
            "--v=2",
            *([f"--node-labels={labels}"] if labels else []),
            *self.kubelet_flags,
        ]
        self._spawn("kubelet", argv)

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        last = "not registered"
        while time.monotonic() < deadline:
            self._check_running()
            r = self.cp.http.get(f"/api/v1/nodes/{self.name}")
            if r.status_code == 200:
                conds = {c["type"]: c for c in r.json().get("status", {}).get("conditions", [])}
                ready = conds.get("Ready", {})
                if ready.get("status") == "True":
                    return
                last = f"Ready={ready.get('status')}: {ready.get('message', '')}"
            time.sleep(0.5)
        raise NodeError(
            f"node {self.name} not Ready within {self.start_timeout}s ({last}):\n"
            f"{self.log_tail('kubelet')}"
        )

    def node(self) -> dict[str, Any]:
        """The Node object as the API server has it now."""
        r = self.cp.http.get(f"/api/v1/nodes/{self.name}")
        if r.status_code != 200:
            raise ControlPlaneError(f"get node {self.name}: {r.status_code} {r.text}")
        return dict(r.json())

    def allocatable(self) -> dict[str, str]:
        """The Node's ``status.allocatable`` now (a device plugin's resources appear here)."""
        return dict(self.node()["status"].get("allocatable") or {})

    def annotate(self, annotations: Mapping[str, str | None]) -> None:
        """Merge ``annotations`` into the Node's (None removes one), as a DaemonSet would."""
        r = self.cp.http.patch(
            f"/api/v1/nodes/{self.name}",
            content=json.dumps({"metadata": {"annotations": dict(annotations)}}),
            headers={"Content-Type": "application/merge-patch+json"},
        )
        if r.status_code != 200:
            raise ControlPlaneError(f"annotate node {self.name}: {r.status_code} {r.text}")

    def restart_kubelet(self) -> None:
        """Stop the kubelet and start it again (its pods keep running); wait until Ready."""
        stop_process(self._procs.pop("kubelet"))
        self._start_kubelet()
        self._wait_ready()


__all__ = [
    "FIXED_PATHS",
    "STATE_FILE",
    "Node",
    "NodeError",
    "cleanup",
    "leftovers",
    "preflight",
]

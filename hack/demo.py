"""The README's main command (``make demo``): SDG end to end on a local control plane.

Starts etcd + kube-apiserver, registers GPU nodes, installs the CRD, RBAC and webhook
configuration, starts the real manager process (``python -m controllers``) under its
ServiceAccount's RBAC, applies ``examples/``, and prints what happened. ``--keep`` leaves
it all running.

Where the machine allows it (root, runc, CNI plugins: ``sdgruntime.envtest.node``),
``gpu-node-1`` is a real node — a kubelet with containerd and runc, its 8 GPUs simulated
behind the kubelet's device-plugin API (``hack/node``) — with kube-scheduler and
kube-controller-manager beside the API server: the Deployment's ReplicaSet makes its pods,
the examples' containers really run (as busybox: there is no registry) and the demo shows
what each printed. The other nodes are simulated (a fake kubelet marks their pods
Running). ``--node fake`` simulates all of them; the first line says which ran.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import anyio  # noqa: E402
import httpx  # noqa: E402

from api.constants import DEFAULT_CDI_ANNOTATION_PREFIX, SDG_KIND  # noqa: E402
from cli.devices import devices_view  # noqa: E402
from cli.render import table  # noqa: E402
from controllers.inventory import RESOURCESLICES  # noqa: E402
from controllers.ledger.records import RECORD_LABEL, RECORD_LABEL_VALUE  # noqa: E402
from sdgruntime import errors  # noqa: E402
from sdgruntime.client import Client  # noqa: E402
from sdgruntime.envtest import ControlPlane, load_manifests  # noqa: E402
from sdgruntime.envtest.controlplane import free_port, stop_process  # noqa: E402
from sdgruntime.envtest.fakes import (  # noqa: E402
    Kubelet,
    create_node,
    indexed_devices,
    make_node,
)
from sdgruntime.envtest.images import BUSYBOX_IMAGE  # noqa: E402
from sdgruntime.envtest.node import Node, preflight  # noqa: E402
from sdgruntime.kinds import CONFIGMAPS, NODES, PODS  # noqa: E402

NS = "deviceshare-system"
SA = f"system:serviceaccount:{NS}:deviceshare-manager"
SHARED = {"deviceshare.io/mode": "shared"}
NODES_SPEC: list[tuple[str, dict[str, str], dict[str, int]]] = [
    ("gpu-node-1", SHARED, {"nvidia.com/gpu": 8}),
    # Delivered through the GPU Operator's RuntimeClass (a per-node delivery override).
    ("gpu-node-2", {**SHARED, "deviceshare.io/delivery": "runtimeclass"}, {"nvidia.com/gpu": 4}),
    ("gpu-node-3", {**SHARED, "gpu-type": "a100"}, {"nvidia.com/gpu": 2}),
    ("amd-node-1", SHARED, {"amd.com/gpu": 2}),
    ("cpu-node-1", {}, {"nvidia.com/gpu": 8}),  # has GPUs but did not opt in
    # GPUs published by a DRA driver (a ResourceSlice), none in allocatable: SDG books them
    # by index with their UUIDs; GPU 1 is unhealthy (tainted by the driver).
    # Delivered as CDI device names for NRI's device-injector.
    ("dra-node-1", {**SHARED, "gpu-inventory": "dra", "deviceshare.io/delivery": "cdi"}, {}),
]
#: Where the machine allows it, this one is a real kubelet node with simulated GPUs.
REAL_NODE = "gpu-node-1"
#: The Deployment controller runs, the node lifecycle controller does not: it would taint
#: the simulated nodes, whose fake kubelet sends no heartbeats.
CONTROLLER_MANAGER_FLAGS = ["--controllers=*,-node-lifecycle-controller"]
DRA_GPUS = [(0, "GPU-6f1c0d2e-0000", True), (1, "GPU-6f1c0d2e-0001", False)]
DRA_GPUS += [(2, "GPU-6f1c0d2e-0002", True), (3, "GPU-6f1c0d2e-0003", True)]


def dra_slice(node: str) -> dict[str, Any]:
    """The ResourceSlice NVIDIA's DRA driver (v25.12) would publish for ``node`` (4 GPUs):
    devices ``gpu-<minor>`` with no ``index`` (gone since v25.8), their IDs the PCI bus
    order of ``resource.kubernetes.io/pciBusID`` (NVML's), as hack/node/gpusim publishes
    them; the unhealthy GPU carries the taint the driver's main branch sets for XID 79."""
    devices = []
    for minor, uuid, healthy in DRA_GPUS:
        device: dict[str, Any] = {
            "name": f"gpu-{minor}",
            "attributes": {
                "type": {"string": "gpu"},
                "uuid": {"string": uuid},
                "productName": {"string": "NVIDIA A100-SXM4-40GB"},
                "brand": {"string": "Nvidia"},
                "architecture": {"string": "Ampere"},
                "cudaComputeCapability": {"version": "8.0.0"},
                "driverVersion": {"version": "550.54.15"},
                "cudaDriverVersion": {"version": "12.4.0"},
                "resource.kubernetes.io/pciBusID": {"string": f"0000:{0x07 + 8 * minor:02x}:00.0"},
            },
            "capacity": {"memory": {"value": "40Gi"}},
        }
        if not healthy:
            device["taints"] = [
                {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}
            ]
        devices.append(device)
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-gpu.nvidia.com"},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def step(n: int, total: int, text: str) -> None:
    print(f"[{n}/{total}] {text}", flush=True)


def start_manager(cp: ControlPlane, workdir: Path) -> tuple[subprocess.Popen[bytes], int, Path]:
    webhook_port, probe_port = free_port(), free_port()
    log = workdir / "manager.log"
    kubeconfig = cp.user_kubeconfig(
        SA, ["system:serviceaccounts", f"system:serviceaccounts:{NS}", "system:authenticated"]
    )
    cmd = [
        sys.executable,
        "-m",
        "controllers",
        f"--kubeconfig={kubeconfig}",
        "--webhook-host=127.0.0.1",
        f"--webhook-port={webhook_port}",
        f"--webhook-cert-dir={cp.webhook_cert_dir()}",
        "--metrics-bind-address=127.0.0.1:0",
        f"--health-probe-bind-address=127.0.0.1:{probe_port}",
        "--leader-elect",
        f"--leader-election-namespace={NS}",
        f"--claims-namespace={NS}",
    ]
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(
                f"the manager exited ({proc.returncode}); see {log}:\n" + log.read_text()[-3000:]
            )
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"http://127.0.0.1:{probe_port}/readyz", timeout=1).status_code == 200:
                return proc, webhook_port, log
        time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"the manager did not become ready in 60s; see {log}")


def as_busybox(obj: dict[str, Any]) -> dict[str, Any]:
    """A Pod or Deployment whose containers run the local busybox image (no registry
    here); their commands stay as they are."""
    spec = obj["spec"]["template"]["spec"] if obj["kind"] == "Deployment" else obj["spec"]
    for kind in ("initContainers", "containers"):
        for c in spec.get(kind) or []:
            c["image"], c["imagePullPolicy"] = BUSYBOX_IMAGE, "Never"
    return obj


async def apply_examples(client: Client, *, real: bool) -> list[tuple[str, str]]:
    """Create every object of examples/; returns (what, denial message) for denied ones.
    ``real``: containers run (as busybox) and the controller-manager makes replicas."""
    denied: list[tuple[str, str]] = []
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        for obj in load_manifests([path]):
            kind = obj["kind"]
            what = f"{kind.lower()}/{obj['metadata']['name']} ({path.name})"
            if real and kind in ("Pod", "Deployment"):
                obj = as_busybox(obj)
            try:
                if kind == "SharedDeviceGroup":
                    await client.create(SDG_KIND, obj)
                elif kind == "Pod":
                    await client.create(PODS, obj, obj["metadata"].get("namespace") or "default")
                else:
                    created = await client.request("POST", _collection(obj), json=obj)
                    if kind == "Deployment" and not real:
                        await _replica_pods(client, created)
            except errors.ApiError as err:
                denied.append((what, err.message))
    return denied


async def _replica_pods(client: Client, deployment: dict[str, Any]) -> None:
    """No controller-manager runs here: create the replicas' pods from the template, as
    the Deployment's ReplicaSet would (same labels, annotations and spec)."""
    name = deployment["metadata"]["name"]
    template = deployment["spec"]["template"]
    replicas = int(deployment["spec"].get("replicas", 1))
    print(
        f"      deployment/{name}: no controller-manager here, so the demo creates its "
        f"{replicas} replica pods from the template, as its ReplicaSet would"
    )
    for i in range(replicas):
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {**template.get("metadata", {}), "name": f"{name}-demo-{i}"},
            "spec": template["spec"],
        }
        await client.create(PODS, pod, "default")


def _collection(obj: dict[str, Any]) -> str:
    group, _, version = obj["apiVersion"].rpartition("/")
    plural = obj["kind"].lower() + "s"
    ns = obj["metadata"].get("namespace") or "default"
    prefix = f"/apis/{group}/{version}" if group else f"/api/{version}"
    return f"{prefix}/namespaces/{ns}/{plural}"


async def settle(client: Client, seconds: float = 20.0) -> None:
    """Until every group is decided, every pod of a bound group is Running, and each
    group's podCount has caught up with its pods (it is written once per batch period)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        groups, _ = await client.list_all(SDG_KIND)
        pods, _ = await client.list_all(PODS, "default")
        bound = {
            g["metadata"]["name"] for g in groups if g.get("status", {}).get("phase") == "Bound"
        }
        decided = all(g.get("status", {}).get("conditions") for g in groups)
        waiting = [
            p
            for p in pods
            if p["metadata"].get("annotations", {}).get("deviceshare.io/group") in bound
            and p.get("status", {}).get("phase") != "Running"
        ]
        members: dict[str, int] = {}
        for p in pods:
            group = p["metadata"].get("annotations", {}).get("deviceshare.io/group")
            if group in bound and p.get("status", {}).get("phase") not in ("Succeeded", "Failed"):
                members[group] = members.get(group, 0) + 1
        counted = all(
            g.get("status", {}).get("podCount", 0) == members.get(g["metadata"]["name"], 0)
            for g in groups
            if g["metadata"]["name"] in bound
        )
        if decided and not waiting and counted:
            return
        await anyio.sleep(0.2)


def _delivered(pod: dict[str, Any]) -> str:
    """What the pod webhook gave the first container: device env, RuntimeClass, CDI names."""
    container = pod["spec"]["containers"][0]
    env = {
        e["name"]: e.get("value", "")
        for e in container.get("env") or []
        if e["name"].endswith("_VISIBLE_DEVICES")
    }
    parts = [f"{k}={v}" for k, v in sorted(env.items())]
    if pod["spec"].get("runtimeClassName"):
        parts.append(f"runtimeClassName={pod['spec']['runtimeClassName']}")
    cdi = (
        pod["metadata"]
        .get("annotations", {})
        .get(f"{DEFAULT_CDI_ANNOTATION_PREFIX}{container['name']}")
    )
    if cdi:
        parts.append(f"cdi={cdi}")
    return " ".join(parts) or "-"


def _age(ts: str) -> str:
    import datetime as dt

    then = dt.datetime.strptime(ts, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
    secs = int((dt.datetime.now(dt.UTC) - then).total_seconds())
    return f"{secs}s" if secs < 120 else f"{secs // 60}m"


async def report(client: Client, denied: list[tuple[str, str]]) -> None:
    groups, _ = await client.list_all(SDG_KIND)
    pods, _ = await client.list_all(PODS, "default")
    nodes, _ = await client.list_all(NODES)
    # The claim records, selected as `sdg devices` selects them (the namespace also holds
    # the controller-manager's kube-root-ca.crt where it runs).
    cms, _ = await client.list_all(
        CONFIGMAPS, NS, label_selector=f"{RECORD_LABEL}={RECORD_LABEL_VALUE}"
    )
    print("\n$ kubectl get sdg")
    rows = []
    for g in sorted(groups, key=lambda g: g["metadata"]["name"]):
        st = g.get("status") or {}
        ready = next(
            (c["status"] for c in st.get("conditions") or [] if c["type"] == "Ready"), "<none>"
        )
        rows.append(
            [
                g["metadata"]["name"],
                st.get("phase", "Pending"),
                ready,
                st.get("nodeName", "<none>"),
                st.get("deviceSummary") or "<none>",
                st.get("podCount", 0),
                _age(g["metadata"]["creationTimestamp"]),
            ]
        )
    print(table(["NAME", "PHASE", "READY", "NODE", "DEVICES", "PODS", "AGE"], rows))

    print("\nPods and the devices injected into them:")
    rows = []
    for p in sorted(pods, key=lambda p: p["metadata"]["name"]):
        group = p["metadata"].get("annotations", {}).get("deviceshare.io/group", "-")
        rows.append(
            [
                p["metadata"]["name"],
                group,
                p["spec"].get("nodeName") or "<pending>",
                p.get("status", {}).get("phase", "?"),
                _delivered(p),
            ]
        )
    print(table(["POD", "GROUP", "NODE", "STATUS", "DELIVERED"], rows))

    print("\n$ sdg devices")
    slices, _ = await client.list_all(RESOURCESLICES)
    print(devices_view(nodes, groups, cms, slices))
    for g in groups:
        uuids = (g.get("status") or {}).get("physicalDevices")
        if uuids:
            text = "; ".join(f"{r}: {u}" for r, u in sorted(uuids.items()))
            print(f"\nGroup {g['metadata']['name']} holds physical devices {text}")

    for g in groups:
        st = g.get("status") or {}
        if st.get("phase") != "Bound":
            cond = next((c for c in st.get("conditions") or [] if c["type"] == "Scheduled"), {})
            print(f"\nGroup {g['metadata']['name']} is Pending: {cond.get('message', '?')}")
    for what, message in denied:
        print(f"\nDenied {what}:\n  {message}")


def real_node_problems(choice: str) -> list[str]:
    """Why ``gpu-node-1`` cannot be a real node here (empty: it can)."""
    if choice == "fake":
        return ["--node fake"]
    problems = preflight()
    if problems and choice == "real":
        raise SystemExit("--node real, but a real node cannot run here: " + "; ".join(problems))
    return problems


@contextlib.contextmanager
def gpu_node(cp: ControlPlane, real: bool) -> Iterator[Node | None]:
    """gpu-node-1 as a real node with 8 simulated GPUs behind the device-plugin API, or
    nothing (the caller registers it as a simulated node)."""
    if not real:
        yield None
        return
    from hack.node.simulators import DevicePluginSim, make_gpus

    with Node(cp, name=REAL_NODE, labels=SHARED) as node:
        plugin = DevicePluginSim(make_gpus(8), node.work_dir / "gpusim", cdi_dir=node.cdi_dir)
        plugin.start(lambda: node.allocatable().get("nvidia.com/gpu") == "8")
        try:
            # The GPUs' UUIDs, as a DaemonSet (or an admin) annotates a device-plugin node.
            node.annotate(plugin.annotation())
            yield node
        finally:
            plugin.stop()


async def demo(keep: bool, node_choice: str) -> int:
    total = 6
    problems = real_node_problems(node_choice)
    real = not problems
    if real:
        print(
            f"Real node: {REAL_NODE} is a kubelet with containerd and runc (its GPUs simulated "
            "behind the device-plugin API); kube-scheduler and kube-controller-manager run."
        )
    else:
        print(f"Simulated nodes only ({'; '.join(problems)}): a fake kubelet runs the pods.")
    step(1, total, "starting the local control plane (first run builds kube-apiserver: minutes)")
    components = ("kube-controller-manager", "kube-scheduler") if real else ()
    with ControlPlane(
        crd_paths=[ROOT / "config" / "crd"],
        components=components,
        component_flags={"kube-controller-manager": CONTROLLER_MANAGER_FLAGS},
    ) as cp:
        version = cp.http.get("/version").json()["gitVersion"]
        print(f"      kube-apiserver {version} at {cp.host}; CRD SharedDeviceGroup installed")
        async with Client.from_kubeconfig(str(cp.kubeconfig_path)) as client:
            step(2, total, "registering the nodes")
            with gpu_node(cp, real) as node:
                fake = []
                for name, labels, gpus in NODES_SPEC:
                    if node is not None and name == node.name:
                        info = node.node()["status"]["nodeInfo"]
                        print(
                            f"      {name}: REAL, kubelet {info['kubeletVersion']}, "
                            f"{info['containerRuntimeVersion']}, 8 nvidia.com/gpu from the "
                            "device-plugin simulator, shared, delivery env"
                        )
                        continue
                    await create_node(client, make_node(name, labels=labels, allocatable=gpus))
                    fake.append(name)
                    gpu_text = ", ".join(f"{v} {k}" for k, v in gpus.items())
                    if not gpus:
                        cp.apply(dra_slice(name))
                        gpu_text = (
                            f"{len(DRA_GPUS)} nvidia.com/gpu in a DRA ResourceSlice, 1 unhealthy"
                        )
                    shared = "shared" if labels.get("deviceshare.io/mode") else "NOT shared"
                    delivery = labels.get("deviceshare.io/delivery", "auto")
                    print(f"      {name}: simulated, {gpu_text}, {shared}, delivery {delivery}")
                await run_demo(cp, client, keep, real, fake)
    print("\nStopped the manager and the control plane.")
    return 0


async def run_demo(
    cp: ControlPlane, client: Client, keep: bool, real: bool, fake: list[str]
) -> None:
    total = 6
    cp.apply(
        {
            "apiVersion": "node.k8s.io/v1",
            "kind": "RuntimeClass",
            "metadata": {"name": "nvidia"},
            "handler": "nvidia",
        }
    )
    step(3, total, "installing RBAC and policies; starting the manager as its ServiceAccount")
    cp.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    for obj in load_manifests(
        [ROOT / "config" / "holders", ROOT / "config" / "rbac", ROOT / "config" / "policy"]
    ):
        cp.apply(obj)
    proc, port, log = start_manager(cp, cp.work_dir)
    cp.install_webhooks([ROOT / "config" / "webhook"], port)
    print(f"      manager ready (pid {proc.pid}, log {log}); webhooks registered")
    try:
        async with anyio.create_task_group() as tg:
            # The fake nodes' kubelet also plays the device manager: it gives the groups'
            # holder pods their GPUs, as a real kubelet does on gpu-node-1 in real mode.
            await tg.start(Kubelet(client, nodes=fake, devices=indexed_devices).run)
            step(4, total, "applying examples/ and two requests that cannot be met")
            denied = await apply_examples(client, real=real)
            await client.create(
                SDG_KIND,
                {
                    "apiVersion": SDG_KIND.api_version,
                    "kind": SDG_KIND.kind,
                    "metadata": {"name": "too-big-group"},
                    "spec": {"resources": {"nvidia.com/gpu": 16}},
                },
            )
            bad = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": "greedy",
                    "annotations": {"deviceshare.io/group": "my-gpu-group"},
                },
                "spec": {
                    "containers": [
                        {
                            "name": "c",
                            "image": "busybox",
                            "resources": {"limits": {"nvidia.com/gpu": "1"}},
                        }
                    ]
                },
            }
            try:
                await client.create(PODS, bad, "default")
            except errors.ApiError as err:
                denied.append(("pod/greedy (requests nvidia.com/gpu itself)", err.message))
            step(5, total, "waiting for groups to bind and pods to run")
            await settle(client, 60.0 if real else 20.0)
            step(6, total, "result")
            await report(client, denied)
            if real:
                await container_output(cp, client, set(fake))
            if keep:
                print(
                    "\nStill running. Explore with:\n"
                    f"  export KUBECONFIG={cp.kubeconfig_path}"
                    "\n  kubectl get sdg; sdg devices; sdg explain too-big-group\n"
                    "Ctrl-C stops everything.",
                    flush=True,
                )
                with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as sigs:
                    async for _ in sigs:
                        break
            tg.cancel_scope.cancel()
    finally:
        stop_process(proc, 30)


async def container_output(cp: ControlPlane, client: Client, fake: set[str]) -> None:
    """What the containers on the real node printed (``kubectl logs``), beside what the
    pod webhook injected."""
    pods, _ = await client.list_all(PODS, "default")
    real = [p for p in pods if p["spec"].get("nodeName") and p["spec"]["nodeName"] not in fake]
    for p in sorted(real, key=lambda p: p["metadata"]["name"]):
        name = p["metadata"]["name"]
        first = p["spec"]["containers"][0]["name"]
        text = ""
        deadline = time.monotonic() + 10
        while not text and time.monotonic() < deadline:
            r = cp.http.get(
                f"/api/v1/namespaces/default/pods/{name}/log", params={"container": first}
            )
            text = r.text.strip() if r.status_code == 200 else ""
            if not text:
                await anyio.sleep(0.3)
        print(f"\n$ kubectl logs {name} -c {first}    # injected: {_delivered(p)}")
        for line in (text or "(nothing printed)").splitlines()[:4]:
            print(f"  {line}")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--keep", action="store_true", help="stay up until Ctrl-C")
    parser.add_argument(
        "--node",
        choices=("auto", "real", "fake"),
        default="auto",
        help=f"{REAL_NODE} as a real kubelet node where the machine allows it (auto), "
        "always (real: fail if it cannot), or never (fake)",
    )
    args = parser.parse_args()
    return anyio.run(demo, args.keep, args.node)


if __name__ == "__main__":
    sys.exit(main())

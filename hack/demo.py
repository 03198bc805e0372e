"""The README's main command (``make demo``): SDG end to end on a local control plane.

Starts etcd + kube-apiserver, registers simulated GPU nodes (there is no kubelet; a fake
one marks bound pods Running), installs the CRD, RBAC and webhook configuration, starts
the real manager process (``python -m controllers``) under its ServiceAccount's RBAC,
applies ``examples/``, and prints what happened. ``--keep`` leaves it all running.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import anyio  # noqa: E402
import httpx  # noqa: E402

from api.constants import SDG_KIND  # noqa: E402
from controllers.cliviews import devices_view, table  # noqa: E402
from controllers.inventory import RESOURCESLICES  # noqa: E402
from sdgruntime import errors  # noqa: E402
from sdgruntime.client import Client  # noqa: E402
from sdgruntime.envtest import ControlPlane, load_manifests  # noqa: E402
from sdgruntime.envtest.controlplane import free_port  # noqa: E402
from sdgruntime.envtest.fakes import Kubelet, create_node, make_node  # noqa: E402
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
DRA_GPUS = [(0, "GPU-6f1c0d2e-0000", True), (1, "GPU-6f1c0d2e-0001", False)]
DRA_GPUS += [(2, "GPU-6f1c0d2e-0002", True), (3, "GPU-6f1c0d2e-0003", True)]


def dra_slice(node: str) -> dict[str, Any]:
    """The ResourceSlice NVIDIA's DRA driver would publish for ``node`` (4 GPUs)."""
    devices = []
    for index, uuid, healthy in DRA_GPUS:
        device: dict[str, Any] = {
            "name": f"gpu-{index}",
            "attributes": {
                "index": {"int": index},
                "uuid": {"string": uuid},
                "type": {"string": "gpu"},
            },
        }
        if not healthy:
            device["taints"] = [{"key": "gpu.nvidia.com/unhealthy", "effect": "NoSchedule"}]
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


async def apply_examples(client: Client) -> list[tuple[str, str]]:
    """Create every object of examples/; returns (what, denial message) for denied ones."""
    denied: list[tuple[str, str]] = []
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        for obj in load_manifests([path]):
            kind = obj["kind"]
            what = f"{kind.lower()}/{obj['metadata']['name']} ({path.name})"
            try:
                if kind == "SharedDeviceGroup":
                    await client.create(SDG_KIND, obj)
                elif kind == "Pod":
                    await client.create(PODS, obj, obj["metadata"].get("namespace") or "default")
                else:
                    created = await client.request("POST", _collection(obj), json=obj)
                    if kind == "Deployment":
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
    """Until every group is decided and every pod of a bound group is Running."""
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
        if decided and not waiting:
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
        .get(f"cdi-devices.nri.io/container.{container['name']}")
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
    cms, _ = await client.list_all(CONFIGMAPS, NS)
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


async def demo(keep: bool) -> int:
    total = 6
    step(1, total, "starting the local control plane (first run builds kube-apiserver: minutes)")
    with ControlPlane(crd_paths=[ROOT / "config" / "crd"]) as cp:
        version = cp.http.get("/version").json()["gitVersion"]
        print(f"      kube-apiserver {version} at {cp.host}; CRD SharedDeviceGroup installed")
        async with Client.from_kubeconfig(str(cp.kubeconfig_path)) as client:
            step(2, total, "registering simulated nodes (no kubelet; a fake one runs pods)")
            for name, labels, gpus in NODES_SPEC:
                await create_node(client, make_node(name, labels=labels, allocatable=gpus))
                gpu_text = ", ".join(f"{v} {k}" for k, v in gpus.items())
                if not gpus:
                    cp.apply(dra_slice(name))
                    gpu_text = f"{len(DRA_GPUS)} nvidia.com/gpu in a DRA ResourceSlice, 1 unhealthy"
                shared = "shared" if labels.get("deviceshare.io/mode") else "NOT shared"
                delivery = labels.get("deviceshare.io/delivery", "env")
                print(f"      {name}: {gpu_text}, {shared}, delivery {delivery}")
            cp.apply(
                {
                    "apiVersion": "node.k8s.io/v1",
                    "kind": "RuntimeClass",
                    "metadata": {"name": "nvidia"},
                    "handler": "nvidia",
                }
            )
            step(
                3, total, "installing RBAC and policies; starting the manager as its ServiceAccount"
            )
            cp.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
            for obj in load_manifests([ROOT / "config" / "rbac", ROOT / "config" / "policy"]):
                cp.apply(obj)
            proc, port, log = start_manager(cp, cp.work_dir)
            cp.install_webhooks([ROOT / "config" / "webhook"], port)
            print(f"      manager ready (pid {proc.pid}, log {log}); webhooks registered")
            try:
                async with anyio.create_task_group() as tg:
                    await tg.start(Kubelet(client).run)
                    step(4, total, "applying examples/ and two requests that cannot be met")
                    denied = await apply_examples(client)
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
                    await settle(client)
                    step(6, total, "result")
                    await report(client, denied)
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
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
    print("\nStopped the manager and the control plane.")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--keep", action="store_true", help="stay up until Ctrl-C")
    args = parser.parse_args()
    return anyio.run(demo, args.keep)


if __name__ == "__main__":
    sys.exit(main())

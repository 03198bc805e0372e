"""Bounded memory and work, end to end: the foreign-pod mirror holds only pods on shared
nodes, Pending groups retry when a pod outside any group gives devices back, and a
manager with 300 pods of 1.4 MB env each stays small."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from api.constants import SDG_KIND
from api.pods import POD_NODE_INDEX
from controllers import metrics as sdg_metrics
from sdgruntime import errors
from sdgruntime.client import Client
from sdgruntime.envtest import ControlPlane
from sdgruntime.envtest.controlplane import free_port
from sdgruntime.kinds import NODES, PODS
from tests.e2e.harness import (
    GPU,
    MANAGER_NS,
    ROOT,
    add_node,
    eventually,
    group,
    manager_kubeconfig,
    pod,
    run_sdg,
    wait_bound,
)

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

MODE = "deviceshare.io/mode"
RAW_DEVICES = "devices.nri.io/pod"


def foreign_pod(name: str, node: str, **container: Any) -> dict[str, Any]:
    """A pod outside any group, bound to ``node`` by hand (no scheduler involved)."""
    body = pod(name, None, nodeName=node)
    body["spec"]["containers"][0].update(container)
    return body


def scheduled_message(g: dict[str, Any]) -> str:
    for cond in (g.get("status") or {}).get("conditions") or ():
        if cond["type"] == "Scheduled":
            return str(cond.get("message", ""))
    return ""


async def test_the_foreign_mirror_keeps_only_pods_on_shared_nodes(
    cluster: ControlPlane, client: Client, namespace: str
) -> None:
    n = 20
    gpu_pod = {"resources": {"limits": {GPU: "1"}, "requests": {GPU: "1"}}}
    await add_node(client, "plain-1", 8, shared=False)
    await add_node(client, "shared-1", 8)
    async with run_sdg(cluster) as sdg:

        def cached_on(node: str) -> int:
            return len(sdg.manager.cache.list(PODS, index=POD_NODE_INDEX, value=node, copy=False))

        async def create_all() -> None:
            for i in range(n):
                await client.create(PODS, foreign_pod(f"gpu-{i}", "plain-1", **gpu_pod), namespace)
            await eventually(lambda: cached_on("plain-1") == n, what="pods in the cache")

        # GPU pods on a node that is not shared: cached, never mirrored.
        await create_all()
        assert sdg.foreign.size() == 0
        for i in range(n):
            await client.delete(PODS, f"gpu-{i}", namespace, grace_period_seconds=0)
        await eventually(lambda: cached_on("plain-1") == 0, what="pods gone from the cache")
        assert sdg.foreign.size() == 0
        await create_all()
        assert sdg.foreign.size() == 0

        # The node becomes shared: its pods come in from the pod cache, and count.
        await client.patch(NODES, "plain-1", {"metadata": {"labels": {MODE: "shared"}}})
        await eventually(lambda: sdg.foreign.size() == n, what="the node's pods mirrored")
        assert {u.pod for u in sdg.foreign.on("plain-1")} == {
            f"{namespace}/gpu-{i}" for i in range(n)
        }
        assert sdg_metrics.FOREIGN_DEVICE_PODS.labels("plain-1")._value.get() == n
        # ... and placement backs off there: a group that fits only with it stays Pending.
        await client.create(SDG_KIND, group("two", {GPU: 2}))
        assert (await wait_bound(client, "two"))["status"]["nodeName"] == "shared-1"
        await client.create(SDG_KIND, group("wide", {GPU: 8}))
        wide = await eventually(
            lambda: _pending_with(client, "wide", "in use by pods outside any group"),
            what="wide Pending, blocked on plain-1",
        )
        assert "in use by pods outside any group" in scheduled_message(wide)

        # The label goes: so do its pods.
        await client.patch(NODES, "plain-1", {"metadata": {"labels": {MODE: None}}})
        await eventually(lambda: sdg.foreign.size() == 0, what="the node's pods dropped")


async def _pending_with(client: Client, name: str, text: str) -> dict[str, Any] | None:
    g = await client.get(SDG_KIND, name)
    pending = (g.get("status") or {}).get("phase") == "Pending"
    return g if pending and text in scheduled_message(g) else None


@pytest.mark.parametrize("how", ["ends", "drops-annotation", "deleted"])
async def test_a_pending_group_binds_when_the_pod_outside_any_group_gives_devices_back(
    cluster: ControlPlane, client: Client, namespace: str, how: str
) -> None:
    await add_node(client, "shared-1", 2)
    async with run_sdg(cluster):
        rogue = foreign_pod("rogue", "shared-1")
        rogue["metadata"]["annotations"] = {RAW_DEVICES: "- path: /dev/nvidia0"}
        await client.create(PODS, rogue, namespace)
        await client.create(SDG_KIND, group("waiting", {GPU: 2}))
        await eventually(
            lambda: _pending_with(client, "waiting", "in use by pods outside any group"),
            what="waiting Pending, blocked by the rogue pod",
        )
        # Another pod outside any group elsewhere changes nothing for it.
        await add_node(client, "plain-1", 8, shared=False)
        await client.create(PODS, foreign_pod("other", "plain-1"), namespace)

        if how == "ends":
            status = {"status": {"phase": "Succeeded"}}
            await client.patch(PODS, "rogue", status, namespace, subresource="status")
        elif how == "drops-annotation":
            gone = {"metadata": {"annotations": {RAW_DEVICES: None}}}
            await client.patch(PODS, "rogue", gone, namespace)
        else:
            await client.delete(PODS, "rogue", namespace, grace_period_seconds=0)
        bound = await wait_bound(client, "waiting")
        assert bound["status"]["nodeName"] == "shared-1"
        assert bound["status"]["selectedDevices"] == {GPU: "0,1"}


# --- 300 pods of 1.4 MB env ------------------------------------------------------------

FAT_PODS = 300
#: Env per pod, split over vars of 175 kB: a pod stays under etcd's 1.5 MiB request limit
#: (and the API server's 3 MB body limit).
FAT_ENV_BYTES = 1_400_000
FAT_VARS = 8
#: Without the pod cache's transform the manager would keep every pod's env: 300 x 1.4 MB
#: = 420 MB (and more as Python objects). With it, a cached pod is a few kB, so the growth
#: is the manager's working memory (decoding one 1.4 MB watch event at a time, allocator
#: slack). 64 MiB is far from 420 MB either way, and leaves a 512Mi manager room.
RSS_GROWTH_BOUND = 64 * 2**20


def vm(pid: int, field: str = "VmRSS") -> int:
    """The process's resident set (VmRSS) or its peak (VmHWM), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} for pid {pid}")


@contextlib.contextmanager
def manager_process(cp: ControlPlane, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``python -m controllers`` under the manager's ServiceAccount identity (no webhooks
    registered with the API server: the pods here are no group's); SIGTERM on exit."""
    cmd = [
        sys.executable,
        "-m",
        "controllers",
        f"--kubeconfig={manager_kubeconfig(cp)}",
        "--webhook-host=127.0.0.1",
        f"--webhook-port={free_port()}",
        f"--webhook-cert-dir={cp.webhook_cert_dir()}",
        "--metrics-bind-address=0",
        f"--health-probe-bind-address=127.0.0.1:{free_port()}",
        f"--claims-namespace={MANAGER_NS}",
        "--holders=off",  # no kubelet here to give a holder its devices
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def fat_pod(name: str, value: str) -> dict[str, Any]:
    """A Pending pod (no scheduler runs here) whose container carries ``FAT_VARS`` env
    vars of ``value``: the env is one shared string here, 1.4 MB on the wire."""
    body = pod(name, None)
    body["spec"]["containers"][0]["env"] = [
        {"name": f"BLOB_{i}", "value": value} for i in range(FAT_VARS)
    ]
    return body


def sentinel_pod(name: str) -> dict[str, Any]:
    """A pod outside any group on the group's node: the group's Ready condition names it."""
    body = foreign_pod(name, "shared-1")
    body["spec"]["containers"][0]["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
    return body


async def wait_until_seen(
    client: Client, proc: subprocess.Popen[bytes], sentinel: dict[str, Any], namespace: str
) -> None:
    """Create ``sentinel`` and wait until group g's Ready condition names it: the manager's
    pod cache then holds every pod created before it."""
    await client.create(PODS, sentinel, namespace)
    name = f"{namespace}/{sentinel['metadata']['name']}"

    async def named() -> bool:
        assert proc.poll() is None, f"the manager exited with {proc.returncode}"
        g = await client.get(SDG_KIND, "g")
        return any(
            c["type"] == "Ready" and name in c.get("message", "")
            for c in (g.get("status") or {}).get("conditions") or ()
        )

    await eventually(named, within=120, what=f"{name} seen by the manager")


async def test_a_manager_with_300_pods_of_1_4_mb_env_stays_small(
    cluster: ControlPlane, client: Client, namespace: str, tmp_path: Path
) -> None:
    await add_node(client, "shared-1", 8)
    value = "x" * (FAT_ENV_BYTES // FAT_VARS)
    names = [f"fat-{i}" for i in range(FAT_PODS)]
    try:
        with manager_process(cluster, tmp_path / "manager.log") as proc:
            await client.create(SDG_KIND, group("g", {GPU: 1}))
            await wait_bound(client, "g", within=60)
            await anyio.sleep(2)  # caches synced, first reconciles done
            assert proc.poll() is None, (tmp_path / "manager.log").read_text()[-3000:]
            before, peak_before = vm(proc.pid), vm(proc.pid, "VmHWM")
            for name in names:
                await client.create(PODS, fat_pod(name, value), namespace)
            # Last, a pod outside any group on the group's node: once the group names it,
            # the manager's pod watch has delivered every pod before it.
            await wait_until_seen(client, proc, sentinel_pod("sentinel"), namespace)
            growth = vm(proc.pid) - before
            print(f"manager VmRSS {before / 2**20:.1f} MiB, +{growth / 2**20:.1f} MiB")
            assert growth < RSS_GROWTH_BOUND, (
                f"the manager grew by {growth / 2**20:.1f} MiB with {FAT_PODS} pods of "
                f"{FAT_ENV_BYTES / 1e6} MB env (bound {RSS_GROWTH_BOUND / 2**20:.0f} MiB)"
            )
        # A manager started while they exist reads them in its first list: streamed, one
        # pod at a time (in pages of 500 it peaked at 1.3 GB).
        with manager_process(cluster, tmp_path / "restarted.log") as proc:
            await wait_until_seen(client, proc, sentinel_pod("sentinel-2"), namespace)
            peak = vm(proc.pid, "VmHWM") - peak_before
            print(f"restarted manager: peak +{peak / 2**20:.1f} MiB")
            assert peak < RSS_GROWTH_BOUND, (
                f"a manager starting with {FAT_PODS} pods of {FAT_ENV_BYTES / 1e6} MB env "
                f"peaked {peak / 2**20:.1f} MiB above a fresh one's (bound "
                f"{RSS_GROWTH_BOUND / 2**20:.0f} MiB)"
            )
    finally:
        # One by one: the cluster's reset would list all 420 MB of them at once.
        for name in [*names, "sentinel", "sentinel-2"]:
            with contextlib.suppress(errors.NotFound):
                await client.delete(PODS, name, namespace, grace_period_seconds=0)

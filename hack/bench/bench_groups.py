"""Groups bound per second (compare.py's S3, alone and quicker): N one-GPU groups created
at once (``--in-flight`` POSTs), timed from the first POST to the last group seen Bound.

``.venv/bin/python hack/bench/bench_groups.py --nodes 100 --groups 200 --rounds 3
[--strategy binpack] [--holders auto] [-- --group-workers=8]``: starts the local control
plane and the real manager process (webhooks on, leader election on, as compare.py runs
it), makes the fleet, then per round creates fresh groups and prints seconds, groups/s and the CPU
seconds of the manager and the API server, and the API writes per group (``--holders
auto``: each group also gets its holder pod, given its devices by a fake kubelet's device
manager). Extra arguments after ``--`` go to the
manager. Afterwards it checks that no device is held twice (the claim records against
every Bound group's status). A benchmark, never a timed test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
for p in (str(HERE), str(ROOT)):
    if p not in sys.path:
        sys.path.insert(0, p)

from _kube import Kube, Stopwatch  # noqa: E402
from compare import (  # noqa: E402
    GPU,
    SDG_PATH,
    Env,
    FirstSeen,
    Proc,
    PySpy,
    Watch,
    create_all,
    create_nodes,
    ensure_namespace,
    group_pod,
    has_node,
    is_bound,
    pods_path,
    wait_http_ok,
)

from sdgruntime.client import Client  # noqa: E402
from sdgruntime.envtest import ControlPlane  # noqa: E402
from sdgruntime.envtest.controlplane import free_port  # noqa: E402
from sdgruntime.envtest.fakes import Kubelet, indexed_devices  # noqa: E402
from tests.e2e.harness import MANAGER_NS, install_rbac  # noqa: E402

Obj = dict[str, Any]


async def manager(env: Env, extra: list[str]) -> tuple[Proc, int, int]:
    webhook_port, probe_port, metrics_port = free_port(), free_port(), free_port()
    cmd = [
        sys.executable,
        "-m",
        "controllers",
        f"--kubeconfig={env.sa_kubeconfig}",
        "--webhook-host=127.0.0.1",
        f"--webhook-port={webhook_port}",
        f"--webhook-cert-dir={env.cp.webhook_cert_dir()}",
        f"--metrics-bind-address=127.0.0.1:{metrics_port}",
        f"--health-probe-bind-address=127.0.0.1:{probe_port}",
        "--leader-elect",
        f"--leader-election-namespace={MANAGER_NS}",
        f"--claims-namespace={MANAGER_NS}",
        *extra,
    ]
    proc = Proc("sdg-manager", cmd, env.work / "manager.log", env.env)
    await wait_http_ok(proc, f"http://127.0.0.1:{probe_port}/readyz")
    return proc, webhook_port, metrics_port


async def fake_kubelet(env: Env) -> None:
    """The fake kubelet with a device manager (``sdgruntime.envtest.fakes.Kubelet``)."""
    async with Client.from_kubeconfig(env.admin_kubeconfig) as client:
        await Kubelet(client, devices=indexed_devices).run()


async def scrape(port: int) -> dict[str, float]:
    """The manager's counters (``_total`` and histogram ``_sum``/``_count`` series)."""
    import aiohttp

    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://127.0.0.1:{port}/metrics") as r,
    ):
        text = await r.text()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        key, _, value = line.rpartition(" ")
        if key.split("{")[0].endswith(("_total", "_sum", "_count")):
            out[key] = float(value)
    return out


def show(before: dict[str, float], after: dict[str, float], wanted: tuple[str, ...]) -> None:
    for key, value in sorted(after.items()):
        delta = value - before.get(key, 0.0)
        if delta and key.startswith(wanted):
            print(f"    {key} {delta:g}")


def group(name: str, strategy: str) -> Obj:
    return {
        "apiVersion": "deviceshare.io/v1alpha1",
        "kind": "SharedDeviceGroup",
        "metadata": {"name": name},
        "spec": {"resources": {GPU: 1}, "schedulingStrategy": strategy},
    }


async def held_twice(kube: Kube) -> list[str]:
    """Devices given to two groups: by the records, or by a record and a status."""
    items, _ = await kube.list(f"/api/v1/namespaces/{MANAGER_NS}/configmaps")
    owner: dict[tuple[str, str, int], str] = {}
    bad: list[str] = []
    for cm in items:
        data = cm.get("data") or {}
        if "node" not in data:
            continue
        for g, devices in json.loads(data.get("claims") or "{}").items():
            for res, ids in devices.items():
                for i in str(ids).split(","):
                    key = (data["node"], res, int(i))
                    if key in owner and owner[key] != g:
                        bad.append(f"{key} {owner[key]} {g}")
                    owner[key] = g
    groups, _ = await kube.list(SDG_PATH)
    for g in groups:
        st = g.get("status") or {}
        if st.get("phase") != "Bound":
            continue
        for res, ids in (st.get("selectedDevices") or {}).items():
            for i in str(ids).split(","):
                key = (st["nodeName"], res, int(i))
                if owner.get(key) != g["metadata"]["name"]:
                    bad.append(f"{key} status {g['metadata']['name']} record {owner.get(key)}")
    return bad


async def stream_pods(
    kube: Kube, args: argparse.Namespace, mgr: Proc, mport: int, pids: dict[str, int]
) -> None:
    """compare.py's S1: pods of round 0's groups, created at once, until all are bound."""
    await ensure_namespace(kube, "bench")
    groups = [f"g0-{i:04d}" for i in range(args.groups)]
    pods = [group_pod(f"p-{i:05d}", groups[i % len(groups)]) for i in range(args.pods)]
    seen = FirstSeen([p["metadata"]["name"] for p in pods], has_node)
    spy = PySpy(mgr.pid, Path(args.py_spy)) if args.py_spy else None
    m0 = await scrape(mport)
    sw = Stopwatch(pids)
    async with Watch(kube, pods_path("bench"), seen):
        made = await create_all(kube, pods_path("bench"), pods, args.in_flight)
        await seen.wait(900)
    secs = max(seen.first.values()) - made.t_first
    cpu = sw.cpu()
    await asyncio.sleep(3)  # the reconciles that follow the last bind
    cpu_after = sw.cpu()
    print(
        f"pods: {args.pods} bound in {secs:.2f} s = {args.pods / secs:.0f}/s; CPU-s "
        + " ".join(f"{k} {v:.2f}" for k, v in cpu.items())
        + f"; manager incl. 3 s after: {cpu_after['manager']:.2f}",
        flush=True,
    )
    show(
        m0,
        await scrape(mport),
        ("controller_runtime_reconcile_total", "controller_runtime_reconcile_time_seconds_sum"),
    )
    if spy is not None:
        prof = spy.stop()
        print("py-spy:", json.dumps(prof)[:3000] if prof else None)


async def run(args: argparse.Namespace) -> None:
    cp = ControlPlane(crd_paths=[ROOT / "config" / "crd"])
    cp.start()
    try:
        install_rbac(cp)
        env = Env(cp, cp.work_dir)
        async with Kube(env.admin_kubeconfig, limit=args.in_flight + 16) as kube:
            await create_nodes(kube, 0, args.nodes, 32)
            mgr, port, mport = await manager(env, [f"--holders={args.holders}", *args.manager_args])
            env.webhooks(port)
            await asyncio.sleep(2)
            pids = {
                "manager": mgr.pid,
                "apiserver": cp.pids["kube-apiserver"],
                "etcd": cp.pids["etcd"],
            }
            spy = PySpy(mgr.pid, Path(args.py_spy_groups)) if args.py_spy_groups else None
            kubelet = None
            if args.holders == "auto":
                # The fleet's kubelet, playing the device manager for the holder pods
                # (in this process: its CPU is not the manager's).
                kubelet = asyncio.ensure_future(fake_kubelet(env))
            try:
                for r in range(args.rounds):
                    names = [f"g{r}-{i:04d}" for i in range(args.groups)]
                    seen = FirstSeen(names, is_bound)
                    m0 = await scrape(mport)
                    w0 = await kube.writes()
                    sw = Stopwatch(pids)
                    async with Watch(kube, SDG_PATH, seen):
                        made = await create_all(
                            kube, SDG_PATH, [group(n, args.strategy) for n in names], args.in_flight
                        )
                        await seen.wait(600)
                    secs = max(seen.first.values()) - made.t_first
                    first = min(seen.first.values()) - made.t_first
                    cpu = sw.cpu()
                    print(
                        f"round {r}: {args.groups} groups in {secs:.2f} s = "
                        f"{args.groups / secs:.1f}/s (creates took {made.create_s:.2f} s, "
                        f"first Bound at {first:.2f} s); CPU-s "
                        + " ".join(f"{k} {v:.2f}" for k, v in cpu.items()),
                        flush=True,
                    )
                    writes = await kube.writes() - w0
                    print(
                        f"    API writes per group: {writes.total() / args.groups:.2f} ("
                        + ", ".join(f"{k} {v / args.groups:.2f}" for k, v in writes.most_common(8))
                        + ")",
                        flush=True,
                    )
                    if args.metrics:
                        show(m0, await scrape(mport), tuple(args.metrics.split(",")))
                if spy is not None:
                    print("py-spy (groups):", json.dumps(spy.stop())[:3000])
                if args.pods:
                    await stream_pods(kube, args, mgr, mport, pids)
                bad = await held_twice(kube)
                print("devices held twice:", bad[:10] if bad else "none", flush=True)
            finally:
                if kubelet is not None:
                    kubelet.cancel()
                await mgr.stop(10)
    finally:
        cp.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--groups", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--in-flight", type=int, default=64)
    parser.add_argument("--strategy", default="spread")
    parser.add_argument(
        "--holders",
        choices=("off", "auto"),
        default="off",
        help="auto: holder pods per group, given devices by a fake kubelet's device manager",
    )
    parser.add_argument("--pods", type=int, default=0, help="then stream this many pods")
    parser.add_argument("--py-spy-groups", default="", help="profile the rounds into this file")
    parser.add_argument("--py-spy", default="", help="profile the pod stream into this file")
    parser.add_argument("--metrics", default="", help="metric name prefixes to print (a,b)")
    parser.add_argument("manager_args", nargs="*")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(run(args))


if __name__ == "__main__":
    main()

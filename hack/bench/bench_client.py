"""The client alone: Binding POSTs through ``sdgruntime.client.Client`` against raw aiohttp.

The measurement behind docs/design.md's "3000 Binding POSTs, 32 in flight, one process"
(212 binds/s at 4.4 ms of CPU each through the httpx client, 1506 at 0.22 ms with raw
aiohttp), repeatable: start the local control plane, create a node and ``--pods`` unbound
pods per contender, then bind each contender's pods with ``--in-flight`` POSTs at a time
and report binds/s and this process's CPU per bind (only the bind phase is timed; the
control plane runs in other processes). Contenders alternate for ``--rounds`` rounds.

    .venv/bin/python hack/bench/bench_client.py [--pods 3000] [--in-flight 32] [--rounds 2]

A benchmark, never a timed test: nothing here passes or fails.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
for p in (str(HERE), str(ROOT)):
    if p not in sys.path:
        sys.path.insert(0, p)

from _kube import Kube, bounded  # noqa: E402

from sdgruntime.client import Client  # noqa: E402
from sdgruntime.envtest import ControlPlane  # noqa: E402
from sdgruntime.envtest.fakes import make_node  # noqa: E402

NS = "bench-client"
NODE = "node-0"


def pod(name: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": "nobody",
            "containers": [{"name": "c", "image": "busybox", "command": ["sleep", "1"]}],
        },
    }


async def create_pods(kube: Kube, prefix: str, n: int) -> list[tuple[str, str]]:
    async def one(i: int) -> tuple[str, str]:
        got = await kube.request("POST", f"/api/v1/namespaces/{NS}/pods", pod(f"{prefix}-{i}"))
        return got["metadata"]["name"], got["metadata"]["uid"]

    jobs: list[Callable[[], Awaitable[tuple[str, str]]]] = [(lambda i=i: one(i)) for i in range(n)]
    return await bounded(64, jobs)


async def timed(
    binds: list[Callable[[], Awaitable[object]]], in_flight: int
) -> tuple[float, float]:
    cpu0, t0 = time.process_time(), time.perf_counter()
    await bounded(in_flight, binds)
    return time.perf_counter() - t0, time.process_time() - cpu0


async def run(args: argparse.Namespace) -> None:
    with ControlPlane() as cp:
        kubeconfig = str(cp.kubeconfig_path)
        async with (
            Kube(kubeconfig, limit=64) as kube,
            Client.from_kubeconfig(kubeconfig, max_connections=args.in_flight) as client,
        ):
            await kube.request("POST", "/api/v1/namespaces", {"metadata": {"name": NS}})
            await kube.request("POST", "/api/v1/nodes", make_node(NODE))
            results: dict[str, list[tuple[float, float]]] = {"sdgruntime Client": [], "aiohttp": []}
            for r in range(args.rounds):
                for name in results:
                    pods = await create_pods(kube, f"r{r}-{name[:3].lower()}", args.pods)
                    if name == "aiohttp":
                        binds = [
                            (
                                lambda n=n, u=u: kube.request(
                                    "POST",
                                    f"/api/v1/namespaces/{NS}/pods/{n}/binding",
                                    {
                                        "apiVersion": "v1",
                                        "kind": "Binding",
                                        "metadata": {"name": n, "namespace": NS, "uid": u},
                                        "target": {
                                            "apiVersion": "v1",
                                            "kind": "Node",
                                            "name": NODE,
                                        },
                                    },
                                )
                            )
                            for n, u in pods
                        ]
                    else:
                        binds = [
                            (lambda n=n, u=u: client.bind(NS, n, NODE, pod_uid=u)) for n, u in pods
                        ]
                    results[name].append(await timed(binds, args.in_flight))
    print(f"{args.pods} Binding POSTs per round, {args.in_flight} in flight, {args.rounds} rounds")
    print("| binder | binds/s | CPU ms per bind |")
    print("| --- | ---: | ---: |")
    for name, rows in results.items():
        rate = sum(args.pods / wall for wall, _ in rows) / len(rows)
        cpu = sum(cpu / args.pods for _, cpu in rows) / len(rows) * 1000
        print(f"| {name} | {rate:.0f} | {cpu:.2f} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=3000)
    parser.add_argument("--in-flight", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    asyncio.run(run(parser.parse_args()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The S2 yardstick: Binding POSTs from one Python process, nothing else.

No cache, no checks, no status writes: read the jobs (namespace, pod, uid, node), POST
each pod's ``binding`` subresource with aiohttp, ``--in-flight`` at a time, and print a
JSON summary. What any Python binder talking to this API server can at best reach.

    python hack/bench/raw_binder.py --kubeconfig K --jobs jobs.json [--in-flight 32]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _kube import ApiError, Kube, bounded


async def bind_all(kubeconfig: str, jobs: list[list[str]], in_flight: int) -> dict[str, object]:
    errors: dict[str, int] = {}
    async with Kube(kubeconfig, limit=in_flight) as kube:

        def job(ns: str, name: str, uid: str, node: str) -> Callable[[], Awaitable[None]]:
            body = {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {"name": name, "namespace": ns, "uid": uid},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node},
            }

            async def run() -> None:
                try:
                    await kube.request("POST", f"/api/v1/namespaces/{ns}/pods/{name}/binding", body)
                except ApiError as e:
                    errors[str(e.status)] = errors.get(str(e.status), 0) + 1

            return run

        t0 = time.time()
        await bounded(in_flight, [job(*j) for j in jobs])
        t1 = time.time()
    return {"start": t0, "end": t1, "binds": len(jobs), "errors": errors}


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--jobs", required=True, type=Path)
    parser.add_argument("--in-flight", type=int, default=32)
    args = parser.parse_args()
    jobs = json.loads(args.jobs.read_text())
    print(json.dumps(asyncio.run(bind_all(args.kubeconfig, jobs, args.in_flight))), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

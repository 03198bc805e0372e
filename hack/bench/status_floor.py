"""The S4 control run: the least one Python process spends to keep S4's group statuses.

What SDG's status controller must do, and nothing else: list and watch the namespace's
pods; keep each group's active pods (``namespace/name``, by the ``deviceshare.io/group``
annotation; Succeeded and Failed pods leave); for each group whose pods changed, write
``status.allocatedPods`` (sorted, at most 1000 listed) and ``status.podCount`` in one JSON
merge patch, ``--writers`` at a time, oldest change first, one write per group in flight,
skipping a write that equals the last one. No cache of groups, no batching period, no
Events, no retries. ``GET /readyz`` answers 200 once the watch is open; on SIGTERM a JSON
summary line is printed (pod events, writes, errors).

    python hack/bench/status_floor.py --kubeconfig K --namespace NS [--writers 8]

Part of the comparison benchmark (``hack/bench/compare.py``), not of SDG.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _kube import ApiError, Kube, run_loop
from aiohttp import web

Obj = dict[str, Any]
GROUP_ANNOTATION = "deviceshare.io/group"
SDG_PATH = "/apis/deviceshare.io/v1alpha1/shareddevicegroups"
MAX_LISTED = 1000


def group_of(pod: Obj) -> str | None:
    value = ((pod.get("metadata") or {}).get("annotations") or {}).get(GROUP_ANNOTATION)
    return value if isinstance(value, str) and value else None


def is_active(pod: Obj) -> bool:
    return (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


class StatusFloor:
    """Pods by group from the watch, and the writers that put them in the groups' status."""

    def __init__(self, kube: Kube, writers: int) -> None:
        self.kube = kube
        self.pods: dict[str, set[str]] = {}  # group -> active pod keys
        self.group_of_pod: dict[str, str] = {}  # pod key -> group
        self.written: dict[str, tuple[list[str], int]] = {}
        #: groups to write, oldest change first (a dict as an ordered set); a group being
        #: written is not in it, and an event meanwhile puts it back for one more write
        self.dirty: dict[str, None] = {}
        self.writing: set[str] = set()
        self.wake = asyncio.Event()
        self.writers = writers
        self.counts = {"pod_events": 0, "writes": 0, "skipped": 0}
        self.errors: list[str] = []

    def on_pod(self, typ: str, pod: Obj) -> None:
        self.counts["pod_events"] += 1
        meta = pod.get("metadata") or {}
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        group = group_of(pod)
        before = self.group_of_pod.pop(key, None)
        if before is not None:
            self.pods[before].discard(key)
            self.mark(before)
        if group is not None and typ != "DELETED" and is_active(pod):
            self.group_of_pod[key] = group
            self.pods.setdefault(group, set()).add(key)
            self.mark(group)

    def mark(self, group: str) -> None:
        self.dirty[group] = None
        self.wake.set()

    async def writer(self) -> None:
        while True:
            group = next((g for g in self.dirty if g not in self.writing), None)
            if group is None:
                self.wake.clear()
                await self.wake.wait()
                continue
            del self.dirty[group]
            self.writing.add(group)
            try:
                await self.write(group)
            finally:
                self.writing.discard(group)
                if self.dirty:
                    self.wake.set()

    async def write(self, group: str) -> None:
        keys = sorted(self.pods.get(group, ()))
        want = (keys[:MAX_LISTED], len(keys))
        if self.written.get(group) == want:
            self.counts["skipped"] += 1
            return
        patch = {"status": {"allocatedPods": want[0], "podCount": want[1]}}
        try:
            await self.kube.request(
                "PATCH",
                f"{SDG_PATH}/{group}/status",
                patch,
                content_type="application/merge-patch+json",
            )
        except ApiError as e:
            if len(self.errors) < 20:
                self.errors.append(f"{group}: {e}")
            return
        self.written[group] = want
        self.counts["writes"] += 1


async def run(args: argparse.Namespace) -> dict[str, object]:
    ready = False

    async def readyz(_: web.Request) -> web.Response:
        return web.Response(status=200 if ready else 503, text="ok" if ready else "not yet")

    app = web.Application()
    app.router.add_get("/readyz", readyz)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", args.port).start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # one connection more than writers: the watch holds one
    async with Kube(args.kubeconfig, limit=args.writers + 1, lean=True) as kube:
        floor = StatusFloor(kube, args.writers)
        path = f"/api/v1/namespaces/{args.namespace}/pods"
        items, rv = await kube.list(path)
        for pod in items:
            floor.on_pod("ADDED", pod)
        tasks = [asyncio.create_task(kube.watch(path, rv, floor.on_pod))]
        tasks += [asyncio.create_task(floor.writer()) for _ in range(args.writers)]
        ready = True  # the watch goes on from the list: nothing after it is missed
        waiter = asyncio.create_task(stop.wait())
        done, _ = await asyncio.wait({tasks[0], waiter}, return_when=asyncio.FIRST_COMPLETED)
        if tasks[0] in done and tasks[0].exception() is not None:
            floor.errors.append(f"watch: {tasks[0].exception()}")
        for task in (*tasks, waiter):
            task.cancel()
    await runner.cleanup()
    return {"end": time.time(), **floor.counts, "errors": floor.errors}


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--port", type=int, required=True, help="for GET /readyz")
    parser.add_argument("--writers", type=int, default=8)
    args = parser.parse_args()
    print(json.dumps(run_loop(run(args))), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The S9 control run: the least one Python process spends on S1's per-pod API traffic.

What SDG's manager must do for each streamed group pod, and nothing else, in one asyncio
process: answer the pod webhook's AdmissionReview (HTTPS, ``POST /mutate-v1-pod``) with a
JSONPatch precomputed per group from the pod as SDG's webhook made it; watch the
namespace's pods; for each one that names ``deviceshare-scheduler`` and has no node, once,
POST its Binding to its group's node and then a ``Scheduled`` Event. No cache, no checks,
no status writes, no retries. ``GET /readyz`` answers 200 once the watch is open; on
SIGTERM a JSON summary line is printed (reviews answered, binds, events, connections
accepted, errors).

    python hack/bench/floor.py --kubeconfig K --cert-dir D --port P --namespace NS \\
        --templates templates.json --nodes nodes.json [--in-flight 32]

``templates.json``: group -> the pod as SDG's webhook made it; ``nodes.json``: group ->
node. Any other webhook path gets 404 (SDG's other webhooks are failurePolicy Ignore).
``GET /connections`` answers how many connections the server has accepted so far.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import datetime as dt
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _kube import ApiError, Kube, run_loop

from sdgruntime.httpserver import HTTPServer, Request, Response
from sdgruntime.metrics import REGISTRY
from sdgruntime.webhook.certs import server_context

Obj = dict[str, Any]
GROUP_ANNOTATION = "deviceshare.io/group"
SCHEDULER = "deviceshare-scheduler"


def group_patch(template: Obj) -> list[Obj]:
    """What SDG's webhook set on the template's pod, as JSONPatch ``add`` operations
    (``add`` of an existing member replaces it): schedulerName, nodeSelector,
    tolerations, each container's env and the annotations."""
    spec, meta = template["spec"], template["metadata"]
    ops: list[Obj] = []
    for key in ("schedulerName", "nodeSelector", "tolerations"):
        if key in spec:
            ops.append({"op": "add", "path": f"/spec/{key}", "value": spec[key]})
    for i, c in enumerate(spec.get("containers") or ()):
        if "env" in c:
            ops.append({"op": "add", "path": f"/spec/containers/{i}/env", "value": c["env"]})
    if meta.get("annotations"):
        ops.append({"op": "add", "path": "/metadata/annotations", "value": meta["annotations"]})
    return ops


def review_answers(templates: dict[str, Obj]) -> dict[str | None, tuple[str, str]]:
    """Per group, the response AdmissionReview as text before and after its uid; ``None``
    (a pod of no known group): allowed, unchanged."""
    out: dict[str | None, tuple[str, str]] = {}
    head = '{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":'
    for group, pod in templates.items():
        patch = base64.b64encode(json.dumps(group_patch(pod)).encode()).decode("ascii")
        out[group] = (head, f',"allowed":true,"patchType":"JSONPatch","patch":"{patch}"}}}}')
    out[None] = (head, ',"allowed":true}}')
    return out


class Floor:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.ns = args.namespace
        self.answers = review_answers(json.loads(Path(args.templates).read_text()))
        self.nodes: dict[str, str] = json.loads(Path(args.nodes).read_text())
        self.ready = False
        self.seen: set[str] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        self.sem = asyncio.Semaphore(args.in_flight)
        self.counts = {"reviews": 0, "binds": 0, "events": 0}
        self.errors: dict[str, int] = {}
        self.kube: Kube | None = None

    def error(self, what: str) -> None:
        self.errors[what] = self.errors.get(what, 0) + 1

    # --- the webhook ---------------------------------------------------------------------

    async def mutate(self, request: Request) -> Response:
        review = json.loads(request.body)
        req = review["request"]
        obj = req.get("object") or {}
        group = ((obj.get("metadata") or {}).get("annotations") or {}).get(GROUP_ANNOTATION)
        if req.get("subResource") or group not in self.answers:
            group = None  # ephemeral containers, or a group this run has no template for
        head, tail = self.answers[group]
        self.counts["reviews"] += 1
        body = (head + json.dumps(req["uid"]) + tail).encode()
        return Response(200, {"content-type": "application/json"}, body)

    async def readyz(self, request: Request) -> Response:
        return Response.text("ok" if self.ready else "", 200 if self.ready else 503)

    async def connections(self, request: Request) -> Response:
        """How many connections the server has accepted so far (each a TLS handshake)."""
        return Response.text(f"{accepted():.0f}\n")

    # --- the binder ----------------------------------------------------------------------

    def on_pod(self, typ: str, pod: Obj) -> None:
        if typ == "DELETED":
            return
        spec, meta = pod.get("spec") or {}, pod["metadata"]
        if spec.get("schedulerName") != SCHEDULER or spec.get("nodeName"):
            return
        name = meta["name"]
        if name in self.seen:
            return
        self.seen.add(name)
        task = asyncio.create_task(self.bind(pod))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def bind(self, pod: Obj) -> None:
        assert self.kube is not None
        meta = pod["metadata"]
        name, uid = meta["name"], meta.get("uid")
        group = (meta.get("annotations") or {}).get(GROUP_ANNOTATION)
        node = self.nodes.get(group or "")
        if node is None:
            self.error("no node")
            return
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": self.ns, "uid": uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        async with self.sem:
            try:
                await self.kube.request(
                    "POST", f"/api/v1/namespaces/{self.ns}/pods/{name}/binding", body
                )
            except ApiError as e:
                self.error(f"bind {e.status}")
                return
            self.counts["binds"] += 1
            ts = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            event = {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": f"{name}.{time.time_ns():x}", "namespace": self.ns},
                "involvedObject": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": name,
                    "namespace": self.ns,
                    "uid": uid,
                    "resourceVersion": meta.get("resourceVersion"),
                },
                "type": "Normal",
                "reason": "Scheduled",
                "message": f"Successfully assigned {self.ns}/{name} to {node}",
                "source": {"component": SCHEDULER},
                "firstTimestamp": ts,
                "lastTimestamp": ts,
                "count": 1,
                "reportingComponent": SCHEDULER,
                "reportingInstance": SCHEDULER,
            }
            try:
                await self.kube.request("POST", f"/api/v1/namespaces/{self.ns}/events", event)
            except ApiError as e:
                self.error(f"event {e.status}")
                return
            self.counts["events"] += 1

    # --- the process ---------------------------------------------------------------------

    async def run(self) -> dict[str, object]:
        cert_dir = Path(self.args.cert_dir)
        # SDG's own HTTP server and TLS settings (no session tickets), the cheapest Python
        # path SDG has, as for the requests.
        tls = server_context(cert_dir / "tls.crt", cert_dir / "tls.key")
        routes = {
            "/mutate-v1-pod": self.mutate,
            "/readyz": self.readyz,
            "/connections": self.connections,
        }
        server = HTTPServer(
            self.args.host, self.args.port, routes, ssl_context_provider=lambda: tls, name="floor"
        )
        serving = asyncio.create_task(server.serve())
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        t0 = time.time()
        # one connection more than binds in flight: the watch holds one
        async with Kube(self.args.kubeconfig, limit=self.args.in_flight + 1, lean=True) as kube:
            self.kube = kube
            path = f"/api/v1/namespaces/{self.ns}/pods"
            items, rv = await kube.list(path)
            for pod in items:
                self.on_pod("ADDED", pod)
            watch = asyncio.create_task(kube.watch(path, rv, self.on_pod))
            self.ready = True  # the watch goes on from the list: nothing after it is missed
            waiter = asyncio.create_task(stop.wait())
            done, _ = await asyncio.wait({watch, waiter}, return_when=asyncio.FIRST_COMPLETED)
            if watch in done and watch.exception() is not None:
                self.error(f"watch: {watch.exception()}")
            watch.cancel()
            waiter.cancel()
            for task in list(self.tasks):
                task.cancel()
        serving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await serving
        return {
            "start": t0,
            "end": time.time(),
            **self.counts,
            "connections": accepted(),
            "errors": self.errors,
        }


def accepted() -> float:
    """Connections the floor's server accepted: each a TLS handshake on both sides, as
    ``sdgruntime_http_connections_total`` counts SDG's."""
    labels = {"server": "floor", "protocol": "http/1.1"}
    return REGISTRY.get_sample_value("sdgruntime_http_connections_total", labels) or 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--cert-dir", required=True, help="tls.crt and tls.key to serve")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--templates", required=True, type=Path)
    parser.add_argument("--nodes", required=True, type=Path)
    parser.add_argument("--in-flight", type=int, default=32)
    args = parser.parse_args()
    print(json.dumps(run_loop(Floor(args).run())), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The pod webhook alone: server CPU per AdmissionReview, over kept and over new connections.

    .venv/bin/python hack/bench/bench_webhook.py [--reviews 4000] [--in-flight 64]

The server (``sdgruntime.webhook.WebhookServer`` + ``webhooks.podmutator.PodMutator`` on a
cache holding one Bound group and its node) runs in a child process; this process sends
real pod CREATE reviews over TLS the way the API server does (HTTP/1.1, a pool of at most
25 idle connections per host, client-go's ``MaxIdleConnsPerHost``) and reads the child's
CPU time from /proc. Rounds: ``keep-alive`` (the pool reused) and ``new connection``
(one TLS handshake per review: what the API server does for the requests over its 25 idle
connections). The server speaks HTTP/1.1 only. ``--py-spy FILE`` records the server
during one round (``--py-spy-round``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

GROUP = {
    "metadata": {"name": "g", "uid": "u1", "resourceVersion": "1"},
    "spec": {"resources": {"nvidia.com/gpu": 1}},
    "status": {"phase": "Bound", "nodeName": "n1", "selectedDevices": {"nvidia.com/gpu": "0"}},
}
NODE = {"metadata": {"name": "n1", "labels": {"deviceshare.io/mode": "shared"}}}


def pod(name: str) -> dict[str, Any]:
    """A pod as the API server sends it to a webhook at CREATE (defaults applied)."""
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "namespace": "bench",
            "annotations": {"deviceshare.io/group": "g"},
            "creationTimestamp": None,
        },
        "spec": {
            "containers": [
                {
                    "name": "app",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {},
                    "terminationMessagePath": "/dev/termination-log",
                    "terminationMessagePolicy": "File",
                    "imagePullPolicy": "IfNotPresent",
                }
            ],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "securityContext": {},
            "schedulerName": "default-scheduler",
            "enableServiceLinks": True,
            "preemptionPolicy": "PreemptLowerPriority",
            "priority": 0,
        },
        "status": {},
    }


def review(name: str) -> bytes:
    from sdgruntime.jsoncodec import dumps

    return dumps(
        {
            "kind": "AdmissionReview",
            "apiVersion": "admission.k8s.io/v1",
            "request": {
                "uid": str(uuid.uuid4()),
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
                "requestResource": {"group": "", "version": "v1", "resource": "pods"},
                "name": name,
                "namespace": "bench",
                "operation": "CREATE",
                "userInfo": {"username": "kubernetes-admin", "groups": ["system:masters"]},
                "object": pod(name),
                "oldObject": None,
                "dryRun": False,
                "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"},
            },
        }
    )


async def serve(cert_dir: str, port_file: str) -> None:
    """The child: the real server and mutator on a cache stub, until killed."""
    import anyio

    from sdgruntime import errors
    from sdgruntime.kinds import NODES
    from sdgruntime.webhook.server import WebhookServer
    from webhooks.podmutator import PodMutator

    class Cache:
        def get(self, kind: Any, name: str, namespace: str | None = None, *, copy: bool = True):
            obj = NODE if kind == NODES else GROUP if name == "g" else None
            if obj is None:
                raise errors.NotFound(name)
            return obj

        def find(self, kind: Any, name: str, namespace: str | None = None, *, copy: bool = True):
            return None  # no RuntimeClass: the pod mutator's one lookup that may miss

    server = WebhookServer("127.0.0.1", 0, cert_dir)
    server.register("/mutate-v1-pod", PodMutator(Cache(), None))  # type: ignore[arg-type]
    async with anyio.create_task_group() as tg:
        port = await tg.start(server.serve)
        await anyio.Path(port_file).write_text(str(port))


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def drive(port: int, ca: str, n: int, in_flight: int, fresh: bool) -> float:
    import aiohttp

    ctx = ssl.create_default_context(cafile=ca)
    ctx.set_alpn_protocols(["http/1.1"])  # as Go's transport with HTTP/2 disabled
    connector = aiohttp.TCPConnector(ssl=ctx, limit=0, force_close=fresh)
    url = f"https://127.0.0.1:{port}/mutate-v1-pod?timeout=10s"
    bodies = [review(f"p{i}") for i in range(n)]
    sem = asyncio.Semaphore(in_flight)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one(body: bytes) -> None:
            async with (
                sem,
                session.post(url, data=body, headers={"content-type": "application/json"}) as resp,
            ):
                assert resp.status == 200, await resp.text()
                assert b'"allowed":true' in await resp.read()

        started = time.perf_counter()
        await asyncio.gather(*(one(b) for b in bodies))
        return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--reviews", type=int, default=4000)
    parser.add_argument("--in-flight", type=int, default=25)
    parser.add_argument("--py-spy", type=Path, help="record the server into this file")
    parser.add_argument(
        "--py-spy-round", choices=("keep-alive", "new connection"), default="keep-alive"
    )
    parser.add_argument("--serve", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        import anyio

        anyio.run(serve, *args.serve)
        return 0
    from sdgruntime.envtest.certs import CertificateAuthority

    work = Path(tempfile.mkdtemp(prefix="bench-webhook-"))
    ca = CertificateAuthority()
    ca.serving(["127.0.0.1"]).write(work, "tls.crt", "tls.key")
    (work / "ca.crt").write_bytes(ca.cert_pem)
    port_file = work / "port"
    child = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(work), str(port_file)],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        while not port_file.exists() or not port_file.read_text():
            time.sleep(0.05)
        port = int(port_file.read_text())
        asyncio.run(drive(port, str(work / "ca.crt"), 200, args.in_flight, False))  # warm up
        print(f"{args.reviews} pod CREATE reviews, {args.in_flight} in flight, server CPU:")
        for label, fresh in (("keep-alive", False), ("new connection", True)):
            spy = None
            if args.py_spy and label == args.py_spy_round:
                exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
                spy = subprocess.Popen(
                    [
                        exe,
                        "record",
                        "-p",
                        str(child.pid),
                        "-r",
                        "200",
                        "-f",
                        "raw",
                        "-o",
                        str(args.py_spy),
                        "--nonblocking",
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                time.sleep(1.0)
            before = cpu_seconds(child.pid)
            wall = asyncio.run(
                drive(port, str(work / "ca.crt"), args.reviews, args.in_flight, fresh)
            )
            cpu = cpu_seconds(child.pid) - before
            if spy is not None:
                spy.send_signal(2)
                spy.wait(timeout=30)
            print(
                f"  {label:>15}: {cpu / args.reviews * 1e6:6.0f} us CPU per review, "
                f"{args.reviews / wall:6.0f} reviews/s"
            )
    finally:
        child.kill()
        child.wait()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

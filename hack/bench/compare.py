"""SDG side by side with kube-scheduler, a raw binder and a kopf operator, in one run.

``make bench-compare`` (or ``.venv/bin/python hack/bench/compare.py [--scale small]``)
starts the local control plane once (etcd + kube-apiserver, CRD, ``config/rbac``) and, in
turn on that one API server, runs each contender as its own process:

- the SDG manager (``python -m controllers --leader-elect``, its default workers, as
  ``hack/demo.py`` starts it) under its ServiceAccount's RBAC, webhooks called over TLS;
- kube-scheduler from the cached ``hack/controlplane`` build (client QPS/burst 5000, no
  leader election);
- ``raw_binder.py``: Binding POSTs from one Python process (aiohttp, 32 in flight);
- ``floor.py``: S1's per-pod API traffic (pod webhook answers, Binding and Event POSTs)
  from one Python process and nothing else, the control run for S9 and, its webhook
  answers alone in S8's paced rounds, for S8;
- ``status_floor.py``: S4's status writes from one Python process (a pod watch and the
  merge patches, 8 at a time) and nothing else, the control run for S4;
- ``kopf_peer.py``: SDG's status controller as an idiomatic kopf operator.

Each is authenticated as it runs in a cluster: kube-scheduler as ``system:kube-scheduler``
with a client certificate (kubeadm's scheduler.conf), every Python contender with a
ServiceAccount token (as a pod does). The API server caches a token's verdict for 10 s
and verifies a certificate on every request, so this decides part of its CPU per request
(S10).

It prints S1-S8 (the goals of the "faster than kube-scheduler and kopf" issue), each as
SDG's value, its yardstick measured in the same run, and the ratio, with the machine and
the command; it rewrites the ``compare`` section of hack/bench/RESULTS.md. Each ratio is
against a yardstick measured minutes apart on the same machine, because absolute numbers
on a shared 2-core VM are noisy. With py-spy installed, the manager and the floor are
sampled in a second, shorter S1 run (py-spy pauses what it samples: ``Run.profiled``).

A benchmark, never a timed test: nothing here passes or fails.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import dataclasses
import datetime as dt
import json
import logging
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
for p in (str(HERE), str(ROOT)):
    if p not in sys.path:
        sys.path.insert(0, p)

import _pyspy  # noqa: E402
import aiohttp  # noqa: E402
from _kube import (  # noqa: E402
    ApiError,
    Kube,
    Stopwatch,
    bounded,
    cpu_seconds,
    memory,
    reset_peak,
)
from _pprof import ApiServerProfile  # noqa: E402
from _report import machine, summary, update_section  # noqa: E402

from sdgruntime.envtest import ControlPlane  # noqa: E402
from sdgruntime.envtest.controlplane import _die_with_parent, free_port  # noqa: E402
from sdgruntime.envtest.fakes import make_node  # noqa: E402
from tests.e2e.harness import (  # noqa: E402
    MANAGER_NS,
    SA_USER,
    install_rbac,
    remove_webhooks,
)

log = logging.getLogger("compare")
Obj = dict[str, Any]

GPU = "nvidia.com/gpu"
TOKEN_SECONDS = 24 * 3600  # the contenders' ServiceAccount tokens outlast any run
SHARED = {"deviceshare.io/mode": "shared"}
GROUP_ANNOTATION = "deviceshare.io/group"
SDG_PATH = "/apis/deviceshare.io/v1alpha1/shareddevicegroups"
LEASE_PATH = f"/apis/coordination.k8s.io/v1/namespaces/{MANAGER_NS}/leases/deviceshare-manager"
NOBODY = "bench-nobody"  # a schedulerName no scheduler serves: pods stay unbound


@dataclasses.dataclass(frozen=True)
class Scale:
    nodes: int  # S1-S3 fleet
    groups: int  # S1 groups, one GPU each, spread: one per node
    pods: int  # S1 streaming pods and S2 backlog
    big_nodes: int  # S4/S6/S7 fleet
    big_groups: int
    big_pods: int
    s8_rate: float
    s8_pods: int
    placement_iters: int


SCALES = {
    "full": Scale(500, 500, 5000, 1000, 2000, 10000, 200.0, 2000, 1000),
    "small": Scale(50, 50, 500, 100, 200, 1000, 200.0, 600, 300),
}


# --- objects -----------------------------------------------------------------------------


def node_obj(i: int) -> Obj:
    return make_node(f"node-{i:04d}", labels=SHARED, allocatable={GPU: 8})


def group_obj(name: str) -> Obj:
    return {
        "apiVersion": "deviceshare.io/v1alpha1",
        "kind": "SharedDeviceGroup",
        "metadata": {"name": name},
        "spec": {"resources": {GPU: 1}, "schedulingStrategy": "spread"},
    }


def group_pod(name: str, group: str, scheduler: str | None = None) -> Obj:
    spec: Obj = {"containers": [{"name": "c0", "image": "busybox", "command": ["sleep", "3600"]}]}
    if scheduler:
        spec["schedulerName"] = scheduler
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": {GROUP_ANNOTATION: group}},
        "spec": spec,
    }


def twin_pod(mutated: Obj, name: str, node: str, scheduler: str | None) -> Obj:
    """The same pod as SDG's webhook made it (env, toleration), without the group
    annotation, for another scheduler: pinned to ``node`` by node affinity on
    ``metadata.name`` (no nodeName), or left to ``scheduler``."""
    spec = copy.deepcopy(mutated["spec"])
    for key in ("nodeName", "schedulerName"):
        spec.pop(key, None)
    if scheduler:
        spec["schedulerName"] = scheduler
    spec["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                ]
            }
        }
    }
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def pods_path(ns: str) -> str:
    return f"/api/v1/namespaces/{ns}/pods"


# --- processes ---------------------------------------------------------------------------


class Proc:
    """A contender's process, its log in the work dir; dies with this process."""

    def __init__(self, name: str, cmd: list[str], log_path: Path, env: dict[str, str]) -> None:
        self.name, self.cmd, self.log_path = name, cmd, log_path
        self.t_spawn = time.perf_counter()
        self.popen = subprocess.Popen(
            cmd,
            cwd=ROOT,
            stdout=log_path.open("ab"),
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            preexec_fn=_die_with_parent,
        )
        self.pid = self.popen.pid

    def check(self) -> None:
        if self.popen.poll() is not None:
            tail = self.log_path.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{self.name} exited with {self.popen.returncode}:\n{tail}")

    async def stop(self, grace: float = 30.0) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                await asyncio.to_thread(self.popen.wait, grace)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()


async def wait_http_ok(proc: Proc, url: str, within: float = 120.0) -> float:
    """Seconds from spawn until ``url`` answers 200 (polled every 20 ms)."""
    deadline = time.monotonic() + within
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=False)) as http:
        while time.monotonic() < deadline:
            proc.check()
            with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError, OSError):
                async with http.get(url, timeout=aiohttp.ClientTimeout(total=1)) as r:
                    if r.status == 200:
                        return time.perf_counter() - proc.t_spawn
            await asyncio.sleep(0.02)
    raise RuntimeError(f"{proc.name}: {url} not OK within {within}s; see {proc.log_path}")


def last_json_line(path: Path) -> Any:
    """The summary a helper process printed last (None if it printed none)."""
    for line in reversed(path.read_text(errors="replace").strip().splitlines()):
        with contextlib.suppress(ValueError):
            return json.loads(line)
    return None


async def settle(pid: int, max_wait: float = 20.0, idle: float = 0.05) -> float:
    """Wait until the process uses under ``idle`` CPU-s per second (or ``max_wait``)."""
    t0 = time.perf_counter()
    last = cpu_seconds(pid)
    while time.perf_counter() - t0 < max_wait:
        await asyncio.sleep(1.0)
        now = cpu_seconds(pid)
        if now - last < idle:
            break
        last = now
    return time.perf_counter() - t0


class Env:
    """The one control plane and how each contender is started on it."""

    def __init__(self, cp: ControlPlane, work: Path, manager_flags: Sequence[str] = ()) -> None:
        self.cp = cp
        self.work = work
        self.manager_flags = list(manager_flags)
        # Each contender authenticates as it runs in a cluster. SDG, the floors, the raw
        # binder and kopf run in pods: ServiceAccount tokens, whose verdict the API server
        # caches. kube-scheduler runs with a client certificate (kubeadm's scheduler.conf,
        # k3s's too), verified on each request; so does this script's load (the admin).
        self.sa_kubeconfig = str(
            cp.service_account_kubeconfig(MANAGER_NS, SA_USER.rsplit(":", 1)[1], TOKEN_SECONDS)
        )
        self.admin_kubeconfig = str(cp.kubeconfig_path)
        # kubeadm's scheduler.conf: the user system:kube-scheduler, whom the API server's
        # bootstrap RBAC grants what a scheduler does (the admin would skip RBAC and flow
        # control, which no scheduler in a cluster does).
        self.scheduler_kubeconfig = str(cp.user_kubeconfig("system:kube-scheduler"))
        kopf_sa = "kopf-peer"
        self.operator_kubeconfig = str(
            cp.service_account_kubeconfig(MANAGER_NS, kopf_sa, TOKEN_SECONDS)
        )
        cp.bind_cluster_role(f"system:serviceaccount:{MANAGER_NS}:{kopf_sa}", "cluster-admin")
        self.binaries = cp.binaries
        self.env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.commands: dict[str, str] = {}

    async def manager(self, tag: str) -> tuple[Proc, int, float]:
        """The real manager process; returns it, its webhook port and seconds to Ready."""
        webhook_port, probe_port = free_port(), free_port()
        cmd = [
            sys.executable,
            "-m",
            "controllers",
            f"--kubeconfig={self.sa_kubeconfig}",
            "--webhook-host=127.0.0.1",
            f"--webhook-port={webhook_port}",
            f"--webhook-cert-dir={self.cp.webhook_cert_dir()}",
            "--metrics-bind-address=127.0.0.1:0",
            f"--health-probe-bind-address=127.0.0.1:{probe_port}",
            "--leader-elect",
            f"--leader-election-namespace={MANAGER_NS}",
            f"--claims-namespace={MANAGER_NS}",
            # The fleet's nodes are fake (no kubelet, no device manager): nothing could give
            # a holder pod its devices, so the rows run with holders off (as before them).
            "--holders=off",
            *self.manager_flags,  # --manager-flag: later flags win
        ]
        self.commands.setdefault("SDG manager", shlex.join(["python", *cmd[1:]]))
        proc = Proc(f"sdg-manager ({tag})", cmd, self.work / f"manager-{tag}.log", self.env)
        ready = await wait_http_ok(proc, f"http://127.0.0.1:{probe_port}/readyz")
        return proc, webhook_port, ready

    async def kube_scheduler(self, tag: str) -> tuple[Proc, float]:
        port = free_port()
        config = self.work / "kube-scheduler.yaml"
        config.write_text(
            "apiVersion: kubescheduler.config.k8s.io/v1\n"
            "kind: KubeSchedulerConfiguration\n"
            "clientConnection:\n"
            f"  kubeconfig: {self.scheduler_kubeconfig}\n"
            "  qps: 5000\n"
            "  burst: 5000\n"
            "leaderElection:\n"
            "  leaderElect: false\n"
        )
        assert self.binaries is not None
        cmd = [
            str(self.binaries / "kube-scheduler"),
            f"--config={config}",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            "--authentication-skip-lookup",
            "-v=1",
        ]
        self.commands.setdefault("kube-scheduler", shlex.join(cmd))
        proc = Proc(f"kube-scheduler ({tag})", cmd, self.work / f"kube-scheduler-{tag}.log", {})
        ready = await wait_http_ok(proc, f"https://127.0.0.1:{port}/readyz")
        return proc, ready

    async def kopf(self) -> tuple[Proc, float]:
        port = free_port()
        cmd = [
            sys.executable,
            "-m",
            "kopf",
            "run",
            "--standalone",
            "--all-namespaces",
            f"--liveness=http://127.0.0.1:{port}/healthz",
            str(HERE / "kopf_peer.py"),
        ]
        self.commands.setdefault("kopf peer", shlex.join(["python", *cmd[1:]]))
        env = {**self.env, "KUBECONFIG": self.operator_kubeconfig}
        proc = Proc("kopf peer", cmd, self.work / "kopf.log", env)
        ready = await wait_http_ok(proc, f"http://127.0.0.1:{port}/healthz")
        return proc, ready

    def raw_binder_cmd(self, jobs: Path) -> list[str]:
        cmd = [
            sys.executable,
            str(HERE / "raw_binder.py"),
            f"--kubeconfig={self.sa_kubeconfig}",
            f"--jobs={jobs}",
            "--in-flight=32",
        ]
        self.commands.setdefault("raw binder", shlex.join(["python", *cmd[1:]]))
        return cmd

    async def floor(
        self, tag: str, ns: str, templates: Path, nodes: Path
    ) -> tuple[Proc, int, float]:
        """``floor.py`` serving the pod webhook and binding ``ns``'s pods (as SDG's
        ServiceAccount, so its Bindings skip SDG's binding webhook); returns it, its
        webhook port and seconds to Ready."""
        port = free_port()
        cmd = [
            sys.executable,
            str(HERE / "floor.py"),
            f"--kubeconfig={self.sa_kubeconfig}",
            f"--cert-dir={self.cp.webhook_cert_dir()}",
            f"--port={port}",
            f"--namespace={ns}",
            f"--templates={templates}",
            f"--nodes={nodes}",
            "--in-flight=32",
        ]
        self.commands.setdefault("Python floor", shlex.join(["python", *cmd[1:]]))
        proc = Proc(f"floor ({tag})", cmd, self.work / f"floor-{tag}.log", self.env)
        # https with an unverified context: the certificate is the webhook service's
        ready = await wait_http_ok(proc, f"https://127.0.0.1:{port}/readyz")
        return proc, port, ready

    async def status_floor(self, ns: str, writers: int = 8) -> tuple[Proc, float]:
        """``status_floor.py`` keeping the status of ``ns``'s groups (as SDG's
        ServiceAccount, ``writers`` at a time as SDG's 8 status workers); returns it and
        seconds to Ready."""
        port = free_port()
        cmd = [
            sys.executable,
            str(HERE / "status_floor.py"),
            f"--kubeconfig={self.sa_kubeconfig}",
            f"--namespace={ns}",
            f"--port={port}",
            f"--writers={writers}",
        ]
        self.commands.setdefault("status floor", shlex.join(["python", *cmd[1:]]))
        proc = Proc("status floor", cmd, self.work / "status-floor.log", self.env)
        ready = await wait_http_ok(proc, f"http://127.0.0.1:{port}/readyz")
        return proc, ready

    def webhooks(self, port: int | None) -> None:
        """Register SDG's webhooks at ``port`` (None: remove them)."""
        if port is None:
            remove_webhooks(self.cp)
        else:
            self.cp.install_webhooks([ROOT / "config" / "webhook"], port)


# --- the API side ------------------------------------------------------------------------


class Watch:
    """list + watch of a collection, ``on(type, obj)`` called as events arrive."""

    def __init__(self, kube: Kube, path: str, on: Callable[[str, Obj], None]) -> None:
        self.kube, self.path, self.on = kube, path, on
        self.task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Watch:
        items, rv = await self.kube.list(self.path)
        for obj in items:
            self.on("ADDED", obj)
        self.task = asyncio.create_task(self.kube.watch(self.path, rv, self.on))
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.task is not None
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


class FirstSeen:
    """When each of ``names`` first satisfied ``done`` on a watch; ``event`` once all did."""

    def __init__(self, names: list[str], done: Callable[[Obj], bool]) -> None:
        self.names, self.done = set(names), done
        self.first: dict[str, float] = {}
        self.event = asyncio.Event()

    def __call__(self, typ: str, obj: Obj) -> None:
        if typ == "DELETED":
            return
        name = obj["metadata"]["name"]
        if name in self.names and name not in self.first and self.done(obj):
            self.first[name] = time.perf_counter()
            if len(self.first) == len(self.names):
                self.event.set()

    async def wait(self, within: float) -> None:
        try:
            await asyncio.wait_for(self.event.wait(), within)
        except TimeoutError:
            raise RuntimeError(
                f"only {len(self.first)} of {len(self.names)} within {within:.0f}s"
            ) from None


class StatusConverged:
    """S4's judge, a Watch handler on groups: ``done`` is set while every expected group's
    ``podCount``/``allocatedPods`` equal its pods; ``t``/``cpu`` are when that became true
    (and the ``cpu()`` reading then), reset if a later write undoes it."""

    def __init__(self, expected: dict[str, set[str]], cpu: Callable[[], dict[str, float]]):
        self.expected = expected
        self.bad = set(expected)
        self.cpu_of = cpu
        self.t: float | None = None
        self.cpu: dict[str, float] | None = None
        self.done = asyncio.Event()

    def __call__(self, typ: str, obj: Obj) -> None:
        name = obj["metadata"]["name"]
        if name not in self.expected or typ == "DELETED":
            return
        st = obj.get("status") or {}
        want = self.expected[name]
        if st.get("podCount") == len(want) and set(st.get("allocatedPods") or ()) == want:
            self.bad.discard(name)
            if not self.bad and self.t is None:
                self.t, self.cpu = time.perf_counter(), self.cpu_of()
                self.done.set()
        else:
            self.bad.add(name)
            self.t = None
            self.done.clear()

    async def wait(self, within: float, holds: float = 3.0) -> None:
        """Until converged and still so ``holds`` seconds later."""
        deadline = time.monotonic() + within
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RuntimeError(f"{len(self.bad)} groups not converged in {within:g} s")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.done.wait(), remaining)
            await asyncio.sleep(holds)  # it holds: no later write undid it
            if self.done.is_set():
                return


def has_node(pod: Obj) -> bool:
    return bool((pod.get("spec") or {}).get("nodeName"))


def is_bound(group: Obj) -> bool:
    return (group.get("status") or {}).get("phase") == "Bound"


@dataclasses.dataclass
class Made:
    t_first: float  # perf_counter when the first POST went
    t_last: float  # ... and when the last answer came
    lat: list[float]

    @property
    def create_s(self) -> float:
        return self.t_last - self.t_first


async def create_all(kube: Kube, path: str, objs: list[Obj], in_flight: int) -> Made:
    """POST every object, ``in_flight`` at a time."""
    made = Made(time.perf_counter(), 0.0, [])

    def job(obj: Obj) -> Callable[[], Any]:
        async def run() -> None:
            t = time.perf_counter()
            await kube.request("POST", path, obj)
            made.lat.append(time.perf_counter() - t)

        return run

    await bounded(in_flight, [job(o) for o in objs])
    made.t_last = time.perf_counter()
    return made


async def create_nodes(kube: Kube, first: int, last: int, in_flight: int) -> float:
    async def one(i: int) -> None:
        node = node_obj(i)
        created = await kube.request("POST", "/api/v1/nodes", node)
        created["status"] = node["status"]
        await kube.request("PUT", f"/api/v1/nodes/{node['metadata']['name']}/status", created)

    t0 = time.perf_counter()
    await bounded(in_flight, [lambda i=i: one(i) for i in range(first, last)])
    return time.perf_counter() - t0


async def delete_pods(kube: Kube, ns: str, within: float = 300.0) -> None:
    """Delete every pod of ``ns`` (a DELETE of the collection, grace 0) until none is left;
    a collection delete that outlives the API server's request timeout (an error, or its
    answer, the deleted pods, cut short) is sent again."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        with contextlib.suppress(ApiError, aiohttp.ClientPayloadError):
            await kube.request("DELETE", pods_path(ns), params={"gracePeriodSeconds": "0"})
        page = await kube.request("GET", pods_path(ns), params={"limit": "1"})
        if not page.get("items"):
            return
        await asyncio.sleep(0.5)
    raise RuntimeError(f"pods of {ns} not gone within {within}s")


async def wait_groups_empty(kube: Kube, within: float = 300.0) -> None:
    """Until every group's status says no pods (its status controller caught up)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        groups, _ = await kube.list(SDG_PATH)
        if all(not (g.get("status") or {}).get("podCount") for g in groups):
            return
        await asyncio.sleep(0.5)
    raise RuntimeError(f"group statuses still list pods after {within}s")


async def wait_webhook(kube: Kube, ns: str, group: str, on: bool, within: float = 30.0) -> None:
    """Until the API server does (or no longer does) call SDG's pod webhook: a dry-run
    create of a group pod comes back with (without) SDG's schedulerName."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        pod = group_pod("webhook-probe", group)
        made = await kube.request("POST", pods_path(ns), pod, params={"dryRun": "All"})
        if (made["spec"].get("schedulerName") == "deviceshare-scheduler") == on:
            return
        await asyncio.sleep(0.2)
    raise RuntimeError(f"pod webhook still {'off' if on else 'on'} after {within}s")


async def hold_lease(kube: Kube, holder: str, seconds: int) -> None:
    """Take (or give up, ``holder=""``) the manager's Lease, so that a manager started
    now serves webhooks but does not lead (schedule) until the bench lets it."""
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    spec = {"holderIdentity": holder, "leaseDurationSeconds": seconds, "renewTime": now}
    try:
        await kube.request(
            "PATCH", LEASE_PATH, {"spec": spec}, content_type="application/merge-patch+json"
        )
    except ApiError as e:
        if e.status != 404:
            raise
        lease = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": "deviceshare-manager", "namespace": MANAGER_NS},
            "spec": {**spec, "acquireTime": now},
        }
        await kube.request("POST", LEASE_PATH.rsplit("/", 1)[0], lease)


async def manager_metrics(mgr: Proc) -> str | None:
    """The manager's ``/metrics`` text (its metrics port from its log); None if unreadable."""
    match = re.search(
        r"metrics server listening on ([\d.]+:\d+) \(http\)", mgr.log_path.read_text()
    )
    if match is None:
        return None
    try:
        async with aiohttp.ClientSession() as http, http.get(f"http://{match[1]}/metrics") as r:
            return await r.text()
    except aiohttp.ClientError:
        return None


async def webhook_connections(mgr: Proc) -> float | None:
    """Connections the manager's webhook server has accepted so far
    (``sdgruntime_http_connections_total``); None if unreadable. Each is a TLS handshake on
    both sides, so S1 shows how often the API server's webhook client dials instead of
    reusing a connection."""
    text = await manager_metrics(mgr)
    if text is None:
        return None
    total = 0.0
    for line in text.splitlines():
        if line.startswith("sdgruntime_http_connections_total{") and 'server="webhook"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


async def webhook_calls(kube: Kube) -> tuple[float, float]:
    """The API server's mutating webhook calls on CREATE so far, as it timed them from
    dispatch to the patch applied (``apiserver_admission_webhook_admission_duration_seconds``,
    type admit): (seconds, calls)."""
    assert kube.session is not None
    async with kube.session.get("/metrics") as resp:
        text = await resp.text()
    metric = "apiserver_admission_webhook_admission_duration_seconds"
    secs = calls = 0.0
    for line in text.splitlines():
        if 'operation="CREATE"' not in line or 'type="admit"' not in line:
            continue
        if line.startswith(f"{metric}_sum"):
            secs += float(line.rsplit(" ", 1)[1])
        elif line.startswith(f"{metric}_count"):
            calls += float(line.rsplit(" ", 1)[1])
    return secs, calls


def per_call_ms(before: tuple[float, float], after: tuple[float, float]) -> float | None:
    """Mean ms per webhook call between two ``webhook_calls`` readings (None: no call)."""
    calls = after[1] - before[1]
    return (after[0] - before[0]) / calls * 1e3 if calls > 0 else None


async def floor_connections(port: int) -> float | None:
    """Connections the floor's webhook server has accepted so far (``GET /connections``);
    None if unreadable."""
    try:
        async with (
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=False)) as http,
            http.get(f"https://127.0.0.1:{port}/connections") as r,
        ):
            return float(await r.text()) if r.status == 200 else None
    except (aiohttp.ClientError, ValueError):
        return None


#: S1 measures each contender's CPU-s per second while idle, just before its creates.
IDLE_SECONDS = 3.0
#: Pods of S1's second, profiled run (``Run.profiled``): enough samples for the parts.
PROFILED_PODS = 2000


#: What settle_writes watches: every kind the contenders write in S1, but Leases.
SETTLE_WATCHED = ("/api/v1/events", "/api/v1/pods", "/api/v1/configmaps", SDG_PATH)


async def settle_writes(kube: Kube, quiet: float = 1.0, limit: float = 60.0) -> float:
    """Waits until nothing in ``SETTLE_WATCHED`` has changed for ``quiet`` seconds, at
    most ``limit``; the seconds waited. What a contender defers past its last bind (Events
    its recorder paces, batched status writes) then falls in its phase. Watches, not the
    API server's /metrics: polled five times a second, those scrapes were a tenth of its
    CPU in SDG's S1 phase, and more the longer a contender took to settle."""
    t0 = time.perf_counter()
    last = [t0]

    def changed(_type: str, _obj: Obj) -> None:
        last[0] = time.perf_counter()

    tasks: list[asyncio.Task[None]] = []
    try:
        for path in SETTLE_WATCHED:
            head = await kube.request("GET", path, params={"limit": "1"})
            rv = head["metadata"]["resourceVersion"]
            tasks.append(asyncio.create_task(kube.watch(path, rv, changed)))
        while True:
            now = time.perf_counter()
            if now - last[0] >= quiet or now - t0 >= limit:
                return now - t0
            for task in tasks:
                if task.done():
                    task.result()  # a watch that failed says why
            await asyncio.sleep(0.1)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def made_pods(kube: Kube, ns: str) -> dict[str, Obj]:
    """Per group, one of ``ns``'s pods as SDG's webhook made it (the floor's templates)."""
    items, _ = await kube.list(pods_path(ns))
    made: dict[str, Obj] = {}
    for pod in items:
        made.setdefault(pod["metadata"]["annotations"][GROUP_ANNOTATION], pod)
    return made


async def ensure_namespace(kube: Kube, name: str) -> None:
    with contextlib.suppress(ApiError):
        await kube.request("POST", "/api/v1/namespaces", {"metadata": {"name": name}})


# --- profiling ---------------------------------------------------------------------------


class PySpy:
    """``py-spy record`` of a process (100 Hz; idle stacks dropped; the process is paused
    for each sample, so stacks are whole). ``--native``: C frames too, so a thread woken in
    the event loop's poll but waiting for a core is told from one using it
    (``_pyspy.WAITING``)."""

    def __init__(self, pid: int, out: Path) -> None:
        self.out = out
        exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        self.proc: subprocess.Popen[bytes] | None = None
        if Path(exe).is_file():
            self.proc = subprocess.Popen(
                [
                    *(exe, "record", "--pid", str(pid), "--rate", "100", "--native"),
                    *("--function", "--format", "raw", "--output", str(out)),
                ],
                stdout=subprocess.DEVNULL,
                stderr=out.with_suffix(".log").open("wb"),
                preexec_fn=_die_with_parent,
            )

    def stop(self) -> dict[str, Any] | None:
        if self.proc is None:
            return None
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return None
        return summarize_stacks(self.out) if self.out.exists() else None


def _short(frame: str) -> str:
    """``fn (path/to/file.py:12)`` -> ``fn (pkg/file.py)``: site-packages and the repo
    root cut off, the line dropped (py-spy --function gives the function's first line)."""
    name, _, where = frame.partition(" (")
    where = where.rstrip(")")
    path = where.rsplit(":", 1)[0]
    for marker in ("site-packages/", "lib/python3.11/", str(ROOT) + "/"):
        if marker in path:
            path = path.split(marker, 1)[1]
    return f"{name} ({path})"


def summarize_stacks(path: Path, top: int = 15) -> dict[str, Any]:
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or _pyspy.waiting(stack.split(";")):
            continue
        n = int(count)
        frames = [_short(f) for f in stack.split(";")]
        total += n
        own[frames[-1]] += n
        for f in set(frames):
            inclusive[f] += n
    ours = ("sdgruntime/", "controllers/", "webhooks/", "api/")
    mine = Counter({f: n for f, n in inclusive.items() if f.split(" (", 1)[-1].startswith(ours)})
    for entry in ("main (controllers/__main__.py)", "<module> (controllers/__main__.py)"):
        mine.pop(entry, None)
    return {"samples": total, "own": own.most_common(top), "inclusive": mine.most_common(top)}


# --- the scenarios -----------------------------------------------------------------------


class Run:
    def __init__(self, args: argparse.Namespace, scale: Scale) -> None:
        self.args, self.scale = args, scale
        self.out: dict[str, Any] = {
            "scale": args.scale,
            "sizes": dataclasses.asdict(scale),
            "in_flight": args.in_flight,
        }
        self.phases: list[dict[str, Any]] = []
        self.work = Path(args.work_dir) if args.work_dir else None
        if self.work is not None:
            self.work.mkdir(parents=True, exist_ok=True)
        self.group_nodes: dict[str, str] = {}  # S1 group -> its node
        self.procs: list[Proc] = []

    async def stopwatch(self, pids: dict[str, int]) -> Stopwatch:
        """A Stopwatch that also counts the API server's writes from now on."""
        sw = Stopwatch(pids)
        sw.writes0 = await self.kube.writes()
        return sw

    async def phase(
        self, name: str, sw: Stopwatch, cpu: dict[str, float] | None = None, **extra: Any
    ) -> None:
        cpu = cpu or sw.cpu()
        wall = sw.wall()
        writes = {}
        if sw.writes0 is not None:
            after = await self.kube.writes()
            writes = {k: n - sw.writes0.get(k, 0) for k, n in after.items()}
            writes = {k: n for k, n in sorted(writes.items(), key=lambda kv: -kv[1]) if n > 0}
        self.phases.append({"name": name, "wall": wall, "cpu": cpu, "writes": writes, **extra})
        log.warning("%s: %.1f s; CPU %s", name, wall, fmt_cpu(cpu))

    def api_profile(self, tag: str) -> ApiServerProfile:
        """The API server's CPU profile from now on (``stop()`` gives its parts)."""
        assert self.kube.session is not None
        return ApiServerProfile(self.kube.session, self.env.work, tag)

    def spy(self, proc: Proc, phase: str) -> PySpy | None:
        """A py-spy of ``proc`` into ``py-spy-PHASE.txt`` beside its log, unless
        ``--no-py-spy``."""
        if not self.args.py_spy:
            return None
        return PySpy(proc.pid, proc.log_path.parent / f"py-spy-{phase}.txt")

    def pids(self, **procs: Proc | None) -> dict[str, int]:
        out = {"kube-apiserver": self.cp.pids["kube-apiserver"], "etcd": self.cp.pids["etcd"]}
        out.update({k: p.pid for k, p in procs.items() if p is not None})
        return out

    async def stop(self, proc: Proc) -> None:
        await proc.stop()
        if proc in self.procs:
            self.procs.remove(proc)

    # S5 needs no API server: before the control plane, with the machine otherwise idle.
    def s5_placement(self) -> None:
        """place() at 1000 nodes, each call timed on the wall clock and in this thread's
        CPU time: on a shared machine the wall-clock tail is mostly time the process
        waited for a core, which the CPU time leaves out."""
        import gc

        from bench_placement import build_fleet

        from controllers.placement import NodeMemo, place

        fleet = build_fleet(1000)
        memo = NodeMemo()  # as the group scheduler keeps one
        rows = {}
        for label, spec in (
            ("binpack 1 GPU", {"resources": {GPU: 1}}),
            ("spread 2 GPU", {"resources": {GPU: 2}, "schedulingStrategy": "spread"}),
        ):
            for _ in range(100):
                place(spec, fleet.nodes, fleet.tracker, memo=memo)
            wall: list[float] = []
            cpu: list[float] = []
            gc.collect()
            gc.disable()
            try:
                for _ in range(self.scale.placement_iters):
                    w0, c0 = time.perf_counter(), time.thread_time()
                    place(spec, fleet.nodes, fleet.tracker, memo=memo)
                    cpu.append(time.thread_time() - c0)
                    wall.append(time.perf_counter() - w0)
            finally:
                gc.enable()
            rows[label] = {"wall": summary(wall), "cpu": summary(cpu)}
        self.out["s5"] = rows

    async def run(self) -> dict[str, Any]:
        self.out["machine"] = machine()
        self.out["meminfo"] = meminfo()
        t_all = time.perf_counter()
        log.warning("S5: place() at 1000 nodes (in memory)")
        self.s5_placement()
        cp = ControlPlane(crd_paths=[ROOT / "config" / "crd"], work_dir=self.work)
        t0 = time.perf_counter()
        cp.start()
        self.cp = cp
        try:
            self.out["controlplane_start_s"] = time.perf_counter() - t0
            install_rbac(cp)
            env = Env(cp, cp.work_dir, self.args.manager_flag)
            self.env = env
            self.out["work_dir"] = str(cp.work_dir)
            async with Kube(env.admin_kubeconfig, limit=self.args.in_flight + 16) as kube:
                self.kube = kube
                version = await kube.request("GET", "/version")
                self.out["kubernetes"] = version.get("gitVersion", "?")
                await self.scenarios()
        finally:
            for proc in list(self.procs):
                await proc.stop(10)
            cp.stop()
        self.out["total_s"] = time.perf_counter() - t_all
        self.out["commands"] = self.env.commands
        self.out["phases"] = self.phases
        return self.out

    async def scenarios(self) -> None:
        sc, kube, env = self.scale, self.kube, self.env
        for ns in (
            "s1-sdg",
            "s1-kube",
            "s2-sdg",
            "s2-raw",
            "s4-sdg",
            "s4-floor",
            "s4-kopf",
            "s8-on",
            "s8f-on",
            "s8f-off",
        ):
            await ensure_namespace(kube, ns)
        await ensure_namespace(kube, "s8-off")
        await ensure_namespace(kube, "s1-floor")
        t = await create_nodes(kube, 0, sc.nodes, self.args.in_flight)
        log.warning("%d nodes in %.1f s", sc.nodes, t)

        # --- S3 and S1 with SDG --------------------------------------------------------
        mgr, port, _ = await env.manager("s1")
        self.procs.append(mgr)
        env.webhooks(port)
        groups = [f"g-{i:04d}" for i in range(sc.groups)]
        await self.s3_groups(mgr, groups, "S3: groups bound (webhooks on)")
        await wait_webhook(kube, "s1-sdg", groups[0], on=True)
        await self.s1_sdg(mgr, groups)
        await delete_pods(kube, "s1-sdg")
        await wait_groups_empty(kube)
        await self.stop(mgr)
        # kube-scheduler's Bindings (system:kube-scheduler's) are ones SDG's binding webhook
        # skips, but none may call the stopped manager.
        env.webhooks(None)

        # --- S1 with the Python floor: SDG's per-pod API traffic and nothing else -------
        templates = self.write_json("floor-templates.json", self.templates)
        nodes = self.write_json("floor-nodes.json", self.group_nodes)
        floor, port, _ = await env.floor("s1", "s1-floor", templates, nodes)
        self.procs.append(floor)
        env.webhooks(port)
        await wait_webhook(kube, "s1-floor", groups[0], on=True)
        await self.s1_floor(floor, groups, port)
        await self.stop(floor)
        env.webhooks(None)
        self.out["s1_floor"]["report"] = last_json_line(floor.log_path)
        await delete_pods(kube, "s1-floor")

        # --- S1 with kube-scheduler ------------------------------------------------------
        ks, _ = await env.kube_scheduler("s1")
        self.procs.append(ks)
        await self.s1_kube(ks)
        await self.stop(ks)
        await delete_pods(kube, "s1-kube")

        # --- S8 with SDG: a manager that serves webhooks but does not lead ---------------
        await hold_lease(kube, "bench-holds-the-lease", 3600)
        mgr, port, _ = await env.manager("s8")
        self.procs.append(mgr)
        self.out["s8"] = await self.s8(mgr, port, groups)
        await self.stop(mgr)
        env.webhooks(None)
        for ns in ("s8-on", "s8-off"):
            await delete_pods(kube, ns)
        # S8's control run: the same paced creates through a floor started as SDG's manager
        # was, so that both meet the API server with no connection of theirs open yet
        floor, port, _ = await env.floor("s8", "s8f-none", templates, nodes)
        self.procs.append(floor)
        self.out["s8_floor"] = await self.s8(floor, port, groups, ns="s8f")
        await self.stop(floor)
        env.webhooks(None)
        for ns in ("s8f-on", "s8f-off"):
            await delete_pods(kube, ns)

        # --- S2 with SDG: the backlog made while the manager does not lead ---------------
        mgr, port, _ = await env.manager("s2")
        self.procs.append(mgr)
        env.webhooks(port)
        await wait_webhook(kube, "s2-sdg", groups[0], on=True)
        backlog = await self.s2_backlog(mgr, groups)
        env.webhooks(None)
        await self.s2_sdg(mgr, backlog)
        await delete_pods(kube, "s2-sdg")
        await wait_groups_empty(kube)
        await self.stop(mgr)

        # --- S2 with the raw binder ------------------------------------------------------
        await self.s2_raw(backlog)
        await delete_pods(kube, "s2-raw")

        # --- S4 with SDG (webhooks off), on the big fleet ---------------------------------
        t = await create_nodes(kube, sc.nodes, sc.big_nodes, self.args.in_flight)
        log.warning("%d more nodes in %.1f s", sc.big_nodes - sc.nodes, t)
        mgr, _, _ = await env.manager("s4")
        self.procs.append(mgr)
        more = [f"g-{i:04d}" for i in range(sc.groups, sc.big_groups)]
        await self.s3_groups(mgr, more, "S3b: groups bound at the big fleet (webhooks off)")
        all_groups = groups + more
        # Unsampled, as kopf is: py-spy pauses what it samples (``Run.profiled``); S4's
        # profile is ``ab.py --only s4 --py-spy``'s.
        await self.s4(mgr, "s4-sdg", all_groups, S4_SDG)
        await delete_pods(kube, "s4-sdg")
        await wait_groups_empty(kube)
        await self.stop(mgr)

        # --- S4 with the status floor: the status writes and nothing else ----------------
        floor, _ = await env.status_floor("s4-floor")
        self.procs.append(floor)
        await self.s4(floor, "s4-floor", all_groups, S4_FLOOR)
        await delete_pods(kube, "s4-floor")
        await wait_groups_empty(kube)
        await self.stop(floor)
        self.out["s4_floor"]["report"] = last_json_line(floor.log_path)

        # --- S4 with kopf ----------------------------------------------------------------
        kopf, _ = await env.kopf()
        self.procs.append(kopf)
        await asyncio.sleep(2)  # its watches are up a moment after the liveness endpoint
        await self.s4(kopf, "s4-kopf", all_groups, S4_KOPF)  # no py-spy: see _pyspy.BLOCKING
        await self.stop(kopf)

        # --- S7 and S6: cold starts with the big fleet and its pods existing -------------
        await self.s6_s7()

    async def s3_groups(self, mgr: Proc, names: list[str], label: str) -> None:
        seen = FirstSeen(names, is_bound)
        nodes: dict[str, str] = {}

        def on(typ: str, obj: Obj) -> None:
            seen(typ, obj)
            if is_bound(obj):
                nodes[obj["metadata"]["name"]] = obj["status"]["nodeName"]

        sw = await self.stopwatch(self.pids(manager=mgr))
        async with Watch(self.kube, SDG_PATH, on):
            made = await create_all(
                self.kube, SDG_PATH, [group_obj(n) for n in names], self.args.in_flight
            )
            await seen.wait(600)
        last = max(seen.first[n] for n in names)
        secs = last - made.t_first
        self.group_nodes.update({n: nodes[n] for n in names})
        await self.phase(label, sw, groups=len(names), created_s=made.create_s, bound_s=secs)
        key = "s3" if "s3" not in self.out else "s3b"
        self.out[key] = {"groups": len(names), "bound_s": secs, "per_s": len(names) / secs}

    async def stream(
        self,
        name: str,
        ns: str,
        pods: list[Obj],
        pids: dict[str, int],
        spy: PySpy | None = None,
        profile_key: str = "profile",
        api_tag: str | None = None,
    ) -> dict[str, Any]:
        """S1's measure for one contender: ``pods`` created in ``ns`` (``in_flight`` at a
        time) on a watch opened before; first create -> last pod seen with a node. The
        phase ``name`` gets the CPU-s of ``pids`` until the writes settle after the last
        bind (``settle_writes``: Events written later still count; the writes of what came
        before settle before it starts); ``spy`` (of the one Python process in ``pids``)
        is stopped at the last bind, its summary in ``out[profile_key]``, its parts
        (``_pyspy``) in the phase; the API server's profile goes to ``pprof-API_TAG-*``
        (``ns`` by default)."""
        seen = FirstSeen([p["metadata"]["name"] for p in pods], has_node)
        await settle_writes(self.kube)  # what came before (S3's paced Events) is not S1's
        idle_sw = Stopwatch(pids)  # what each spends while nothing is asked of it
        await asyncio.sleep(IDLE_SECONDS)
        idle = {k: v / IDLE_SECONDS for k, v in idle_sw.cpu().items()}
        sw = await self.stopwatch(pids)
        api = self.api_profile(api_tag or ns)
        calls_before = await webhook_calls(self.kube)
        async with Watch(self.kube, pods_path(ns), seen):
            made = await create_all(self.kube, pods_path(ns), pods, self.args.in_flight)
            calls = await webhook_calls(self.kube)
            await seen.wait(900)
        if spy is not None:
            self.out[profile_key] = spy.stop()
        last = max(seen.first.values())
        secs = last - made.t_first
        at_bind = sw.cpu()
        settled = await settle_writes(self.kube)
        await self.phase(
            name, sw, pods=len(pods), created_s=made.create_s, cpu_at_last_bind=at_bind
        )
        self.phases[-1]["apiserver_parts"] = await api.stop()
        if spy is not None and spy.out.exists():
            (who,) = (k for k in pids if k not in ("kube-apiserver", "etcd", "bench"))
            self.phases[-1]["python_parts"] = {who: _pyspy.stack_parts(spy.out)}
        return {
            "pods": len(pods),
            "seconds": secs,
            "per_s": len(pods) / secs,
            "create_s": made.create_s,
            "after_last_create_s": last - made.t_last,
            "settle_s": settled,
            "idle_cpu_per_s": idle,
            "webhook_call_ms": per_call_ms(calls_before, calls),
        }

    async def s1_sdg(self, mgr: Proc, groups: list[str]) -> None:
        n = self.scale.pods
        pods = [group_pod(f"p-{i:05d}", groups[i % len(groups)]) for i in range(n)]
        self.out["profile"] = None
        opened = await webhook_connections(mgr)
        s1 = await self.stream(S1_SDG, "s1-sdg", pods, self.pids(manager=mgr))
        after = await webhook_connections(mgr)
        s1["webhook_connections"] = None if opened is None or after is None else after - opened
        self.out["s1_sdg"] = s1
        measured = self.phases[-1]
        # The pods as SDG's webhook made them: the other schedulers get the same ones.
        self.templates = await made_pods(self.kube, "s1-sdg")
        await self.profiled(measured, "s1-sdg", pods, self.pids(manager=mgr), mgr, "s1")

    async def profiled(
        self,
        measured: dict[str, Any],
        ns: str,
        pods: list[Obj],
        pids: dict[str, int],
        proc: Proc,
        phase: str,
        profile_key: str = "profile",
    ) -> None:
        """S1's parts for the Python contender ``proc``. py-spy pauses the process it
        samples 100 times a second: sampled, SDG's manager streamed S1 at 105 pods/s
        against 189 unsampled, and its webhook accepted 2,519 connections against 1,140
        (RESULTS.md, session 43). So the goal rows come from S1 unsampled (``measured``,
        its phase), and a second run of the first ``PROFILED_PODS`` of the same pods
        (new names), in ``ns`` again once the first are gone, is sampled: its samples
        share out the measured run's CPU (``measured["python_parts"]``). Nothing without
        py-spy."""
        spy = self.spy(proc, phase)
        if spy is None:
            return
        await delete_pods(self.kube, ns)
        await wait_groups_empty(self.kube)
        # New names: a contender may remember the pods it has seen by name (the floor does).
        again = [
            {**pod, "metadata": {**pod["metadata"], "name": f"again-{pod['metadata']['name']}"}}
            for pod in pods[:PROFILED_PODS]
        ]
        await self.stream(
            f"{measured['name']} (again, py-spy on)",
            ns,
            again,
            pids,
            spy,
            profile_key=profile_key,
            api_tag=f"{ns}-profiled",
        )
        parts = self.phases[-1].get("python_parts")
        if parts:
            measured["python_parts"] = parts

    def write_json(self, name: str, obj: Any) -> Path:
        path = self.env.work / name
        path.write_text(json.dumps(obj))
        return path

    async def s1_floor(self, floor: Proc, groups: list[str], port: int) -> None:
        """S1's pods, created as in ``s1_sdg``, through the floor's webhook and bound by
        it; then each pod is checked against its group's template and node."""
        n, ns = self.scale.pods, "s1-floor"
        pods = [group_pod(f"p-{i:05d}", groups[i % len(groups)]) for i in range(n)]
        opened = await floor_connections(port)
        s1 = await self.stream(S1_FLOOR, ns, pods, self.pids(floor=floor))
        after = await floor_connections(port)
        s1["webhook_connections"] = None if opened is None or after is None else after - opened
        self.out["s1_floor"] = s1
        measured = self.phases[-1]
        wrong = 0
        items, _ = await self.kube.list(pods_path(ns))
        for pod in items:
            group = pod["metadata"]["annotations"][GROUP_ANNOTATION]
            want = self.templates[group]
            wrong += pod["spec"].get("nodeName") != self.group_nodes[group]
            wrong += pod["metadata"]["annotations"] != want["metadata"]["annotations"]
            for key in ("schedulerName", "nodeSelector", "tolerations"):
                wrong += pod["spec"].get(key) != want["spec"].get(key)
            envs = [c.get("env") for c in pod["spec"]["containers"]]
            wrong += envs != [c.get("env") for c in want["spec"]["containers"]]
        assert wrong == 0, f"the floor made {wrong} fields differ from SDG's pods"
        # as the manager's: S9's parts side by side
        pids = self.pids(floor=floor)
        await self.profiled(measured, ns, pods, pids, floor, "s1-floor", "profile_floor")

    async def s1_kube(self, ks: Proc) -> None:
        n = self.scale.pods
        groups = sorted(self.templates)
        pods = []
        for i in range(n):
            g = groups[i % len(groups)]
            pods.append(twin_pod(self.templates[g], f"p-{i:05d}", self.group_nodes[g], None))
        pids = self.pids(**{"kube-scheduler": ks})
        self.out["s1_kube"] = await self.stream(S1_KUBE, "s1-kube", pods, pids)
        wrong = 0
        items, _ = await self.kube.list(pods_path("s1-kube"))
        for pod in items:
            values = pod["spec"]["affinity"]["nodeAffinity"][
                "requiredDuringSchedulingIgnoredDuringExecution"
            ]["nodeSelectorTerms"][0]["matchFields"][0]["values"]
            wrong += pod["spec"].get("nodeName") != values[0]
        assert wrong == 0, f"kube-scheduler put {wrong} pods elsewhere"

    async def paced(self, ns: str, prefix: str, groups: list[str], n: int) -> list[float]:
        """Open loop: one create every 1/rate s, whatever the previous ones are doing."""
        loop = asyncio.get_running_loop()
        pods = [group_pod(f"{prefix}-{i:05d}", groups[i % len(groups)]) for i in range(n)]
        lat: list[float] = []

        async def one(pod: Obj) -> None:
            t = time.perf_counter()
            await self.kube.request("POST", pods_path(ns), pod)
            lat.append(time.perf_counter() - t)

        tasks = []
        t0 = loop.time()
        for i, pod in enumerate(pods):
            delay = t0 + i / self.scale.s8_rate - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(pod)))
        await asyncio.gather(*tasks)
        self.s8_rate_seen = min(getattr(self, "s8_rate_seen", 1e9), n / (loop.time() - t0))
        return lat

    async def s8(
        self,
        mgr: Proc,
        port: int,
        groups: list[str],
        rounds: int = 4,
        ns: str = "s8",
        spy: PySpy | None = None,
    ) -> Obj:
        """Pod creates with ``mgr``'s pod webhook (SDG's, or the floor's in namespaces
        ``s8f-*``) and without, in alternating rounds (so that load from elsewhere on the
        machine falls on both alike); each round starts with half a second of creates that
        are not counted (new webhook client, connections). ``spy`` is stopped at the end
        (its profile in the result's ``profile``)."""
        per = self.scale.s8_pods // rounds
        warm = int(self.scale.s8_rate // 2)
        lat: dict[str, list[float]] = {"on": [], "off": []}
        per_round: dict[str, list[float]] = {"on": [], "off": []}  # each round's p99, ms
        dials: list[float] = []  # connections the webhook accepted in each round (with it)

        async def accepted() -> float | None:
            return await (webhook_connections(mgr) if ns == "s8" else floor_connections(port))

        own = 0 if ns == "s8" else 1  # the floor counts the connection that reads its count

        sw = await self.stopwatch(self.pids(**{"manager" if ns == "s8" else "floor": mgr}))
        for r in range(rounds):
            for mode in ("on", "off"):
                where = f"{ns}-{mode}"
                self.env.webhooks(port if mode == "on" else None)
                before = await accepted() if mode == "on" else None
                await wait_webhook(self.kube, where, groups[0], on=mode == "on")
                await self.paced(where, f"warm{r}", groups, warm)
                got = await self.paced(where, f"w{r}", groups, per)
                lat[mode] += got
                per_round[mode].append(round(summary(got)["p99"] * 1000, 1))
                after = await accepted() if mode == "on" else None
                if after is not None and before is not None:
                    dials.append(after - before - own)
        who = "" if ns == "s8" else " (Python floor)"
        label = f"S8{who}: {rounds} rounds of paced creates, webhook on / off in turn"
        await self.phase(label, sw, pods=2 * rounds * (per + warm))
        return {
            "on": {"latency": summary(lat["on"]), "rate": self.s8_rate_seen},
            "off": {"latency": summary(lat["off"]), "rate": self.s8_rate_seen},
            "rounds": rounds,
            "per_round_p99_ms": per_round,
            "per_round_connections": dials,
            **({"profile": spy.stop()} if spy is not None else {}),
        }

    async def s2_backlog(self, mgr: Proc, groups: list[str]) -> list[Obj]:
        n = self.scale.pods
        pods = [group_pod(f"b-{i:05d}", groups[i % len(groups)]) for i in range(n)]
        sw = await self.stopwatch(self.pids(manager=mgr))
        made = await create_all(self.kube, pods_path("s2-sdg"), pods, self.args.in_flight)
        await self.phase("S2: backlog created (webhook on, manager not leading)", sw, pods=n)
        items, _ = await self.kube.list(pods_path("s2-sdg"))
        assert len(items) == n and not any(has_node(p) for p in items)
        assert all(p["spec"].get("schedulerName") == "deviceshare-scheduler" for p in items)
        self.out["s2_backlog_create_s"] = made.create_s
        return items

    async def s2_sdg(self, mgr: Proc, backlog: list[Obj], spy: PySpy | None = None) -> None:
        """S2's drain: the lease let go, ``mgr`` leads and binds the backlog; ``spy`` (of
        ``mgr``) is stopped at the last bind, its parts in the phase."""
        n = len(backlog)
        seen = FirstSeen([p["metadata"]["name"] for p in backlog], has_node)
        sw = await self.stopwatch(self.pids(manager=mgr))
        api = self.api_profile("s2-sdg")
        async with Watch(self.kube, pods_path("s2-sdg"), seen):
            t_release = time.perf_counter()
            await hold_lease(self.kube, "", 1)
            await seen.wait(900)
        at_bind = sw.cpu()
        if spy is not None:
            spy.stop()
        first, last = min(seen.first.values()), max(seen.first.values())
        await self.phase(S2_SDG, sw, pods=n, cpu_at_last_bind=at_bind)
        self.phases[-1]["apiserver_parts"] = await api.stop()
        if spy is not None and spy.out.exists():
            self.phases[-1]["python_parts"] = {"manager": _pyspy.stack_parts(spy.out)}
        self.out["s2_sdg"] = {
            "pods": n,
            "seconds": last - first,
            "per_s": n / (last - first),
            "release_to_first_s": first - t_release,
        }

    async def s2_raw(self, backlog: list[Obj]) -> None:
        n = len(backlog)
        pods = []
        for i, b in enumerate(backlog):
            g = b["metadata"]["annotations"][GROUP_ANNOTATION]
            pods.append(twin_pod(b, f"r-{i:05d}", self.group_nodes[g], NOBODY))
        await create_all(self.kube, pods_path("s2-raw"), pods, self.args.in_flight)
        items, _ = await self.kube.list(pods_path("s2-raw"))
        jobs = [
            [
                "s2-raw",
                p["metadata"]["name"],
                p["metadata"]["uid"],
                p["spec"]["affinity"]["nodeAffinity"][
                    "requiredDuringSchedulingIgnoredDuringExecution"
                ]["nodeSelectorTerms"][0]["matchFields"][0]["values"][0],
            ]
            for p in items
        ]
        jobs_file = self.write_json("raw-jobs.json", jobs)
        seen = FirstSeen([p["metadata"]["name"] for p in items], has_node)
        async with Watch(self.kube, pods_path("s2-raw"), seen):
            proc = Proc(
                "raw binder",
                self.env.raw_binder_cmd(jobs_file),
                self.env.work / "raw-binder.log",
                self.env.env,
            )
            sw = await self.stopwatch(self.pids(**{"raw binder": proc}))
            api = self.api_profile("s2-raw")
            await seen.wait(900)
            cpu = sw.cpu()
            await asyncio.to_thread(proc.popen.wait, 120)
        report = json.loads(proc.log_path.read_text().strip().splitlines()[-1])
        first, last = min(seen.first.values()), max(seen.first.values())
        await self.phase(S2_RAW, sw, cpu, pods=n)
        self.phases[-1]["apiserver_parts"] = await api.stop()
        self.out["s2_raw"] = {
            "pods": n,
            "seconds": last - first,
            "per_s": n / (last - first),
            "posts_s": report["end"] - report["start"],
            "errors": report["errors"],
        }

    async def s4(
        self, proc: Proc, ns: str, groups: list[str], label: str, spy: PySpy | None = None
    ) -> None:
        """S4 for one contender; ``spy`` (its profile: summed up in ``out["profile_s4"]``
        for SDG's, by part in the phase) is stopped at convergence."""
        sc = self.scale
        per_group = sc.big_pods // len(groups)
        n = per_group * len(groups)
        pods = [group_pod(f"s-{i:05d}", groups[i % len(groups)], NOBODY) for i in range(n)]
        expected: dict[str, set[str]] = {g: set() for g in groups}
        for p in pods:
            expected[p["metadata"]["annotations"][GROUP_ANNOTATION]].add(
                f"{ns}/{p['metadata']['name']}"
            )
        peak_reset = reset_peak(proc.pid)
        proc_key = proc.name.split(" (")[0]
        sw = await self.stopwatch(self.pids(**{proc_key: proc}))
        api = self.api_profile(ns)
        converged = StatusConverged(expected, sw.cpu)
        async with Watch(self.kube, SDG_PATH, converged):
            made = await create_all(self.kube, pods_path(ns), pods, self.args.in_flight)
            try:
                await converged.wait(900)
            except RuntimeError as exc:
                raise RuntimeError(f"{label}: {exc}") from None
        if spy is not None:
            summary = spy.stop()
            if ns == "s4-sdg":
                self.out["profile_s4"] = summary
        assert converged.t is not None and converged.cpu is not None
        mem = memory(proc.pid)
        who = ns.removeprefix("s4-")
        lag = converged.t - made.t_last
        await self.phase(label, sw, converged.cpu, pods=n, groups=len(groups))
        self.phases[-1]["apiserver_parts"] = await api.stop()
        if spy is not None and spy.out.exists():
            self.phases[-1]["python_parts"] = {proc_key: _pyspy.stack_parts(spy.out)}
        self.out[f"s4_{who}"] = {
            "pods": n,
            "groups": len(groups),
            "create_s": made.create_s,
            "lag_s": lag,
            "cpu_s": converged.cpu[proc.name.split(" (")[0]],
            "peak_rss": mem["VmHWM"],
            "rss": mem["VmRSS"],
            "peak_reset": peak_reset,
        }

    async def s6_s7(self) -> None:
        env = self.env
        sw = await self.stopwatch(self.pids())
        mgr, _, ready = await env.manager("s7")
        self.procs.append(mgr)
        settled = await settle(mgr.pid)
        mem = memory(mgr.pid)
        cpu = cpu_seconds(mgr.pid)
        await self.phase("S7/S6: SDG cold start", sw)
        await self.stop(mgr)
        self.out["s7_sdg"] = {"ready_s": ready, "settle_s": settled, "cpu_s": cpu}
        self.out["s6_sdg"] = mem
        sw = await self.stopwatch(self.pids())
        ks, ready = await env.kube_scheduler("s6")
        self.procs.append(ks)
        settled = await settle(ks.pid)
        mem = memory(ks.pid)
        cpu = cpu_seconds(ks.pid)
        await self.phase("S7/S6: kube-scheduler cold start", sw)
        await self.stop(ks)
        self.out["s7_kube"] = {"ready_s": ready, "settle_s": settled, "cpu_s": cpu}
        self.out["s6_kube"] = mem
        pods = await self.kube.request("GET", "/api/v1/pods", params={"limit": "1"})
        nodes = await self.kube.request("GET", "/api/v1/nodes", params={"limit": "1"})
        groups = await self.kube.request("GET", SDG_PATH, params={"limit": "1"})

        def count(page: Obj) -> int:
            return len(page["items"]) + int(page["metadata"].get("remainingItemCount") or 0)

        self.out["s6_objects"] = {
            "pods": count(pods),
            "nodes": count(nodes),
            "groups": count(groups),
        }


# --- report ------------------------------------------------------------------------------


def meminfo() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
    return "?"


def fmt_cpu(cpu: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.1f}" for k, v in cpu.items())


def mib(n: float) -> str:
    return f"{n / 1024 / 1024:.0f} MiB"


def s8_each(s8: dict[str, Any]) -> str:
    """Each round's p99 with the webhook and the connections it accepted then: a tail in
    one round names its cause (a process just started meets the API server with no
    connection open, and a slow handshake makes it dial more: round 1)."""
    rounds, dials = s8.get("per_round_p99_ms"), s8.get("per_round_connections")
    text = f"; each round's p99 with it: {' / '.join(map(str, rounds['on']))} ms" if rounds else ""
    if dials:
        text += f", connections accepted: {' / '.join(f'{d:.0f}' for d in dials)}"
    return text


def s8_rows(out: dict[str, Any], creates: str) -> list[tuple[str, str, str, str, str, str]]:
    """S8, the webhook's added p99, and the floor's control run when there was one."""
    r: list[tuple[str, str, str, str, str, str]] = []
    on, off = out["s8"]["on"], out["s8"]["off"]
    added = (on["latency"]["p99"] - off["latency"]["p99"]) * 1000
    each = s8_each(out["s8"])
    r.append(
        (
            "S8",
            f"pod create p99 at {on['rate']:.0f}/s with SDG's webhook minus without "
            f"({creates}, {out['s8']['rounds']} rounds in turn)",
            f"{added:+.1f} ms (p99 {on['latency']['p99'] * 1000:.1f} ms)",
            f"no webhook: p99 {off['latency']['p99'] * 1000:.1f} ms; the goal +5 ms{each}",
            f"{added / 5:.2f}x",
            "< 1.0x (5 ms)",
        )
    )
    f = out.get("s8_floor")
    if f is not None:
        f_on, f_off = f["on"]["latency"]["p99"], f["off"]["latency"]["p99"]
        f_added = (f_on - f_off) * 1000
        r.append(
            (
                "S8 floor",
                "S8 through the Python floor's pod webhook (`floor.py`: a precomputed "
                "answer per group on sdgruntime's HTTP server, nothing else), in rounds of "
                "its own, started after SDG's as SDG's was; SDG's added p99 over the floor's",
                f"floor {f_added:+.1f} ms (p99 {f_on * 1000:.1f} ms); SDG "
                f"{added - f_added:+.1f} ms over the floor",
                f"no webhook: p99 {f_off * 1000:.1f} ms{s8_each(f)}",
                f"{f_added / 5:.2f}x",
                "control run: S8's limit in Python on this host",
            )
        )
    return r


def s4_rows(out: dict[str, Any]) -> list[tuple[str, str, str, str, str, str]]:
    """S4 against kopf, and the status floor's control run when there was one."""
    r: list[tuple[str, str, str, str, str, str]] = []
    a, b = out["s4_sdg"], out["s4_kopf"]
    r.append(
        (
            "S4",
            f"status of {a['groups']} groups / {a['pods']} pods (webhooks off): lag after the "
            "last create; CPU-s; peak RSS",
            f"{a['lag_s']:.2f} s; {a['cpu_s']:.1f} CPU-s; {mib(a['peak_rss'])}",
            f"kopf {b['lag_s']:.2f} s; {b['cpu_s']:.1f} CPU-s; {mib(b['peak_rss'])}",
            f"{a['lag_s'] / b['lag_s']:.2f}x; {a['cpu_s'] / b['cpu_s']:.2f}x; "
            f"{a['peak_rss'] / b['peak_rss']:.2f}x",
            "<= 0.2x; <= 0.2x; <= 0.33x",
        )
    )
    f = out.get("s4_floor")
    if f is not None:
        r.append(
            (
                "S4 floor",
                "S4 with the status floor (`status_floor.py`: a pod watch and the merge "
                "patches, 8 at a time, nothing else); SDG's and kopf's lag and CPU-s over it",
                f"floor {f['lag_s']:.2f} s; {f['cpu_s']:.1f} CPU-s; SDG "
                f"{a['lag_s'] / f['lag_s']:.2f}x; {a['cpu_s'] / f['cpu_s']:.2f}x the floor",
                f"kopf {b['lag_s'] / f['lag_s']:.2f}x; {b['cpu_s'] / f['cpu_s']:.2f}x the floor",
                f"{f['lag_s'] / b['lag_s']:.2f}x; {f['cpu_s'] / b['cpu_s']:.2f}x",
                "control run: S4's limit on this API server",
            )
        )
    return r


def rows(out: dict[str, Any]) -> list[tuple[str, str, str, str, str, str]]:
    """(id, what, SDG, yardstick, ratio, goal) for S1-S10."""
    r: list[tuple[str, str, str, str, str, str]] = []
    sz = out["sizes"]
    a, b = out["s1_sdg"], out["s1_kube"]
    r.append(
        (
            "S1",
            f"streaming: {a['pods']} pods of {sz['groups']} bound groups on {sz['nodes']} nodes, "
            "first create -> last bind",
            f"{a['per_s']:.0f} pods/s",
            f"kube-scheduler {b['per_s']:.0f} pods/s",
            f"{a['per_s'] / b['per_s']:.2f}x",
            ">= 1.0x",
        )
    )
    a, b = out["s2_sdg"], out["s2_raw"]
    r.append(
        (
            "S2",
            f"backlog: {a['pods']} pre-created group pods, first -> last bind",
            f"{a['per_s']:.0f} pods/s",
            f"raw Binding POSTs {b['per_s']:.0f} pods/s",
            f"{a['per_s'] / b['per_s']:.2f}x",
            ">= 0.8x",
        )
    )
    a = out["s3"]
    extra = ""
    if "s3b" in out:
        extra = (
            f"; {out['s3b']['groups']} more at {sz['big_nodes']} nodes (webhooks off): "
            f"{out['s3b']['per_s']:.0f}/s"
        )
    r.append(
        (
            "S3",
            f"{a['groups']} groups created at once at {sz['nodes']} nodes, first create -> "
            "last Bound",
            f"{a['per_s']:.0f} groups/s{extra}",
            "the goal, 100 groups/s",
            f"{a['per_s'] / 100:.2f}x",
            ">= 1.0x (100/s)",
        )
    )
    r += s4_rows(out)
    s5 = out["s5"]["binpack 1 GPU"]
    s5b = out["s5"]["spread 2 GPU"]
    r.append(
        (
            "S5",
            "place() p99 at 1000 nodes (in memory; bench_placement's fleet), binpack 1 GPU "
            "(spread 2 GPU); CPU time of the call (wall clock)",
            f"{s5['cpu']['p99'] * 1e3:.2f} ms ({s5b['cpu']['p99'] * 1e3:.2f} ms); wall "
            f"{s5['wall']['p99'] * 1e3:.2f} ms ({s5b['wall']['p99'] * 1e3:.2f} ms)",
            "the goal, 1 ms",
            f"{s5['cpu']['p99'] * 1e3:.2f}x (wall {s5['wall']['p99'] * 1e3:.2f}x)",
            "< 1.0x",
        )
    )
    a, b, objs = out["s6_sdg"], out["s6_kube"], out["s6_objects"]
    r.append(
        (
            "S6",
            f"RSS after a cold start with {objs['pods']} pods, {objs['nodes']} nodes, "
            f"{objs['groups']} groups, settled",
            f"{mib(a['VmRSS'])} (peak {mib(a['VmHWM'])})",
            f"kube-scheduler {mib(b['VmRSS'])} (peak {mib(b['VmHWM'])})",
            f"{a['VmRSS'] / b['VmRSS']:.2f}x",
            "<= 1.0x",
        )
    )
    a, b = out["s7_sdg"], out["s7_kube"]
    r.append(
        (
            "S7",
            "cold start to /readyz with those objects existing (process spawn -> 200)",
            f"{a['ready_s']:.2f} s",
            f"the goal, 5 s (kube-scheduler: {b['ready_s']:.2f} s)",
            f"{a['ready_s'] / 5:.2f}x (vs kube-scheduler {a['ready_s'] / b['ready_s']:.2f}x)",
            "< 1.0x (5 s)",
        )
    )
    r += s8_rows(out, f"{sz['s8_pods']} creates each")
    r.extend(cost_rows(out))
    return r


S1_SDG, S1_KUBE = "S1: streaming pods, SDG", "S1: streaming pods, kube-scheduler"
S1_FLOOR = "S1: streaming pods, Python floor"
S2_SDG, S2_RAW = "S2: backlog bound, SDG", "S2: backlog bound, raw binder"
S4_FLOOR = "S4: status convergence, status floor"
S4_SDG, S4_KOPF = "S4: status convergence, SDG", "S4: status convergence, kopf peer"


def _phase(out: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((ph for ph in out.get("phases") or () if ph["name"] == name), None)


def cost_rows(out: dict[str, Any]) -> list[tuple[str, str, str, str, str, str]]:
    """S9 and S10 (issue "cost per pod"): CPU-s per pod in S1, SDG's run against
    kube-scheduler's, for the scheduler itself and for the API server it drives."""
    a, b = _phase(out, S1_SDG), _phase(out, S1_KUBE)
    if a is None or b is None:
        return []
    pods_a, pods_b = a.get("pods") or 1, b.get("pods") or 1
    mine = a["cpu"].get("manager", 0.0) / pods_a
    theirs = b["cpu"].get("kube-scheduler", 0.0) / pods_b
    api_a = a["cpu"].get("kube-apiserver", 0.0) / pods_a
    api_b = b["cpu"].get("kube-apiserver", 0.0) / pods_b
    result = [
        (
            "S9",
            "S1's CPU-s per pod: SDG's manager (pod webhook, binds, status, Events) against "
            "kube-scheduler",
            f"{mine * 1e3:.2f} ms/pod",
            f"kube-scheduler {theirs * 1e3:.2f} ms/pod",
            f"{mine / theirs:.2f}x" if theirs else "n/a",
            "<= 1.0x",
        ),
        (
            "S10",
            "S1's kube-apiserver CPU-s per pod in SDG's run against kube-scheduler's run",
            f"{api_a * 1e3:.2f} ms/pod",
            f"{api_b * 1e3:.2f} ms/pod",
            f"{api_a / api_b:.2f}x" if api_b else "n/a",
            "<= 1.15x",
        ),
    ]
    f = _phase(out, S1_FLOOR)
    if f is not None:
        floor = f["cpu"].get("floor", 0.0) / (f.get("pods") or 1)
        result.insert(
            1,
            (
                "S9 floor",
                "S1's CPU-s per pod of the Python floor (`floor.py`: the same pod webhook "
                "answers, Binding and Event POSTs from one process, nothing else) against "
                "kube-scheduler; SDG's manager over the floor",
                f"floor {floor * 1e3:.2f} ms/pod; SDG's manager "
                + (f"{mine / floor:.2f}x the floor" if floor else "n/a"),
                f"kube-scheduler {theirs * 1e3:.2f} ms/pod",
                f"{floor / theirs:.2f}x" if theirs else "n/a",
                "control run: S9's limit in Python",
            ),
        )
    return result


def cost_parts(out: dict[str, Any]) -> list[str]:
    """S9/S10's parts: CPU-s per pod by component, API writes per pod by kind and the
    API server's CPU per pod by part, in each run, so a regression names its cause."""
    runs = [(S1_SDG, "SDG's run"), (S1_KUBE, "kube-scheduler's run"), (S1_FLOOR, "floor's run")]
    if _phase(out, S1_SDG) is None or _phase(out, S1_KUBE) is None:
        return []
    return parts_table(out, "S9/S10 parts, per pod in S1", runs)


def s2_parts(out: dict[str, Any]) -> list[str]:
    """S2's parts, as S1's: what SDG's backlog drain costs beside the raw binder's."""
    runs = [(S2_SDG, "SDG's run"), (S2_RAW, "raw binder's run")]
    if _phase(out, S2_SDG) is None or _phase(out, S2_RAW) is None:
        return []
    return parts_table(out, "S2 parts, per pod bound", runs)


def s4_parts(out: dict[str, Any]) -> list[str]:
    """S4's parts, as S1's: SDG's status keeping beside the status floor's and kopf's."""
    runs = [(S4_SDG, "SDG's run"), (S4_FLOOR, "status floor's run"), (S4_KOPF, "kopf's run")]
    if _phase(out, S4_SDG) is None:
        return []
    return parts_table(out, "S4 parts, per pod", runs)


def parts_table(out: dict[str, Any], title: str, named: list[tuple[str, str]]) -> list[str]:
    """Per pod in each phase of ``named`` (phase, column) that ran: CPU by component,
    writes by kind, the API server's CPU by part (``apiserver_ms``)."""
    found = [(ph, label) for name, label in named if (ph := _phase(out, name)) is not None]
    runs = [ph for ph, _ in found]
    names = [label for _, label in found]
    pods = [ph.get("pods") or 1 for ph in runs]
    lines = [
        "",
        f"{title} ({' | '.join(names)}):",
        "",
        f"| part | {' | '.join(names)} |",
        "| --- |" + " ---: |" * len(runs),
    ]

    def row(label: str, cells: list[str]) -> str:
        return f"| {label} | {' | '.join(cells)} |"

    for who in sorted(set().union(*(ph["cpu"] for ph in runs))):
        cells = []
        for ph, n in zip(runs, pods, strict=True):
            c = ph["cpu"].get(who)
            cells.append(f"{c / n * 1e3:.2f} ms" if c is not None else "-")
        lines.append(row(f"CPU {who}", cells))
    writes = [ph.get("writes") or {} for ph in runs]
    for kind in sorted(set().union(*writes), key=lambda k: -sum(w.get(k, 0) for w in writes)):
        cells = [f"{w.get(kind, 0) / n:.2f}" for w, n in zip(writes, pods, strict=True)]
        lines.append(row(kind, cells))
    api = [apiserver_ms(ph, n) for ph, n in zip(runs, pods, strict=True)]
    for part in sorted(set().union(*api), key=lambda k: -sum(a.get(k, 0.0) for a in api)):
        lines.append(row(f"kube-apiserver: {part}", [f"{a.get(part, 0.0):.2f} ms" for a in api]))
    py = [python_ms(ph, n) for ph, n in zip(runs, pods, strict=True)]
    for part in sorted(set().union(*py), key=lambda k: -sum(p.get(k, 0.0) for p in py)):
        cells = [f"{p[part]:.2f} ms" if part in p else "-" for p in py]
        lines.append(row(f"Python process: {part}", cells))
    if any(api):
        lines += [
            "",
            "The kube-apiserver rows split its CPU per pod (the row above) by what its own "
            "CPU profile (Go's pprof, 100 Hz, the whole phase) was doing: each sample goes "
            "to the first matching part of `hack/bench/_pprof.py`'s list.",
        ]
    if any(py):
        lines += [
            "",
            "The Python process rows split the CPU per pod of the run's Python contender "
            "(SDG's manager, the floor) by the py-spy profile, up to the last bind, of a "
            f"second S1 run of its first {PROFILED_PODS} pods (the measured run is not "
            "sampled: py-spy pauses the process 100 times a second): each "
            "sample goes to the first matching part of `hack/bench/_pyspy.py`'s list (the "
            "floor's binds include their Event POSTs); what it spent after the last bind "
            "(paced Events, status) is its own row.",
        ]
    return lines


def python_ms(ph: dict[str, Any], pods: int) -> dict[str, float]:
    """The phase's Python contender's CPU in ms per pod by part (``_pyspy``): its CPU up
    to the last bind shared out by its py-spy samples, and what came after."""
    parts = ph.get("python_parts") or {}
    if len(parts) != 1:
        return {}
    ((who, samples),) = parts.items()
    total = (ph.get("cpu") or {}).get(who)
    until = (ph.get("cpu_at_last_bind") or {}).get(who, total)
    if total is None or until is None:
        return {}
    out = _pyspy.ms_per_pod(samples, until, pods)
    if out:
        out["after the last bind (not profiled)"] = max(total - until, 0.0) * 1e3 / pods
    return out


def apiserver_ms(phase: dict[str, Any], pods: int) -> dict[str, float]:
    """The API server's CPU ms per pod of ``phase`` by part: its profile's shares of the
    CPU /proc measured (so the parts add up to S10's figure); {} without a profile."""
    found = phase.get("apiserver_parts")
    cpu = phase["cpu"].get("kube-apiserver")
    total = sum(found.values()) if found else 0.0
    if not found or cpu is None or total <= 0:
        return {}
    return {part: secs / total * cpu / pods * 1e3 for part, secs in found.items()}


def webhook_detail(s1: dict[str, Any]) -> str:
    """How many connections SDG's webhook accepted in S1 (each a TLS handshake)."""
    opened = s1.get("webhook_connections")
    if opened is None:
        return ""
    call = s1.get("webhook_call_ms")
    return (
        f"; SDG's webhook accepted {opened:.0f} connections for {s1['pods']} reviews "
        f"({opened / s1['pods']:.2f} per review, each a TLS handshake on both sides)"
        + (f", each call {call:.1f} ms on average as the API server timed it" if call else "")
    )


def settle_detail(sdg: dict[str, Any], kube: dict[str, Any]) -> str:
    """How long S1's writes went on after the last bind (its phase counts them), and the
    API server's idle CPU before each run, to weigh what that tail adds."""
    if "settle_s" not in sdg or "settle_s" not in kube:
        return ""
    idle = [r.get("idle_cpu_per_s", {}).get("kube-apiserver", 0.0) for r in (sdg, kube)]
    return (
        f"; writes went on {sdg['settle_s']:.1f} s / {kube['settle_s']:.1f} s after the last "
        "bind (paced Events, PodsJoined after 5 s quiet; counted in S9 and S10), the API "
        f"server idling at {idle[0]:.2f} / {idle[1]:.2f} CPU-s per s just before"
    )


def floor_detail(out: dict[str, Any]) -> str:
    """S1 detail of the floor's run (empty without one)."""
    f = out.get("s1_floor")
    if not f:
        return ""
    rep = f.get("report") or {}
    errors = rep.get("errors")
    return (
        f" S1 with the Python floor: {f['per_s']:.0f} pods/s, creates {f['create_s']:.1f} s, "
        f"last bind {f['after_last_create_s']:.2f} s after the last create; it answered "
        f"{rep.get('reviews', '?')} reviews, POSTed {rep.get('binds', '?')} Bindings and "
        f"{rep.get('events', '?')} Events{', errors ' + str(errors) if errors else ''}"
        + (
            f"; its webhook calls took {f['webhook_call_ms']:.1f} ms on average"
            if f.get("webhook_call_ms")
            else ""
        )
        + (
            f"; its server accepted {f['webhook_connections']:.0f} connections in S1"
            if f.get("webhook_connections") is not None
            else ""
        )
        + "."
    )


def markdown(out: dict[str, Any], command: str) -> str:
    m = out["machine"]
    load = ", ".join(f"{x:.2f}" for x in m["loadavg"])
    lines = [
        f"Machine: {m['date']}; nproc={m['nproc']} ({m['cpu']}); {out['meminfo']} memory; "
        f"{m['python']}; {m['platform']}; load average at start {load}; "
        f"kube-apiserver and kube-scheduler {out['kubernetes']}.",
        f"Command: `{command}` (scale {out['scale']}); whole run {out['total_s'] / 60:.1f} min "
        f"(control plane start {out['controlplane_start_s']:.1f} s). Creates come from this "
        f"script (aiohttp, admin, {out['in_flight']} in flight) for every contender; "
        "kube-scheduler (as system:kube-scheduler) and the creates authenticate by client "
        "certificate, SDG and the Python contenders by ServiceAccount token; nodes "
        "are fake (8 GPUs, `deviceshare.io/mode=shared`), groups one GPU, `spread`; "
        "admission policies (`config/policy`) not installed.",
        "",
        "| | measured | SDG | yardstick (same run) | ratio | goal |",
        "| --- | --- | ---: | ---: | ---: | --- |",
    ]
    for row in rows(out):
        lines.append("| " + " | ".join(row) + " |")
    s1a, s1b = out["s1_sdg"], out["s1_kube"]
    s8 = out["s8"]

    def lat(s: dict[str, float]) -> str:
        return " / ".join(f"{s[k] * 1000:.1f}" for k in ("p50", "p95", "p99", "max"))

    lines += [
        "",
        f"S1 detail: all {s1a['pods']} creates took {s1a['create_s']:.1f} s with SDG "
        f"(each through its pod webhook) and {s1b['create_s']:.1f} s with kube-scheduler; "
        f"the last bind came {s1a['after_last_create_s']:.2f} s / "
        f"{s1b['after_last_create_s']:.2f} s after the last create"
        + webhook_detail(s1a)
        + settle_detail(s1a, s1b)
        + ". S2: SDG's first bind "
        f"{out['s2_sdg']['release_to_first_s']:.1f} s after the bench released the Lease "
        f"(not counted); the raw binder's POSTs took {out['s2_raw']['posts_s']:.1f} s"
        f"{', errors ' + str(out['s2_raw']['errors']) if out['s2_raw']['errors'] else ''}. "
        f"S8 create latency p50 / p95 / p99 / max: {lat(s8['on']['latency'])} ms with the "
        f"webhook, {lat(s8['off']['latency'])} ms without. S7: SDG settled (CPU idle) "
        f"{out['s7_sdg']['settle_s']:.0f} s after Ready, kube-scheduler "
        f"{out['s7_kube']['settle_s']:.0f} s. S4 peak RSS is VmHWM reset at the start of "
        "the phase (`/proc/PID/clear_refs`), CPU-s from the first create to convergence."
        + floor_detail(out),
        *cost_parts(out),
        *s2_parts(out),
        *s4_parts(out),
        "",
        "CPU seconds per phase (from /proc; `bench` is this script: load generator and watches):",
        "",
        "| phase | wall s | CPU s | API server writes (apiserver_request_total) |",
        "| --- | ---: | --- | --- |",
    ]
    for ph in out["phases"]:
        writes = ", ".join(f"{k} {n}" for k, n in (ph.get("writes") or {}).items())
        lines.append(f"| {ph['name']} | {ph['wall']:.1f} | {fmt_cpu(ph['cpu'])} | {writes} |")
    lines += ["", "How each contender ran:", ""]
    for who, cmd in out["commands"].items():
        lines.append(f"- {who}: `{cmd}`")
    prof = out.get("profile")
    if not prof:
        lines += ["", "No profile: py-spy is not installed (`pip install -e '.[bench]'`)."]
    else:
        lines += [
            "",
            f"py-spy profile of the SDG manager during S1 ({prof['samples']} samples at "
            "100 Hz, idle stacks dropped; by function):",
            "",
            "| # | own samples (leaf frame) | share | | inclusive, SDG's own functions | share |",
            "| ---: | --- | ---: | --- | --- | ---: |",
        ]
        inc = prof["inclusive"]
        for i in range(min(15, len(prof["own"]))):
            o, c = prof["own"][i]
            io, ic = inc[i] if i < len(inc) else ("", 0)
            lines.append(
                f"| {i + 1} | `{o}` | {c / prof['samples']:.1%} | | `{io}` | "
                f"{ic / prof['samples']:.1%} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--scale", choices=sorted(SCALES), default="full")
    parser.add_argument("--in-flight", type=int, default=64, help="creates in flight")
    parser.add_argument("--no-py-spy", dest="py_spy", action="store_false")
    parser.add_argument("--work-dir", help="keep logs and the control plane's files here")
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    parser.add_argument("--no-results", action="store_true", help="leave RESULTS.md alone")
    parser.add_argument(
        "--manager-flag",
        action="append",
        default=[],
        metavar="FLAG",
        help="one more flag for every SDG manager (repeatable): --manager-flag=--pod-workers=32",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s")
    command = "python hack/bench/compare.py " + " ".join(sys.argv[1:] if argv is None else argv)
    out = asyncio.run(Run(args, SCALES[args.scale]).run())
    text = markdown(out, command.strip())
    print(text)
    if args.json:
        args.json.write_text(json.dumps(out, indent=2, default=str))
    if not args.no_results:
        update_section("compare", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

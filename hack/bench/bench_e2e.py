"""End-to-end benchmark: SDG in-process against a real local kube-apiserver with 1000 nodes.

Starts its own control plane (etcd + kube-apiserver, CRDs, ``config/rbac``), creates the
fake fleet, runs SDG as the e2e tests do (ServiceAccount RBAC, webhooks called by the API
server over TLS), then measures:

a. group decision latency: groups created one at a time, create -> ``status.phase=Bound``
   seen on a watch opened before the creates; plus the scheduler's own
   ``sdg_scheduling_decision_seconds{kind="group"}`` histogram;
b. group throughput: a burst of groups created concurrently, time until all are Bound;
c. pod throughput: pods of one bound group created concurrently (pod webhook, pod
   scheduler, Binding), time until all have ``spec.nodeName``; ``sdg_pod_bind_seconds``.

Each phase also reports the API requests the manager made (and their 409s), reconciles
per controller, CPU seconds of this process, kube-apiserver and etcd, and timing wrappers
("probes") the benchmark puts around a few SDG functions (place, claim write, status
write, Event write, Binding): that says what dominates. SDG's code is not changed.

    .venv/bin/python hack/bench/bench_e2e.py [--nodes 1000] [--groups 200] [--burst 200]
        [--pods 200] [--pod-cpu 10m] [--group-workers 1] [--pod-workers 8] [--profile DIR]
        [--json out.json] [--no-results]

Results go to the ``e2e`` section of hack/bench/RESULTS.md unless ``--no-results``.

``--profile DIR`` samples this process with pyinstrument (install it ad hoc, e.g.
``pip install --target /tmp/benchtools pyinstrument`` and ``PYTHONPATH=/tmp/benchtools``).
A benchmark, not a test: nothing here is a pass/fail threshold.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.abc

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from _report import machine, machine_line, summary, update_section  # noqa: E402
from bench_placement import build_fleet  # noqa: E402

from api.constants import SDG_KIND  # noqa: E402
from sdgruntime import errors  # noqa: E402
from sdgruntime.client import Client  # noqa: E402
from sdgruntime.envtest import ControlPlane  # noqa: E402
from sdgruntime.envtest.fakes import create_node, make_node  # noqa: E402
from sdgruntime.kinds import NAMESPACES, PODS, Kind  # noqa: E402
from sdgruntime.metrics import REGISTRY  # noqa: E402
from tests.e2e.harness import GPU, SHARED, group, install_rbac, pod, run_sdg  # noqa: E402

NAMESPACE = "sdg-bench"
POD_NODE = "bench-pods-node"
Obj = dict[str, Any]


# --- observing the API server ---------------------------------------------------------


class Watcher:
    """Records when each object first satisfies ``done``, as seen on a watch.

    Started (list + watch) before the creates it times, so no transition is missed; the
    timestamp is taken when the event reaches this process, i.e. what a user would see.
    """

    def __init__(
        self, client: Client, kind: Kind, namespace: str | None, done: Callable[[Obj], bool]
    ) -> None:
        self.client, self.kind, self.namespace, self.done = client, kind, namespace, done
        self.first: dict[str, float] = {}
        self._events: dict[str, anyio.Event] = {}

    def event(self, name: str) -> anyio.Event:
        return self._events.setdefault(name, anyio.Event())

    async def wait_all(self, names: list[str], within: float) -> None:
        with anyio.fail_after(within):
            for name in names:
                await self.event(name).wait()

    def _see(self, obj: Obj) -> None:
        name = obj["metadata"]["name"]
        if name not in self.first and self.done(obj):
            self.first[name] = time.perf_counter()
            self.event(name).set()

    async def run(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        started = False
        while True:
            items, rv = await self.client.list_all(self.kind, self.namespace)
            for obj in items:
                self._see(obj)
            if not started:
                task_status.started()
                started = True
            try:
                while True:
                    async with contextlib.aclosing(
                        self.client.watch(
                            self.kind, self.namespace, resource_version=rv, timeout_seconds=600
                        )
                    ) as events:
                        async for ev in events:
                            rv = ev["object"]["metadata"].get("resourceVersion", rv)
                            if ev["type"] in ("ADDED", "MODIFIED"):
                                self._see(ev["object"])
            except errors.Gone:
                continue  # relist


def is_bound(obj: Obj) -> bool:
    return (obj.get("status") or {}).get("phase") == "Bound"


def has_node(obj: Obj) -> bool:
    return bool((obj.get("spec") or {}).get("nodeName"))


# --- in-process metrics and CPU ---------------------------------------------------------

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def snapshot() -> Samples:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for metric in REGISTRY.collect()
        for s in metric.samples
    }


def delta(before: Samples, after: Samples) -> Samples:
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v - before.get(k, 0.0)}


def select(d: Samples, metric: str, **labels: str) -> list[tuple[dict[str, str], float]]:
    want = set(labels.items())
    return [(dict(lbl), v) for (n, lbl), v in d.items() if n == metric and want <= set(lbl)]


def total(d: Samples, metric: str, **labels: str) -> float:
    return sum(v for _, v in select(d, metric, **labels))


@dataclass
class Histo:
    count: float
    mean: float
    p50: float
    p95: float
    p99: float


def histogram(d: Samples, metric: str, **labels: str) -> Histo | None:
    """Count, mean and bucket-interpolated quantiles (as PromQL histogram_quantile)."""
    count = total(d, f"{metric}_count", **labels)
    if not count:
        return None
    buckets: dict[float, float] = {}
    for lbl, v in select(d, f"{metric}_bucket", **labels):
        le = float(lbl["le"])
        buckets[le] = buckets.get(le, 0.0) + v
    bounds = sorted(buckets)

    def q(quant: float) -> float:
        rank = quant * count
        lower, seen = 0.0, 0.0
        for le in bounds:
            if buckets[le] >= rank:
                if le == float("inf"):
                    return lower
                span = buckets[le] - seen
                return lower + (le - lower) * ((rank - seen) / span if span else 1.0)
            lower, seen = le, buckets[le]
        return lower

    return Histo(count, total(d, f"{metric}_sum", **labels) / count, q(0.5), q(0.95), q(0.99))


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (children excluded), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Probes:
    """Timing wrappers around a few SDG functions, installed by the benchmark only.

    They say where a decision's wall time goes (in-memory placement vs each API write)
    without changing SDG's code; the wrappers cost a perf_counter pair per call.
    """

    def __init__(self) -> None:
        self.samples: dict[str, list[float]] = {}
        self._undo: list[tuple[Any, str, Any]] = []

    def _add(self, label: str, secs: float) -> None:
        self.samples.setdefault(label, []).append(secs)

    def sync(self, owner: Any, attr: str, label: str) -> None:
        fn = getattr(owner, attr)

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self._add(label, time.perf_counter() - t0)

        self._undo.append((owner, attr, fn))
        setattr(owner, attr, timed)

    def coro(self, owner: Any, attr: str, label: str) -> None:
        fn = getattr(owner, attr)

        @functools.wraps(fn)
        async def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return await fn(*args, **kwargs)
            finally:
                self._add(label, time.perf_counter() - t0)

        self._undo.append((owner, attr, fn))
        setattr(owner, attr, timed)

    def take(self) -> dict[str, list[float]]:
        out, self.samples = self.samples, {}
        return out

    def remove(self) -> None:
        for owner, attr, fn in reversed(self._undo):
            setattr(owner, attr, fn)
        self._undo.clear()


def install_probes() -> Probes:
    import controllers.groupscheduler as gs
    import controllers.podscheduler as ps
    from controllers.ledger.writer import RecordWriter
    from sdgruntime.events import EventRecorder

    probes = Probes()
    probes.sync(gs, "place", "group: place() in memory")
    probes.coro(gs.GroupScheduler, "_schedule", "group: _schedule (decision incl. writes)")
    probes.coro(RecordWriter, "write", "group: claim record write")
    probes.coro(gs.GroupScheduler, "_bind_status", "group: status PUT (+ Scheduled event)")
    probes.coro(EventRecorder, "event", "any: Event write (inline, awaited)")
    probes.sync(ps, "pod_fits", "pod: fit check in memory")
    probes.coro(Client, "bind", "pod: Binding POST")
    return probes


@dataclass
class Phase:
    """What one phase cost: wall time, CPU per process, manager requests, reconciles."""

    name: str
    wall: float = 0.0
    cpu: dict[str, float] = field(default_factory=dict)
    metrics: Samples = field(default_factory=dict)
    own_requests: dict[str, int] = field(default_factory=dict)  # the benchmark's own, by verb
    extra: dict[str, Any] = field(default_factory=dict)
    probes: dict[str, list[float]] = field(default_factory=dict)

    def conflicts(self) -> dict[str, int]:
        """409s by method (the benchmark itself never gets one)."""
        out: dict[str, int] = {}
        for lbl, v in select(self.metrics, "rest_client_requests_total", code="409"):
            out[lbl["method"]] = out.get(lbl["method"], 0) + int(v)
        return out

    def queue_adds(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for lbl, v in select(self.metrics, "workqueue_adds_total"):
            out[lbl["name"]] = out.get(lbl["name"], 0) + int(v)
        return dict(sorted(out.items()))

    def manager_requests(self) -> dict[str, int]:
        """rest_client_requests_total by method minus the benchmark client's own calls."""
        out: dict[str, int] = {}
        for lbl, v in select(self.metrics, "rest_client_requests_total"):
            out[lbl["method"]] = out.get(lbl["method"], 0) + int(v)
        for verb, n in self.own_requests.items():
            out[verb] = out.get(verb, 0) - n
        return {k: v for k, v in sorted(out.items()) if v}

    def reconciles(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for lbl, v in select(self.metrics, "controller_runtime_reconcile_total"):
            out[lbl["controller"]] = out.get(lbl["controller"], 0) + int(v)
        return dict(sorted(out.items()))

    def requeues(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for lbl, v in select(self.metrics, "controller_runtime_reconcile_total"):
            if lbl["result"] != "success":
                key = f"{lbl['controller']}/{lbl['result']}"
                out[key] = out.get(key, 0) + int(v)
        return dict(sorted(out.items()))


class Meter:
    """Wraps phases: metric deltas, CPU deltas (this process, apiserver, etcd), profiles."""

    def __init__(self, pids: dict[str, int], profile_dir: Path | None, probes: Probes) -> None:
        self.pids = pids
        self.probes = probes
        self.profile_dir = profile_dir
        self.phases: list[Phase] = []

    def _cpu(self) -> dict[str, float]:
        out = {"sdg+bench (python)": time.process_time()}
        for name, pid in self.pids.items():
            out[name] = cpu_seconds(pid)
        return out

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[Phase]:
        ph = Phase(name)
        profiler = None
        if self.profile_dir is not None:
            from pyinstrument import Profiler  # ad hoc tool, not a project dependency

            profiler = Profiler(interval=0.001, async_mode="disabled")
            profiler.start()
        self.probes.take()
        m0, c0, t0 = snapshot(), self._cpu(), time.perf_counter()
        try:
            yield ph
        finally:
            ph.wall = time.perf_counter() - t0
            c1 = self._cpu()
            ph.cpu = {k: c1[k] - c0[k] for k in c0}
            ph.metrics = delta(m0, snapshot())
            ph.probes = self.probes.take()
            if profiler is not None:
                profiler.stop()
                assert self.profile_dir is not None
                self.profile_dir.mkdir(parents=True, exist_ok=True)
                slug = name.split(" ")[0].strip(":").lower()
                (self.profile_dir / f"{slug}.txt").write_text(
                    profiler.output_text(unicode=False, color=False)
                )
                (self.profile_dir / f"{slug}.html").write_text(profiler.output_html())
            self.phases.append(ph)


# --- the workload ---------------------------------------------------------------------


async def create_fleet(admin: Client, n: int, concurrency: int) -> tuple[float, int]:
    """The bench_placement fleet (same mix) plus one roomy node for the pod phase."""
    nodes = build_fleet(n).nodes
    nodes.append(
        make_node(
            POD_NODE,
            labels={**SHARED, "bench/role": "pods"},
            allocatable={GPU: 8, "pods": 1000, "cpu": 64, "memory": "256Gi"},
        )
    )
    limiter = anyio.CapacityLimiter(concurrency)

    async def one(node: Obj) -> None:
        # build_fleet's nodes are the in-memory bench's, as a cache holds them
        node["metadata"].pop("resourceVersion", None)
        async with limiter:
            await create_node(admin, node)

    t0 = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for node in nodes:
            tg.start_soon(one, node)
    return time.perf_counter() - t0, len(nodes)


def group_spec(i: int) -> tuple[dict[str, int], str]:
    """A mix: 1 or 2 GPUs, binpack or spread."""
    return {GPU: 1 + (i // 2) % 2}, ("binpack", "spread")[i % 2]


async def sequential_groups(admin: Client, watcher: Watcher, n: int, ph: Phase) -> list[float]:
    lat: list[float] = []
    rtt: list[float] = []
    for i in range(n):
        name = f"seq-{i:04d}"
        resources, strategy = group_spec(i)
        t0 = time.perf_counter()
        await admin.create(SDG_KIND, group(name, resources, schedulingStrategy=strategy))
        rtt.append(time.perf_counter() - t0)
        with anyio.fail_after(30):
            await watcher.event(name).wait()
        lat.append(watcher.first[name] - t0)
    ph.own_requests = {"POST": n}
    ph.extra["create_rtt"] = summary(rtt)
    return lat


async def burst_groups(
    admin: Client, watcher: Watcher, n: int, concurrency: int, ph: Phase
) -> dict[str, Any]:
    names = [f"burst-{i:04d}" for i in range(n)]
    limiter = anyio.CapacityLimiter(concurrency)
    sent: dict[str, float] = {}

    async def one(i: int, name: str) -> None:
        resources, strategy = group_spec(i)
        async with limiter:
            sent[name] = time.perf_counter()
            await admin.create(SDG_KIND, group(name, resources, schedulingStrategy=strategy))

    t0 = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for i, name in enumerate(names):
            tg.start_soon(one, i, name)
    created = time.perf_counter() - t0
    await watcher.wait_all(names, within=240)
    done = max(watcher.first[n] for n in names) - t0
    ph.own_requests = {"POST": n}
    return {
        "created_s": created,
        "all_bound_s": done,
        "groups_per_s": n / done,
        "latency": summary(watcher.first[n] - sent[n] for n in names),
    }


def burst_pod(name: str, cpu: str | None) -> dict[str, Any]:
    """A pod of phase c's group, requesting ``cpu`` when given (each bind's fit check
    then sums requests on the node)."""
    obj = pod(name, "bench-pods")
    if cpu:
        obj["spec"]["containers"][0]["resources"] = {"requests": {"cpu": cpu}}
    return obj


async def burst_pods(
    admin: Client, watcher: Watcher, n: int, concurrency: int, ph: Phase, cpu: str | None = None
) -> dict[str, Any]:
    names = [f"p-{i:04d}" for i in range(n)]
    limiter = anyio.CapacityLimiter(concurrency)
    sent: dict[str, float] = {}
    rtt: list[float] = []

    async def one(name: str) -> None:
        async with limiter:
            sent[name] = t = time.perf_counter()
            await admin.create(PODS, burst_pod(name, cpu), NAMESPACE)
            rtt.append(time.perf_counter() - t)

    t0 = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for name in names:
            tg.start_soon(one, name)
    created = time.perf_counter() - t0
    await watcher.wait_all(names, within=240)
    done = max(watcher.first[n] for n in names) - t0
    ph.own_requests = {"POST": n}
    return {
        "created_s": created,
        "all_bound_s": done,
        "pods_per_s": n / done,
        "create_rtt": summary(rtt),
        "latency": summary(watcher.first[n] - sent[n] for n in names),
    }


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"machine": machine(), "args": vars(args) | {"profile": None}}
    t_all = time.perf_counter()
    t0 = time.perf_counter()
    cp = ControlPlane(crd_paths=[ROOT / "config" / "crd"])
    cp.start()
    try:
        out["controlplane_start_s"] = time.perf_counter() - t0
        install_rbac(cp)
        probes = install_probes()
        meter = Meter(cp.pids, args.profile, probes)
        async with Client.from_kubeconfig(str(cp.kubeconfig_path), max_connections=64) as admin:
            version = await admin.request("GET", "/version")
            out["kube_apiserver"] = version.get("gitVersion", "?")
            with meter.phase("nodes: create the fleet") as ph:
                secs, count = await create_fleet(admin, args.nodes, args.concurrency)
                ph.extra = {"nodes": count, "nodes_per_s": count / secs}
                ph.own_requests = {"POST": count, "PATCH": count}
            print(f"created {count} nodes in {secs:.1f}s ({count / secs:.0f}/s)", flush=True)
            await admin.create(NAMESPACES, {"metadata": {"name": NAMESPACE}})

            async with contextlib.AsyncExitStack() as stack:
                with meter.phase("startup: SDG start + cache sync"):
                    await stack.enter_async_context(
                        run_sdg(cp, group_workers=args.group_workers, pod_workers=args.pod_workers)
                    )
                tg = await stack.enter_async_context(anyio.create_task_group())
                stack.callback(tg.cancel_scope.cancel)  # stop the watchers first
                groups = Watcher(admin, SDG_KIND, None, is_bound)
                pods = Watcher(admin, PODS, NAMESPACE, has_node)
                await tg.start(groups.run)
                await tg.start(pods.run)
                # One group first: recovery and first-reconcile costs stay out of (a).
                await admin.create(SDG_KIND, group("warmup", {GPU: 1}))
                with anyio.fail_after(60):
                    await groups.event("warmup").wait()
                await anyio.sleep(1)

                with meter.phase("a: sequential groups") as ph:
                    lat = await sequential_groups(admin, groups, args.groups, ph)
                    ph.extra["latency"] = summary(lat)
                print(f"a: {args.groups} sequential groups done", flush=True)
                await anyio.sleep(1)

                with meter.phase("b: group burst") as ph:
                    ph.extra.update(
                        await burst_groups(admin, groups, args.burst, args.concurrency, ph)
                    )
                print(f"b: {args.burst} burst groups done", flush=True)

                await admin.create(
                    SDG_KIND,
                    group("bench-pods", {GPU: 2}, nodeSelector={"bench/role": "pods"}),
                )
                with anyio.fail_after(60):
                    await groups.event("bench-pods").wait()
                await anyio.sleep(1)
                with meter.phase("c: pod burst") as ph:
                    ph.extra.update(
                        await burst_pods(
                            admin, pods, args.pods, args.concurrency, ph, cpu=args.pod_cpu
                        )
                    )
                print(f"c: {args.pods} pods done", flush=True)
                # Let follow-up work (status controller, events) settle, and measure it.
                with meter.phase("settle: 3 s after the pod burst"):
                    await anyio.sleep(3)
                with meter.phase(f"rtt: {args.rtt} sequential GETs of one group") as ph:
                    rtt = []
                    for _ in range(args.rtt):
                        t = time.perf_counter()
                        await admin.get(SDG_KIND, "warmup")
                        rtt.append(time.perf_counter() - t)
                    ph.extra["latency"] = summary(rtt)
                    ph.own_requests = {"GET": args.rtt}
        out["phases"] = meter.phases
        probes.remove()
    finally:
        cp.stop()
    out["total_s"] = time.perf_counter() - t_all
    return out


# --- reporting ------------------------------------------------------------------------


def ms(s: dict[str, float]) -> str:
    if not s.get("n"):
        return "-"
    return (
        f"{s['mean'] * 1e3:.1f} / {s['p50'] * 1e3:.1f} / {s['p95'] * 1e3:.1f} / "
        f"{s['p99'] * 1e3:.1f} / {s['max'] * 1e3:.1f}"
    )


def hms(h: Histo | None) -> str:
    if h is None:
        return "-"
    return (
        f"n={h.count:.0f}: {h.mean * 1e3:.1f} / ~{h.p50 * 1e3:.1f} / ~{h.p95 * 1e3:.1f} / "
        f"~{h.p99 * 1e3:.1f}"
    )


def markdown(out: dict[str, Any]) -> str:
    phases: dict[str, Phase] = {p.name.split(":")[0]: p for p in out["phases"]}
    a, b, c, rtt = phases["a"], phases["b"], phases["c"], phases["rtt"]
    args = out["args"]

    def h(ph: Phase, metric: str, **labels: str) -> str:
        return hms(histogram(ph.metrics, metric, **labels))

    dec = "sdg_scheduling_decision_seconds"
    lines = [
        f"Machine: {machine_line(out['machine'], 'kube-apiserver ' + out['kube_apiserver'])}.",
        f"Command: `python hack/bench/bench_e2e.py --nodes {args['nodes']} --groups "
        f"{args['groups']} --burst {args['burst']} --pods {args['pods']} --concurrency "
        f"{args['concurrency']} --group-workers {args['group_workers']} --pod-workers "
        f"{args['pod_workers']}`; whole run {out['total_s']:.0f} s (control plane start "
        f"{out['controlplane_start_s']:.1f} s). Webhooks on, RBAC of `config/rbac`; etcd, "
        "kube-apiserver and this one Python process (SDG *and* the benchmark client) share "
        "the cores.",
        "",
        f"Fleet: {phases['nodes'].extra['nodes']} nodes (the bench_placement mix, no claims "
        f"yet, + one roomy node for the pod phase) created in {phases['nodes'].wall:.1f} s "
        f"({phases['nodes'].extra['nodes_per_s']:.0f} nodes/s, create + status, "
        f"{args['concurrency']} in flight). SDG start to cache synced: "
        f"{phases['startup'].wall:.2f} s. Baseline API round trip (a GET from this process, "
        f"SDG idle): {ms(rtt.extra['latency'])} ms, "
        f"{rtt.cpu['sdg+bench (python)'] / args['rtt'] * 1e3:.1f} ms Python CPU per request.",
        "",
        "Latencies in ms as mean / p50 / p95 / p99 / max; histogram rows are "
        "count: mean / ~p50 / ~p95 / ~p99 with quantiles interpolated within buckets.",
        "",
        "| measurement | value |",
        "| --- | --- |",
        f"| **a. create -> Bound seen on a watch, {args['groups']} groups one at a time** | "
        f"**{ms(a.extra['latency'])}** |",
        f"| a. the create call alone (incl. validating webhook) | {ms(a.extra['create_rtt'])} |",
        f"| a. `{dec}{{kind=group}}` (place + claim write + status write) | "
        f"{h(a, dec, kind='group')} |",
        f"| a. `controller_runtime_reconcile_time_seconds{{group-scheduler}}` | "
        f"{h(a, 'controller_runtime_reconcile_time_seconds', controller='group-scheduler')} |",
        f"| a. `workqueue_queue_duration_seconds{{group-scheduler}}` | "
        f"{h(a, 'workqueue_queue_duration_seconds', name='group-scheduler')} |",
        f"| **b. {args['burst']} groups created concurrently: all created / all Bound** | "
        f"{b.extra['created_s']:.2f} s / {b.extra['all_bound_s']:.2f} s = "
        f"**{b.extra['groups_per_s']:.1f} groups/s** |",
        f"| b. per group create -> Bound (queueing behind one another) | "
        f"{ms(b.extra['latency'])} |",
        f"| b. `{dec}{{kind=group}}` | {h(b, dec, kind='group')} |",
        f"| **c. {args['pods']} pods of one group created concurrently: all created / all "
        f"have nodeName** | {c.extra['created_s']:.2f} s / {c.extra['all_bound_s']:.2f} s = "
        f"**{c.extra['pods_per_s']:.1f} pods/s** |",
        f"| c. per pod create -> nodeName | {ms(c.extra['latency'])} |",
        f"| c. the create call alone (incl. pod mutating webhook) | {ms(c.extra['create_rtt'])} |",
        f"| c. `controller_runtime_webhook_latency_seconds{{/mutate-v1-pod}}` (handler only) | "
        f"{h(c, 'controller_runtime_webhook_latency_seconds', webhook='/mutate-v1-pod')} |",
        f"| c. `sdg_pod_bind_seconds` (the Binding POST) | {h(c, 'sdg_pod_bind_seconds')} |",
        f"| c. `{dec}{{kind=pod}}` | {h(c, dec, kind='pod')} |",
        "",
        "Where SDG's time goes, from timing wrappers the benchmark puts around SDG functions "
        "(calls: mean ms, total s; nested: `_schedule` contains place, the claim write and "
        "the status write):",
        "",
        "| probe | a. sequential | b. group burst | c. pod burst |",
        "| --- | --- | --- | --- |",
    ]
    labels: list[str] = []
    for ph in (a, b, c):
        labels += [k for k in ph.probes if k not in labels]
    for label in labels:
        cells = []
        for ph in (a, b, c):
            v = ph.probes.get(label)
            cells.append(f"{len(v)}: {sum(v) / len(v) * 1e3:.1f}, {sum(v):.2f} s" if v else "-")
        lines.append(f"| {label} | {' | '.join(cells)} |")
    lines += [
        "",
        "Cost per phase: wall time; CPU seconds of this Python process / kube-apiserver / "
        "etcd; API requests SDG made (the benchmark's own subtracted) and how many got 409 "
        "Conflict; work-queue adds and reconciles per controller; non-success results.",
        "",
        "| phase | wall s | CPU s | SDG requests | 409s | queue adds | reconciles | requeues |",
        "| --- | ---: | --- | --- | --- | --- | --- | --- |",
    ]
    for p in out["phases"]:
        cpu = " / ".join(
            f"{p.cpu.get(k, 0):.1f}" for k in ("sdg+bench (python)", "kube-apiserver", "etcd")
        )

        def fmt(d: dict[str, int]) -> str:
            return ", ".join(f"{k} {v}" for k, v in d.items()) or "-"

        lines.append(
            f"| {p.name} | {p.wall:.2f} | {cpu} | {fmt(p.manager_requests())} | "
            f"{fmt(p.conflicts())} | {fmt(p.queue_adds())} | {fmt(p.reconciles())} | "
            f"{fmt(p.requeues())} |"
        )
    return "\n".join(lines)


def jsonable(out: dict[str, Any]) -> dict[str, Any]:
    res = dict(out)
    res["phases"] = [
        {
            "name": p.name,
            "wall": p.wall,
            "cpu": p.cpu,
            "manager_requests": p.manager_requests(),
            "reconciles": p.reconciles(),
            "requeues": p.requeues(),
            "conflicts": p.conflicts(),
            "queue_adds": p.queue_adds(),
            "probes": {k: summary(v) for k, v in p.probes.items()},
            "extra": p.extra,
        }
        for p in out["phases"]
    ]
    return res


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--groups", type=int, default=200, help="sequential groups (a)")
    parser.add_argument("--burst", type=int, default=200, help="concurrent groups (b)")
    parser.add_argument("--pods", type=int, default=200, help="concurrent pods (c)")
    parser.add_argument("--pod-cpu", help="each pod's cpu request in (c), e.g. 10m (none)")
    parser.add_argument("--concurrency", type=int, default=16, help="creates in flight")
    parser.add_argument("--rtt", type=int, default=200, help="sequential GETs (baseline)")
    parser.add_argument("--group-workers", type=int, default=1, help="SDG setting (default 1)")
    parser.add_argument("--pod-workers", type=int, default=8, help="SDG setting (default 8)")
    parser.add_argument("--profile", type=Path, help="write pyinstrument profiles per phase")
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    parser.add_argument(
        "--no-results", action="store_true", help="do not update hack/bench/RESULTS.md"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    out = anyio.run(bench, args)
    text = markdown(out)
    print(text)
    if args.json:
        args.json.write_text(json.dumps(jsonable(out), indent=2, default=str))
    if not args.no_results:
        update_section("e2e", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

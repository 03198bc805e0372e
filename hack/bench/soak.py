"""Memory under churn: does the manager's RSS stay flat while groups and pods come and go?

``make bench-soak`` (or ``.venv/bin/python hack/bench/soak.py --duration 540 --warmup 200
[--census] [-- manager flags]``) starts the local control plane and the real manager
process (webhooks on, leader election on, holder pods on, as compare.py and
bench_groups.py start it) wrapped by ``memhook.py``, a fake kubelet (with its device
manager) in this process, and ``--nodes`` nodes. Then, round after round until
``--duration`` seconds (or ``--rounds``): create ``--groups`` one-GPU groups and
``--pods`` pods in them, wait until every group is Bound and every pod has a node, delete
them all and wait until they are gone. Every name is new (``g{round}-{i}``), so state
kept per object *ever seen* grows, and only state per object that *exists* stays flat.

Measured: the manager's RSS (``/proc/PID/status`` VmRSS) at the end of every round (all
objects deleted: the same point of the cycle each time). At the end of the warm-up the
manager is told to mark (SIGUSR1: gc counts by type, container sizes, the allocators'
books; with ``--census`` a ``tracemalloc`` snapshot, tracing from the manager's start),
at the end to report (SIGUSR2); the report lists what grew between the two. The bar:
RSS growth from the end of the warm-up to the end of the soak <= ``--bar-mib`` (2 MiB).
``--census`` runs are for finding what grows: tracing slows the manager and its own
books grow the RSS, so their RSS is not held to the bar (nor written to RESULTS.md).

Writes the ``soak`` section of RESULTS.md unless ``--no-results``. A benchmark, never a
timed test.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import shlex
import signal
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
for p in (str(HERE), str(ROOT)):
    if p not in sys.path:
        sys.path.insert(0, p)

import compare  # noqa: E402
from _kube import ApiError, Kube, cpu_seconds, memory  # noqa: E402
from _report import machine, machine_line, update_section  # noqa: E402
from compare import (  # noqa: E402
    GPU,
    SDG_PATH,
    Env,
    FirstSeen,
    Proc,
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
NS = "soak"
#: What the manager image (Dockerfile) sets that memory depends on: a fixed glibc mmap
#: threshold (without it, freed TLS buffers fragment the heap: RESULTS.md, session 18).
IMAGE_ENV = ["MALLOC_MMAP_THRESHOLD_=131072"]
MIB = 1024 * 1024


def group(name: str) -> Obj:
    return {
        "apiVersion": "deviceshare.io/v1alpha1",
        "kind": "SharedDeviceGroup",
        "metadata": {"name": name},
        "spec": {"resources": {GPU: 1}, "schedulingStrategy": "spread"},
    }


#: ``--split``: the manager's parts in three processes (``--controllers``), each measured.
SPLIT = {
    "schedulers": ["--controllers=group-scheduler,pod-scheduler,foreign-reporter"],
    "status": ["--controllers=status", "--leader-election-id=deviceshare-status"],
    "webhooks": ["--controllers=webhooks", "--no-leader-elect"],
}


async def start_manager(
    env: Env, args: argparse.Namespace, name: str = "manager", flags: list[str] | None = None
) -> tuple[Proc, int, Path]:
    webhook_port, probe_port = free_port(), free_port()
    out = env.work / f"memhook-{name}"
    cmd = [
        sys.executable,
        str(HERE / "memhook.py"),
        f"--kubeconfig={env.sa_kubeconfig}",
        "--webhook-host=127.0.0.1",
        f"--webhook-port={webhook_port}",
        f"--webhook-cert-dir={env.cp.webhook_cert_dir()}",
        "--metrics-bind-address=127.0.0.1:0",
        f"--health-probe-bind-address=127.0.0.1:{probe_port}",
        "--leader-elect",
        f"--leader-election-namespace={MANAGER_NS}",
        f"--claims-namespace={MANAGER_NS}",
        "--holders=auto",
        *(flags or []),
        *args.manager_args,
    ]
    for pair in ([] if args.no_image_env else IMAGE_ENV) + args.manager_env:
        key, _, value = pair.partition("=")
        env.env[key] = value
    env.env["SDG_MEMHOOK_OUT"] = str(out)
    env.env["SDG_MEMHOOK_TRACE"] = str(args.frames if args.census else 0)
    env.commands[name] = shlex.join(["python", *cmd[1:]])
    saved = compare.ROOT
    if args.tree:  # another source tree's manager (an A/B): its modules, its directory
        compare.ROOT = Path(args.tree)
        env.env["PYTHONPATH"] = args.tree
    try:
        proc = Proc(f"sdg-{name}", cmd, env.work / f"{name}.log", dict(env.env))
    finally:
        compare.ROOT = saved
    await wait_http_ok(proc, f"http://127.0.0.1:{probe_port}/readyz")
    return proc, webhook_port, out


async def fake_kubelet(env: Env) -> None:
    async with Client.from_kubeconfig(env.admin_kubeconfig) as client:
        await Kubelet(client, devices=indexed_devices).run()


async def until_empty(kube: Kube, path: str, within: float) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        page = await kube.request("GET", path, params={"limit": "1"})
        if not page.get("items"):
            return
        await asyncio.sleep(0.2)
    raise RuntimeError(f"{path} not empty within {within:g} s")


async def one_round(kube: Kube, r: int, args: argparse.Namespace) -> dict[str, float]:
    """Create, wait bound, delete, wait gone; seconds of each part."""
    t0 = time.perf_counter()
    names = [f"g{r}-{i:03d}" for i in range(args.groups)]
    pods = [group_pod(f"p{r}-{i:04d}", names[i % len(names)]) for i in range(args.pods)]
    groups_bound = FirstSeen(names, is_bound)
    pods_placed = FirstSeen([p["metadata"]["name"] for p in pods], has_node)
    async with Watch(kube, SDG_PATH, groups_bound), Watch(kube, pods_path(NS), pods_placed):
        await create_all(kube, SDG_PATH, [group(n) for n in names], args.in_flight)
        await groups_bound.wait(args.round_timeout)  # the webhook admits pods of Bound groups
        await create_all(kube, pods_path(NS), pods, args.in_flight)
        await pods_placed.wait(args.round_timeout)
    t_bound = time.perf_counter()
    with contextlib.suppress(ApiError):
        await kube.request("DELETE", pods_path(NS), params={"gracePeriodSeconds": "0"})
    await until_empty(kube, pods_path(NS), args.round_timeout)
    with contextlib.suppress(ApiError):
        await kube.request("DELETE", SDG_PATH)
    await until_empty(kube, SDG_PATH, args.round_timeout)
    # Holder pods go with their groups (the manager deletes them; the fake kubelet finishes).
    await until_holders_gone(kube, args.round_timeout)
    t_gone = time.perf_counter()
    return {"bound_s": t_bound - t0, "gone_s": t_gone - t_bound}


async def until_holders_gone(kube: Kube, within: float) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        page = await kube.request(
            "GET", pods_path(MANAGER_NS), params={"labelSelector": "deviceshare.io/role=holder"}
        )
        if not page.get("items"):
            return
        await asyncio.sleep(0.2)
    raise RuntimeError(f"holder pods not gone within {within:g} s")


def _read_json(path: Path) -> Obj | None:
    return dict(json.loads(path.read_text())) if path.exists() else None


async def wait_file(path: Path, proc: Proc, within: float = 120.0) -> Obj:
    """What memhook wrote to ``path`` (it renames finished files into place)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        proc.check()
        found = _read_json(path)
        if found is not None:
            return found
        err = _read_json(path.with_name("error.json"))
        if err is not None:
            raise RuntimeError(f"memhook failed: {err}")
        await asyncio.sleep(0.5)
    raise RuntimeError(f"{path} not written within {within:g} s")


def slope_mib_per_min(samples: list[tuple[float, int]]) -> float:
    """Least-squares slope of (seconds, RSS bytes), in MiB per minute."""
    if len(samples) < 2:
        return 0.0
    xs = [t for t, _ in samples]
    ys = [b / MIB for _, b in samples]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return (
        60.0 * sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den if den else 0.0
    )


def figures(rows: list[Obj], name: str, warm_at: int) -> Obj:
    """One process's RSS figures from the rounds' samples."""
    after = rows[warm_at:]
    half = after[len(after) // 2 :]
    rss = [row["rss"][name] for row in rows]
    return {
        "rss_first": rss[0],
        "rss_warm": rss[warm_at],
        "rss_end": rss[-1],
        "growth": rss[-1] - rss[warm_at],
        "second_half_growth": half[-1]["rss"][name] - half[0]["rss"][name],
        "slope_after_warmup": slope_mib_per_min([(x["t"], x["rss"][name]) for x in after]),
    }


async def soak(args: argparse.Namespace) -> Obj:
    cp = ControlPlane(crd_paths=[ROOT / "config" / "crd"])
    cp.start()
    parts = SPLIT if args.split else {"manager": []}
    procs: dict[str, tuple[Proc, Path]] = {}
    try:
        install_rbac(cp)
        env = Env(cp, cp.work_dir)
        async with Kube(env.admin_kubeconfig, limit=args.in_flight + 16) as kube:
            await create_nodes(kube, 0, args.nodes, 32)
            await ensure_namespace(kube, NS)
            for name, flags in parts.items():
                proc, port, out = await start_manager(env, args, name, flags)
                procs[name] = (proc, out)
                if name in ("manager", "webhooks"):
                    env.webhooks(port)
            await asyncio.sleep(2)
            kubelet = asyncio.ensure_future(fake_kubelet(env))
            rows: list[Obj] = []
            t_start = time.perf_counter()
            cpu0 = {name: cpu_seconds(proc.pid) for name, (proc, _) in procs.items()}
            warm_at: int | None = None
            try:
                r = 0
                while True:
                    elapsed = time.perf_counter() - t_start
                    if args.rounds and r >= args.rounds:
                        break
                    if not args.rounds and elapsed >= args.duration:
                        break
                    times = await one_round(kube, r, args)
                    rss = {name: memory(proc.pid)["VmRSS"] for name, (proc, _) in procs.items()}
                    row = {"round": r, "t": time.perf_counter() - t_start, "rss": rss, **times}
                    rows.append(row)
                    print(
                        f"round {r:4d} t={row['t']:7.1f}s RSS "
                        + " ".join(f"{n} {b / MIB:7.2f}" for n, b in rss.items())
                        + f" MiB (bound {times['bound_s']:.2f} s, gone {times['gone_s']:.2f} s)",
                        flush=True,
                    )
                    if warm_at is None and row["t"] >= args.warmup:
                        for name, (proc, out) in procs.items():
                            os.kill(proc.pid, signal.SIGUSR1)
                            mark = await wait_file(out / "mark.json", proc)
                            print(f"  warm-up over at round {r}: {name} mark {mark}", flush=True)
                        warm_at = r
                        # The mark's own books (gc counts, container sizes) count as warm-up.
                        rows[-1]["rss"] = {
                            name: memory(proc.pid)["VmRSS"] for name, (proc, _) in procs.items()
                        }
                    r += 1
                if warm_at is None:
                    raise RuntimeError("the soak ended before its warm-up: lengthen --duration")
                peak = {name: memory(proc.pid)["VmHWM"] for name, (proc, _) in procs.items()}
                cpu = {name: cpu_seconds(p.pid) - cpu0[name] for name, (p, _) in procs.items()}
                reports = {}
                for name, (proc, out) in procs.items():
                    os.kill(proc.pid, signal.SIGUSR2)
                    reports[name] = await wait_file(out / "report.json", proc, within=600)
            finally:
                kubelet.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await kubelet
                for proc, _ in procs.values():
                    await proc.stop(10)
    finally:
        cp.stop()
    return {
        "args": vars(args),
        "machine": machine(),
        "commands": {name: env.commands.get(name, "") for name in procs},
        "manager_env": ([] if args.no_image_env else IMAGE_ENV) + args.manager_env,
        "rounds": len(rows),
        "warm_round": warm_at,
        "seconds": rows[-1]["t"],
        "processes": {
            name: {
                **figures(rows, name, warm_at),
                "rss_peak": peak[name],
                "cpu_s": cpu[name],
                "report": reports[name],
            }
            for name in procs
        },
        "bound_s_mean": statistics.fmean(x["bound_s"] for x in rows),
        "rows": rows,
    }


def markdown(res: Obj, bar: float) -> str:
    a, m = res["args"], res["machine"]
    procs = res["processes"]
    lines = [
        f"Machine: {machine_line(m)}.",
        f"Command: `python hack/bench/soak.py --duration {a['duration']:g} --warmup "
        f"{a['warmup']:g} --nodes {a['nodes']} --groups {a['groups']} --pods {a['pods']}"
        + (" --split" if a.get("split") else "")
        + (" --census" if a["census"] else "")
        + (f" --tree {a['tree']}" if a["tree"] else "")
        + "".join(f" --manager-env {e}" for e in a["manager_env"])
        + (" --no-image-env" if a.get("no_image_env") else "")
        + "`; "
        + "; ".join(f"{name}: `{cmd}`" for name, cmd in res["commands"].items())
        + "; environment "
        + (", ".join(f"`{e}`" for e in res.get("manager_env", [])) or "glibc defaults")
        + ".",
        "",
        f"{res['rounds']} rounds in {res['seconds']:.0f} s ({res['rounds'] * a['groups']} groups"
        f" and {res['rounds'] * a['pods']} pods created, bound and deleted; a round took "
        f"{res['bound_s_mean']:.1f} s to bind on average); CPU "
        + ", ".join(f"{name} {p['cpu_s']:.0f} s" for name, p in procs.items())
        + ".",
        "",
        "| RSS at round end, MiB | " + " | ".join(procs) + " |",
        "| --- |" + " ---: |" * len(procs),
    ]

    def row(label: str, cell: Callable[[Obj], str]) -> str:
        return f"| {label} | " + " | ".join(cell(p) for p in procs.values()) + " |"

    def met(p: Obj) -> str:
        return f"{p['growth'] / MIB:+.2f} ({'met' if p['growth'] <= bar * MIB else 'NOT met'})"

    lines += [
        row("first round", lambda p: f"{p['rss_first'] / MIB:.2f}"),
        row(f"end of warm-up (round {res['warm_round']})", lambda p: f"{p['rss_warm'] / MIB:.2f}"),
        row(f"end of soak (round {res['rounds'] - 1})", lambda p: f"{p['rss_end'] / MIB:.2f}"),
        row(f"growth after warm-up (bar <= {bar:g})", met),
        row(
            "growth over the second half after warm-up",
            lambda p: f"{p['second_half_growth'] / MIB:+.2f}",
        ),
        row(
            "slope after warm-up (least squares), MiB/min",
            lambda p: f"{p['slope_after_warmup']:+.3f}",
        ),
        row("peak (VmHWM)", lambda p: f"{p['rss_peak'] / MIB:.2f}"),
    ]
    for name, p in procs.items():
        rep = p["report"]
        grown = [t for t in rep.get("types_grown", []) if t["grew"] >= 50][:8]
        if grown:
            lines += [
                "",
                f"{name}: live objects grown after warm-up (gc, by type): "
                + ", ".join(f"`{t['type']}` +{t['grew']}" for t in grown)
                + ".",
            ]
        cont = [c for c in rep.get("containers_grown", []) if c["now"] - c["before"] >= 50][:8]
        if cont:
            lines += [
                "",
                f"{name}: containers grown after warm-up: "
                + ", ".join(f"`{c['holder']}` {c['before']}->{c['now']}" for c in cont)
                + ".",
            ]
    return "\n".join(lines)


def print_report(res: Obj) -> None:
    for name, p in res["processes"].items():
        print(f"\n== {name}")
        print_census(p["report"])


def print_census(rep: Obj) -> None:
    print(f"heap census after warm-up ({rep.get('seconds_since_mark', 0):.0f} s):")
    print("  objects:", rep.get("objects"))
    for when, books in (rep.get("allocators") or {}).items():
        print(
            f"  allocators at {when}:",
            {k: f"{v / MIB:.2f} MiB" if "malloc" in k else v for k, v in books.items()},
        )
    print("  types grown:")
    for t in rep.get("types_grown", [])[:20]:
        print(f"    {t['grew']:+8d} {t['type']} (now {t['now']})")
    print("  containers grown:")
    for c in rep.get("containers_grown", [])[:20]:
        print(f"    {c['before']:8d} -> {c['now']:8d} {c['type']} {c['holder']}")
    print("  new large containers:")
    for c in rep.get("containers_new", [])[:15]:
        print(f"    {c['now']:8d} {c['type']} {c['holder']}")
    for s in rep.get("tracemalloc_lineno", [])[:25]:
        print(f"    {s['size_diff'] / 1024:+9.1f} KiB {s['count_diff']:+7d} {s['where']}")
    for s in rep.get("tracemalloc_traceback", [])[:8]:
        print(f"  {s['size_diff'] / 1024:+9.1f} KiB {s['count_diff']:+7d}")
        for line in s["stack"][-12:]:
            print("      " + line)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=540.0, help="seconds of churn")
    parser.add_argument("--rounds", type=int, default=0, help="rounds instead of --duration")
    parser.add_argument("--warmup", type=float, default=200.0, help="seconds before the mark")
    parser.add_argument("--nodes", type=int, default=10)
    parser.add_argument("--groups", type=int, default=20)
    parser.add_argument("--pods", type=int, default=100)
    parser.add_argument("--in-flight", type=int, default=32)
    parser.add_argument("--round-timeout", type=float, default=120.0)
    parser.add_argument("--bar-mib", type=float, default=2.0)
    parser.add_argument(
        "--split",
        action="store_true",
        help="three managers (--controllers): schedulers, status, webhooks, each measured",
    )
    parser.add_argument("--census", action="store_true", help="tracemalloc from the mark on")
    parser.add_argument("--frames", type=int, default=8, help="tracemalloc frames (--census)")
    parser.add_argument("--json", default="", help="also write the figures to this file")
    parser.add_argument(
        "--manager-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set in the manager's environment (e.g. MALLOC_MMAP_THRESHOLD_=131072)",
    )
    parser.add_argument(
        "--no-image-env",
        action="store_true",
        help="run the manager without the image's environment (IMAGE_ENV): glibc defaults",
    )
    parser.add_argument(
        "--tree", default="", help="run the manager of this source tree (e.g. a git archive)"
    )
    parser.add_argument("--no-results", action="store_true", help="leave RESULTS.md alone")
    parser.add_argument("manager_args", nargs="*", help="after --: more manager flags")
    args = parser.parse_args(argv)
    if args.groups * 1 > args.nodes * 8:
        parser.error("more groups than GPUs: each node has 8, each group takes 1")
    if args.warmup >= args.duration and not args.rounds:
        parser.error("--warmup must be shorter than --duration")
    if any("=" not in e for e in args.manager_env):
        parser.error("--manager-env takes KEY=VALUE")
    if args.tree:
        args.tree = str(Path(args.tree).resolve())
        if not (Path(args.tree) / "controllers" / "__main__.py").is_file():
            parser.error(f"--tree {args.tree}: no controllers/__main__.py there")
    logging.basicConfig(level=logging.WARNING)
    res = asyncio.run(soak(args))
    print_report(res)
    md = markdown(res, args.bar_mib)
    print("\n" + md)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1, default=str))
    if not args.no_results and not args.census:
        update_section("soak-split" if args.split else "soak", md)
    met = all(p["growth"] <= args.bar_mib * MIB for p in res["processes"].values())
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())

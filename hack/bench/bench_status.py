"""S4 alone, A/B: status convergence of the SDG manager from one or more source trees.

    .venv/bin/python hack/bench/bench_status.py --groups 400 --per-group 5 \
        --tree before=/tmp/sdg-before --tree after=. --rounds 2

starts the local control plane once, binds ``--groups`` groups (the first tree's manager),
then for each round and each tree (alternating, so machine load falls on both) starts that
tree's manager, creates ``groups * per-group`` annotated pods interleaved across groups as
compare.py's S4 does (webhooks off, a schedulerName nobody serves, 64 in flight), and
reports: lag (last create answered -> every group's status right, on a watch), the
manager's CPU-s over the phase, the API server's CPU-s, and the API server's count of
status PATCHes and Event writes (``apiserver_request_total``) at convergence and 40 s
later (coalesced Events go out up to 30 s after a change). Pods are then deleted and the
statuses emptied before the next manager starts. A tree is a copy of the repository (the
manager runs with it as cwd and PYTHONPATH), e.g. the working tree with one file put back
as it was. ``--kopf`` adds the kopf peer; ``--py-spy DIR`` samples each contender. A
benchmark: nothing passes or fails.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
for p in (str(HERE), str(ROOT)):
    if p not in sys.path:
        sys.path.insert(0, p)

import compare  # noqa: E402
from _kube import Kube, Stopwatch, cpu_seconds, memory, reset_peak  # noqa: E402
from compare import (  # noqa: E402
    GROUP_ANNOTATION,
    NOBODY,
    SDG_PATH,
    Env,
    FirstSeen,
    Proc,
    PySpy,
    StatusConverged,
    Watch,
    create_all,
    create_nodes,
    delete_pods,
    ensure_namespace,
    group_obj,
    group_pod,
    is_bound,
    pods_path,
    wait_groups_empty,
)

from sdgruntime.envtest import ControlPlane  # noqa: E402
from tests.e2e.harness import install_rbac  # noqa: E402

log = logging.getLogger("bench_status")
NS = "s4-bench"


async def writes(kube: Kube) -> dict[str, float]:
    """The API server's request counts for the writes S4 is about."""
    counts = await kube.writes()
    return {
        "status_patch": counts["shareddevicegroups/status PATCH"],
        "event_post": counts["events POST"],
        "event_patch": counts["events PATCH"],
    }


async def start_manager(env: Env, tree: Path, tag: str) -> Proc:
    """compare.Env.manager, from another source tree (its cwd and PYTHONPATH)."""
    saved, saved_root = dict(env.env), compare.ROOT
    env.env["PYTHONPATH"] = str(tree)
    compare.ROOT = tree
    try:
        proc, _, _ = await env.manager(tag)
    finally:
        env.env, compare.ROOT = saved, saved_root
    return proc


async def phase(
    kube: Kube, cp: ControlPlane, proc: Proc, groups: list[str], n: int, spy: Path | None
) -> dict:
    pods = [group_pod(f"s-{i:05d}", groups[i % len(groups)], NOBODY) for i in range(n)]
    expected: dict[str, set[str]] = {g: set() for g in groups}
    for p in pods:
        expected[p["metadata"]["annotations"][GROUP_ANNOTATION]].add(
            f"{NS}/{p['metadata']['name']}"
        )
    reset_peak(proc.pid)
    sw = Stopwatch(
        {"manager": proc.pid, "apiserver": cp.pids["kube-apiserver"], "etcd": cp.pids["etcd"]}
    )
    w0 = await writes(kube)
    sampler = PySpy(proc.pid, spy) if spy else None
    converged = StatusConverged(expected, sw.cpu)

    pod_seen: list[float] = []

    def on_pod(typ: str, obj: dict) -> None:
        if typ == "ADDED":
            pod_seen.append(time.perf_counter())

    async with Watch(kube, SDG_PATH, converged), Watch(kube, pods_path(NS), on_pod):
        made = await create_all(kube, pods_path(NS), pods, 64)
        await converged.wait(600)
    assert converged.t is not None and converged.cpu is not None
    profile = sampler.stop() if sampler else None
    w1 = await writes(kube)  # at convergence (+3 s)
    await asyncio.sleep(40)  # coalesced Events go out up to 30 s after a change
    w2 = await writes(kube)
    mem = memory(proc.pid)
    return {
        "lag_s": round(converged.t - made.t_last, 2),
        "wall_last_create": round(time.time() - (time.perf_counter() - made.t_last), 3),
        "wall_first_create": round(time.time() - (time.perf_counter() - made.t_first), 3),
        "wall_converged": round(time.time() - (time.perf_counter() - converged.t), 3),
        "create_s": round(made.create_s, 2),
        "last_pod_seen_s": round(max(pod_seen) - made.t_last, 2),
        "cpu": {k: round(v, 2) for k, v in converged.cpu.items()},
        "peak_rss_mib": round(mem["VmHWM"] / 2**20, 1),
        "writes": {k: w1[k] - w0[k] for k in w0},
        "writes_40s_later": {k: w2[k] - w0[k] for k in w0},
        **({"profile": profile} if profile else {}),
    }


async def main_async(args: argparse.Namespace) -> None:
    trees: list[tuple[str, Path]] = args.tree
    work = Path(args.work_dir) if args.work_dir else None
    cp = ControlPlane(crd_paths=[ROOT / "config" / "crd"], work_dir=work)
    cp.start()
    procs: list[Proc] = []
    try:
        install_rbac(cp)
        env = Env(cp, cp.work_dir, [])
        async with Kube(env.admin_kubeconfig, limit=80) as kube:
            await ensure_namespace(kube, NS)
            await create_nodes(kube, 0, args.nodes, 64)
            groups = [f"g-{i:04d}" for i in range(args.groups)]
            mgr = await start_manager(env, trees[0][1], "bind")
            procs.append(mgr)
            seen = FirstSeen(groups, is_bound)
            async with Watch(kube, SDG_PATH, seen):
                await create_all(kube, SDG_PATH, [group_obj(g) for g in groups], 64)
                await seen.wait(600)
            await mgr.stop()
            procs.remove(mgr)
            contenders = list(trees) + ([("kopf", None)] if args.kopf else [])
            for r in range(args.rounds):
                for label, tree in contenders:
                    if tree is None:
                        proc, _ = await env.kopf()
                        await asyncio.sleep(2)
                    else:
                        proc = await start_manager(env, tree, f"{label}-{r}")
                        await asyncio.sleep(2)  # settle after start
                    procs.append(proc)
                    c0 = cpu_seconds(proc.pid)
                    spy = Path(args.py_spy) / f"{label}-{r}.txt" if args.py_spy else None
                    n = args.groups * args.per_group
                    res = await phase(kube, cp, proc, groups, n, spy)
                    res["start_cpu"] = round(c0, 2)
                    print(json.dumps({"round": r, "who": label, **res}), flush=True)
                    await delete_pods(kube, NS)
                    await wait_groups_empty(kube)
                    await proc.stop(10)
                    procs.remove(proc)
    finally:
        for proc in procs:
            with contextlib.suppress(Exception):
                await proc.stop(5)
        cp.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--groups", type=int, default=400)
    parser.add_argument("--per-group", type=int, default=5)
    parser.add_argument("--nodes", type=int, default=0, help="default: groups / 2")
    parser.add_argument("--tree", action="append", default=[], help="label=path (repeatable)")
    parser.add_argument("--kopf", action="store_true", help="also run the kopf peer")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--work-dir")
    parser.add_argument("--py-spy", help="sample each contender into this directory")
    args = parser.parse_args()
    specs = args.tree or [f"here={ROOT}"]
    args.tree = [(t.split("=", 1)[0], Path(t.split("=", 1)[1]).resolve()) for t in specs]
    args.nodes = args.nodes or max(1, args.groups // 2)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s")
    asyncio.run(main_async(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

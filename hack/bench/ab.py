"""A/B of SDG's own phases: S3 + S1 and S3b + S4 + S6/S7 of ``compare.py``, SDG's
manager only (``--only s8``: S8's webhook latency, with a manager that serves webhooks and
does not lead, then through the floor's webhook; ``--only s2``: S2's backlog drain after a
failover, then the raw binder's drain of the same backlog as the run's yardstick).

For before/after runs of one change: run it from each tree in turn (``ROOT`` is the tree
whose manager and bench code run), alternating, on a quiet machine. Prints each phase's
wall and CPU seconds, the API server's writes and, for S1, its CPU per pod by part (its
own profile, ``_pprof.py``); ``--py-spy`` profiles the manager in S1 (a second run,
``compare.Run.profiled``: py-spy slows what it samples, so compare the phases of runs
without it), S2, S4 and S8 (and the floor in S8), and ``--work-dir`` keeps the raw
stacks (``py-spy-s1.txt``, ``py-spy-s2.txt``, ``py-spy-s4.txt``, ``py-spy-s8.txt``,
``py-spy-s8-floor.txt``) and the API server's profiles (``pprof-*.pb.gz``).
About 2.5 minutes at full scale on 2 cores.

    python hack/bench/ab.py ROOT OUT.json [--only s1|s2|s4|s8] [--py-spy] [--work-dir DIR]

Part of the benchmarks, not of SDG.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import Any


def phases(only: str | None) -> tuple[bool, bool, bool, bool]:
    """Whether S1, S4, S8 and S2 run: S1 and S4, unless ``only`` names one phase."""
    if only not in (None, "s1", "s2", "s4", "s8"):
        raise ValueError(f"--only takes s1, s2, s4 or s8, not {only!r}")
    return only in (None, "s1"), only in (None, "s4"), only == "s8", only == "s2"


def per_bench(cpu: dict[str, float]) -> dict[str, float]:
    """Each process's CPU-s per CPU-s of the bench in the same phase. The bench's work in
    a phase is fixed (the same creates and watches), so its CPU-s measure how fast the
    host ran then: on this shared host a whole run can cost ~1.45x more CPU-s in
    everything but crypto (RESULTS.md, session 37). Compare A/B runs by these ratios too."""
    bench = cpu.get("bench") or 0.0
    if bench <= 0:
        return {}
    return {k: v / bench for k, v in cpu.items() if k != "bench"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("root", help="the tree to run (its manager and its compare.py)")
    p.add_argument("out", help="the results as JSON")
    p.add_argument("--only", choices=("s1", "s2", "s4", "s8"))
    p.add_argument("--py-spy", action="store_true")
    p.add_argument("--work-dir")
    p.add_argument("--scale", default="full", choices=("full", "small"))
    p.add_argument("--manager-flag", action="append", default=[])
    p.add_argument(
        "--nice", type=int, help="S8: the manager's and the floor's nice value (both alike)"
    )
    p.add_argument(
        "--s8-after-s1",
        action="store_true",
        help="S8 after S1 with SDG in the same cluster, as compare.py runs it (its first "
        "rounds with SDG's webhook are slower then: RESULTS.md, session 42)",
    )
    a = p.parse_args(argv)
    run_s1, run_s4, run_s8, run_s2 = phases(a.only)
    sys.path[:0] = [a.root, f"{a.root}/hack/bench"]
    import compare as c  # the tree's own, from ROOT

    class AB(c.Run):
        def s5_placement(self) -> None:  # not measured here
            pass

        def s8_contender(self, proc: Any, phase: str) -> Any:
            """Readies an S8 contender: its ``--nice`` value, and a py-spy of it into
            ``py-spy-PHASE.txt`` with ``--py-spy`` (returned, else None)."""
            if a.nice is not None:
                os.setpriority(os.PRIO_PROCESS, proc.pid, a.nice)
            if not self.args.py_spy:
                return None
            return c.PySpy(proc.pid, proc.log_path.parent / f"py-spy-{phase}.txt")

        async def scenarios(self) -> None:
            sc, kube, env = self.scale, self.kube, self.env
            for ns in ("s1-sdg", "s4-sdg", "s8-on", "s8-off", "s8f-on", "s8f-off", "s2-sdg"):
                await c.ensure_namespace(kube, ns)
            await c.create_nodes(kube, 0, sc.nodes, self.args.in_flight)
            groups = [f"g-{i:04d}" for i in range(sc.groups)]

            async def standby(tag: str) -> tuple[Any, int]:
                """A manager that serves webhooks but does not lead: the bench holds its
                lease (S8's and S2's)."""
                await c.hold_lease(kube, "bench-holds-the-lease", 3600)
                mgr, port, _ = await env.manager(tag)
                self.procs.append(mgr)
                return mgr, port

            if run_s8:
                mgr, port, _ = await env.manager("s3")
                self.procs.append(mgr)
                if a.s8_after_s1:
                    env.webhooks(port)
                await self.s3_groups(mgr, groups, "S3")
                if a.s8_after_s1:
                    await c.wait_webhook(kube, "s1-sdg", groups[0], on=True)
                    await self.s1_sdg(mgr, groups)
                    await c.delete_pods(kube, "s1-sdg")
                    await c.wait_groups_empty(kube)
                    env.webhooks(None)
                await self.stop(mgr)
                mgr, port = await standby("s8")
                spy = self.s8_contender(mgr, "s8")
                self.out["s8"] = await self.s8(mgr, port, groups, spy=spy)
                text = await c.manager_metrics(mgr) or ""
                self.out["s8_metrics"] = [
                    line
                    for line in text.splitlines()
                    if line.startswith(("sdgruntime_http", "controller_runtime_webhook"))
                ]
                assert kube.session is not None
                async with kube.session.get("/metrics") as resp:
                    text = await resp.text()
                self.out["s8_apiserver_metrics"] = [
                    line for line in text.splitlines() if "admission" in line and "pod" in line
                ]
                await self.stop(mgr)
                # The same rounds through the floor's webhook, with the pods SDG's made
                floor, floor_port, _ = await env.floor(
                    "s8",
                    "s8f-none",
                    self.write_json("floor-templates.json", await c.made_pods(kube, "s8-on")),
                    self.write_json("floor-nodes.json", self.group_nodes),
                )
                self.procs.append(floor)
                spy = self.s8_contender(floor, "s8-floor")
                self.out["s8_floor"] = await self.s8(floor, floor_port, groups, ns="s8f", spy=spy)
                await self.stop(floor)
            if run_s2:
                await c.ensure_namespace(kube, "s2-raw")
                mgr, _, _ = await env.manager("s3")
                self.procs.append(mgr)
                await self.s3_groups(mgr, groups, "S3")
                await self.stop(mgr)
                mgr, port = await standby("s2")
                env.webhooks(port)
                await c.wait_webhook(kube, "s2-sdg", groups[0], on=True)
                backlog = await self.s2_backlog(mgr, groups)
                env.webhooks(None)
                spy = None
                if self.args.py_spy:
                    spy = c.PySpy(mgr.pid, mgr.log_path.parent / "py-spy-s2.txt")
                await self.s2_sdg(mgr, backlog, spy)
                await c.delete_pods(kube, "s2-sdg")
                await c.wait_groups_empty(kube)
                await self.stop(mgr)
                await self.s2_raw(backlog)
            if run_s1:
                mgr, port, _ = await env.manager("s1")
                self.procs.append(mgr)
                env.webhooks(port)
                await self.s3_groups(mgr, groups, "S3")
                await c.wait_webhook(kube, "s1-sdg", groups[0], on=True)
                await self.s1_sdg(mgr, groups)
                await c.delete_pods(kube, "s1-sdg")
                await c.wait_groups_empty(kube)
                await self.stop(mgr)
                env.webhooks(None)
            if run_s4:
                await c.create_nodes(kube, sc.nodes, sc.big_nodes, self.args.in_flight)
                mgr, _, _ = await env.manager("s4")
                self.procs.append(mgr)
                if not run_s1:
                    await self.s3_groups(mgr, groups, "S3")
                more = [f"g-{i:04d}" for i in range(sc.groups, sc.big_groups)]
                await self.s3_groups(mgr, more, "S3b")
                spy = None
                if self.args.py_spy:
                    spy = c.PySpy(mgr.pid, mgr.log_path.parent / "py-spy-s4.txt")
                await self.s4(mgr, "s4-sdg", groups + more, "S4: status convergence, SDG", spy)
                await self.stop(mgr)
                await self.s6_s7()  # with S4's pods, groups and nodes in place

    args = argparse.Namespace(
        scale=a.scale,
        in_flight=64,
        py_spy=a.py_spy,
        work_dir=a.work_dir,
        json=None,
        no_results=True,
        manager_flag=a.manager_flag,
    )
    out: dict[str, Any] = asyncio.run(AB(args, c.SCALES[a.scale]).run())
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1, default=str)
    for ph in out["phases"]:
        cpu = {k: round(v, 2) for k, v in ph["cpu"].items()}
        print(ph["name"], round(ph["wall"], 1), cpu, ph.get("writes"))
        ratios = per_bench(ph["cpu"])
        if ratios:
            print("  CPU-s per bench CPU-s:", ", ".join(f"{k} {v:.2f}" for k, v in ratios.items()))
        # the API server's CPU per pod by part (its own profile; a ROOT older than
        # 266b5d6 has none)
        parts = c.apiserver_ms(ph, ph.get("pods") or 1) if hasattr(c, "apiserver_ms") else {}
        if parts:
            top = sorted(parts.items(), key=lambda kv: -kv[1])
            print("  kube-apiserver ms/pod:", ", ".join(f"{k} {v:.2f}" for k, v in top))
        # the manager's, by its py-spy profile (--py-spy; a ROOT older than session 37 has
        # none)
        py = c.python_ms(ph, ph.get("pods") or 1) if hasattr(c, "python_ms") else {}
        if py:
            top = sorted(py.items(), key=lambda kv: -kv[1])
            print("  manager ms/pod:", ", ".join(f"{k} {v:.2f}" for k, v in top))
    for key in ("s1_sdg", "s2_sdg", "s2_raw", "s4_sdg", "s6_sdg", "s6_objects", "s7_sdg"):
        if key in out:
            print(key, out[key])
    for key in ("s8", "s8_floor"):
        if key in out:
            print(key, out[key])
    if "s2_sdg" in out and "s2_raw" in out:  # S2's goal: SDG's drain rate over the raw one's
        print("S2", round(out["s2_sdg"]["per_s"] / out["s2_raw"]["per_s"], 2), "x raw binds")
    if "s8" in out:  # compare's own S8 rows: the added p99s, the floor's beside SDG's
        for row in c.s8_rows(out, f"{c.SCALES[a.scale].s8_pods} creates each"):
            print(row[0], row[2], row[3])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

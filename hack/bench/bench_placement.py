"""In-memory placement benchmark: ``place()`` and the tracker's reservation at 1000 nodes.

No API server: this is the pure decision the group scheduler makes for every group, on a
realistic fleet (decoded Node dicts as the informer cache holds them, a tracker with about
half of the devices claimed). Latency per decision is reported as p50/p95/p99 and mean.

    .venv/bin/python hack/bench/bench_placement.py [--nodes 1000] [--iterations 2000]
                                                   [--json out.json]

A benchmark, not a test: it asserts only that the workload is what it claims to be.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from _report import machine, machine_line, summary, update_section  # noqa: E402

from controllers.ledger.tracker import DeviceTracker  # noqa: E402
from controllers.placement import NodeMemo, node_device_capacity, place  # noqa: E402

#: As the group scheduler keeps one: node facts memoised across calls.
MEMO = NodeMemo()
from sdgruntime.envtest.fakes import make_node  # noqa: E402

GPU = "nvidia.com/gpu"
SHARED = {"deviceshare.io/mode": "shared"}
GPU_TYPES = ("a100", "h100", "l4")
ZONES = ("zone-a", "zone-b", "zone-c")


@dataclass
class Fleet:
    nodes: list[dict[str, Any]]
    tracker: DeviceTracker
    shared: int
    tainted: int
    cordoned: int
    not_ready: int
    devices: int
    claimed: int


def build_fleet(n: int, seed: int = 42) -> Fleet:
    """``n`` nodes: ~70% shared, 1/2/4/8 GPUs, ~5% tainted, ~3% cordoned, ~2% NotReady,
    ``gpu-type``/``zone`` labels for nodeSelectors, a resourceVersion each as from the
    API server; then about half the devices claimed by single- and multi-device groups,
    lowest IDs first, as the scheduler would."""
    rng = random.Random(seed)
    nodes: list[dict[str, Any]] = []
    counts = dict.fromkeys(("shared", "tainted", "cordoned", "not_ready"), 0)
    for i in range(n):
        name = f"node-{i:04d}"
        shared = rng.random() < 0.70
        labels = {
            **(SHARED if shared else {}),
            "bench/gpu-type": rng.choice(GPU_TYPES),
            "topology.kubernetes.io/zone": rng.choice(ZONES),
        }
        roll = rng.random()
        taints = (
            [{"key": "dedicated", "value": "training", "effect": "NoSchedule"}]
            if roll < 0.05
            else []
        )
        unschedulable = 0.05 <= roll < 0.08
        ready = not (0.08 <= roll < 0.10)
        if shared:
            counts["shared"] += 1
            counts["tainted"] += bool(taints)
            counts["cordoned"] += unschedulable
            counts["not_ready"] += not ready
        node = make_node(
            name,
            labels=labels,
            allocatable={GPU: rng.choice((1, 2, 4, 8))},
            taints=taints,
            ready=ready,
            unschedulable=unschedulable,
        )
        # Every Node the informer cache holds carries one (placement memoises by it).
        node["metadata"]["resourceVersion"] = str(1000 + i)
        nodes.append(node)
    tracker = DeviceTracker()
    for node in nodes:
        tracker.set_node_capacity(node["metadata"]["name"], node_device_capacity(node))
    devices = claimed = g = 0
    for node in nodes:
        name = node["metadata"]["name"]
        cap = tracker.capacity(name, GPU)
        devices += cap
        target = rng.choice((cap // 2, (cap + 1) // 2))  # half, rounding either way
        while tracker.capacity(name, GPU) - tracker.free(name, GPU) < target:
            want = min(rng.choice((1, 1, 2, 4)), target - (cap - tracker.free(name, GPU)))
            tracker.add_claim(f"seed-{g}", name, {GPU: tracker.lowest_free(name, GPU, want)})
            g += 1
            claimed += want
    tracker.check_invariants()
    return Fleet(nodes, tracker, devices=devices, claimed=claimed, **counts)


@dataclass
class Stats:
    name: str
    iterations: int
    mean_us: float
    p50_us: float
    p95_us: float
    p99_us: float
    max_us: float
    note: str = ""


def measure(
    name: str, fn: Callable[[], object], iterations: int, warmup: int, note: str = ""
) -> Stats:
    """Time ``fn`` once per iteration with perf_counter_ns; GC is collected before and
    disabled during the timed loop so a collection does not land on one sample."""
    for _ in range(warmup):
        fn()
    gc.collect()
    gc.disable()
    try:
        samples: list[int] = []
        clock = time.perf_counter_ns
        for _ in range(iterations):
            t0 = clock()
            fn()
            samples.append(clock() - t0)
    finally:
        gc.enable()
    return stats(name, samples, note)


def stats(name: str, samples_ns: list[int], note: str = "") -> Stats:
    s = summary(ns / 1000 for ns in samples_ns)
    return Stats(name, s["n"], s["mean"], s["p50"], s["p95"], s["p99"], s["max"], note)


def run(n_nodes: int, iterations: int, warmup: int, seed: int) -> dict[str, Any]:
    fleet = build_fleet(n_nodes, seed)
    nodes, tracker = fleet.nodes, fleet.tracker
    results: list[Stats] = []

    specs: dict[str, dict[str, Any]] = {
        "place binpack 1 GPU": {"resources": {GPU: 1}},
        "place spread 2 GPU": {"resources": {GPU: 2}, "schedulingStrategy": "spread"},
        "place binpack 2 GPU + nodeSelector": {
            "resources": {GPU: 2},
            "nodeSelector": {"bench/gpu-type": "h100", "topology.kubernetes.io/zone": "zone-b"},
        },
    }
    for label, spec in specs.items():
        decision = place(spec, nodes, tracker, memo=MEMO)
        assert decision.node is not None, f"{label}: expected a feasible node"
        note = f"{decision.feasible} feasible, {len(decision.reasons)} filtered"
        results.append(
            measure(
                label, lambda s=spec: place(s, nodes, tracker, memo=MEMO), iterations, warmup, note
            )
        )

    # The memo's two edges: Nodes without a resourceVersion (hand-built; nothing is
    # memoised), and 1% of the fleet updated before every call (new objects with new
    # versions, as node heartbeats and label edits arrive through the informer).
    spec = specs["place binpack 1 GPU"]
    unversioned = [
        {**n, "metadata": {k: v for k, v in n["metadata"].items() if k != "resourceVersion"}}
        for n in nodes
    ]
    results.append(
        measure(
            "place binpack 1 GPU, Nodes without resourceVersion",
            lambda: place(spec, unversioned, tracker, memo=MEMO),
            iterations,
            warmup,
            "nothing memoised",
        )
    )
    churn = list(nodes)
    updated = [
        {**n, "metadata": {**n["metadata"], "resourceVersion": f"u{n['metadata']['name']}"}}
        for n in nodes
    ]
    step = max(1, n_nodes // 100)
    turn = [0]

    def place_with_churn() -> None:
        start = turn[0] = (turn[0] + step) % n_nodes
        for i in range(start, min(start + step, n_nodes)):
            churn[i] = updated[i] if churn[i] is nodes[i] else nodes[i]
        place(spec, churn, tracker, memo=MEMO)

    results.append(
        measure(
            "place binpack 1 GPU, 1% of Nodes updated per call",
            place_with_churn,
            iterations,
            warmup,
            f"{step} new Node objects per call",
        )
    )

    nowhere = {"resources": {GPU: 16}}
    decision = place(nowhere, nodes, tracker, memo=MEMO)
    assert decision.node is None and len(decision.reasons) == n_nodes
    message = decision.message()
    results.append(
        measure(
            "place nowhere (16 GPU) + pending message",
            lambda: place(nowhere, nodes, tracker, memo=MEMO).message(),
            iterations,
            warmup,
            f"all {n_nodes} filtered",
        )
    )

    # What the group scheduler does in memory around place(): span attributes (sorted
    # reasons and scores, first 50 each), then the claim book's reserve (the lowest free
    # IDs, recorded); release undoes it untimed-ish (it is cheap and keeps the fleet
    # identical across iterations).
    spec = specs["place binpack 1 GPU"]

    def scheduler_path() -> None:
        d = place(spec, nodes, tracker, memo=MEMO)
        attrs = {f"sdg.filter.{n}": "; ".join(w) for n, w in sorted(d.reasons.items())[:50]}
        attrs.update({f"sdg.score.{n}": s for n, s in sorted(d.scores.items())[:50]})
        assert d.node is not None
        picked = {r: tracker.lowest_free(d.node, r, n) for r, n in spec["resources"].items()}
        tracker.add_claim("bench-group", d.node, picked)
        tracker.release("bench-group")

    results.append(
        measure(
            "scheduler in-memory path (place + span attrs + reserve + release)",
            scheduler_path,
            iterations,
            warmup,
        )
    )

    # A reservation alone (lowest_free + add_claim, as Ledger.reserve records one): a
    # fresh group on a node with free devices; the release after it is not timed.
    free_nodes = [
        n["metadata"]["name"] for n in nodes if tracker.free(n["metadata"]["name"], GPU) >= 2
    ]
    alloc_ns: list[int] = []
    for _ in range(warmup):
        tracker.add_claim(
            "bench-alloc", free_nodes[0], {GPU: tracker.lowest_free(free_nodes[0], GPU, 2)}
        )
        tracker.release("bench-alloc")
    gc.collect()
    gc.disable()
    try:
        clock = time.perf_counter_ns
        for i in range(iterations * 10):
            node = free_nodes[i % len(free_nodes)]
            t0 = clock()
            tracker.add_claim("bench-alloc", node, {GPU: tracker.lowest_free(node, GPU, 2)})
            alloc_ns.append(clock() - t0)
            tracker.release("bench-alloc")
    finally:
        gc.enable()
    results.append(stats("tracker lowest_free + add_claim 2 GPU", alloc_ns))

    # Components, as evidence for where place() spends its time.
    results.append(
        measure(
            f"node_device_capacity x {n_nodes}",
            lambda: [node_device_capacity(n) for n in nodes],
            max(50, iterations // 10),
            warmup,
            "once per Node update (informer feed)",
        )
    )
    results.append(
        measure(
            f"tracker.free x {n_nodes}",
            lambda: [tracker.free(n["metadata"]["name"], GPU) for n in nodes],
            max(50, iterations // 10),
            warmup,
        )
    )
    # place() with the ``blocked`` hook: devices used outside SDG on ~5% of the nodes.
    rng = random.Random(seed)
    blocked = {
        n["metadata"]["name"]: {GPU: f"have {GPU} used by pods outside any group"}
        for n in nodes
        if rng.random() < 0.05
    }
    spec = specs["place binpack 1 GPU"]
    results.append(
        measure(
            "place binpack 1 GPU, blocked on 5% of nodes",
            lambda: place(spec, nodes, tracker, blocked, memo=MEMO),
            iterations,
            warmup,
            f"{len(blocked)} blocked",
        )
    )

    # The free-ID search is O(need + held), never O(capacity): on a 1024-device node, the
    # lowest 2 free IDs with every even ID held (4 IDs looked at), and with IDs 0..999 held
    # (the worst case: every held ID is skipped).
    for label, held in (("512 even IDs held", range(0, 1024, 2)), ("IDs 0-999 held", range(1000))):
        big = DeviceTracker()
        big.set_capacity("big", GPU, 1024)
        for i in held:
            big.add_claim(f"held-{i}", "big", {GPU: [i]})
        results.append(
            measure(
                f"tracker.lowest_free 2 of 1024, {label}",
                lambda t=big: t.lowest_free("big", GPU, 2),
                iterations,
                warmup,
                f"-> {big.lowest_free('big', GPU, 2)}",
            )
        )
    tracker.check_invariants()
    return {
        "fleet": {
            "nodes": n_nodes,
            "shared": fleet.shared,
            "shared_tainted": fleet.tainted,
            "shared_cordoned": fleet.cordoned,
            "shared_not_ready": fleet.not_ready,
            "devices": fleet.devices,
            "claimed": fleet.claimed,
            "groups": len(tracker.groups()),
        },
        "nowhere_message": message,
        "results": [asdict(r) for r in results],
    }


def _us(v: float) -> str:
    return f"{v:,.0f}" if v >= 100 else f"{v:.1f}"


def table(rows: list[dict[str, Any]]) -> str:
    head = "| benchmark | iters | mean µs | p50 µs | p95 µs | p99 µs | max µs | note |"
    out = [head, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        cells = " | ".join(_us(r[k]) for k in ("mean_us", "p50_us", "p95_us", "p99_us", "max_us"))
        out.append(f"| {r['name']} | {r['iterations']} | {cells} | {r['note']} |")
    return "\n".join(out)


def markdown(out: dict[str, Any], m: dict[str, Any], args: argparse.Namespace) -> str:
    f = out["fleet"]
    return "\n".join(
        [
            f"Machine: {machine_line(m)}.",
            f"Command: `python hack/bench/bench_placement.py --nodes {args.nodes} "
            f"--iterations {args.iterations} --warmup {args.warmup} --seed {args.seed}`.",
            "",
            f"Fleet: {f['nodes']} decoded Node dicts (`make_node`), {f['shared']} labelled "
            f"shared ({f['shared_tainted']} tainted NoSchedule, {f['shared_cordoned']} "
            f"cordoned, {f['shared_not_ready']} NotReady), 1/2/4/8 GPUs each, `gpu-type`/"
            f"`zone` labels; {f['claimed']} of {f['devices']} GPUs claimed by "
            f"{f['groups']} groups in the DeviceTracker. One sample = one call; GC off while "
            "timing.",
            "",
            table(out["results"]),
            "",
            f"Pending message of the no-fit decision: `{out['nowhere_message']}`",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--iterations", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    parser.add_argument(
        "--no-results", action="store_true", help="do not update hack/bench/RESULTS.md"
    )
    args = parser.parse_args(argv)
    m = machine()
    started = time.perf_counter()
    out = run(args.nodes, args.iterations, args.warmup, args.seed)
    f = out["fleet"]
    print(
        f"fleet: {f['nodes']} nodes, {f['shared']} shared ({f['shared_tainted']} tainted, "
        f"{f['shared_cordoned']} cordoned, {f['shared_not_ready']} NotReady), "
        f"{f['claimed']}/{f['devices']} GPUs claimed by {f['groups']} groups"
    )
    print(table(out["results"]))
    print(f"pending message: {out['nowhere_message'][:200]}...")
    print(f"total {time.perf_counter() - started:.1f}s")
    if args.json:
        args.json.write_text(json.dumps({"machine": m, **out}, indent=2))
    if not args.no_results:
        update_section("placement", markdown(out, m, args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

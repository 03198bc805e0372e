"""Admission without a round trip: a MutatingAdmissionPolicy against SDG's pod webhook.

    .venv/bin/python hack/bench/bench_map.py [--groups 10,100,1000] [--pods 400]

Issue 21's lever 1, measured on one real API server: the same group pod created
(``dryRun=All``: admission runs in full, nothing is stored) ``--pods`` times per row, with

- ``none``: no admission for group pods (the floor);
- ``policy``: one MutatingAdmissionPolicy whose params are the SharedDeviceGroups (one
  binding, ``paramRef.selector: {}``): a match condition picks the pod's group, and an
  apply configuration adds what the webhook's env delivery adds (the vendor env var in
  every container, ``deviceshare.io/devices``, a node selector);
- ``webhook``: SDG's pod webhook, served by a manager that runs only its webhooks
  (``--controllers=webhooks``), over TLS as in a cluster;

at each count of Bound groups in ``--groups`` (made directly, status written by hand: no
scheduler runs). Printed per row: API-server CPU per create, the webhook manager's CPU
per create, wall time per create; each row checks that the pod came back with its
devices. The API server evaluates a policy once per selected param, so its cost grows
with the number of groups; the webhook's does not.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "hack" / "bench"))

from _kube import ApiError, Kube, bounded, cpu_seconds  # noqa: E402
from compare import GPU, Env, ensure_namespace, group_pod, node_obj  # noqa: E402

from sdgruntime.envtest import ControlPlane  # noqa: E402
from tests.e2e.harness import install_rbac  # noqa: E402

Obj = dict[str, Any]
NS = "bench"
POLICY = "sdg-devices"
MAP_PATH = "/apis/admissionregistration.k8s.io/v1/mutatingadmissionpolicies"
BINDING_PATH = "/apis/admissionregistration.k8s.io/v1/mutatingadmissionpolicybindings"

#: What the env delivery writes, from the group given as params.
APPLY = """
Object{
  metadata: Object.metadata{
    annotations: {"deviceshare.io/devices": "nvidia.com/gpu=" +
      params.status.selectedDevices["nvidia.com/gpu"]}
  },
  spec: Object.spec{
    containers: object.spec.containers.map(c, Object.spec.containers{
      name: c.name,
      env: [Object.spec.containers.env{
        name: "NVIDIA_VISIBLE_DEVICES",
        value: params.status.selectedDevices["nvidia.com/gpu"]
      }]
    })
  }
}
"""

NODE_PATCH = """[JSONPatch{op: "add", path: "/spec/nodeSelector",
  value: {"kubernetes.io/hostname": params.status.nodeName}}]"""


def policy() -> Obj:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingAdmissionPolicy",
        "metadata": {"name": POLICY},
        "spec": {
            "paramKind": {"apiVersion": "deviceshare.io/v1alpha1", "kind": "SharedDeviceGroup"},
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE"],
                        "resources": ["pods"],
                    }
                ]
            },
            "matchConditions": [
                {
                    "name": "group-pod",
                    "expression": "has(object.metadata.annotations) && "
                    "object.metadata.annotations[?'deviceshare.io/group']"
                    ".orValue('') == params.metadata.name",
                },
                {
                    "name": "bound",
                    "expression": "has(params.status) && has(params.status.phase) && "
                    "params.status.phase == 'Bound'",
                },
            ],
            "failurePolicy": "Fail",
            "reinvocationPolicy": "Never",
            "mutations": [
                {"patchType": "ApplyConfiguration", "applyConfiguration": {"expression": APPLY}},
                # nodeSelector is an atomic map: an apply configuration may not set it.
                {"patchType": "JSONPatch", "jsonPatch": {"expression": NODE_PATCH}},
            ],
        },
    }


def binding() -> Obj:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingAdmissionPolicyBinding",
        "metadata": {"name": POLICY},
        "spec": {
            "policyName": POLICY,
            "paramRef": {"selector": {}, "parameterNotFoundAction": "Allow"},
        },
    }


async def make_groups(kube: Kube, first: int, last: int) -> None:
    async def one(i: int) -> None:
        name = f"g{i:05d}"
        body = {
            "apiVersion": "deviceshare.io/v1alpha1",
            "kind": "SharedDeviceGroup",
            "metadata": {"name": name},
            "spec": {"resources": {GPU: 1}},
        }
        made = await kube.request("POST", "/apis/deviceshare.io/v1alpha1/shareddevicegroups", body)
        made["status"] = {
            "phase": "Bound",
            "nodeName": "node-0000",
            "selectedDevices": {GPU: str(i % 8)},
        }
        await kube.request(
            "PUT", f"/apis/deviceshare.io/v1alpha1/shareddevicegroups/{name}/status", made
        )

    await bounded(32, [lambda i=i: one(i) for i in range(first, last)])


def delivered(pod: Obj, group_index: int) -> bool:
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0].get("env") or []}
    return env.get("NVIDIA_VISIBLE_DEVICES") == str(group_index % 8)


async def creates(kube: Kube, groups: int, pods: int, tag: str, check: bool) -> float:
    """``pods`` dry-run creates of pods of groups spread over ``groups``; wall seconds."""

    async def one(i: int) -> None:
        g = (i * 7919) % groups
        body = group_pod(f"{tag}-{i}", f"g{g:05d}")
        got = await kube.request("POST", f"/api/v1/namespaces/{NS}/pods?dryRun=All", body)
        if check and not delivered(got, g):
            raise AssertionError(f"{tag}: pod of g{g:05d} came back without its devices: {got}")

    t0 = time.perf_counter()
    await bounded(16, [lambda i=i: one(i) for i in range(pods)])
    return time.perf_counter() - t0


async def measure(
    kube: Kube, apiserver: int, other: int | None, groups: int, pods: int, tag: str, check: bool
) -> dict[str, float]:
    await creates(kube, groups, 32, tag + "-warm", check)  # caches, connections, compile
    a0 = cpu_seconds(apiserver)
    o0 = cpu_seconds(other) if other else 0.0
    wall = await creates(kube, groups, pods, tag, check)
    return {
        "apiserver_ms": (cpu_seconds(apiserver) - a0) * 1000 / pods,
        "webhook_ms": ((cpu_seconds(other) - o0) * 1000 / pods) if other else 0.0,
        "wall_ms": wall * 1000 / pods,
    }


async def until_policy_applies(kube: Kube) -> None:
    deadline = time.monotonic() + 60
    while True:
        got = await kube.request(
            "POST", f"/api/v1/namespaces/{NS}/pods?dryRun=All", group_pod("probe", "g00000")
        )
        if delivered(got, 0):
            return
        if time.monotonic() > deadline:
            raise TimeoutError("the MutatingAdmissionPolicy never applied")
        await asyncio.sleep(0.5)


async def run(args: argparse.Namespace) -> list[Obj]:
    counts = sorted(int(x) for x in args.groups.split(","))
    cp = ControlPlane(crd_paths=[ROOT / "config" / "crd"])
    cp.start()
    rows: list[Obj] = []
    try:
        install_rbac(cp)
        env = Env(cp, cp.work_dir, ["--controllers=webhooks", "--holders=off"])
        apiserver = cp.pids["kube-apiserver"]
        async with Kube(env.admin_kubeconfig, limit=48) as kube:
            await ensure_namespace(kube, NS)
            node = node_obj(0)
            made = await kube.request("POST", "/api/v1/nodes", node)
            made["status"] = node["status"]
            await kube.request("PUT", "/api/v1/nodes/node-0000/status", made)
            have = 0
            for n in counts:
                await make_groups(kube, have, n)
                have = n
                await asyncio.sleep(2)  # the param informer and the manager's cache catch up
                row: Obj = {"groups": n}
                row["none"] = await measure(kube, apiserver, None, n, args.pods, "none", False)
                await kube.request("POST", MAP_PATH, policy())
                await kube.request("POST", BINDING_PATH, binding())
                await until_policy_applies(kube)
                row["policy"] = await measure(kube, apiserver, None, n, args.pods, "map", True)
                await kube.request("DELETE", f"{BINDING_PATH}/{POLICY}")
                await kube.request("DELETE", f"{MAP_PATH}/{POLICY}")
                mgr, port, _ = await env.manager(f"webhooks-{n}")
                try:
                    env.webhooks(port)
                    await asyncio.sleep(2)
                    row["webhook"] = await measure(
                        kube, apiserver, mgr.pid, n, args.pods, "wh", True
                    )
                finally:
                    env.webhooks(None)
                    await mgr.stop()
                rows.append(row)
                print(json.dumps(row), flush=True)
    except ApiError as exc:
        print(f"API error: {exc}", file=sys.stderr)
        raise
    finally:
        cp.stop()
    return rows


def table(rows: list[Obj]) -> str:
    head = (
        "| Bound groups | none: API server | policy: API server | webhook: API server "
        "+ manager | policy / webhook (CPU) | wall per create: none / policy / webhook |\n"
        "| ---: | ---: | ---: | ---: | ---: | ---: |\n"
    )
    lines = []
    for r in rows:
        no, po, wh = r["none"], r["policy"], r["webhook"]
        wh_cpu = wh["apiserver_ms"] + wh["webhook_ms"]
        lines.append(
            f"| {r['groups']} | {no['apiserver_ms']:.2f} ms | {po['apiserver_ms']:.2f} ms | "
            f"{wh['apiserver_ms']:.2f} + {wh['webhook_ms']:.2f} ms | "
            f"{po['apiserver_ms'] / wh_cpu:.2f}x | "
            f"{no['wall_ms']:.2f} / {po['wall_ms']:.2f} / {wh['wall_ms']:.2f} ms |"
        )
    return head + "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--groups", default="10,100,1000", help="Bound group counts, rising")
    parser.add_argument("--pods", type=int, default=400, help="dry-run creates per row")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON here")
    args = parser.parse_args()
    rows = asyncio.run(run(args))
    print("\n" + table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

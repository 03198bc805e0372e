"""The manager works under exactly config/rbac, and every rule there is needed: removing
any one of them makes the standard flow fail."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from api.constants import SDG_KIND
from sdgruntime import errors
from sdgruntime.client import Client
from sdgruntime.envtest import ControlPlane
from sdgruntime.envtest.controlplane import load_manifests
from sdgruntime.envtest.fakes import indexed_devices
from sdgruntime.kinds import CONFIGMAPS, EVENTS, PODS
from tests.e2e.harness import (
    MANAGER_NS,
    ROOT,
    add_node,
    eventually,
    group,
    install_rbac,
    kubelet,
    pod,
    run_sdg,
    wait_bound,
)

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


def _rules() -> list[tuple[str, dict[str, Any]]]:
    """Every rule the standard flow needs. The ResourceClaim rules are not: they enter
    groups Bound on ResourceSlice devices in DRA's books, and tests/e2e/test_dra_books.py
    shows each of their verbs needed, on a control plane with kube-scheduler."""
    out = []
    for obj in load_manifests([ROOT / "config" / "rbac" / "role.yaml"]):
        for rule in obj["rules"]:
            if all(r.startswith("resourceclaims") for r in rule["resources"]):
                continue
            out.append((obj["kind"], rule))
    return out


def _rule_id(item: tuple[str, dict[str, Any]]) -> str:
    kind, rule = item
    return f"{kind}:{','.join(rule['resources'])}"


async def _standard_flow(cp: ControlPlane, client: Client, namespace: str) -> None:
    """Leader election, placement, the group's holder pod, fenced claim, webhook, binding,
    unschedulable status, events: everything the manager does in a cluster (DRA's books
    are proven apart, in test_dra_books)."""
    await add_node(client, "n1", 2)
    name = f"g-{namespace}"  # unique: Events of earlier tests stay in the namespace default
    async with (
        run_sdg(cp, leader_elect=True, leader_election_id=f"rbac-{namespace}", holders="auto"),
        kubelet(client, devices=indexed_devices),
    ):
        await client.create(SDG_KIND, group(name, {"nvidia.com/gpu": 1}))
        await wait_bound(client, name, within=10)
        await client.create(PODS, pod("fits", name), namespace)
        misfit = pod("misfit", name, nodeSelector={"zone": "nowhere"})
        await client.create(PODS, misfit, namespace)

        async def done() -> bool:
            fits = await client.get(PODS, "fits", namespace)
            mis = await client.get(PODS, "misfit", namespace)
            conds = (mis.get("status") or {}).get("conditions") or []
            evs, _ = await client.list_all(EVENTS, "default")
            cms, _ = await client.list_all(CONFIGMAPS, MANAGER_NS)
            return (
                bool(fits["spec"].get("nodeName"))
                and any(c["type"] == "PodScheduled" and c["status"] == "False" for c in conds)
                and any(e["involvedObject"].get("name") == name for e in evs)
                and any(c["metadata"]["name"] == "sdg-claims.n1" for c in cms)
            )

        await eventually(done, within=10, what="standard flow")


async def test_flow_works_under_exactly_config_rbac(
    cluster: ControlPlane, client: Client, namespace: str
) -> None:
    await _standard_flow(cluster, client, namespace)


@pytest.mark.parametrize("dropped", _rules(), ids=_rule_id)
async def test_every_rule_is_needed(
    cluster: ControlPlane, client: Client, namespace: str, dropped: tuple[str, dict[str, Any]]
) -> None:
    kind, rule = dropped
    install_rbac(cluster, drop_rule=lambda r: r == rule)
    failed = False
    try:
        with anyio.fail_after(30):
            await _standard_flow(cluster, client, namespace)
    except (AssertionError, errors.ApiError, ExceptionGroup, TimeoutError, RuntimeError) as err:
        failed = True
        print(f"without {kind} rule {rule}: {type(err).__name__}: {str(err)[:300]}")
    finally:
        install_rbac(cluster)
    assert failed, f"the flow still works without {kind} rule {rule}: the role is too broad"

"""SDG's identity holds less than its RBAC: the membership policy (config/policy) lets the
manager's ServiceAccount write pods/status only as the pod scheduler does, the
PodScheduled condition of a pod not bound yet. Every other change through that right
(labels, annotations, finalizers, phase, other conditions, a bound pod's status) is
refused with what it tried, while other clients keep what pods/status allows them.
And ``--allocated-pods counts`` writes per-namespace counts the real CRD accepts, no pod
names."""

from __future__ import annotations

from typing import Any

import pytest

from api.conditions import rfc3339
from api.constants import SDG_KIND
from sdgruntime import errors
from sdgruntime.client import Client
from sdgruntime.envtest import ControlPlane
from sdgruntime.kinds import PODS
from tests.e2e.harness import (
    SA_USER,
    add_node,
    eventually,
    group,
    manager_kubeconfig,
    pod,
    run_sdg,
    wait_bound,
)

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

GPU = "nvidia.com/gpu"


def scheduled_false(message: str) -> dict[str, Any]:
    """The status patch the pod scheduler sends for a pod it cannot bind."""
    condition = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": message,
        "lastTransitionTime": rfc3339(),
    }
    return {"status": {"conditions": [condition]}}


async def status_patch(c: Client, name: str, body: dict[str, Any], namespace: str) -> Any:
    return await c.patch(PODS, name, body, namespace, patch_type="strategic", subresource="status")


async def refused(c: Client, name: str, body: dict[str, Any], namespace: str) -> str:
    with pytest.raises(errors.ApiError) as err:
        await status_patch(c, name, body, namespace)
    assert err.value.code == 403, err.value.message
    return err.value.message


async def test_sdg_writes_only_the_pod_scheduled_condition_of_unbound_pods(
    cluster: ControlPlane, client: Client, namespace: str
) -> None:
    await add_node(client, "n1", 1)
    await client.create(
        PODS, pod("waiting", None, schedulerName="deviceshare-scheduler"), namespace
    )
    await client.create(PODS, pod("running", None, nodeName="n1"), namespace)
    async with Client.from_kubeconfig(manager_kubeconfig(cluster)) as sdg:
        # What the pod scheduler writes: allowed.
        await status_patch(sdg, "waiting", scheduled_false("no node fits"), namespace)
        conds = (await client.get(PODS, "waiting", namespace))["status"]["conditions"]
        assert [(c["type"], c["status"], c["message"]) for c in conds] == [
            ("PodScheduled", "False", "no node fits")
        ]
        tries: dict[str, dict[str, Any]] = {
            "metadata.labels": {"metadata": {"labels": {"app": "frontend"}}},
            "metadata.annotations": {"metadata": {"annotations": {"team": "x"}}},
            "metadata.finalizers": {"metadata": {"finalizers": ["example.com/hold"]}},
            "status.phase": {"status": {"phase": "Failed"}},
            "conditions other than PodScheduled": {
                "status": {"conditions": [{"type": "Ready", "status": "True"}]}
            },
        }
        for what, body in tries.items():
            message = await refused(sdg, "waiting", body, namespace)
            assert (
                f"pods/status of {namespace}/waiting: SDG's manager ({SA_USER}) may only set "
                f"the PodScheduled condition of a pod not bound yet, but this write changes "
                f"{what}. SDG never writes these"
            ) in message, what
            assert "delete the manager's pods" in message
        # A label hidden in an otherwise allowed write is refused as well.
        body = {**scheduled_false("again"), "metadata": {"labels": {"app": "frontend"}}}
        assert "changes metadata.labels." in await refused(sdg, "waiting", body, namespace)
        # A bound pod's status is the kubelet's.
        message = await refused(sdg, "running", scheduled_false("no"), namespace)
        assert "this write changes the status of a pod bound to node n1." in message
    after = await client.get(PODS, "waiting", namespace)
    assert not after["metadata"].get("labels") and not after["metadata"].get("finalizers")
    assert "team" not in (after["metadata"].get("annotations") or {})
    assert after["status"]["phase"] == "Pending"
    # Other clients with pods/status (CNI plugins, node agents; the admin here) keep what
    # the API server allows them: the rule is on SDG's identity only.
    note = {"metadata": {"annotations": {"cni.example.com/ip": "10.0.0.7"}}}
    await status_patch(client, "running", note, namespace)
    running = await client.get(PODS, "running", namespace)
    assert running["metadata"]["annotations"]["cni.example.com/ip"] == "10.0.0.7"


async def test_allocated_pods_as_counts_per_namespace(
    cluster: ControlPlane, client: Client, namespace: str
) -> None:
    await add_node(client, "n1", 2)
    async with run_sdg(cluster, allocated_pods="counts"):
        await client.create(SDG_KIND, group("counted", {GPU: 1}))
        await wait_bound(client, "counted")
        for name, ns in (("a", namespace), ("b", namespace), ("c", "default")):
            await client.create(PODS, pod(name, "counted"), ns)

        async def counted() -> dict[str, Any] | None:
            status = (await client.get(SDG_KIND, "counted"))["status"]
            return status if status.get("podCount") == 3 else None

        status = await eventually(counted, what="podCount 3")
        assert status["allocatedPodCounts"] == {"default": 1, namespace: 2}
        assert status["allocatedPods"] == []
        await client.delete(PODS, "c", "default", grace_period_seconds=0)

        async def dropped() -> dict[str, Any] | None:
            status = (await client.get(SDG_KIND, "counted"))["status"]
            return status if status.get("podCount") == 2 else None

        status = await eventually(dropped, what="podCount 2")
        assert status["allocatedPodCounts"] == {namespace: 2}

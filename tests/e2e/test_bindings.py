"""A group pod is bound only to its group's node, whoever creates the Binding: SDG's
binding webhook (config/webhook: vbinding.deviceshare.io) reads the pod and its group; the
Bindings of SDG's own pod scheduler (and kube-scheduler's) skip it."""

from __future__ import annotations

from typing import Any

import pytest

from api.constants import SDG_KIND
from sdgruntime import errors
from sdgruntime.client import Client
from sdgruntime.envtest import ControlPlane
from sdgruntime.kinds import PODS
from sdgruntime.metrics import REGISTRY
from tests.e2e.harness import GPU, add_node, group, kubelet, pod, run_sdg, wait_bound, wait_rbac
from tests.e2e.test_membership import running

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

WEBHOOK = 'admission webhook "vbinding.deviceshare.io" denied the request'
BINDER = "pod-binder"


def binding(name: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": name},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }


def webhook_calls() -> float:
    """Reviews SDG's binding webhook answered (any code)."""
    total = 0.0
    for metric in REGISTRY.collect():
        for sample in metric.samples:
            if (
                sample.name == "controller_runtime_webhook_requests_total"
                and sample.labels.get("webhook") == "/validate-v1-binding"
            ):
                total += sample.value
    return total


async def refused(call: Any) -> str:
    with pytest.raises(errors.ApiError) as info:
        await call
    assert info.value.code == 403, info.value.message
    assert WEBHOOK in info.value.message, info.value.message
    return info.value.message


async def test_a_group_pod_is_bound_only_to_its_groups_node(
    cluster: ControlPlane, client: Client, namespace: str
) -> None:
    await add_node(client, "n1", 2)
    await add_node(client, "n2", 2)
    # Someone with the rights a custom scheduler or controller holds.
    cluster.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": BINDER},
            "rules": [
                {"apiGroups": [""], "resources": ["pods/binding", "bindings"], "verbs": ["create"]}
            ],
        }
    )
    cluster.bind_cluster_role(BINDER, BINDER)
    wait_rbac(
        cluster,
        {
            "user": BINDER,
            "resourceAttributes": {
                "namespace": namespace,
                "verb": "create",
                "resource": "pods",
                "subresource": "binding",
            },
        },
        True,
    )
    kubeconfig = str(cluster.user_kubeconfig(BINDER))
    async with (
        run_sdg(cluster),
        kubelet(client),
        Client.from_kubeconfig(kubeconfig) as binder,
    ):
        await client.create(SDG_KIND, group("g", {GPU: 1}))
        node = (await wait_bound(client, "g"))["status"]["nodeName"]
        other = "n2" if node == "n1" else "n1"

        # SDG's own binds do not call the webhook (matchConditions).
        before = webhook_calls()
        await client.create(PODS, pod("member", "g"), namespace)
        assert (await running(client, "member", namespace))["spec"]["nodeName"] == node
        assert webhook_calls() == before

        # No node matches its selector, so the pod scheduler leaves it Pending.
        for name in ("waiting", "legacy"):
            await client.create(PODS, pod(name, "g", nodeSelector={"zone": "nowhere"}), namespace)
        path = f"/api/v1/namespaces/{namespace}/pods/waiting/binding"
        msg = await refused(binder.request("POST", path, json=binding("waiting", other)))
        assert (
            f"pod {namespace}/waiting is in SharedDeviceGroup 'g', whose devices are on node "
            f"{node}: it may be bound only there, not to {other}, where its device IDs name "
            f"other devices. Bind it to {node}, or leave the pod to deviceshare-scheduler."
        ) in msg
        assert not (await client.get(PODS, "waiting", namespace))["spec"].get("nodeName")
        # The legacy bindings resource is checked the same way.
        legacy = f"/api/v1/namespaces/{namespace}/bindings"
        await refused(binder.request("POST", legacy, json=binding("legacy", other)))
        assert webhook_calls() >= before + 2

        # To the group's node: allowed.
        await binder.request("POST", path, json=binding("waiting", node))
        assert (await client.get(PODS, "waiting", namespace))["spec"]["nodeName"] == node
        await binder.request("POST", legacy, json=binding("legacy", node))
        assert (await client.get(PODS, "legacy", namespace))["spec"]["nodeName"] == node

        # A pod outside any group is not SDG's business.
        await client.create(PODS, pod("plain", None, schedulerName="elsewhere"), namespace)
        plain = f"/api/v1/namespaces/{namespace}/pods/plain/binding"
        await binder.request("POST", plain, json=binding("plain", other))
        assert (await client.get(PODS, "plain", namespace))["spec"]["nodeName"] == other

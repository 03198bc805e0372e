"""``--controllers``: the manager's parts run apart, in three processes' worth of
managers, and together still do what one manager does."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from api.constants import SDG_KIND
from sdgruntime.client import Client
from sdgruntime.envtest import ControlPlane
from sdgruntime.kinds import PODS
from tests.e2e.harness import (
    GPU,
    add_node,
    env_of,
    eventually,
    group,
    kubelet,
    pod,
    run_sdg,
    wait_bound,
)

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

SCHEDULERS = "group-scheduler,pod-scheduler,foreign-reporter"


async def test_parts_run_apart_and_together_serve_a_group(
    cluster: ControlPlane, client: Client, namespace: str
) -> None:
    await add_node(client, "gpu-node-1", 2)
    async with (
        run_sdg(cluster, controllers=SCHEDULERS, webhooks=False) as schedulers,
        run_sdg(cluster, controllers="webhooks") as webhooks,
        kubelet(client),
    ):
        assert schedulers.manager._webhook_server is None  # nothing listens for reviews
        assert schedulers.pod_mutator is None and webhooks.pod_mutator is not None
        assert set(schedulers.manager.controllers) == {
            "group-scheduler",
            "pod-scheduler",
            "foreign-device-pods",
        }
        assert webhooks.manager.controllers == {}
        await client.create(SDG_KIND, group("split", {GPU: 2}))
        await wait_bound(client, "split")
        created = await client.create(
            PODS, pod("w", "split", schedulerName="deviceshare-scheduler"), namespace
        )
        assert env_of(created)["NVIDIA_VISIBLE_DEVICES"] == "0,1"  # the webhooks' manager

        async def running() -> dict[str, Any] | None:
            p = await client.get(PODS, "w", namespace)
            return p if p["status"].get("phase") == "Running" else None

        await eventually(running, what="the pod bound by the schedulers' manager")
        # No status part runs yet: the group's pods are not counted.
        await anyio.sleep(2)
        assert not (await client.get(SDG_KIND, "split"))["status"].get("podCount")

        async with run_sdg(cluster, controllers="status", webhooks=False):

            async def counted() -> dict[str, Any] | None:
                g = await client.get(SDG_KIND, "split")
                return g if g["status"].get("podCount") == 1 else None

            g = await eventually(counted, what="podCount from the status part's manager")
            assert g["status"]["allocatedPods"] == [f"{namespace}/w"]

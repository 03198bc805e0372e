"""A scheduling decision is visible: one span with its reasons, sdg_* and runtime metrics."""

from __future__ import annotations

import httpx
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from api.constants import SDG_KIND
from sdgruntime.client import Client
from sdgruntime.envtest import ControlPlane
from sdgruntime.kinds import PODS
from tests.e2e.harness import GPU, add_node, eventually, group, pod, run_sdg, wait_bound

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


async def test_decision_span_and_metrics(
    cluster: ControlPlane, client: Client, namespace: str
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    await add_node(client, "unshared", 8, shared=False)
    await add_node(client, "gpu", 2)
    async with run_sdg(cluster, tracer_provider=provider) as sdg:
        await client.create(SDG_KIND, group("traced", {GPU: 2}))
        await wait_bound(client, "traced")
        await client.create(PODS, pod("tp", "traced"), namespace)

        async def pod_bound() -> bool:
            return bool((await client.get(PODS, "tp", namespace))["spec"].get("nodeName"))

        await eventually(pod_bound, what="pod bound")

        def decisions() -> list:
            return [s for s in exporter.get_finished_spans() if s.name == "schedule pod"]

        await eventually(decisions, what="pod span")
        group_spans = [s for s in exporter.get_finished_spans() if s.name == "schedule group"]
        assert len(group_spans) == 1
        attrs = dict(group_spans[0].attributes or {})
        assert attrs["sdg.group"] == "traced"
        assert attrs["sdg.candidates"] == 2
        assert attrs["sdg.filter.unshared"] == "not labelled deviceshare.io/mode=shared"
        assert attrs["sdg.score.gpu"] == 0
        assert attrs["sdg.node"] == "gpu"
        assert attrs["sdg.devices"] == f"{GPU}=0,1"
        assert attrs["sdg.result"] == "bound"
        pod_attrs = dict(decisions()[0].attributes or {})
        assert pod_attrs["sdg.pod"] == f"{namespace}/tp"
        assert pod_attrs["sdg.node"] == "gpu"
        assert pod_attrs["sdg.result"] == "bound"
        # The decision span sits inside the controller's reconcile span.
        reconciles = [s for s in exporter.get_finished_spans() if s.name.startswith("reconcile")]
        assert any(s.context.span_id == group_spans[0].parent.span_id for s in reconciles)

        port = sdg.manager.metrics_port
        async with httpx.AsyncClient() as http:
            text = (await http.get(f"http://127.0.0.1:{port}/metrics")).text
        for needle in (
            'sdg_scheduling_attempts_total{kind="group",result="bound"}',
            'sdg_scheduling_attempts_total{kind="pod",result="bound"}',
            'sdg_devices_allocated{node="gpu",resource="nvidia.com/gpu"} 2.0',
            'sdg_devices_free{node="gpu",resource="nvidia.com/gpu"} 0.0',
            'sdg_groups{phase="Bound"}',
            "sdg_scheduling_decision_seconds_bucket",
            "sdg_pod_bind_seconds_bucket",
            'controller_runtime_reconcile_total{controller="group-scheduler",result="success"}',
            'workqueue_adds_total{controller="pod-scheduler",name="pod-scheduler"}',
        ):
            assert needle in text, (needle, [ln for ln in text.splitlines() if "sdg_" in ln])

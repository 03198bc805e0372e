"""Traces leave the process: the real manager (``python -m controllers``, as the image runs
it), configured only by ``OTEL_*`` variables, exports its scheduling decision over
OTLP/HTTP to a receiver that decodes the protobuf as a collector would."""

from __future__ import annotations

import contextlib
import gzip
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from api.constants import SDG_KIND
from sdgruntime.client import Client
from sdgruntime.envtest import ControlPlane
from sdgruntime.envtest.controlplane import free_port
from tests.e2e.harness import (
    GPU,
    MANAGER_NS,
    ROOT,
    add_node,
    eventually,
    group,
    manager_kubeconfig,
    wait_bound,
)

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

SERVICE = "sdg-otlp-e2e"


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


class Receiver:
    """An OTLP/HTTP trace receiver on 127.0.0.1: ``POST /v1/traces`` with a protobuf
    ``ExportTraceServiceRequest``, answered like a collector. Keeps every span it got as
    ``(service.name, span name, attributes, trace id, span id, parent span id)``."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.content_types: set[str] = set()
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces":
                    self.send_error(404)
                    return
                receiver.take(self.headers.get("Content-Type", ""), body)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"

    def take(self, content_type: str, body: bytes) -> None:
        request = ExportTraceServiceRequest.FromString(body)
        spans = []
        for rs in request.resource_spans:
            resource = {a.key: _value(a.value) for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    spans.append(
                        {
                            "service": resource.get("service.name"),
                            "name": s.name,
                            "attributes": {a.key: _value(a.value) for a in s.attributes},
                            "trace_id": s.trace_id,
                            "span_id": s.span_id,
                            "parent_span_id": s.parent_span_id,
                        }
                    )
        with self._lock:
            self.content_types.add(content_type)
            self.spans.extend(spans)

    def named(self, name: str) -> list[dict[str, Any]]:
        with self._lock:
            return [s for s in self.spans if s["name"] == name]

    @contextlib.contextmanager
    def running(self) -> Iterator[Receiver]:
        thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self.server.shutdown()
            self.server.server_close()


@contextlib.contextmanager
def manager_process(cp: ControlPlane, env: dict[str, str], log: Path) -> Iterator[int]:
    """``python -m controllers`` under the manager's ServiceAccount identity; yields the
    probe port once ``/readyz`` passes, stops it with SIGTERM."""
    probe_port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "controllers",
        f"--kubeconfig={manager_kubeconfig(cp)}",
        "--webhook-host=127.0.0.1",
        f"--webhook-port={free_port()}",
        f"--webhook-cert-dir={cp.webhook_cert_dir()}",
        "--metrics-bind-address=0",
        f"--health-probe-bind-address=127.0.0.1:{probe_port}",
        f"--claims-namespace={MANAGER_NS}",
        "--holders=off",  # a node without a kubelet: nothing would give a holder devices
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield probe_port
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def otel_env(endpoint: str) -> dict[str, str]:
    """The process environment without any OTEL_* of ours, plus only standard ones."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(
        {
            "PYTHONPATH": str(ROOT),
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_SERVICE_NAME": SERVICE,
            "OTEL_BSP_SCHEDULE_DELAY": "200",  # ms; the default 5 s would only slow the test
        }
    )
    return env


async def test_group_placement_span_reaches_an_otlp_receiver(
    cluster: ControlPlane, client: Client, tmp_path: Path
) -> None:
    await add_node(client, "elsewhere", 8)  # shared, but not in the group's zone
    await add_node(client, "snug", 2, labels={"zone": "a"})
    await add_node(client, "roomy", 4, labels={"zone": "a"})
    log = tmp_path / "manager.log"
    with (
        Receiver().running() as receiver,
        manager_process(cluster, otel_env(receiver.endpoint), log) as probe,
    ):
        async with httpx.AsyncClient() as http:

            async def ready() -> bool:
                try:
                    r = await http.get(f"http://127.0.0.1:{probe}/readyz", timeout=1)
                except httpx.HTTPError:
                    return False
                return r.status_code == 200

            await eventually(ready, within=60, interval=0.2, what="manager ready")
        await client.create(SDG_KIND, group("exported", {GPU: 2}, nodeSelector={"zone": "a"}))
        await wait_bound(client, "exported")

        def decision() -> list[dict[str, Any]]:
            return [
                s
                for s in receiver.named("schedule group")
                if s["attributes"].get("sdg.group") == "exported"
            ]

        try:
            (span,) = await eventually(decision, within=20, what="schedule group span exported")
        except AssertionError:
            raise AssertionError(log.read_text()[-3000:]) from None
        attrs = span["attributes"]
        assert span["service"] == SERVICE
        assert receiver.content_types == {"application/x-protobuf"}
        assert attrs["sdg.candidates"] == 3
        assert attrs["sdg.filter.elsewhere"] == "didn't match the group's nodeSelector"
        assert "sdg.filter.snug" not in attrs and "sdg.filter.roomy" not in attrs
        # binpack: the fewest devices left after placement scores highest.
        assert attrs["sdg.score.snug"] == 0
        assert attrs["sdg.score.roomy"] == -2
        assert attrs["sdg.node"] == "snug"
        assert attrs["sdg.devices"] == f"{GPU}=0,1"
        assert attrs["sdg.result"] == "bound"
        # Inside the controller's reconcile span, in one trace.
        reconcile = await eventually(
            lambda: [
                s
                for s in receiver.named("reconcile group-scheduler")
                if s["span_id"] == span["parent_span_id"]
            ],
            what="the parent reconcile span",
        )
        assert reconcile[0]["trace_id"] == span["trace_id"]

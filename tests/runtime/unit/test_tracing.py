"""setup_tracing names the service as the OTel spec orders it, from the environment only."""

from __future__ import annotations

import pytest

from sdgruntime import tracing


@pytest.fixture(autouse=True)
def console(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES", "OTEL_SDK_DISABLED"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")


def service_of(monkeypatch: pytest.MonkeyPatch, **env: str) -> dict[str, object]:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    provider = tracing.setup_tracing("deviceshare-manager", set_global=False)
    assert provider is not None
    try:
        return dict(provider.resource.attributes)
    finally:
        provider.shutdown()


def test_the_default_service_name(monkeypatch: pytest.MonkeyPatch) -> None:
    assert service_of(monkeypatch)["service.name"] == "deviceshare-manager"


def test_resource_attributes_name_the_service_and_are_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    attrs = service_of(
        monkeypatch, OTEL_RESOURCE_ATTRIBUTES="service.name=gpu-sharing,deployment.environment=prod"
    )
    assert attrs["service.name"] == "gpu-sharing"
    assert attrs["deployment.environment"] == "prod"


def test_otel_service_name_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    attrs = service_of(
        monkeypatch,
        OTEL_SERVICE_NAME="from-env",
        OTEL_RESOURCE_ATTRIBUTES="service.name=gpu-sharing,k8s.namespace.name=gpu",
    )
    assert attrs["service.name"] == "from-env"
    assert attrs["k8s.namespace.name"] == "gpu"


def test_start_span_records_with_a_tracer_and_costs_nothing_without() -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = tracing.tracer_for(provider, "test")
    assert tracer is not None
    with tracing.start_span(tracer, "schedule pod") as span:
        span.set_attribute("sdg.pod", "ns/p")
    [finished] = exporter.get_finished_spans()
    assert finished.name == "schedule pod" and finished.attributes == {"sdg.pod": "ns/p"}

    # Tracing off: the same code runs, on a span that records nothing.
    assert tracing.tracer_for(None) is None  # no global provider is set in tests
    with tracing.start_span(None, "schedule pod") as span:
        span.set_attribute("sdg.pod", "ns/p")
        assert not span.is_recording()
    with tracing.start_span(None, "again") as again:  # reusable, also nested
        assert again is span

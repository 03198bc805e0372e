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

"""The secure-metrics flags: what they set on the manager, and that config/ deploys with
them (HTTPS for scrapers the API server authorizes; Prometheus scrapes that way)."""

from __future__ import annotations

from pathlib import Path

import yaml

from controllers.app import manager_options
from controllers.settings import parse

ROOT = Path(__file__).resolve().parents[2]


def test_plain_http_unless_asked() -> None:
    options = manager_options(parse([], environ={}))
    assert (options.metrics_secure, options.metrics_cert_dir) == (False, None)


def test_flags_and_env_reach_the_manager_options() -> None:
    options = manager_options(parse(["--metrics-secure", "--metrics-cert-dir=/certs"], environ={}))
    assert (options.metrics_secure, options.metrics_cert_dir) == (True, "/certs")
    env = {"SDG_METRICS_SECURE": "true", "SDG_METRICS_CERT_DIR": "/c"}
    assert manager_options(parse([], environ=env)).metrics_cert_dir == "/c"
    assert parse([], environ=env).metrics_secure is True
    assert parse(["--no-metrics-secure"], environ=env).metrics_secure is False


def test_the_deployment_serves_secure_metrics_and_the_monitor_scrapes_so() -> None:
    (deployment,) = yaml.safe_load_all((ROOT / "config/manager/manager.yaml").read_text())
    (c,) = deployment["spec"]["template"]["spec"]["containers"]
    settings = parse(c["args"], environ={})
    assert settings.metrics_secure is True
    assert settings.metrics_cert_dir is None  # self-signed at start
    (monitor,) = yaml.safe_load_all((ROOT / "config/prometheus/monitor.yaml").read_text())
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["scheme"] == "https"
    assert endpoint["bearerTokenFile"] == "/var/run/secrets/kubernetes.io/serviceaccount/token"
    # A self-signed certificate cannot be verified: say so rather than fail every scrape.
    assert endpoint["tlsConfig"] == {"insecureSkipVerify": True}


def test_event_pace_flags_reach_the_manager_options() -> None:
    default = manager_options(parse([], environ={}))
    assert (default.event_qps, default.event_burst) == (50.0, 100)  # the kubelet's
    options = manager_options(parse(["--event-qps=5", "--event-burst=10"], environ={}))
    assert (options.event_qps, options.event_burst) == (5.0, 10)
    env = {"SDG_EVENT_QPS": "7.5"}
    assert manager_options(parse([], environ=env)).event_qps == 7.5

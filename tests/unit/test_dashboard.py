"""The Grafana dashboard (config/prometheus/grafana-dashboard.json) plots metrics that exist.

A renamed metric or label leaves a panel silently empty; these checks tie every query to
the metric objects the manager registers, and every sdg_* metric to a panel.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from prometheus_client.metrics import MetricWrapperBase

import controllers.metrics as sdg_metrics
import sdgruntime.metrics as runtime_metrics

DASHBOARD = Path(__file__).resolve().parents[2] / "config" / "prometheus" / "grafana-dashboard.json"
#: Labels Prometheus adds to every scraped series (ServiceMonitor target labels).
TARGET_LABELS = {"namespace", "pod", "service", "job", "instance", "endpoint", "container"}
_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def metrics() -> dict[str, tuple[str, ...]]:
    """Every series name the manager exposes -> its label names."""
    out: dict[str, tuple[str, ...]] = {}
    for module in (runtime_metrics, sdg_metrics):
        for obj in vars(module).values():
            if isinstance(obj, MetricWrapperBase):
                for suffix in _SUFFIXES[obj._type]:
                    out[obj._name + suffix] = tuple(obj._labelnames)
    return out


def targets() -> list[dict[str, Any]]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [t for p in panels for t in p.get("targets", [])]


def referenced(expr: str) -> set[str]:
    known_prefixes = (
        "sdg_",
        "sdgruntime_",
        "controller_runtime_",
        "workqueue_",
        "leader_",
        "rest_client_",
    )
    return {m for m in re.findall(r"[a-z_:][a-z0-9_:]*", expr) if m.startswith(known_prefixes)}


def test_every_query_uses_exposed_metrics_and_labels() -> None:
    exposed = metrics()
    assert targets()
    for target in targets():
        expr = target["expr"]
        names = referenced(expr)
        assert names, expr
        assert names <= set(exposed), f"unknown metric in {expr}: {names - set(exposed)}"
        labels = {lbl for n in names for lbl in exposed[n]} | TARGET_LABELS | {"le"}
        for by in re.findall(r"by \(([^)]*)\)", expr):
            used = {s.strip() for s in by.split(",") if s.strip()}
            assert used <= labels, f"{expr}: no label {used - labels}"
        legend = set(re.findall(r"\{\{(\w+)\}\}", target.get("legendFormat", "")))
        assert legend <= labels, f"{target['legendFormat']}: no label {legend - labels}"


def test_every_domain_and_controller_runtime_metric_has_a_panel() -> None:
    used = {n for t in targets() for n in referenced(t["expr"])}
    families = {
        obj._name
        for module in (runtime_metrics, sdg_metrics)
        for obj in vars(module).values()
        if isinstance(obj, MetricWrapperBase)
    }
    missing = [f for f in sorted(families) if not any(u.startswith(f) for u in used)]
    assert not missing, f"metrics without a panel: {missing}"


def test_panels_are_laid_out_without_overlap() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    taken: set[tuple[int, int]] = set()
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for p in dashboard["panels"]:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24
        cells = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not cells & taken, p["title"]
        taken |= cells
    assert dashboard["uid"] == "shared-device-group"
    assert {v["name"] for v in dashboard["templating"]["list"]} == {"datasource", "namespace"}

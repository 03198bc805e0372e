"""S9 and S10 of ``make bench-compare``: cost per pod from S1's two phases, with parts."""

from __future__ import annotations

from typing import Any

from hack.bench.compare import S1_KUBE, S1_SDG, cost_parts, cost_rows


def run(manager: float, api_sdg: float, scheduler: float, api_kube: float) -> dict[str, Any]:
    return {
        "phases": [
            {
                "name": S1_SDG,
                "pods": 1000,
                "cpu": {"kube-apiserver": api_sdg, "manager": manager},
                "writes": {"events POST": 1200, "pods/binding POST": 1000},
            },
            {
                "name": S1_KUBE,
                "pods": 500,
                "cpu": {"kube-apiserver": api_kube, "kube-scheduler": scheduler},
                "writes": {"events POST": 500, "pods/binding POST": 500},
            },
        ]
    }


def test_cost_rows_compare_cpu_per_pod_not_per_run() -> None:
    # SDG's run streamed twice the pods: 2 CPU-s for 1000 pods is kube-scheduler's 1 for 500.
    (s9, s10) = cost_rows(run(manager=2.0, api_sdg=6.0, scheduler=1.0, api_kube=2.0))
    assert s9[0] == "S9" and s9[2] == "2.00 ms/pod" and s9[4] == "1.00x"
    assert s10[0] == "S10" and s10[4] == "1.50x"


def test_parts_name_each_component_and_request_kind_per_pod() -> None:
    lines = cost_parts(run(manager=2.0, api_sdg=6.0, scheduler=1.0, api_kube=2.0))
    assert "| CPU manager | 2.00 ms | - |" in lines
    assert "| CPU kube-scheduler | - | 2.00 ms |" in lines
    assert "| events POST | 1.20 | 1.00 |" in lines


def test_a_run_without_s1_prints_no_cost_rows() -> None:
    assert cost_rows({"phases": []}) == [] and cost_parts({"phases": []}) == []

"""S9 and S10 of ``make bench-compare``: cost per pod from S1's two phases, with parts."""

from __future__ import annotations

from typing import Any

from hack.bench.compare import (
    S1_FLOOR,
    S1_KUBE,
    S1_SDG,
    S2_RAW,
    S2_SDG,
    S4_FLOOR,
    S4_KOPF,
    S4_SDG,
    cost_parts,
    cost_rows,
    floor_detail,
    per_call_ms,
    s2_parts,
    s4_parts,
    s4_rows,
    s8_rows,
    webhook_detail,
)


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


def with_floor(floor: float) -> dict[str, Any]:
    out = run(manager=2.0, api_sdg=6.0, scheduler=1.0, api_kube=2.0)
    out["phases"].append(
        {
            "name": S1_FLOOR,
            "pods": 1000,
            "cpu": {"kube-apiserver": 5.0, "floor": floor},
            "writes": {"events POST": 1000, "pods/binding POST": 1000},
        }
    )
    return out


def test_the_floor_is_one_more_row_between_s9_and_s10() -> None:
    # The floor spends 0.5 ms/pod: kube-scheduler's 2 ms/pod is 4x it, SDG's 2 ms/pod too.
    (s9, floor, s10) = cost_rows(with_floor(0.5))
    assert (s9[0], s10[0]) == ("S9", "S10") and s9[4] == "1.00x"
    assert floor[0] == "S9 floor"
    assert floor[2] == "floor 0.50 ms/pod; SDG's manager 4.00x the floor"
    assert floor[3] == "kube-scheduler 2.00 ms/pod" and floor[4] == "0.25x"


def test_parts_have_a_third_column_for_the_floors_run() -> None:
    lines = cost_parts(with_floor(0.5))
    assert "| part | SDG's run | kube-scheduler's run | floor's run |" in lines
    assert "| CPU floor | - | - | 0.50 ms |" in lines
    assert "| events POST | 1.20 | 1.00 | 1.00 |" in lines


def test_floor_patch_sets_what_sdgs_webhook_set() -> None:
    import base64
    import json

    from hack.bench.floor import review_answers

    template = {
        "metadata": {"name": "p-1", "annotations": {"deviceshare.io/group": "g", "x": "y"}},
        "spec": {
            "schedulerName": "deviceshare-scheduler",
            "tolerations": [{"key": "t", "operator": "Exists"}],
            "containers": [{"name": "c0", "env": [{"name": "E", "value": "1"}]}],
        },
    }
    head, tail = review_answers({"g": template})["g"]
    review = json.loads(head + json.dumps("u-1") + tail)["response"]
    assert review["uid"] == "u-1" and review["allowed"] is True
    ops = json.loads(base64.b64decode(review["patch"]))
    assert {o["path"] for o in ops} == {
        "/spec/schedulerName",
        "/spec/tolerations",
        "/spec/containers/0/env",
        "/metadata/annotations",
    }


def test_s1_detail_says_how_often_the_webhook_was_dialed() -> None:
    detail = webhook_detail({"pods": 5000, "webhook_connections": 1700.0})
    assert "accepted 1700 connections for 5000 reviews (0.34 per review" in detail
    assert webhook_detail({"pods": 5000, "webhook_connections": None}) == ""
    # and how long the API server's calls took, where it timed them
    timed = webhook_detail({"pods": 5000, "webhook_connections": 900.0, "webhook_call_ms": 123.4})
    assert "each call 123.4 ms on average as the API server timed it" in timed


def test_floor_detail_says_how_long_its_calls_took_and_how_often_it_was_dialed() -> None:
    floor = {"per_s": 146.0, "create_s": 22.1, "after_last_create_s": 12.2, "report": {}}
    assert "accepted" not in floor_detail({"s1_floor": floor})
    floor |= {"webhook_call_ms": 184.8, "webhook_connections": 1200.0}
    detail = floor_detail({"s1_floor": floor})
    assert "its webhook calls took 184.8 ms on average" in detail
    assert "its server accepted 1200 connections in S1" in detail


def test_webhook_call_time_is_the_mean_over_the_phase_only() -> None:
    assert per_call_ms((10.0, 100.0), (16.0, 150.0)) == 120.0  # 6 s over 50 calls
    assert per_call_ms((10.0, 100.0), (10.0, 100.0)) is None  # kube-scheduler's: no calls


def s4(lag: float, cpu: float) -> dict[str, Any]:
    return {"groups": 20, "pods": 100, "lag_s": lag, "cpu_s": cpu, "peak_rss": 1 << 20}


def test_s4_rows_put_sdg_and_kopf_over_the_status_floor() -> None:
    out = {"s4_sdg": s4(6.0, 4.0), "s4_kopf": s4(12.0, 16.0), "s4_floor": s4(4.0, 2.0)}
    (row, floor) = s4_rows(out)
    assert row[0] == "S4" and row[4] == "0.50x; 0.25x; 1.00x"
    assert floor[0] == "S4 floor"
    assert floor[2] == "floor 4.00 s; 2.0 CPU-s; SDG 1.50x; 2.00x the floor"
    assert floor[3] == "kopf 3.00x; 8.00x the floor" and floor[4] == "0.33x; 0.12x"


def test_s4_rows_without_the_floor_are_s4_alone() -> None:
    out = {"s4_sdg": s4(6.0, 4.0), "s4_kopf": s4(12.0, 16.0)}
    assert [r[0] for r in s4_rows(out)] == ["S4"]


def s8(on_p99: float, off_p99: float) -> dict[str, Any]:
    return {
        "on": {"latency": {"p99": on_p99}, "rate": 200.0},
        "off": {"latency": {"p99": off_p99}, "rate": 200.0},
        "rounds": 4,
    }


def test_s8_floor_row_says_how_much_of_the_added_p99_is_sdgs_own() -> None:
    out = {"s8": s8(0.030, 0.010), "s8_floor": s8(0.024, 0.012)}
    (row, floor) = s8_rows(out, "2000 creates each")
    assert row[0] == "S8" and row[2] == "+20.0 ms (p99 30.0 ms)" and row[4] == "4.00x"
    assert floor[0] == "S8 floor"
    assert floor[2] == "floor +12.0 ms (p99 24.0 ms); SDG +8.0 ms over the floor"
    assert floor[3] == "no webhook: p99 12.0 ms" and floor[4] == "2.40x"


def test_s8_rows_without_the_floor_are_s8_alone() -> None:
    assert [r[0] for r in s8_rows({"s8": s8(0.02, 0.01)}, "2000 creates each")] == ["S8"]


def test_s8_row_lists_each_rounds_p99_so_a_one_round_tail_shows() -> None:
    out = {"s8": {**s8(0.30, 0.01), "per_round_p99_ms": {"on": [288.5, 41.6], "off": [9, 9]}}}
    (row,) = s8_rows(out, "2000 creates each")
    assert row[3].endswith("each round's p99 with it: 288.5 / 41.6 ms")


def test_s8_rows_name_the_connections_each_round_made_for_sdg_and_the_floor() -> None:
    rounds = {"per_round_p99_ms": {"on": [900.0, 20.0], "off": [9, 9]}}
    out = {
        "s8": {**s8(0.9, 0.01), **rounds, "per_round_connections": [412.0, 0.0]},
        "s8_floor": {**s8(0.8, 0.01), **rounds, "per_round_connections": [380.0, 2.0]},
    }
    (row, floor) = s8_rows(out, "2000 creates each")
    assert row[3].endswith("900.0 / 20.0 ms, connections accepted: 412 / 0")
    assert floor[3].endswith("900.0 / 20.0 ms, connections accepted: 380 / 2")


def test_s2_parts_put_sdgs_drain_beside_the_raw_binders() -> None:
    out = {
        "phases": [
            {
                "name": S2_SDG,
                "pods": 1000,
                "cpu": {"kube-apiserver": 3.0, "manager": 1.0},
                "writes": {"pods/binding POST": 1000, "shareddevicegroups/status PATCH": 100},
                "apiserver_parts": {"CRD status writes": 1.0, "pods/binding POST": 2.0},
            },
            {
                "name": S2_RAW,
                "pods": 1000,
                "cpu": {"kube-apiserver": 2.0, "raw binder": 0.5},
                "writes": {"pods/binding POST": 1000},
                "apiserver_parts": {"pods/binding POST": 1.0},
            },
        ]
    }
    lines = s2_parts(out)
    assert "S2 parts, per pod bound (SDG's run | raw binder's run):" in lines
    assert "| shareddevicegroups/status PATCH | 0.10 | 0.00 |" in lines
    assert "| kube-apiserver: CRD status writes | 1.00 ms | 0.00 ms |" in lines
    assert "| CPU raw binder | - | 0.50 ms |" in lines
    assert s2_parts({"phases": out["phases"][:1]}) == []


def test_s4_parts_put_sdgs_status_beside_the_floors_and_kopfs() -> None:
    def phase(name: str, api: float, who: str) -> dict[str, Any]:
        return {
            "name": name,
            "pods": 1000,
            "cpu": {"kube-apiserver": api, who: 1.0},
            "apiserver_parts": {
                "CRD status writes": api / 2,
                "creates (pods, Events, ...)": api / 2,
            },
        }

    out = {
        "phases": [
            phase(S4_SDG, 4.0, "sdg-manager"),
            phase(S4_FLOOR, 5.0, "status floor"),
            phase(S4_KOPF, 6.0, "kopf peer"),
        ]
    }
    lines = s4_parts(out)
    assert "S4 parts, per pod (SDG's run | status floor's run | kopf's run):" in lines
    assert "| kube-apiserver: CRD status writes | 2.00 ms | 2.50 ms | 3.00 ms |" in lines
    assert s4_parts({"phases": []}) == []

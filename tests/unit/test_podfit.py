"""Pod-to-node fit: the checks kube-scheduler would make before our scheduler binds."""

from __future__ import annotations

from typing import Any

import pytest

from api.pods import tolerates
from controllers.podfit import (
    host_ports,
    matches_required_affinity,
    pod_fits_node,
    pod_requests,
)


def node(
    *,
    labels: dict[str, str] | None = None,
    allocatable: dict[str, str] | None = None,
    taints: list[dict[str, str]] | None = None,
    unschedulable: bool = False,
    name: str = "n1",
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"taints": taints or [], **({"unschedulable": True} if unschedulable else {})},
        "status": {
            "allocatable": allocatable
            if allocatable is not None
            else {"cpu": "4", "memory": "8Gi", "pods": "10", "ephemeral-storage": "10Gi"}
        },
    }


def container(name: str = "c", requests: dict | None = None, limits: dict | None = None, **kw: Any):
    res: dict[str, Any] = {}
    if requests:
        res["requests"] = requests
    if limits:
        res["limits"] = limits
    return {"name": name, "image": "x", "resources": res, **kw}


def pod(
    name: str = "p",
    containers: list | None = None,
    init: list | None = None,
    phase: str | None = None,
    **spec: Any,
) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}"},
        "spec": {"containers": containers or [container()], **spec},
    }
    if init:
        obj["spec"]["initContainers"] = init
    if phase:
        obj["status"] = {"phase": phase}
    return obj


# --- requests ---------------------------------------------------------------------------


def test_pod_requests_sum_containers_and_default_from_limits() -> None:
    p = pod(
        containers=[
            container(requests={"cpu": "250m", "memory": "1Gi"}),
            container(limits={"cpu": "1", "memory": "512Mi"}),  # requests default to limits
            container(requests={"cpu": "100m"}, limits={"cpu": "2"}),
        ]
    )
    assert pod_requests(p) == {"cpu": 1350, "memory": 1536 * 1024**2}


def test_init_containers_raise_the_request_to_their_max() -> None:
    p = pod(
        containers=[container(requests={"cpu": "500m", "memory": "1Gi"})],
        init=[
            container("i1", requests={"cpu": "2"}),
            container("i2", requests={"memory": "512Mi"}),
        ],
    )
    assert pod_requests(p) == {"cpu": 2000, "memory": 1024**3}


def test_sidecar_init_containers_add_to_the_sum_and_to_later_inits() -> None:
    p = pod(
        containers=[container(requests={"cpu": "1"})],
        init=[
            container("early", requests={"cpu": "1500m"}),  # runs alone: 1.5
            container("sidecar", requests={"cpu": "500m"}, restartPolicy="Always"),
            container("late", requests={"cpu": "1200m"}),  # runs beside sidecar: 1.7
        ],
    )
    # containers 1 + sidecar 0.5 = 1.5; init max = max(1.5, 0.5, 1.7) = 1.7
    assert pod_requests(p) == {"cpu": 1700}
    p["spec"]["initContainers"][2]["resources"]["requests"]["cpu"] = "100m"
    assert pod_requests(p) == {"cpu": 1500}


def test_overhead_and_pod_level_resources() -> None:
    p = pod(
        containers=[container(requests={"cpu": "1", "memory": "1Gi"})],
        overhead={"cpu": "250m", "memory": "64Mi"},
    )
    assert pod_requests(p) == {"cpu": 1250, "memory": (1024 + 64) * 1024**2}
    p["spec"]["resources"] = {"requests": {"cpu": "3"}}
    assert pod_requests(p) == {"cpu": 3250, "memory": (1024 + 64) * 1024**2}


# --- tolerations ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("toleration", "taint", "ok"),
    [
        (
            {"key": "k", "operator": "Equal", "value": "v"},
            {"key": "k", "value": "v", "effect": "NoSchedule"},
            True,
        ),
        ({"key": "k", "value": "v"}, {"key": "k", "value": "v", "effect": "NoSchedule"}, True),
        ({"key": "k", "value": "w"}, {"key": "k", "value": "v", "effect": "NoSchedule"}, False),
        (
            {"key": "k", "operator": "Exists"},
            {"key": "k", "value": "v", "effect": "NoExecute"},
            True,
        ),
        ({"operator": "Exists"}, {"key": "anything", "effect": "NoSchedule"}, True),
        (
            {"key": "k", "operator": "Exists", "effect": "NoExecute"},
            {"key": "k", "effect": "NoSchedule"},
            False,
        ),
        (
            {"key": "k", "operator": "Exists", "effect": "NoSchedule"},
            {"key": "k", "effect": "NoSchedule"},
            True,
        ),
        ({"key": "other", "operator": "Exists"}, {"key": "k", "effect": "NoSchedule"}, False),
        (
            {"key": "k", "operator": "Gt", "value": "1"},
            {"key": "k", "value": "2", "effect": "NoSchedule"},
            False,
        ),
    ],
)
def test_tolerates(toleration: dict, taint: dict, ok: bool) -> None:
    assert tolerates(toleration, taint) is ok


def test_untolerated_taints_block_and_tolerated_ones_do_not() -> None:
    n = node(
        taints=[
            {"key": "soft", "effect": "PreferNoSchedule"},
            {"key": "dedicated", "value": "ml", "effect": "NoSchedule"},
        ]
    )
    assert pod_fits_node(pod(), n, []) == ["node(s) had untolerated taint {dedicated: ml}"]
    tolerant = pod(tolerations=[{"key": "dedicated", "operator": "Equal", "value": "ml"}])
    assert pod_fits_node(tolerant, n, []) is None


def test_unschedulable_node_needs_the_unschedulable_toleration() -> None:
    n = node(unschedulable=True)
    assert pod_fits_node(pod(), n, []) == ["node(s) were unschedulable"]
    ok = pod(tolerations=[{"key": "node.kubernetes.io/unschedulable", "operator": "Exists"}])
    assert pod_fits_node(ok, n, []) is None
    wrong_effect = pod(
        tolerations=[
            {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoExecute"}
        ]
    )
    assert pod_fits_node(wrong_effect, n, []) == ["node(s) were unschedulable"]


# --- selectors and affinity -------------------------------------------------------------


def test_node_selector_mismatch_names_the_missing_labels() -> None:
    n = node(labels={"zone": "a"})
    p = pod(nodeSelector={"zone": "b", "disk": "ssd"})
    assert pod_fits_node(p, n, []) == [
        "node(s) didn't match Pod's node affinity/selector (nodeSelector disk=ssd, zone=b)"
    ]
    assert pod_fits_node(pod(nodeSelector={"zone": "a"}), n, []) is None


def affinity(*terms: dict) -> dict:
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}
        }
    }


@pytest.mark.parametrize(
    ("expr", "ok"),
    [
        ({"key": "zone", "operator": "In", "values": ["a", "b"]}, True),
        ({"key": "zone", "operator": "In", "values": ["c"]}, False),
        ({"key": "zone", "operator": "NotIn", "values": ["c"]}, True),
        ({"key": "missing", "operator": "NotIn", "values": ["c"]}, True),
        ({"key": "zone", "operator": "Exists"}, True),
        ({"key": "missing", "operator": "Exists"}, False),
        ({"key": "missing", "operator": "DoesNotExist"}, True),
        ({"key": "zone", "operator": "DoesNotExist"}, False),
        ({"key": "gpus", "operator": "Gt", "values": ["3"]}, True),
        ({"key": "gpus", "operator": "Gt", "values": ["4"]}, False),
        ({"key": "gpus", "operator": "Lt", "values": ["5"]}, True),
        ({"key": "zone", "operator": "Gt", "values": ["1"]}, False),  # not an integer
        ({"key": "missing", "operator": "Lt", "values": ["1"]}, False),
        ({"key": "zone", "operator": "Bogus", "values": ["a"]}, False),
    ],
)
def test_match_expressions(expr: dict, ok: bool) -> None:
    n = node(labels={"zone": "a", "gpus": "4"})
    assert matches_required_affinity(pod(affinity=affinity({"matchExpressions": [expr]})), n) is ok


def test_affinity_terms_are_ored_and_expressions_anded() -> None:
    n = node(labels={"zone": "a", "disk": "hdd"})
    both = {
        "matchExpressions": [
            {"key": "zone", "operator": "In", "values": ["a"]},
            {"key": "disk", "operator": "In", "values": ["ssd"]},
        ]
    }
    assert not matches_required_affinity(pod(affinity=affinity(both)), n)
    either = affinity(both, {"matchExpressions": [{"key": "disk", "operator": "Exists"}]})
    assert matches_required_affinity(pod(affinity=either), n)
    assert not matches_required_affinity(pod(affinity=affinity({})), n)  # empty term: nothing
    assert not matches_required_affinity(pod(affinity=affinity()), n)  # no terms: nothing
    assert matches_required_affinity(pod(affinity={"nodeAffinity": {}}), n)


def test_match_fields_on_node_name() -> None:
    n = node(name="gpu-1")
    by_name = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-1"]}]}
    assert matches_required_affinity(pod(affinity=affinity(by_name)), n)
    not_name = {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["gpu-1"]}]}
    assert not matches_required_affinity(pod(affinity=affinity(not_name)), n)
    bad_key = {"matchFields": [{"key": "metadata.uid", "operator": "In", "values": ["gpu-1"]}]}
    assert not matches_required_affinity(pod(affinity=affinity(bad_key)), n)
    result = pod_fits_node(pod(affinity=affinity(not_name)), n, [])
    assert result == ["node(s) didn't match Pod's node affinity/selector (required node affinity)"]


# --- resources --------------------------------------------------------------------------


def test_insufficient_cpu_reports_requested_and_free() -> None:
    n = node(allocatable={"cpu": "1", "memory": "1Gi", "pods": "10"})
    existing = [pod("a", [container(requests={"cpu": "800m"})])]
    p = pod(containers=[container(requests={"cpu": "500m"})])
    assert pod_fits_node(p, n, existing) == ["Insufficient cpu (requested 500m, free 200m)"]
    assert pod_fits_node(pod(containers=[container(requests={"cpu": "200m"})]), n, existing) is None


def test_every_short_resource_is_reported() -> None:
    n = node(allocatable={"cpu": "2", "memory": "1Gi", "pods": "10", "ephemeral-storage": "1Gi"})
    p = pod(
        containers=[
            container(
                requests={
                    "cpu": "3",
                    "memory": "2Gi",
                    "ephemeral-storage": "2Gi",
                    "example.com/x": "1",
                }
            )
        ]
    )
    assert pod_fits_node(p, n, []) == [
        "Insufficient cpu (requested 3, free 2)",
        "Insufficient ephemeral-storage (requested 2Gi, free 1Gi)",
        "Insufficient example.com/x (requested 1, free 0)",
        "Insufficient memory (requested 2Gi, free 1Gi)",
    ]


def test_terminal_pods_and_the_pod_itself_do_not_count() -> None:
    n = node(allocatable={"cpu": "1", "memory": "1Gi", "pods": "2"})
    p = pod("me", [container(requests={"cpu": "1"})])
    done = pod("done", [container(requests={"cpu": "1"})], phase="Succeeded")
    failed = pod("failed", [container(requests={"cpu": "1"})], phase="Failed")
    assert pod_fits_node(p, n, [done, failed, p]) is None
    running = pod("run", [container(requests={"cpu": "1m"})], phase="Running")
    assert pod_fits_node(p, n, [running]) == ["Insufficient cpu (requested 1, free 999m)"]


def test_pod_count_limit() -> None:
    n = node(allocatable={"cpu": "4", "memory": "1Gi", "pods": "2"})
    others = [pod("a"), pod("b")]
    assert pod_fits_node(pod(), n, others) == ["Too many pods (node allows 2, 2 already running)"]
    assert pod_fits_node(pod(), n, others[:1]) is None


def test_memory_is_compared_to_the_byte() -> None:
    n = node(allocatable={"cpu": "1", "memory": "1Gi", "pods": "10"})
    assert pod_fits_node(pod(containers=[container(requests={"memory": "1Gi"})]), n, []) is None
    over = pod(containers=[container(requests={"memory": "1073741825"})])
    assert pod_fits_node(over, n, []) == ["Insufficient memory (requested 1073741825, free 1Gi)"]


def test_zero_requests_only_check_pod_count() -> None:
    n = node(allocatable={"pods": "1"})
    assert pod_fits_node(pod(), n, []) is None


# --- host ports -------------------------------------------------------------------------


def ported(name: str, port: int, protocol: str | None = None, ip: str | None = None) -> dict:
    spec: dict[str, Any] = {"containerPort": 80, "hostPort": port}
    if protocol:
        spec["protocol"] = protocol
    if ip:
        spec["hostIP"] = ip
    return pod(name, [container(ports=[spec])])


@pytest.mark.parametrize(
    ("existing", "wanted", "conflict"),
    [
        (ported("a", 8080), ported("p", 8080), True),
        (ported("a", 8080), ported("p", 8081), False),
        (ported("a", 8080, "UDP"), ported("p", 8080), False),
        (ported("a", 8080, "UDP"), ported("p", 8080, "UDP"), True),
        (ported("a", 8080, ip="10.0.0.1"), ported("p", 8080, ip="10.0.0.2"), False),
        (ported("a", 8080, ip="10.0.0.1"), ported("p", 8080, ip="10.0.0.1"), True),
        (ported("a", 8080, ip="0.0.0.0"), ported("p", 8080, ip="10.0.0.2"), True),
        (ported("a", 8080, ip="10.0.0.1"), ported("p", 8080), True),
    ],
)
def test_host_port_conflicts(existing: dict, wanted: dict, conflict: bool) -> None:
    result = pod_fits_node(wanted, node(), [existing])
    if conflict:
        port = wanted["spec"]["containers"][0]["ports"][0]
        proto = port.get("protocol", "TCP")
        wanted_port = f"{port['hostPort']}/{proto}"
        assert result == [
            f"node(s) didn't have free ports for the requested pod ports ({wanted_port})"
        ]
    else:
        assert result is None


def test_host_ports_include_sidecars_but_not_one_shot_inits() -> None:
    port = [{"containerPort": 1, "hostPort": 9000}]
    p = pod(
        init=[
            container("once", ports=port),
            container(
                "side",
                ports=[{"containerPort": 2, "hostPort": 9001, "protocol": "UDP"}],
                restartPolicy="Always",
            ),
        ],
        containers=[container(ports=[{"containerPort": 80}])],  # no hostPort: not claimed
    )
    assert host_ports(p) == [("UDP", "0.0.0.0", 9001)]
    done = ported("done", 8080)
    done["status"] = {"phase": "Succeeded"}
    assert pod_fits_node(ported("p", 8080), node(), [done]) is None


def test_all_failures_are_listed_together() -> None:
    n = node(
        unschedulable=True,
        taints=[{"key": "k", "effect": "NoExecute"}],
        labels={"zone": "a"},
        allocatable={"cpu": "1", "memory": "1Gi", "pods": "10"},
    )
    p = pod(containers=[container(requests={"cpu": "2"})], nodeSelector={"zone": "b"})
    assert pod_fits_node(p, n, []) == [
        "node(s) were unschedulable",
        "node(s) had untolerated taint {k: }",
        "node(s) didn't match Pod's node affinity/selector (nodeSelector zone=b)",
        "Insufficient cpu (requested 2, free 1)",
    ]

"""``sdg doctor`` for a reader who may not list pods outside the manager's namespace (the
deviceshare-doctor roles without the optional deviceshare-doctor-pods): the foreign-pods
check takes the manager's reports from the groups bound to the node, and says so; the
roles in config/rbac grant no cluster-wide pod read but the optional one."""

from __future__ import annotations

from typing import Any

from cli.doctor.facts import Check
from cli.doctor.judge import judge_foreign
from tests.unit.test_doctor import ROOT, TAINT, node, pod
from tests.unit.test_doctor import docs as config_docs

REFUSED = '403 Forbidden "pods is forbidden: User "alice" cannot list resource "pods""'
NAME = "node gpu-1: foreign device pods"


def group(name: str, node_name: str, *, foreign: str = "") -> dict[str, Any]:
    ready = (
        {"type": "Ready", "status": "False", "reason": "ForeignDevicePods", "message": foreign}
        if foreign
        else {"type": "Ready", "status": "True", "reason": "Ready", "message": "ok"}
    )
    return {
        "metadata": {"name": name},
        "status": {"phase": "Bound", "nodeName": node_name, "conditions": [ready]},
    }


def test_the_managers_report_of_a_bound_group_fails_the_check() -> None:
    n = node("gpu-1", 2, taints=[TAINT])
    message = "pods outside any group use the devices of node gpu-1: ml/thief (sets ...)"
    groups = [group("other", "gpu-2"), group("g", "gpu-1", foreign=message)]
    check = judge_foreign(n, [], refused=REFUSED, groups=groups)
    assert check.ok is False
    assert check.detail == f"the manager reports for group(s) g: {message}"
    assert check.fix.startswith("sdg explain g   (as someone who may list pods: kubectl get pods")


def test_bound_groups_without_a_report_pass_and_say_what_was_not_read() -> None:
    n = node("gpu-1", 2, taints=[TAINT])
    check = judge_foreign(n, [], refused=REFUSED, groups=[group("g", "gpu-1")])
    assert check.ok is True
    assert check.detail.startswith("none reported by the manager for group(s) g bound here")
    assert REFUSED in check.detail  # the refused read is shown, never hidden


def test_a_node_without_groups_is_left_undecided_with_the_role_to_bind() -> None:
    n = node("gpu-1", 2, taints=[TAINT])
    check = judge_foreign(n, [], refused=REFUSED, groups=[group("g", "gpu-2")])
    assert check.ok is None
    assert check.detail.startswith("not checked: no group is bound here")
    assert "deviceshare-doctor-pods" in check.fix


def test_without_refusal_the_pods_themselves_are_judged() -> None:
    n = node("gpu-1", 2, taints=[TAINT])
    thief = pod("thief", env={"NVIDIA_VISIBLE_DEVICES": "all"})
    assert judge_foreign(n, [thief], groups=[group("g", "gpu-1")]).ok is False
    assert judge_foreign(n, []) == Check(NAME, True, "none")


def test_only_the_optional_role_reads_pods_cluster_wide() -> None:
    roles = {
        r["metadata"]["name"]: r["rules"]
        for r in config_docs("rbac")
        if r["kind"] == "ClusterRole" and r["metadata"]["name"].startswith("deviceshare-doctor")
    }
    reading = {
        name
        for name, rules in roles.items()
        if any("pods" in r["resources"] and set(r["verbs"]) & {"get", "list"} for r in rules)
    }
    # deviceshare-doctor-records is bound in the manager's namespace only (its comment).
    assert reading == {"deviceshare-doctor-records", "deviceshare-doctor-pods"}
    assert not any("pods" in r["resources"] for r in roles["deviceshare-doctor"])
    text = (ROOT / "config" / "rbac" / "doctor_role.yaml").read_text()
    assert "--clusterrole=deviceshare-doctor-records" in text
    assert "-n deviceshare-system" in text

"""Pod env injection: the patch for a bound group, and every denial a user can hit."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from api.envvars import parse_env_table
from webhooks.injection import (
    Denial,
    Patch,
    apply_operations,
    build_injection,
    check_annotation,
    escape_pointer,
    inject_into,
    pointer,
)

GPU = "nvidia.com/gpu"
NPU = "huawei.com/Ascend910"


def group(
    name: str = "g",
    resources: dict[str, int] | None = None,
    devices: dict[str, str] | None = None,
    phase: str = "Bound",
    **meta: Any,
) -> dict[str, Any]:
    resources = resources or {GPU: 2}
    status: dict[str, Any] = {"phase": phase}
    if phase == "Bound":
        status["nodeName"] = "n1"
        status["selectedDevices"] = devices if devices is not None else {GPU: "0,1"}
    return {
        "apiVersion": "deviceshare.io/v1alpha1",
        "kind": "SharedDeviceGroup",
        "metadata": {"name": name, **meta},
        "spec": {"resources": resources},
        "status": status,
    }


def pod(
    annotation: str | None = "g",
    containers: list[dict[str, Any]] | None = None,
    init: list[dict[str, Any]] | None = None,
    scheduler: str | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "p", "namespace": "ns"}
    if annotation is not None:
        meta["annotations"] = {"deviceshare.io/group": annotation, "other": "x"}
    spec: dict[str, Any] = {"containers": containers or [{"name": "app", "image": "cuda"}]}
    if init:
        spec["initContainers"] = init
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def patched(p: dict[str, Any], g: dict[str, Any] | None, **kw: Any) -> dict[str, Any]:
    result = build_injection(p, g, **kw)
    assert isinstance(result, Patch), result
    return apply_operations(p, result.operations)


def denial(p: dict[str, Any], g: dict[str, Any] | None, **kw: Any) -> str:
    result = build_injection(p, g, **kw)
    assert isinstance(result, Denial), result
    assert not result.allowed
    return result.message


def env_of(c: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in c.get("env", [])}


def test_injects_env_into_every_container_and_sets_the_scheduler() -> None:
    p = pod(
        containers=[{"name": "a", "image": "x"}, {"name": "b", "image": "x"}],
        init=[{"name": "i", "image": "x"}],
        scheduler="default-scheduler",
    )
    result = build_injection(p, group())
    assert isinstance(result, Patch) and result.allowed
    assert result.operations == [
        {
            "op": "add",
            "path": "/spec/initContainers/0/env",
            "value": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "0,1"}],
        },
        {
            "op": "add",
            "path": "/spec/containers/0/env",
            "value": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "0,1"}],
        },
        {
            "op": "add",
            "path": "/spec/containers/1/env",
            "value": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "0,1"}],
        },
        {"op": "replace", "path": "/spec/schedulerName", "value": "deviceshare-scheduler"},
    ]
    out = apply_operations(p, result.operations)
    assert out["metadata"] == p["metadata"]


def test_missing_scheduler_name_is_added_and_ours_is_kept() -> None:
    out = patched(pod(), group())
    assert out["spec"]["schedulerName"] == "deviceshare-scheduler"
    result = build_injection(pod(scheduler="deviceshare-scheduler"), group())
    assert isinstance(result, Patch)
    assert all(op["path"] != "/spec/schedulerName" for op in result.operations)


def test_user_value_is_replaced_in_place_keeping_other_entries() -> None:
    containers = [
        {
            "name": "app",
            "image": "x",
            "env": [
                {"name": "A", "value": "1"},
                {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
                {"name": "B", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            ],
        }
    ]
    p = pod(containers=containers)
    result = build_injection(p, group())
    assert isinstance(result, Patch)
    assert result.operations[0] == {
        "op": "replace",
        "path": "/spec/containers/0/env/1",
        "value": {"name": "NVIDIA_VISIBLE_DEVICES", "value": "0,1"},
    }
    env = apply_operations(p, result.operations)["spec"]["containers"][0]["env"]
    assert [e["name"] for e in env] == ["A", "NVIDIA_VISIBLE_DEVICES", "B"]
    assert env[1] == {"name": "NVIDIA_VISIBLE_DEVICES", "value": "0,1"}
    assert env[2] == containers[0]["env"][2]


def test_value_from_and_duplicates_are_all_overwritten() -> None:
    c = {
        "name": "app",
        "image": "x",
        "env": [
            {"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": {"configMapKeyRef": {"name": "c"}}},
            {"name": "X", "value": "1"},
            {"name": "NVIDIA_VISIBLE_DEVICES", "value": "3"},
        ],
    }
    env = patched(pod(containers=[c]), group())["spec"]["containers"][0]["env"]
    assert env == [
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "0,1"},
        {"name": "X", "value": "1"},
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "0,1"},
    ]


def test_existing_env_gets_appended_and_empty_env_replaced() -> None:
    c1 = {"name": "a", "image": "x", "env": [{"name": "A", "value": "1"}]}
    c2 = {"name": "b", "image": "x", "env": []}
    out = patched(pod(containers=[c1, c2]), group())
    assert env_of(out["spec"]["containers"][0]) == {"A": "1", "NVIDIA_VISIBLE_DEVICES": "0,1"}
    assert env_of(out["spec"]["containers"][1]) == {"NVIDIA_VISIBLE_DEVICES": "0,1"}


def test_already_correct_value_needs_no_env_operation() -> None:
    c = {"name": "a", "image": "x", "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "0,1"}]}
    result = build_injection(pod(containers=[c], scheduler="deviceshare-scheduler"), group())
    assert result == Patch([])


def test_several_resources_each_get_their_variable() -> None:
    g = group(resources={GPU: 1, NPU: 2}, devices={GPU: "3", NPU: "0,1"})
    out = patched(pod(), g)
    assert env_of(out["spec"]["containers"][0]) == {
        "ASCEND_VISIBLE_DEVICES": "0,1",
        "NVIDIA_VISIBLE_DEVICES": "3",
    }


def test_input_pod_is_not_modified() -> None:
    p = pod()
    before = copy.deepcopy(p)
    out = inject_into(p, group())
    assert p == before
    assert isinstance(out, dict) and env_of(out["spec"]["containers"][0])
    assert isinstance(inject_into(p, None), Denial)


# --- pods that are not ours ---------------------------------------------------------------


def test_pod_without_annotation_or_our_scheduler_is_left_alone() -> None:
    assert build_injection(pod(annotation=None), None) == Patch([])
    assert build_injection(pod(annotation=None, scheduler="default-scheduler"), None) == Patch()


def test_our_scheduler_without_annotation_is_denied() -> None:
    msg = denial(pod(annotation=None, scheduler="deviceshare-scheduler"), None)
    assert "no deviceshare.io/group annotation" in msg


# --- denials ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("", "is empty"),
        ("  ", "is empty"),
        ("My_Group", "not a valid SharedDeviceGroup name"),
        ("a/b", "not a valid SharedDeviceGroup name"),
        ("x" * 254, "not a valid SharedDeviceGroup name"),
    ],
)
def test_malformed_annotation_is_denied(value: str, fragment: str) -> None:
    assert fragment in denial(pod(annotation=value), group())
    assert check_annotation(pod(annotation=value)) is not None


def test_missing_group_is_denied() -> None:
    msg = denial(pod(annotation="nope"), None)
    assert msg.startswith("SharedDeviceGroup 'nope' not found")


def test_pending_group_is_denied_with_its_scheduled_message() -> None:
    g = group(phase="Pending")
    g["status"]["conditions"] = [
        {
            "type": "Scheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": "0/2 nodes are available: 2 have 1 free nvidia.com/gpu (need 2).",
        }
    ]
    msg = denial(pod(), g)
    assert msg.startswith(
        "SharedDeviceGroup 'g' is Pending: 0/2 nodes are available: "
        "2 have 1 free nvidia.com/gpu (need 2). Pods can join once it is Bound"
    )
    fresh = group(phase="Pending")
    del fresh["status"]
    assert "is Pending: it has not been scheduled yet. Pods can join" in denial(pod(), fresh)


def test_group_being_deleted_is_denied() -> None:
    g = group(deletionTimestamp="2025-01-01T00:00:00Z")
    assert "is being deleted" in denial(pod(), g)


@pytest.mark.parametrize("section", ["limits", "requests"])
@pytest.mark.parametrize("where", ["containers", "initContainers"])
def test_requesting_the_group_resource_is_denied(section: str, where: str) -> None:
    c = {"name": "greedy", "image": "x", "resources": {section: {GPU: "1", "cpu": "1"}}}
    p = pod(containers=[c]) if where == "containers" else pod(init=[c])
    msg = denial(p, group())
    what = "init container" if where == "initContainers" else "container"
    assert msg.startswith(f"{what} 'greedy' requests nvidia.com/gpu in resources.{section}")
    assert "device plugin would hand it other devices" in msg
    assert "Remove the nvidia.com/gpu limit and request" in msg


def test_pod_level_device_request_is_denied() -> None:
    p = pod()
    p["spec"]["resources"] = {"limits": {GPU: "1"}}
    assert "spec.resources.limits" in denial(p, group())


def test_other_device_resources_are_allowed() -> None:
    c = {"name": "a", "image": "x", "resources": {"limits": {"amd.com/gpu": "1"}}}
    assert isinstance(build_injection(pod(containers=[c]), group()), Patch)


def test_foreign_scheduler_is_denied() -> None:
    msg = denial(pod(scheduler="volcano"), group())
    assert "must use deviceshare-scheduler" in msg


def test_resource_without_env_entry_names_resource_and_flag() -> None:
    g = group(resources={"intel.com/gpu": 1}, devices={"intel.com/gpu": "0"})
    msg = denial(pod(), g)
    assert "intel.com/gpu" in msg and "--device-env intel.com/gpu=<ENV_VAR>" in msg
    table = parse_env_table(["intel.com/gpu=INTEL_VISIBLE_DEVICES"])
    out = patched(pod(), g, env_table=table)
    assert env_of(out["spec"]["containers"][0]) == {"INTEL_VISIBLE_DEVICES": "0"}


def test_two_resources_sharing_one_variable_are_denied() -> None:
    g = group(
        resources={"huawei.com/Ascend910": 1, "huawei.com/Ascend310": 1},
        devices={"huawei.com/Ascend910": "0", "huawei.com/Ascend310": "0"},
    )
    assert "both map to ASCEND_VISIBLE_DEVICES" in denial(pod(), g)


def test_bound_group_without_devices_for_a_resource_is_denied() -> None:
    g = group(resources={GPU: 1, NPU: 1}, devices={GPU: "0"})
    assert "no devices recorded for huawei.com/Ascend910" in denial(pod(), g)


# --- JSON pointers ----------------------------------------------------------------------


def test_pointer_escaping() -> None:
    assert escape_pointer("a/b~c") == "a~1b~0c"
    assert pointer("metadata", "annotations", "deviceshare.io/group") == (
        "/metadata/annotations/deviceshare.io~1group"
    )
    doc = {"metadata": {"annotations": {}}}
    out = apply_operations(
        doc, [{"op": "add", "path": "/metadata/annotations/a~1b~0c", "value": "v"}]
    )
    assert out == {"metadata": {"annotations": {"a/b~c": "v"}}}
    with pytest.raises(ValueError):
        apply_operations(doc, [{"op": "remove", "path": "/metadata"}])
    with pytest.raises(ValueError):
        apply_operations(doc, [{"op": "replace", "path": "/spec", "value": 1}])

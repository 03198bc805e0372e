"""Pod injection: the patch for a bound group (devices by env, RuntimeClass or CDI,
the devices record, scheduler, shared-node toleration), ephemeral containers of a group's
pod, and every denial a user can hit."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from api.constants import CONFLICT_REASONS
from api.envvars import parse_env_table
from tests import factories
from webhooks.delivery import (
    ResourceDevices,
    cdi_delivery,
    delivery_ops,
    env_delivery,
    runtimeclass_delivery,
)
from webhooks.injection import (
    SHARED_TOLERATION,
    Delivery,
    Denial,
    Patch,
    apply_operations,
    build_ephemeral_injection,
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
    *,
    deleting: bool = False,
) -> dict[str, Any]:
    """Group g asking for 2 GPUs; Bound on n1 (devices 0,1 unless ``devices`` says)."""
    bound = phase == "Bound"
    return factories.group(
        name,
        resources or {GPU: 2},
        node="n1" if bound else None,
        devices=({GPU: "0,1"} if devices is None else devices) if bound else None,
        phase=phase,
        deleting=deleting,
    )


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


GPUS = {"name": "NVIDIA_VISIBLE_DEVICES", "value": "0,1"}
ORDER = {"name": "CUDA_DEVICE_ORDER", "value": "PCI_BUS_ID"}
RECORD = {
    "op": "add",
    "path": "/metadata/annotations/deviceshare.io~1devices",
    "value": '{"nvidia.com/gpu":"0,1"}',
}
#: What the API server's policy checks the stored pod against (env mode, default table).
DELIVERED = (
    "mode=env env:NVIDIA_VISIBLE_DEVICES=0,1 off:AMD_VISIBLE_DEVICES off:ASCEND_VISIBLE_DEVICES"
    " domain:amd.com domain:huawei.com domain:nvidia.com"
)
STAMP = {"op": "add", "path": "/metadata/annotations/deviceshare.io~1delivered", "value": DELIVERED}


def test_injects_env_into_every_container_and_sets_the_scheduler() -> None:
    p = pod(
        containers=[{"name": "a", "image": "x"}, {"name": "b", "image": "x"}],
        init=[{"name": "i", "image": "x"}],
        scheduler="default-scheduler",
    )
    result = build_injection(p, group())
    assert isinstance(result, Patch) and result.allowed
    assert result.operations == [
        {"op": "add", "path": "/spec/initContainers/0/env", "value": [GPUS, ORDER]},
        {"op": "add", "path": "/spec/containers/0/env", "value": [GPUS, ORDER]},
        {"op": "add", "path": "/spec/containers/1/env", "value": [GPUS, ORDER]},
        RECORD,
        STAMP,
        {"op": "add", "path": "/spec/tolerations", "value": [dict(SHARED_TOLERATION)]},
        {"op": "replace", "path": "/spec/schedulerName", "value": "deviceshare-scheduler"},
    ]
    out = apply_operations(p, result.operations)
    assert out["metadata"]["annotations"] == {
        **p["metadata"]["annotations"],
        "deviceshare.io/devices": '{"nvidia.com/gpu":"0,1"}',
        "deviceshare.io/delivered": DELIVERED,
    }


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
    assert [e["name"] for e in env] == ["A", "NVIDIA_VISIBLE_DEVICES", "B", "CUDA_DEVICE_ORDER"]
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
        ORDER,
    ]


def test_existing_env_gets_appended_and_empty_env_replaced() -> None:
    c1 = {"name": "a", "image": "x", "env": [{"name": "A", "value": "1"}]}
    c2 = {"name": "b", "image": "x", "env": []}
    out = patched(pod(containers=[c1, c2]), group())
    assert env_of(out["spec"]["containers"][0]) == {
        "A": "1",
        "NVIDIA_VISIBLE_DEVICES": "0,1",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    }
    assert out["spec"]["containers"][1]["env"] == [GPUS, ORDER]


def test_already_correct_value_needs_no_env_operation() -> None:
    c = {"name": "a", "image": "x", "env": [GPUS, ORDER]}
    p = pod(containers=[c], scheduler="deviceshare-scheduler")
    p["spec"]["tolerations"] = [dict(SHARED_TOLERATION)]
    p["metadata"]["annotations"]["deviceshare.io/devices"] = '{"nvidia.com/gpu":"0,1"}'
    p["metadata"]["annotations"]["deviceshare.io/delivered"] = DELIVERED
    assert build_injection(p, group()) == Patch([])


def test_the_containers_own_cuda_device_order_is_kept() -> None:
    """A numbering preference, not a device choice: the pod's own value stays."""
    c = {
        "name": "a",
        "image": "x",
        "env": [{"name": "CUDA_DEVICE_ORDER", "value": "FASTEST_FIRST"}],
    }
    out = patched(pod(containers=[c]), group())
    assert env_of(out["spec"]["containers"][0]) == {
        "CUDA_DEVICE_ORDER": "FASTEST_FIRST",
        "NVIDIA_VISIBLE_DEVICES": "0,1",
    }


def test_cuda_device_order_is_for_nvidia_gpus_only() -> None:
    g = group(resources={"amd.com/gpu": 1}, devices={"amd.com/gpu": "1"})
    out = patched(pod(), g)
    assert env_of(out["spec"]["containers"][0]) == {"AMD_VISIBLE_DEVICES": "1"}
    assert out["metadata"]["annotations"]["deviceshare.io/devices"] == '{"amd.com/gpu":"1"}'


def test_several_resources_each_get_their_variable() -> None:
    g = group(resources={GPU: 1, NPU: 2}, devices={GPU: "3", NPU: "0,1"})
    out = patched(pod(), g)
    assert env_of(out["spec"]["containers"][0]) == {
        "ASCEND_VISIBLE_DEVICES": "0,1",
        "NVIDIA_VISIBLE_DEVICES": "3",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    }
    assert out["metadata"]["annotations"]["deviceshare.io/devices"] == (
        '{"huawei.com/Ascend910":"0,1","nvidia.com/gpu":"3"}'
    )


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
    g = group(deleting=True)
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


@pytest.mark.parametrize(
    "resource",
    ["amd.com/gpu", "nvidia.com/mig-1g.10gb", "nvidia.com/gpu.shared", "amd.com/gpu-partition"],
)
@pytest.mark.parametrize("where", ["containers", "initContainers"])
def test_any_other_device_resource_is_denied_saying_what_to_do(resource: str, where: str) -> None:
    """Another vendor's GPUs, or NVIDIA's own under another name (MIG profiles,
    time-slicing's renamed resource): the device plugin would hand the pod those too."""
    c = {"name": "a", "image": "x", "resources": {"limits": {resource: "1", "cpu": "1"}}}
    p = pod(containers=[c]) if where == "containers" else pod(init=[c])
    msg = denial(p, group())
    what = "init container" if where == "initContainers" else "container"
    assert msg == (
        f"{what} 'a' requests {resource} in resources.limits, a device resource: a pod of "
        "SharedDeviceGroup 'g' sees exactly the group's devices (nvidia.com/gpu), and the "
        "device plugin would hand it other devices besides, outside every group's books. "
        f"Remove the {resource} limit and request, or run the pod outside the group (or in "
        f"a group that holds {resource})"
    )


def test_resources_that_are_no_devices_are_allowed() -> None:
    c = {
        "name": "a",
        "image": "x",
        "resources": {"limits": {"cpu": "1", "example.com/fpga": "1", "hugepages-2Mi": "1Gi"}},
    }
    assert isinstance(build_injection(pod(containers=[c]), group()), Patch)


def test_a_custom_table_entry_is_a_device_resource_too() -> None:
    table = parse_env_table(["intel.com/gpu=ZE_AFFINITY_MASK"])
    c = {"name": "a", "image": "x", "resources": {"requests": {"intel.com/gpu": "1"}}}
    msg = denial(pod(containers=[c]), group(), env_table=table)
    assert msg.startswith("container 'a' requests intel.com/gpu in resources.requests")


def test_dra_claims_are_denied() -> None:
    p = pod()
    p["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]
    p["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    assert denial(p, group()) == (
        "pod asks for devices through spec.resourceClaims (gpu): a pod of SharedDeviceGroup "
        "'g' sees exactly the group's devices, and a DRA driver would hand it the claimed "
        "devices besides, outside the group's books. Remove spec.resourceClaims (and the "
        "containers' resources.claims), or run the pod outside the group"
    )
    p["spec"]["resourceClaims"] = []
    del p["spec"]["containers"][0]["resources"]
    assert isinstance(build_injection(p, group()), Patch)


@pytest.mark.parametrize(
    ("entry", "shown"),
    [
        ({"name": "AMD_VISIBLE_DEVICES", "value": "all"}, "AMD_VISIBLE_DEVICES=all"),
        ({"name": "ASCEND_VISIBLE_DEVICES", "value": "0-3"}, "ASCEND_VISIBLE_DEVICES=0-3"),
        (
            {"name": "AMD_VISIBLE_DEVICES", "valueFrom": {"configMapKeyRef": {"name": "c"}}},
            "AMD_VISIBLE_DEVICES from valueFrom",
        ),
    ],
)
def test_another_vendors_device_env_is_denied(entry: dict[str, Any], shown: str) -> None:
    var = entry["name"]
    of = "amd.com/gpu" if var.startswith("AMD") else "huawei.com/Ascend*"
    msg = denial(pod(init=[{"name": "setup", "image": "x", "env": [entry]}]), group())
    assert msg == (
        f"init container 'setup' sets {shown}, the device variable of {of}, which "
        "SharedDeviceGroup 'g' does not hold: that runtime would hand the container those "
        "devices beside the group's, outside every group's books. Remove "
        f'{var} (SDG sets the group\'s own: NVIDIA_VISIBLE_DEVICES), or set it to "" for no '
        "device"
    )


@pytest.mark.parametrize("value", ["", "void", "none", " None "])
def test_another_vendors_device_env_naming_no_device_is_allowed(value: str) -> None:
    """An AMD group's pod from a CUDA image may say NVIDIA_VISIBLE_DEVICES=void itself."""
    g = group(resources={"amd.com/gpu": 1}, devices={"amd.com/gpu": "1"})
    env = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": value}]
    out = patched(pod(containers=[{"name": "app", "image": "cuda", "env": env}]), g)
    assert env_of(out["spec"]["containers"][0]) == {
        "NVIDIA_VISIBLE_DEVICES": value,
        "AMD_VISIBLE_DEVICES": "1",
    }
    # CUDA_VISIBLE_DEVICES picks among the visible GPUs: no device variable of a runtime.
    env = [{"name": "CUDA_VISIBLE_DEVICES", "value": "1"}]
    assert isinstance(build_injection(pod(containers=[{"name": "a", "env": env}]), group()), Patch)


@pytest.mark.parametrize(
    "key",
    [
        "devices.noderesource.dev/container.app",
        "devices.nri.io/pod",
        "devices.noderesource.dev",
        "mounts.noderesource.dev/container.app",
        "mounts.nri.io",
    ],
)
def test_raw_device_and_mount_annotations_are_denied(key: str) -> None:
    """The device-injector would put /dev/nvidia3 (or a mount of /dev) into the pod."""
    p = pod()
    p["metadata"]["annotations"][key] = "- path: /dev/nvidia3\n  type: c\n  major: 195"
    for mode in ("env", "runtimeclass", "cdi"):
        msg = denial(p, group(), delivery=Delivery(mode))
        assert msg.startswith(
            f"annotation {key} asks NRI's device-injector for device nodes or mounts in the "
            "pod's containers: a pod of SharedDeviceGroup 'g' sees exactly the group's "
            "devices, and SDG owns these annotations on group pods"
        )
        assert f"Remove {key} (devices.noderesource.dev/..., devices.nri.io/..." in msg
    # Look-alikes of other families stay the pod's own.
    q = pod()
    q["metadata"]["annotations"]["devices.noderesource.dev.example.com/x"] = "y"
    q["metadata"]["annotations"]["io-priority.noderesource.dev/pod"] = "class: IOPRIO_CLASS_BE"
    assert isinstance(build_injection(q, group()), Patch)


@pytest.mark.parametrize("mode", ["env", "runtimeclass"])
def test_env_modes_remove_the_pods_own_cdi_annotations_with_a_warning(mode: str) -> None:
    """Without them the injector would hand a group pod every GPU beside the group's."""
    p = pod()
    p["metadata"]["annotations"].update(
        {
            "cdi-devices.noderesource.dev/container.app": '["nvidia.com/gpu=all"]',
            "cdi-devices.nri.io/pod": '["nvidia.com/gpu=all"]',
            "cdi-devices.nri.io": '["nvidia.com/gpu=all"]',
            "cdi-devices.example.com/x": "kept: another family",
        }
    )
    result = build_injection(p, group(), delivery=Delivery(mode))
    assert isinstance(result, Patch)
    out = apply_operations(p, result.operations)
    assert out["metadata"]["annotations"] == {
        "deviceshare.io/group": "g",
        "other": "x",
        "cdi-devices.example.com/x": "kept: another family",
        "deviceshare.io/devices": '{"nvidia.com/gpu":"0,1"}',
        "deviceshare.io/delivered": DELIVERED.replace(
            "mode=env", "mode=runtimeclass runtimeClassName=nvidia" if mode != "env" else "mode=env"
        ),
    }
    assert out["spec"]["containers"][0]["env"] == [GPUS, ORDER]
    assert result.warnings == (
        "SDG replaced or removed CDI device annotation "
        "cdi-devices.noderesource.dev/container.app, cdi-devices.nri.io, "
        "cdi-devices.nri.io/pod: a pod of SharedDeviceGroup 'g' gets exactly the group's "
        "devices, and SDG owns these annotations on group pods",
    )
    assert build_injection(out, group(), delivery=Delivery(mode)) == Patch([])
    # A custom prefix of the manager's is owned the same way.
    q = pod()
    q["metadata"]["annotations"]["cdi.example.com/ctr-app"] = '["nvidia.com/gpu=all"]'
    d = Delivery(mode, cdi_annotation_prefix="cdi.example.com/ctr-")
    assert (
        "cdi.example.com/ctr-app" not in patched(q, group(), delivery=d)["metadata"]["annotations"]
    )


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
        apply_operations(doc, [{"op": "move", "from": "/metadata", "path": "/m"}])
    with pytest.raises(ValueError):
        apply_operations(doc, [{"op": "replace", "path": "/spec", "value": 1}])
    with pytest.raises(ValueError):
        apply_operations(doc, [{"op": "remove", "path": "/metadata/annotations/gone"}])
    assert apply_operations(out, [{"op": "remove", "path": "/metadata/annotations/a~1b~0c"}]) == (
        doc
    )


# --- the shared-node toleration -----------------------------------------------------------


def test_toleration_is_added_so_group_pods_land_on_tainted_shared_nodes() -> None:
    """No effect: it tolerates NoSchedule and NoExecute alike. Group placement ignores the
    shared taint with either effect, so a NoExecute one must not evict the group's pods."""
    out = patched(pod(init=[{"name": "i", "image": "x"}]), group())
    assert out["spec"]["tolerations"] == [
        {"key": "deviceshare.io/mode", "operator": "Equal", "value": "shared"}
    ]


def test_toleration_is_appended_to_the_pods_own() -> None:
    own = {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}
    p = pod()
    p["spec"]["tolerations"] = [own]
    assert patched(p, group())["spec"]["tolerations"] == [own, dict(SHARED_TOLERATION)]
    p["spec"]["tolerations"] = []
    assert patched(p, group())["spec"]["tolerations"] == [dict(SHARED_TOLERATION)]


NO_SCHEDULE = {"key": "deviceshare.io/mode", "value": "shared", "effect": "NoSchedule"}
NO_EXECUTE = {"key": "deviceshare.io/mode", "value": "shared", "effect": "NoExecute"}
PREFER = {"key": "deviceshare.io/mode", "value": "shared", "effect": "PreferNoSchedule"}


@pytest.mark.parametrize(
    "tolerations",
    [
        [{"key": "deviceshare.io/mode", "operator": "Equal", "value": "shared"}],
        [{"key": "deviceshare.io/mode", "value": "shared"}],  # "" is Equal
        [{"key": "deviceshare.io/mode", "operator": "Exists"}],
        [{"operator": "Exists"}],  # tolerates everything
        [NO_SCHEDULE, PREFER, NO_EXECUTE],  # every effect, one by one
    ],
)
def test_an_equivalent_toleration_is_kept_and_none_added(
    tolerations: list[dict[str, str]],
) -> None:
    p = pod()
    p["spec"]["tolerations"] = tolerations
    result = build_injection(p, group())
    assert isinstance(result, Patch)
    assert not [op for op in result.operations if op["path"].startswith("/spec/tolerations")]


@pytest.mark.parametrize(
    "toleration",
    [
        NO_SCHEDULE,  # a NoExecute shared taint would still evict the pod
        {"key": "deviceshare.io/mode", "operator": "Exists", "effect": "NoSchedule"},
        NO_EXECUTE,
        {**NO_EXECUTE, "tolerationSeconds": 300},
        {"key": "deviceshare.io/mode", "value": "other"},
        {"key": "other", "operator": "Exists"},
    ],
)
def test_a_toleration_for_something_else_does_not_count(toleration: dict[str, Any]) -> None:
    p = pod()
    p["spec"]["tolerations"] = [toleration]
    assert patched(p, group())["spec"]["tolerations"] == [toleration, dict(SHARED_TOLERATION)]


def test_a_bounded_no_execute_toleration_is_not_enough() -> None:
    """tolerationSeconds only delays the eviction from the group's node."""
    p = pod()
    p["spec"]["tolerations"] = [NO_SCHEDULE, PREFER, {**NO_EXECUTE, "tolerationSeconds": 60}]
    assert patched(p, group())["spec"]["tolerations"][-1] == dict(SHARED_TOLERATION)


def test_reinvocation_after_other_webhooks_adds_nothing_twice() -> None:
    """The webhook runs again (reinvocationPolicy: IfNeeded) on its own output plus
    whatever later webhooks added: only the newcomers get operations."""
    p = pod(
        containers=[{"name": "a", "image": "x", "env": [{"name": "A", "value": "1"}]}],
        init=[{"name": "i", "image": "x"}],
    )
    once = patched(p, group())
    assert build_injection(once, group()) == Patch([])
    once["spec"]["containers"].append({"name": "sidecar", "image": "x"})  # another webhook
    result = build_injection(once, group())
    assert isinstance(result, Patch)
    assert result.operations == [
        {"op": "add", "path": "/spec/containers/1/env", "value": [GPUS, ORDER]}
    ]
    assert apply_operations(once, result.operations)["spec"]["tolerations"] == [
        dict(SHARED_TOLERATION)
    ]


# --- conflicts --------------------------------------------------------------------------


def conflicted(reason: str, status: str = "False", message: str = "") -> dict[str, Any]:
    g = group()
    g["status"]["conditions"] = [
        {"type": "Scheduled", "status": "True", "reason": "Bound"},
        {"type": "Ready", "status": status, "reason": reason, "message": message},
    ]
    return g


@pytest.mark.parametrize("reason", sorted(CONFLICT_REASONS))
def test_a_group_with_a_conflict_takes_no_new_pods(reason: str) -> None:
    g = conflicted(reason, message="pods run with other devices: ns/rogue on n1; delete those pods")
    msg = denial(pod(), g)
    assert msg.startswith(
        f"SharedDeviceGroup 'g' takes no new pods while its devices are disputed: "
        f"Ready=False, reason {reason}: pods run with other devices: ns/rogue on n1; "
        "delete those pods. Resolve that first (kubectl describe sdg g)"
    )
    assert "pods can join again once the condition clears" in msg


@pytest.mark.parametrize(
    ("reason", "status"),
    [("NotReady", "False"), ("DevicesMissing", "False"), ("Ready", "True"), ("", "Unknown")],
)
def test_other_ready_states_do_not_block_joining(reason: str, status: str) -> None:
    assert isinstance(build_injection(pod(), conflicted(reason, status)), Patch)


# --- ephemeral containers (kubectl debug) -------------------------------------------------


def member(
    ephemeral: list[dict[str, Any]] | None = None,
    env: list[dict[str, Any]] | None = None,
    annotation: str | None = "g",
) -> dict[str, Any]:
    """A group's pod as admitted: injected env, plus ``ephemeral`` containers."""
    c = {
        "name": "app",
        "image": "cuda",
        "env": env or [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "0,1"}],
    }
    p = pod(annotation=annotation, containers=[c])
    if ephemeral is not None:
        p["spec"]["ephemeralContainers"] = ephemeral
    return p


def debug(name: str = "dbg", env: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "image": "cuda", "targetContainerName": "app"}
    if env is not None:
        c["env"] = env
    return c


def ephemeral_patched(
    old: dict[str, Any], new: dict[str, Any], g: dict[str, Any] | None, **kw: Any
) -> dict[str, Any]:
    result = build_ephemeral_injection(new, old, g, **kw)
    assert isinstance(result, Patch), result
    return apply_operations(new, result.operations)


def ephemeral_denial(old: dict[str, Any], new: dict[str, Any], g: dict[str, Any] | None) -> str:
    result = build_ephemeral_injection(new, old, g)
    assert isinstance(result, Denial), result
    return result.message


def test_a_new_ephemeral_container_gets_the_groups_devices() -> None:
    old = member()
    out = ephemeral_patched(old, member([debug()]), group())
    assert env_of(out["spec"]["ephemeralContainers"][0]) == {"NVIDIA_VISIBLE_DEVICES": "0,1"}
    assert out["spec"]["containers"] == old["spec"]["containers"]


def test_the_users_value_for_a_device_variable_is_replaced() -> None:
    """CUDA images say NVIDIA_VISIBLE_DEVICES=all; a user may too (kubectl debug --env)."""
    dbg = debug(
        env=[{"name": "X", "value": "1"}, {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
    )
    out = ephemeral_patched(member(), member([dbg]), group())
    assert out["spec"]["ephemeralContainers"][0]["env"] == [
        {"name": "X", "value": "1"},
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "0,1"},
    ]


def test_only_added_ephemeral_containers_are_touched() -> None:
    """Existing ephemeral containers cannot change; one from before SDG stays as it is."""
    before = debug("old")
    out = ephemeral_patched(member([before]), member([before, debug("new")]), group())
    assert "env" not in out["spec"]["ephemeralContainers"][0]
    assert env_of(out["spec"]["ephemeralContainers"][1]) == {"NVIDIA_VISIBLE_DEVICES": "0,1"}
    assert build_ephemeral_injection(member([before]), member([before]), group()) == Patch()


def test_the_first_containers_other_device_variables_are_copied() -> None:
    """The API server's policy wants every *_VISIBLE_DEVICES entry of the first container
    (CUDA_VISIBLE_DEVICES picks among the visible GPUs): the debug container sees the same."""
    env = [
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "0,1"},
        {"name": "CUDA_VISIBLE_DEVICES", "value": "1"},
    ]
    dbg = debug(env=[{"name": "CUDA_VISIBLE_DEVICES", "value": "0"}])
    out = ephemeral_patched(member(env=env), member([dbg], env=env), group())
    assert env_of(out["spec"]["ephemeralContainers"][0]) == {
        "CUDA_VISIBLE_DEVICES": "1",
        "NVIDIA_VISIBLE_DEVICES": "0,1",
    }


def test_a_custom_device_variable_is_injected_too() -> None:
    """A --device-env name without the _VISIBLE_DEVICES suffix: only the webhook covers it."""
    table = parse_env_table(["intel.com/gpu=ZE_AFFINITY_MASK"])
    g = group(resources={"intel.com/gpu": 1}, devices={"intel.com/gpu": "2"})
    env = [{"name": "ZE_AFFINITY_MASK", "value": "2"}]
    out = ephemeral_patched(member(env=env), member([debug()], env=env), g, env_table=table)
    assert env_of(out["spec"]["ephemeralContainers"][0]) == {"ZE_AFFINITY_MASK": "2"}


def test_ephemeral_injection_is_idempotent() -> None:
    once = ephemeral_patched(member(), member([debug()]), group())
    assert build_ephemeral_injection(once, member(), group()) == Patch([])


def test_ephemeral_containers_of_other_pods_are_not_ours() -> None:
    p = pod(annotation=None)
    new = copy.deepcopy(p)
    new["spec"]["ephemeralContainers"] = [debug()]
    assert build_ephemeral_injection(new, p, None) == Patch()


def test_a_pod_running_on_other_devices_than_its_group_holds_gets_no_debug_container() -> None:
    env = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "3"}]
    msg = ephemeral_denial(member(env=env), member([debug()], env=env), group())
    assert msg.startswith(
        "pod ns/p does not run on the devices SharedDeviceGroup 'g' holds now (container "
        "'app' has NVIDIA_VISIBLE_DEVICES=3, the group holds 0,1), so ephemeral container "
        "'dbg' cannot be given the pod's devices. Delete the pod and create it again"
    )
    unset = [{"name": "A", "value": "1"}]
    msg = ephemeral_denial(member(env=unset), member([debug()], env=unset), group())
    assert "container 'app' has no NVIDIA_VISIBLE_DEVICES, the group holds 0,1" in msg


def test_a_debug_container_asking_for_other_devices_is_denied() -> None:
    dbg = debug(env=[{"name": "AMD_VISIBLE_DEVICES", "value": "all"}])
    msg = ephemeral_denial(member(), member([dbg]), group())
    assert msg.startswith(
        "ephemeral container 'dbg' of pod ns/p sets AMD_VISIBLE_DEVICES, which the pod's "
        "containers do not set"
    )
    assert "Remove it from the ephemeral container" in msg


def test_a_debug_container_of_a_pod_whose_group_is_gone_or_unbound_is_denied() -> None:
    assert "SharedDeviceGroup 'g' of pod ns/p not found" in ephemeral_denial(
        member(), member([debug()]), None
    )
    assert "is not Bound" in ephemeral_denial(member(), member([debug()]), group(phase="Pending"))


# --- delivery modes -------------------------------------------------------------------------

UUIDS = "GPU-aaa,GPU-bbb"
CDI = "cdi-devices.noderesource.dev/container."
OLD_CDI = "cdi-devices.nri.io/container."
EMPTY = {"name": "NVIDIA_VISIBLE_DEVICES", "value": ""}


def with_uuids(g: dict[str, Any], uuids: str = UUIDS) -> dict[str, Any]:
    g["status"]["physicalDevices"] = {GPU: uuids}
    return g


def node(name: str = "n1", mode: str | None = None) -> dict[str, Any]:
    """A shared node, its delivery label set to ``mode`` where given."""
    labels = {} if mode is None else {"deviceshare.io/delivery": mode}
    return factories.node(name, labels=labels)


def sidecar_pod() -> dict[str, Any]:
    """A main container, an init container and a native sidecar (restartPolicy Always)."""
    return pod(
        containers=[{"name": "app", "image": "cuda"}],
        init=[
            {"name": "setup", "image": "x"},
            {"name": "proxy", "image": "x", "restartPolicy": "Always"},
        ],
    )


def every_container(p: dict[str, Any]) -> list[dict[str, Any]]:
    return [*p["spec"].get("initContainers", []), *p["spec"]["containers"]]


def test_env_mode_names_devices_by_uuid_when_asked_and_known() -> None:
    """NVIDIA_VISIBLE_DEVICES takes UUIDs; CUDA_DEVICE_ORDER is for index numbering only.
    The record keeps the IDs."""
    out = patched(pod(), with_uuids(group()), delivery=Delivery(device_ids="uuid"))
    assert out["spec"]["containers"][0]["env"] == [
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "GPU-aaa,GPU-bbb"}
    ]
    assert out["metadata"]["annotations"]["deviceshare.io/devices"] == '{"nvidia.com/gpu":"0,1"}'
    # index mode ignores the UUIDs; uuid mode without them falls back to the IDs; auto (the
    # default) names NVIDIA's GPUs by UUID where known.
    out = patched(pod(), with_uuids(group()), delivery=Delivery(device_ids="index"))
    assert out["spec"]["containers"][0]["env"] == [GPUS, ORDER]
    out = patched(pod(), with_uuids(group()))
    assert env_of(out["spec"]["containers"][0]) == {"NVIDIA_VISIBLE_DEVICES": "GPU-aaa,GPU-bbb"}
    out = patched(pod(), group(), delivery=Delivery(device_ids="uuid"))
    assert out["spec"]["containers"][0]["env"] == [GPUS, ORDER]


@pytest.mark.parametrize("uuids", ["GPU-aaa", "GPU-aaa,GPU-bbb,GPU-ccc", "GPU-a a,GPU-b", ","])
def test_uuids_that_do_not_match_the_ids_are_denied(uuids: str) -> None:
    msg = denial(pod(), with_uuids(group(), uuids), delivery=Delivery(device_ids="uuid"))
    assert msg.startswith(f"SharedDeviceGroup 'g' records UUIDs {uuids!r} for nvidia.com/gpu")
    assert "controller inconsistency" in msg
    # Index mode does not use them: nothing to deny.
    index = Delivery(device_ids="index")
    assert isinstance(build_injection(pod(), with_uuids(group(), uuids), delivery=index), Patch)


def test_env_mode_reaches_init_containers_and_native_sidecars() -> None:
    out = patched(sidecar_pod(), group())
    containers = every_container(out)
    assert [c["name"] for c in containers] == ["setup", "proxy", "app"]  # none left out
    for c in containers:
        assert c["env"] == [GPUS, ORDER], c["name"]


def test_runtimeclass_mode_sets_the_runtime_class_and_the_env() -> None:
    rc = Delivery("runtimeclass")
    result = build_injection(sidecar_pod(), group(), delivery=rc)
    assert isinstance(result, Patch)
    assert {"op": "add", "path": "/spec/runtimeClassName", "value": "nvidia"} in result.operations
    out = apply_operations(sidecar_pod(), result.operations)
    assert out["spec"]["runtimeClassName"] == "nvidia"
    assert all(c["env"] == [GPUS, ORDER] for c in every_container(out))
    assert build_injection(out, group(), delivery=rc) == Patch([])
    # Another configured name; an empty field is filled in; the same name stays as it is.
    out = patched(pod(), group(), delivery=Delivery("runtimeclass", runtime_class_name="gpu"))
    assert out["spec"]["runtimeClassName"] == "gpu"
    p = pod()
    p["spec"]["runtimeClassName"] = ""
    assert patched(p, group(), delivery=rc)["spec"]["runtimeClassName"] == "nvidia"
    p["spec"]["runtimeClassName"] = "nvidia"
    result = build_injection(p, group(), delivery=rc)
    assert isinstance(result, Patch)
    assert not [op for op in result.operations if op["path"] == "/spec/runtimeClassName"]


def test_runtimeclass_mode_refuses_a_pod_naming_another_runtime_class() -> None:
    p = pod()
    p["spec"]["runtimeClassName"] = "kata"
    msg = denial(p, group(), delivery=Delivery("runtimeclass"))
    assert msg == (
        "pod sets runtimeClassName kata, but SharedDeviceGroup 'g' gets its devices on its "
        "node through RuntimeClass nvidia (delivery runtimeclass): under another runtime the "
        "pod would see no GPUs or other ones. Remove spec.runtimeClassName (SDG sets it) or "
        "set it to nvidia"
    )
    # Other modes leave the pod's RuntimeClass alone.
    assert patched(p, group())["spec"]["runtimeClassName"] == "kata"


def test_cdi_mode_annotates_every_container_and_empties_the_vendor_env() -> None:
    result = build_injection(sidecar_pod(), group(), delivery=Delivery("cdi"))
    assert isinstance(result, Patch)
    out = apply_operations(sidecar_pod(), result.operations)
    names = '["nvidia.com/gpu=0","nvidia.com/gpu=1"]'
    assert out["metadata"]["annotations"] == {
        "deviceshare.io/group": "g",
        "other": "x",
        "deviceshare.io/devices": '{"nvidia.com/gpu":"0,1"}',
        "deviceshare.io/delivered": "mode=cdi env:NVIDIA_VISIBLE_DEVICES= "
        "off:AMD_VISIBLE_DEVICES off:ASCEND_VISIBLE_DEVICES "
        f"domain:amd.com domain:huawei.com domain:nvidia.com cdi:{CDI}={names}",
        CDI + "setup": names,
        CDI + "proxy": names,
        CDI + "app": names,
    }
    for c in every_container(out):
        assert c["env"] == [EMPTY, ORDER], c["name"]
    assert "runtimeClassName" not in out["spec"]
    assert build_injection(out, group(), delivery=Delivery("cdi")) == Patch([])
    # The API server stores the empty value as no value (omitempty): the same entry, so
    # a reinvocation after other webhooks changes nothing either.
    for c in every_container(out):
        c["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES"}, ORDER]
    assert build_injection(out, group(), delivery=Delivery("cdi")) == Patch([])
    # The value is a YAML list (JSON is YAML), as the device-injector unmarshals it.
    assert yaml.safe_load(names) == ["nvidia.com/gpu=0", "nvidia.com/gpu=1"]


def test_cdi_mode_replaces_an_images_or_users_device_list_with_empty() -> None:
    """A CUDA image's NVIDIA_VISIBLE_DEVICES=all is overridden by the container's env
    (the kubelet sets it to "", containerd puts the container's env after the image's):
    the entry must be there, empty, whatever the pod said."""
    env = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
    out = patched(pod(containers=[{"name": "app", "env": env}]), group(), delivery=Delivery("cdi"))
    assert out["spec"]["containers"][0]["env"] == [EMPTY, ORDER]


def test_cdi_mode_names_uuids_and_every_resource() -> None:
    g = with_uuids(group())
    out = patched(pod(), g, delivery=Delivery("cdi", device_ids="uuid"))
    assert out["metadata"]["annotations"][CDI + "app"] == (
        '["nvidia.com/gpu=GPU-aaa","nvidia.com/gpu=GPU-bbb"]'
    )
    assert out["spec"]["containers"][0]["env"] == [EMPTY]  # UUIDs: no index order to keep
    g = group(resources={GPU: 1, "amd.com/gpu": 1}, devices={GPU: "3", "amd.com/gpu": "0"})
    out = patched(pod(), g, delivery=Delivery("cdi"))
    assert out["metadata"]["annotations"][CDI + "app"] == '["amd.com/gpu=0","nvidia.com/gpu=3"]'
    assert env_of(out["spec"]["containers"][0]) == {
        "AMD_VISIBLE_DEVICES": "",
        "NVIDIA_VISIBLE_DEVICES": "",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    }


def test_cdi_mode_owns_the_injectors_annotations_on_a_group_pod() -> None:
    """The group decides: a container's own key is overwritten, and keys the injector
    would prefer over ours or hand to other containers are removed (the deprecated
    family's too); other annotations stay. kubectl shows a warning naming them."""
    p = pod(containers=[{"name": "app", "image": "cuda", "env": [GPUS]}])
    p["metadata"]["annotations"].update(
        {
            CDI + "app": '["nvidia.com/gpu=5"]',
            OLD_CDI + "app": '["nvidia.com/gpu=all"]',
            "cdi-devices.nri.io/pod": '["nvidia.com/gpu=all"]',
            "cdi-devices.noderesource.dev": '["nvidia.com/gpu=all"]',
            CDI + "debugger": '["nvidia.com/gpu=all"]',
            "deviceshare.io/devices": '{"nvidia.com/gpu":"7"}',
        }
    )
    result = build_injection(p, group(), delivery=Delivery("cdi"))
    assert isinstance(result, Patch)
    out = apply_operations(p, result.operations)
    assert out["metadata"]["annotations"] == {
        "deviceshare.io/group": "g",
        "other": "x",
        "deviceshare.io/devices": '{"nvidia.com/gpu":"0,1"}',
        "deviceshare.io/delivered": "mode=cdi env:NVIDIA_VISIBLE_DEVICES= off:AMD_VISIBLE_DEVICES "
        "off:ASCEND_VISIBLE_DEVICES domain:amd.com domain:huawei.com domain:nvidia.com "
        f'cdi:{CDI}=["nvidia.com/gpu=0","nvidia.com/gpu=1"]',
        CDI + "app": '["nvidia.com/gpu=0","nvidia.com/gpu=1"]',
    }
    assert out["spec"]["containers"][0]["env"] == [EMPTY, ORDER]
    (warning,) = result.warnings
    assert warning == (
        "SDG replaced or removed CDI device annotation cdi-devices.noderesource.dev, "
        f"{CDI}app, {CDI}debugger and 2 more: a pod of SharedDeviceGroup 'g' gets exactly "
        "the group's devices, and SDG owns these annotations on group pods"
    )
    assert build_injection(out, group(), delivery=Delivery("cdi")) == Patch([])


def test_cdi_mode_reinvoked_after_another_webhook_adds_a_container() -> None:
    once = patched(pod(), group(), delivery=Delivery("cdi"))
    once["spec"]["containers"].append({"name": "late", "image": "x"})
    result = build_injection(once, group(), delivery=Delivery("cdi"))
    assert isinstance(result, Patch)
    assert result.operations == [
        {"op": "add", "path": "/spec/containers/1/env", "value": [EMPTY, ORDER]},
        {
            "op": "add",
            "path": "/metadata/annotations/cdi-devices.noderesource.dev~1container.late",
            "value": '["nvidia.com/gpu=0","nvidia.com/gpu=1"]',
        },
    ]


def test_cdi_mode_with_another_prefix() -> None:
    d = Delivery("cdi", cdi_annotation_prefix="cdi.example.com/ctr-")
    p = pod()
    p["metadata"]["annotations"]["cdi.example.com/ctr-ghost"] = '["nvidia.com/gpu=all"]'
    out = patched(p, group(), delivery=d)
    annotations = out["metadata"]["annotations"]
    assert annotations["cdi.example.com/ctr-app"] == '["nvidia.com/gpu=0","nvidia.com/gpu=1"]'
    assert "cdi.example.com/ctr-ghost" not in annotations


def test_cdi_mode_refuses_a_container_name_too_long_for_its_key() -> None:
    long = "c" * 54  # "container." + 54 > 63 characters
    msg = denial(pod(containers=[{"name": long, "image": "x"}]), group(), delivery=Delivery("cdi"))
    assert msg.startswith(f"container name {long!r} is too long for its CDI annotation")
    assert "use a container name of at most 53 characters" in msg
    assert isinstance(build_injection(pod(containers=[{"name": "c" * 53}]), group()), Patch)
    ok = pod(containers=[{"name": "c" * 53, "image": "x"}])
    assert isinstance(build_injection(ok, group(), delivery=Delivery("cdi")), Patch)


def test_cdi_mode_refuses_devices_it_cannot_name() -> None:
    g = with_uuids(group(), "GPU:aaa:,GPU-bbb")  # a CDI name ends in a letter or digit
    msg = denial(pod(), g, delivery=Delivery("cdi", device_ids="uuid"))
    assert msg.startswith("device 'GPU:aaa:' of nvidia.com/gpu cannot be named as a CDI device")
    assert "label deviceshare.io/delivery=env" in msg


def test_cdi_mode_on_a_pod_without_annotations_adds_them_whole() -> None:
    """Only reachable through the pure function (a group pod has its group annotation)."""
    p = pod()
    del p["metadata"]["annotations"]
    devices = [ResourceDevices(GPU, "NVIDIA_VISIBLE_DEVICES", (0,))]
    ops = cdi_delivery(p, devices, Delivery("cdi"))
    assert not isinstance(ops, Denial)
    assert ops[-1] == {
        "op": "add",
        "path": "/metadata/annotations",
        "value": {
            "deviceshare.io/devices": '{"nvidia.com/gpu":"0"}',
            CDI + "app": '["nvidia.com/gpu=0"]',
        },
    }


def test_each_mode_is_a_pure_function_of_pod_devices_and_settings() -> None:
    devices = [ResourceDevices(GPU, "NVIDIA_VISIBLE_DEVICES", (2,), ("GPU-c",))]
    p = pod()
    before = copy.deepcopy(p)
    for mode in ("env", "runtimeclass", "cdi"):
        for ids in ("auto", "index", "uuid"):
            d = Delivery(mode, device_ids=ids)
            assert delivery_ops(p, devices, d) == delivery_ops(copy.deepcopy(p), devices, d)
    assert p == before
    ops = env_delivery(p, devices, Delivery(device_ids="uuid"))
    assert ops == [
        {
            "op": "add",
            "path": "/spec/containers/0/env",
            "value": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "GPU-c"}],
        },
        {
            "op": "add",
            "path": "/metadata/annotations/deviceshare.io~1devices",
            "value": '{"nvidia.com/gpu":"2"}',
        },
    ]
    ops = runtimeclass_delivery(p, devices, Delivery("runtimeclass"))
    assert not isinstance(ops, Denial)
    assert ops[-1] == {"op": "add", "path": "/spec/runtimeClassName", "value": "nvidia"}


# --- the node label chooses the mode ---------------------------------------------------------


def test_the_nodes_label_overrides_the_managers_mode() -> None:
    out = patched(pod(), group(), node=node(mode="cdi"))
    assert CDI + "app" in out["metadata"]["annotations"]
    assert out["spec"]["containers"][0]["env"] == [EMPTY, ORDER]
    out = patched(pod(), group(), delivery=Delivery("cdi"), node=node(mode="env"))
    assert CDI + "app" not in out["metadata"]["annotations"]
    assert out["spec"]["containers"][0]["env"] == [GPUS, ORDER]
    out = patched(pod(), group(), node=node(mode="runtimeclass"))
    assert out["spec"]["runtimeClassName"] == "nvidia"
    # Settings other than the mode stay the manager's.
    d = Delivery(device_ids="uuid", runtime_class_name="gpu")
    out = patched(pod(), with_uuids(group()), delivery=d, node=node(mode="runtimeclass"))
    assert out["spec"]["runtimeClassName"] == "gpu"
    assert env_of(out["spec"]["containers"][0]) == {"NVIDIA_VISIBLE_DEVICES": "GPU-aaa,GPU-bbb"}


def test_no_label_or_another_node_means_the_managers_mode() -> None:
    assert patched(pod(), group(), node=node())["spec"]["containers"][0]["env"] == [GPUS, ORDER]
    out = patched(pod(), group(), node=node("n2", mode="cdi"))  # not the group's node
    assert out["spec"]["containers"][0]["env"] == [GPUS, ORDER]


def test_an_unknown_label_value_is_denied_naming_node_and_values() -> None:
    msg = denial(pod(), group(), node=node(mode="docker"))
    assert msg == (
        "node n1 of SharedDeviceGroup 'g' has label deviceshare.io/delivery='docker', which is "
        "not a delivery mode SDG knows (env, runtimeclass, cdi), so it cannot tell how that "
        "node's runtime takes devices. Fix the label (kubectl label node n1 "
        "deviceshare.io/delivery=<env|runtimeclass|cdi> --overwrite) or remove it to let SDG "
        "choose from the node's runtime (--delivery auto)"
    )


@pytest.mark.parametrize(
    "kw",
    [
        {"mode": "nri"},
        {"device_ids": "serial"},
        {"runtime_class_name": "Not_A_Name"},
        {"cdi_annotation_prefix": "no-slash."},
        {"cdi_annotation_prefix": "deviceshare.io/cdi."},
        {"cdi_annotation_prefix": "a.io/" + "x" * 63},
    ],
)
def test_delivery_settings_are_checked(kw: dict[str, str]) -> None:
    with pytest.raises(ValueError):
        Delivery(**kw)


# --- ephemeral containers of pods with a devices record -------------------------------------


def admitted(g: dict[str, Any], delivery: Delivery | None = None) -> dict[str, Any]:
    """A pod as the webhook admitted it into ``g``."""
    return patched(pod(), g, delivery=delivery or Delivery())


def test_a_debug_container_copies_the_device_env_the_pod_was_given() -> None:
    g = with_uuids(group())
    old = admitted(g, Delivery(device_ids="uuid"))
    new = copy.deepcopy(old)
    new["spec"]["ephemeralContainers"] = [
        debug(env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}])
    ]
    out = ephemeral_patched(old, new, g)
    assert env_of(out["spec"]["ephemeralContainers"][0]) == {
        "NVIDIA_VISIBLE_DEVICES": "GPU-aaa,GPU-bbb"
    }
    old = admitted(group())
    new = copy.deepcopy(old)
    new["spec"]["ephemeralContainers"] = [debug()]
    out = ephemeral_patched(old, new, group())
    assert out["spec"]["ephemeralContainers"][0]["env"] == [GPUS, ORDER]
    assert build_ephemeral_injection(out, old, group()) == Patch([])
    # The debug container's own numbering preference stays.
    new["spec"]["ephemeralContainers"] = [debug(env=[{"name": "CUDA_DEVICE_ORDER", "value": "F"}])]
    out = ephemeral_patched(old, new, group())
    assert env_of(out["spec"]["ephemeralContainers"][0]) == {
        "CUDA_DEVICE_ORDER": "F",
        "NVIDIA_VISIBLE_DEVICES": "0,1",
    }


def test_a_debug_container_of_a_cdi_pod_gets_the_empty_env_and_a_warning() -> None:
    old = admitted(group(), Delivery("cdi"))
    new = copy.deepcopy(old)
    new["spec"]["ephemeralContainers"] = [debug()]
    result = build_ephemeral_injection(new, old, group())
    assert isinstance(result, Patch)
    out = apply_operations(new, result.operations)
    assert out["spec"]["ephemeralContainers"][0]["env"] == [EMPTY, ORDER]
    assert out["metadata"] == old["metadata"]  # no annotation can change here
    (warning,) = result.warnings
    assert warning.startswith(
        "ephemeral container 'dbg' of pod ns/p sees none of SharedDeviceGroup 'g''s devices: "
        "the pod gets them through CDI annotations"
    )
    assert '(NVIDIA_VISIBLE_DEVICES="" keeps the image from seeing other devices)' in warning
    assert "kubectl exec into one of the pod's containers" in warning


@pytest.mark.parametrize(
    "entry",
    [{"name": "NVIDIA_VISIBLE_DEVICES"}, {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}],
    ids=["as-stored", "admitted-with-void"],
)
def test_a_debug_container_copies_the_stored_or_earlier_no_device_value(
    entry: dict[str, str],
) -> None:
    """As the API server stores the empty value, and as an earlier SDG wrote it."""
    old = admitted(group(), Delivery("cdi"))
    old["spec"]["containers"][0]["env"] = [entry, ORDER]
    new = copy.deepcopy(old)
    new["spec"]["ephemeralContainers"] = [debug()]
    result = build_ephemeral_injection(new, old, group())
    assert isinstance(result, Patch)
    out = apply_operations(new, result.operations)
    assert out["spec"]["ephemeralContainers"][0]["env"] == [entry, ORDER]
    (warning,) = result.warnings
    shown = entry.get("value") or '""'
    assert f"(NVIDIA_VISIBLE_DEVICES={shown} keeps the image" in warning


def test_a_debug_container_of_a_pod_whose_record_differs_is_denied() -> None:
    old = admitted(group())
    old["metadata"]["annotations"]["deviceshare.io/devices"] = '{"nvidia.com/gpu":"2,3"}'
    new = copy.deepcopy(old)
    new["spec"]["ephemeralContainers"] = [debug()]
    msg = ephemeral_denial(old, new, group())
    assert msg.startswith(
        "pod ns/p does not run on the devices SharedDeviceGroup 'g' holds now (it was given "
        "nvidia.com/gpu 2,3, the group holds nvidia.com/gpu 0,1), so ephemeral container "
        "'dbg' cannot be given the pod's devices"
    )
    for value in ("garbage", None):
        if value is None:
            old["metadata"]["annotations"]["deviceshare.io/devices"] = '{"nvidia.com/gpu":"0,1"}'
            old["spec"]["containers"][0]["env"] = []
        else:
            old["metadata"]["annotations"]["deviceshare.io/devices"] = value
        new = copy.deepcopy(old)
        new["spec"]["ephemeralContainers"] = [debug()]
        msg = ephemeral_denial(old, new, group())
        why = (
            "its annotation deviceshare.io/devices is not readable"
            if value
            else "container 'app' has no NVIDIA_VISIBLE_DEVICES"
        )
        assert f"holds now ({why})" in msg


def test_only_a_group_that_allows_host_access_gets_the_host_access_stamp() -> None:
    """The API server's pod policy admits privileged group pods only with this stamp."""
    opted = group()
    opted["spec"]["allowHostAccess"] = True
    out = patched(pod(), opted)
    assert out["metadata"]["annotations"]["deviceshare.io/host-access"] == "allowed"
    assert build_injection(out, opted) == Patch([])
    assert "deviceshare.io/host-access" not in patched(pod(), group())["metadata"]["annotations"]
    # Set by the pod itself in a group that does not allow it: refused, saying what to do.
    forged = pod()
    forged["metadata"]["annotations"]["deviceshare.io/host-access"] = "allowed"
    assert denial(forged, group()) == (
        "pod sets annotation deviceshare.io/host-access, which only SDG sets, on pods of groups "
        "with spec.allowHostAccess: true; SharedDeviceGroup 'g' does not allow host access. "
        "Remove the annotation (and any privileged container, SYS_ADMIN, hostPath under /dev "
        "or hostPID), or let the group's pods reach every device of the node: kubectl patch "
        """sdg g --type=merge -p '{"spec":{"allowHostAccess":true}}'"""
    )
    # Any value the pod set is SDG's to decide in a group that allows it.
    forged["metadata"]["annotations"]["deviceshare.io/host-access"] = "yes"
    assert patched(forged, opted)["metadata"]["annotations"]["deviceshare.io/host-access"] == (
        "allowed"
    )


def test_the_delivered_stamp_names_uuids_and_every_resource() -> None:
    g = group(resources={GPU: 1, "amd.com/gpu": 1}, devices={GPU: "3", "amd.com/gpu": "0"})
    g["status"]["physicalDevices"] = {GPU: "GPU-ddd"}
    out = patched(pod(), g)
    assert out["metadata"]["annotations"]["deviceshare.io/delivered"] == (
        "mode=env env:AMD_VISIBLE_DEVICES=0 env:NVIDIA_VISIBLE_DEVICES=GPU-ddd "
        "off:ASCEND_VISIBLE_DEVICES domain:amd.com domain:huawei.com domain:nvidia.com"
    )


def _shapes() -> list[dict[str, Any]]:
    """Group pods of many shapes: what the pod webhook's reuse of decisions must cover."""
    with_env = pod(containers=[{"name": "a", "env": [GPUS, {"name": "X", "value": "1"}]}])
    init = pod(init=[{"name": "i", "restartPolicy": "Always"}], scheduler="default-scheduler")
    cdi = pod()
    cdi["metadata"]["annotations"]["cdi-devices.nri.io/pod"] = '["nvidia.com/gpu=all"]'
    tolerating = pod()
    tolerating["spec"]["tolerations"] = [NO_SCHEDULE]
    return [pod(), with_env, init, cdi, tolerating]


@pytest.mark.parametrize("mode", ["env", "cdi", "runtimeclass", "auto"])
@pytest.mark.parametrize("shape", range(len(_shapes())))
def test_a_patch_depends_on_no_pod_identity_and_no_pod_count(shape: int, mode: str) -> None:
    """The pod webhook reuses a decision for pods that differ only in name, generateName,
    UID, creationTimestamp, resourceVersion and managedFields, and for a group whose pod
    counts changed (``webhooks.podmutator.decision_key``): the patch must not read them."""
    one, two = _shapes()[shape], _shapes()[shape]
    two["metadata"].update(
        name="other",
        generateName="web-",
        uid="u-2",
        creationTimestamp="2026-12-06T00:00:00Z",
        resourceVersion="7",
        managedFields=[{"manager": "m", "operation": "Update"}],
    )
    counted = factories.group("g", {GPU: 2}, node="n1", devices={GPU: "0,1"}, pods=["ns/a", "ns/b"])
    counted["status"]["allocatedPodCounts"] = {"ns": 2}
    delivery = Delivery(mode)
    first = build_injection(one, group(), delivery=delivery)
    second = build_injection(two, counted, delivery=delivery)
    assert isinstance(first, Patch) and isinstance(second, Patch)
    assert first == second and first.delivery == second.delivery

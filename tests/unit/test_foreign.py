"""Which pods use devices outside the books, and what placement and groups make of it."""

from __future__ import annotations

from typing import Any

import pytest

from api.constants import DEFAULT_ENV_TABLE
from controllers.foreign import ForeignDevices, device_use, foreign_frees

GPU = "nvidia.com/gpu"


def pod(
    name: str = "p",
    node: str | None = "n0",
    *,
    env: list[dict[str, Any]] | None = None,
    limits: dict[str, str] | None = None,
    kind: str = "containers",
    annotations: dict[str, str] | None = None,
    phase: str = "Running",
) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "c", "image": "x"}
    if env is not None:
        container["env"] = env
    if limits is not None:
        container["resources"] = {"limits": limits}
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "x"}]}
    spec.setdefault(kind, []).append(container)
    if node:
        spec["nodeName"] = node
    meta: dict[str, Any] = {"name": name, "namespace": "ns"}
    if annotations is not None:
        meta["annotations"] = annotations
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}


@pytest.mark.parametrize("value", ["all", "0,1", "GPU-1234", " ALL "])
@pytest.mark.parametrize("kind", ["containers", "initContainers", "ephemeralContainers"])
def test_a_device_env_var_set_by_hand_is_a_use(value: str, kind: str) -> None:
    use = device_use(
        pod(env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": value}], kind=kind), DEFAULT_ENV_TABLE
    )
    assert use is not None and use.env_vars == {"NVIDIA_VISIBLE_DEVICES"}
    assert use.affects(GPU, DEFAULT_ENV_TABLE) and not use.affects("amd.com/gpu", DEFAULT_ENV_TABLE)


@pytest.mark.parametrize("value", ["", "void", "none", "NONE"])
def test_values_that_show_no_device_are_not_a_use(value: str) -> None:
    env = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": value}]
    assert device_use(pod(env=env), DEFAULT_ENV_TABLE) is None


def test_value_from_elsewhere_counts_as_a_use() -> None:
    env = [
        {"name": "AMD_VISIBLE_DEVICES", "valueFrom": {"configMapKeyRef": {"name": "x", "key": "k"}}}
    ]
    use = device_use(pod(env=env), DEFAULT_ENV_TABLE)
    assert use is not None and use.affects("amd.com/gpu", DEFAULT_ENV_TABLE)


def test_a_device_plugin_request_is_a_use_and_globs_match_vendor_families() -> None:
    use = device_use(pod(limits={"huawei.com/Ascend910": "1"}), DEFAULT_ENV_TABLE)
    assert use is not None and use.resources == {"huawei.com/Ascend910"}
    assert device_use(pod(limits={"example.com/foo": "1"}), DEFAULT_ENV_TABLE) is None
    assert device_use(pod(limits={"cpu": "1"}), DEFAULT_ENV_TABLE) is None


@pytest.mark.parametrize(
    "p",
    [
        pod(
            env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
            annotations={"deviceshare.io/group": "g"},
        ),
        pod(env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}], node=None),
        pod(env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}], phase="Succeeded"),
        pod(env=[{"name": "OTHER", "value": "all"}]),
    ],
    ids=["group-member", "not-bound", "finished", "other-env"],
)
def test_group_members_unbound_finished_and_unrelated_pods_are_not_foreign(p: dict) -> None:
    assert device_use(p, DEFAULT_ENV_TABLE) is None


def test_mirror_blocks_exactly_the_used_resource_on_its_node_and_forgets() -> None:
    changed: list[str] = []
    mirror = ForeignDevices(DEFAULT_ENV_TABLE, on_change=changed.append)
    rogue = pod("rogue", env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}])
    mirror.observe(rogue)
    mirror.observe(rogue)  # unchanged: no second notification
    assert changed == ["n0"]
    blocked = mirror.blocked([GPU, "amd.com/gpu"])
    assert set(blocked) == {"n0"} and set(blocked["n0"]) == {GPU}
    reason, message = mirror.problem("n0", {GPU: 1}) or ("", "")
    assert reason == "ForeignDevicePods" and "ns/rogue (sets NVIDIA_VISIBLE_DEVICES)" in message
    assert mirror.problem("n0", {"amd.com/gpu": 1}) is None
    assert mirror.problem("n1", {GPU: 1}) is None
    # It ends: nothing is blocked any more.
    mirror.observe({**rogue, "status": {"phase": "Succeeded"}})
    assert mirror.blocked([GPU]) == {} and mirror.counts("n0") == 0
    mirror.observe(rogue)
    mirror.forget(rogue)
    assert mirror.on("n0") == []


def test_problem_message_stays_short_for_many_pods() -> None:
    mirror = ForeignDevices(DEFAULT_ENV_TABLE)
    for i in range(500):
        mirror.observe(pod(f"p{i}", limits={GPU: "1"}))
    _reason, message = mirror.problem("n0", {GPU: 1}) or ("", "")
    assert "and 495 more" in message and len(message) < 1000


def test_cdi_device_annotations_are_a_use() -> None:
    p = pod()
    p["metadata"]["annotations"] = {
        "cdi-devices.noderesource.dev/container.c": '["nvidia.com/gpu=all"]',
        "unrelated.example.com/x": "nvidia.com/gpu=0",
    }
    use = device_use(p, DEFAULT_ENV_TABLE)
    assert use is not None and use.resources == {GPU}
    p["metadata"]["annotations"] = {"cdi-devices.nri.io/pod": '["example.com/fpga=0"]'}
    assert device_use(p, DEFAULT_ENV_TABLE) is None


@pytest.mark.parametrize(
    "resource", ["nvidia.com/mig-1g.10gb", "nvidia.com/gpu.shared", "amd.com/gpu-partition"]
)
def test_alias_resources_of_a_vendor_are_a_use_of_its_gpus(resource: str) -> None:
    """MIG profiles, time-slicing's renamed resource, partitions: the same physical GPUs."""
    use = device_use(pod(limits={resource: "1"}), DEFAULT_ENV_TABLE)
    assert use is not None and use.resources == {resource}
    vendor = "amd.com/gpu" if resource.startswith("amd") else GPU
    other = GPU if vendor != GPU else "amd.com/gpu"
    assert use.affects(vendor, DEFAULT_ENV_TABLE)
    assert not use.affects(other, DEFAULT_ENV_TABLE)
    assert f"requests {resource}" in use.how()


@pytest.mark.parametrize(
    "key",
    [
        "devices.noderesource.dev/container.c",
        "devices.nri.io/pod",
        "devices.noderesource.dev",
        "mounts.noderesource.dev/container.c",
        "mounts.nri.io/pod",
    ],
)
def test_raw_device_and_mount_annotations_are_a_use_of_every_resource(key: str) -> None:
    """A pod injecting /dev/nvidia3 by annotation sees a GPU SDG cannot name."""
    p = pod(annotations={key: "- path: /dev/nvidia3\n  type: c\n  major: 195\n  minor: 3"})
    use = device_use(p, DEFAULT_ENV_TABLE)
    assert use is not None and use.injected == {key}
    assert all(use.affects(r, DEFAULT_ENV_TABLE) for r in (GPU, "amd.com/gpu"))
    assert use.how() == f"sets device-injector annotation {key}"
    # An empty list injects nothing; another plugin's family is no device path.
    assert device_use(pod(annotations={key: "[]"}), DEFAULT_ENV_TABLE) is None
    other = {"io-priority.noderesource.dev/pod": "class: IOPRIO_CLASS_BE"}
    assert device_use(pod(annotations=other), DEFAULT_ENV_TABLE) is None


def test_dra_claims_are_a_use_of_every_resource() -> None:
    p = pod()
    p["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]
    use = device_use(p, DEFAULT_ENV_TABLE)
    assert use is not None and use.claims == {"gpu"}
    assert use.affects(GPU, DEFAULT_ENV_TABLE) and use.affects("amd.com/gpu", DEFAULT_ENV_TABLE)
    assert use.how() == "claims DRA devices (gpu)"
    p["spec"]["resourceClaims"] = []
    assert device_use(p, DEFAULT_ENV_TABLE) is None


def env_from_pod(*entries: dict[str, Any], env: list[dict[str, Any]] | None = None) -> dict:
    p = pod(env=env)
    p["spec"]["containers"][-1]["envFrom"] = list(entries)
    return p


def test_env_from_that_may_set_a_device_variable_is_a_use() -> None:
    """A ConfigMap may hold NVIDIA_VISIBLE_DEVICES=all; SDG cannot read it, so it counts."""
    use = device_use(env_from_pod({"configMapRef": {"name": "settings"}}), DEFAULT_ENV_TABLE)
    assert use is not None
    assert use.env_from == {
        ("AMD_VISIBLE_DEVICES", "configMap settings"),
        ("ASCEND_VISIBLE_DEVICES", "configMap settings"),
        ("NVIDIA_VISIBLE_DEVICES", "configMap settings"),
    }
    assert use.affects(GPU, DEFAULT_ENV_TABLE)
    assert "may set NVIDIA_VISIBLE_DEVICES through envFrom configMap settings" in use.how()
    # A prefix that can still make the name (NVIDIA_ + VISIBLE_DEVICES) counts for it only.
    use = device_use(
        env_from_pod({"prefix": "NVIDIA_", "secretRef": {"name": "s"}}), DEFAULT_ENV_TABLE
    )
    assert use is not None and use.env_from == {("NVIDIA_VISIBLE_DEVICES", "secret s")}
    assert not use.affects("amd.com/gpu", DEFAULT_ENV_TABLE)


def test_env_from_that_cannot_set_a_device_variable_is_not_a_use() -> None:
    """Quiet for the envFrom most pods have: a prefix of their own, or the device
    variable set in env (env wins over envFrom), e.g. to "" for no device."""
    assert (
        device_use(
            env_from_pod({"prefix": "APP_", "configMapRef": {"name": "a"}}),
            {GPU: "NVIDIA_VISIBLE_DEVICES"},
        )
        is None
    )
    exact = {"prefix": "NVIDIA_VISIBLE_DEVICES", "configMapRef": {"name": "a"}}  # key ""
    assert device_use(env_from_pod(exact), {GPU: "NVIDIA_VISIBLE_DEVICES"}) is None
    env = [{"name": var} for var in sorted(set(DEFAULT_ENV_TABLE.values()))]
    p = env_from_pod({"configMapRef": {"name": "settings"}}, env=env)
    assert device_use(p, DEFAULT_ENV_TABLE) is None


def test_the_mirror_blocks_every_resource_for_a_pod_injecting_devices() -> None:
    mirror = ForeignDevices(DEFAULT_ENV_TABLE)
    mirror.observe(pod("raw", annotations={"devices.nri.io/pod": "- path: /dev/nvidia0"}))
    assert set(mirror.blocked([GPU, "amd.com/gpu"])["n0"]) == {GPU, "amd.com/gpu"}
    _reason, message = mirror.problem("n0", {GPU: 1}) or ("", "")
    assert "ns/raw (sets device-injector annotation devices.nri.io/pod)" in message


def test_a_shared_only_mirror_keeps_pods_of_shared_nodes_alone() -> None:
    changed: list[str] = []
    mirror = ForeignDevices(DEFAULT_ENV_TABLE, on_change=changed.append, shared_only=True)
    pods = [pod(f"p{i}", node="plain", limits={GPU: "1"}) for i in range(50)]
    for p in pods:
        mirror.observe(p)
    assert mirror.size() == 0 and mirror.blocked([GPU]) == {} and changed == []
    for p in pods:
        mirror.forget(p)
    assert mirror.size() == 0
    # The node is labelled shared: its pods are read again and kept.
    mirror.set_shared("plain", True, lambda: pods)
    assert mirror.size() == 50 and set(mirror.blocked([GPU])) == {"plain"}
    mirror.observe(pod("later", node="plain", limits={GPU: "1"}))
    mirror.observe(pod("elsewhere", node="other", limits={GPU: "1"}))
    assert mirror.size() == 51 and mirror.on("other") == []
    # The label goes: so do its pods, in one notification.
    changed.clear()
    mirror.set_shared("plain", False, lambda: pods)
    assert mirror.size() == 0 and mirror.blocked([GPU]) == {} and changed == ["plain"]


def test_a_mirror_of_every_node_ignores_shared_marks() -> None:
    mirror = ForeignDevices(DEFAULT_ENV_TABLE)
    mirror.observe(pod("p", node="any", limits={GPU: "1"}))
    mirror.set_shared("any", False, list)
    assert mirror.size() == 1 and mirror.counts_node("any")


def test_pending_groups_retry_only_for_changes_that_may_free_devices_on_a_shared_node() -> None:
    frees = foreign_frees(DEFAULT_ENV_TABLE, lambda node: node == "n0")
    rogue = pod("rogue", env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}])
    raw = pod(
        "raw",
        env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
        annotations={"devices.nri.io/pod": "- path: /dev/nvidia0"},
    )
    # Taking devices: a new pod, or a pod that starts using more.
    assert not frees.create(rogue)
    assert not frees.update(rogue, raw)
    assert not frees.update(
        {**rogue, "metadata": {**rogue["metadata"], "labels": {"a": "b"}}}, rogue
    )
    # Giving back: deleted, finished, or a use removed.
    assert frees.delete(rogue)
    assert frees.update(rogue, {**rogue, "status": {"phase": "Succeeded"}})
    assert frees.update(raw, rogue)
    # Not a foreign pod, or on a node that is not shared: nothing for Pending groups.
    assert not frees.delete(pod("plain"))
    assert not frees.delete(pod("away", node="n1", limits={GPU: "1"}))
    assert not frees.update(
        pod("away", node="n1", limits={GPU: "1"}),
        pod("away", node="n1", limits={GPU: "1"}, phase="Failed"),
    )

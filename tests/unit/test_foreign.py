"""Which pods use devices outside the books, and what placement and groups make of it."""

from __future__ import annotations

from typing import Any

import pytest

from api.constants import DEFAULT_ENV_TABLE
from controllers.foreign import ForeignDevices, device_use

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

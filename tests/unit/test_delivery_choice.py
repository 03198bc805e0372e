"""The delivery rule (``choose_delivery``) and the device-ID rule (``by_uuid``): which mode
a node's group pods get and why, and whether their devices are named by UUID or index;
and that the pod webhook's patch follows both."""

from __future__ import annotations

from typing import Any

import pytest

from tests import factories
from webhooks.delivery import (
    Delivery,
    DeliveryChoice,
    Denial,
    by_uuid,
    choose_delivery,
    ids_reason,
)
from webhooks.injection import Patch, apply_operations, build_injection

GPU = "nvidia.com/gpu"
NVIDIA = "NVIDIA_VISIBLE_DEVICES"
AMD = "AMD_VISIBLE_DEVICES"
ASCEND = "ASCEND_VISIBLE_DEVICES"
AUTO = Delivery()


def node(name: str = "n1", handlers: list[str] | None = None, **labels: str) -> dict[str, Any]:
    """A node; ``handlers`` its kubelet's status.runtimeHandlers; labels by key with
    ``_`` for ``/``: ``deviceshare_io_delivery="cdi"``."""
    keys = {"deviceshare_io_delivery": "deviceshare.io/delivery"}
    keys["deviceshare_io_default_runtime"] = "deviceshare.io/default-runtime"
    obj: dict[str, Any] = {
        "metadata": {"name": name, "labels": {keys[k]: v for k, v in labels.items()}},
        "status": {},
    }
    if handlers is not None:
        obj["status"]["runtimeHandlers"] = [
            {"name": h, "features": {"recursiveReadOnlyMounts": True}} for h in handlers
        ]
    return obj


def rc(name: str = "nvidia", handler: str = "nvidia") -> dict[str, dict[str, Any]]:
    return {name: {"metadata": {"name": name}, "handler": handler}}


def chosen(*args: Any, **kw: Any) -> DeliveryChoice:
    choice = choose_delivery(*args, **kw)
    assert isinstance(choice, DeliveryChoice), choice
    return choice


# --- the delivery rule -----------------------------------------------------------------------


def test_runtimeclass_where_it_exists_and_the_node_lists_its_handler() -> None:
    """k3s and the GPU Operator 25.10+: RuntimeClass nvidia, runc as the default runtime."""
    choice = chosen(node(handlers=["", "nvidia", "nvidia-cdi"]), rc(), AUTO)
    assert (choice.mode, choice.verified) == ("runtimeclass", True)
    assert choice.reason == (
        "RuntimeClass nvidia exists and node n1 lists its handler nvidia in status.runtimeHandlers"
    )
    # The configured RuntimeClass, by its own handler.
    gpu = Delivery(runtime_class_name="gpu")
    assert chosen(node(handlers=["nvidia-cdi"]), rc("gpu", "nvidia-cdi"), gpu).mode == (
        "runtimeclass"
    )
    assert not chosen(node(handlers=["nvidia-cdi"]), rc("nvidia", "nvidia-cdi"), gpu).verified


def test_a_runtimeclass_the_node_cannot_run_or_a_missing_one_is_not_chosen() -> None:
    choice = chosen(node(handlers=[""]), rc(), AUTO)
    assert (choice.mode, choice.verified) == ("env", False)
    assert (
        "RuntimeClass nvidia has handler nvidia, which node n1 does not list in "
        "status.runtimeHandlers (it lists '')"
    ) in choice.reason
    choice = chosen(node(handlers=["nvidia"]), {}, AUTO)
    assert (choice.mode, choice.verified) == ("env", False)
    assert "no RuntimeClass nvidia" in choice.reason
    # A kubelet that reports no handlers (older than 1.30, or a runtime that does not).
    assert not chosen(node(), rc(), AUTO).verified


def test_an_unlabelled_node_gets_env_unverified_naming_what_settles_it() -> None:
    choice = chosen(node(), {}, AUTO)
    assert (choice.mode, choice.verified) == ("env", False)
    assert choice.reason == (
        "nothing tells how node n1's runtime takes devices (no RuntimeClass nvidia; no label "
        "deviceshare.io/default-runtime; no label deviceshare.io/delivery), and "
        "NVIDIA_VISIBLE_DEVICES alone works only where the vendor's runtime is the node's "
        "default"
    )
    assert choice.settle == (
        "if NVIDIA's runtime is the node's default runtime, kubectl label node n1 "
        "deviceshare.io/default-runtime=nvidia; if its runtime has a handler for NVIDIA's, "
        "create RuntimeClass nvidia with that handler (as the GPU Operator and k3s do); or "
        "name the mode: kubectl label node n1 deviceshare.io/delivery=<env|runtimeclass|cdi>"
    )
    assert choice.describe().startswith("env, unverified: nothing tells how node n1's")
    # The node is not known at all: the same, unverified.
    assert not chosen(None, rc(), AUTO).verified


def test_the_default_runtime_label_verifies_env_for_its_vendor_only() -> None:
    labelled = node(deviceshare_io_default_runtime="nvidia")
    choice = chosen(labelled, {}, AUTO)
    assert (choice.mode, choice.verified) == ("env", True)
    assert choice.reason == (
        "node label deviceshare.io/default-runtime=nvidia: its default runtime reads "
        "NVIDIA_VISIBLE_DEVICES"
    )
    assert not chosen(labelled, {}, AUTO, [AMD]).verified
    assert chosen(node(deviceshare_io_default_runtime="ascend"), {}, AUTO, [ASCEND]).verified
    # RuntimeClass first: a node that has both runs the group's pods under it.
    both = node(handlers=["nvidia"], deviceshare_io_default_runtime="nvidia")
    assert chosen(both, rc(), AUTO).mode == "runtimeclass"


def test_the_delivery_label_overrides_everything_and_the_managers_mode_the_rest() -> None:
    k3s = ["nvidia"]
    choice = chosen(node(handlers=k3s, deviceshare_io_delivery="cdi"), rc(), AUTO)
    assert (choice.mode, choice.reason, choice.verified) == (
        "cdi",
        "node label deviceshare.io/delivery=cdi",
        True,
    )
    env = Delivery("env")
    assert chosen(node(handlers=k3s, deviceshare_io_delivery="cdi"), rc(), env).mode == "cdi"
    choice = chosen(node(handlers=k3s), rc(), env)
    assert (choice.mode, choice.reason, choice.verified) == (
        "env",
        "the manager's --delivery env",
        True,
    )


def test_an_unknown_delivery_label_is_denied() -> None:
    denial = choose_delivery(node(deviceshare_io_delivery="docker"), {}, AUTO, group_name="g")
    assert isinstance(denial, Denial)
    assert denial.message.endswith(
        "or remove it to let SDG choose from the node's runtime (--delivery auto)"
    )
    denial = choose_delivery(node(deviceshare_io_delivery="docker"), {}, Delivery("cdi"))
    assert isinstance(denial, Denial)
    assert denial.message.endswith("or remove it to use the manager's default (cdi)")


def test_amd_gets_no_nvidia_runtimeclass_and_is_told_to_label_the_node_cdi() -> None:
    """AMD's device plugin passes device nodes; amd-ctk configures docker only: nothing on
    a Kubernetes node reads AMD_VISIBLE_DEVICES, and NVIDIA's RuntimeClass does not."""
    choice = chosen(node(handlers=["nvidia"]), rc(), AUTO, [AMD])
    assert (choice.mode, choice.verified) == ("env", False)
    assert "RuntimeClass" not in choice.reason
    assert choice.settle.startswith(
        "label it for CDI where NRI's device-injector runs (kubectl label node n1 "
        "deviceshare.io/delivery=cdi; AMD's CDI names are amd.com/gpu=<N>"
    )
    assert choice.settle.endswith("kubectl label node n1 deviceshare.io/default-runtime=amd")
    # A group of NVIDIA and AMD devices: no single runtime takes both; unverified.
    assert not chosen(node(handlers=["nvidia"]), rc(), AUTO, [AMD, NVIDIA]).verified


# --- the device-ID rule ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("device_ids", "env_var", "known", "want"),
    [
        ("auto", NVIDIA, True, True),
        ("auto", NVIDIA, False, False),
        ("auto", AMD, True, False),  # amd.com/gpu=<N> only
        ("auto", ASCEND, True, False),
        ("index", NVIDIA, True, False),
        ("uuid", AMD, True, True),  # asked for: wherever known
        ("uuid", NVIDIA, False, False),
    ],
)
def test_by_uuid(device_ids: str, env_var: str, known: bool, want: bool) -> None:
    assert by_uuid(device_ids, env_var, known=known) is want


def test_ids_reason_says_when_indices_are_all_there_is() -> None:
    assert ids_reason("auto", NVIDIA, known=True) == "by UUID, from status.physicalDevices"
    assert ids_reason("auto", NVIDIA, known=False) == (
        "by index: the inventory knows no UUID for every one"
    )
    assert ids_reason("auto", AMD, known=True) == (
        "by index: the runtime reading AMD_VISIBLE_DEVICES (and its CDI names) takes indices"
    )
    assert ids_reason("index", NVIDIA, known=True) == "by index (--device-ids index)"


# --- what the webhook's patch does with both -------------------------------------------------


def group(devices: dict[str, str], uuids: dict[str, str] | None = None) -> dict[str, Any]:
    """Group g bound on n1 to ``devices`` (and their ``uuids``), asking for as many."""
    counts = {r: len(ids.split(",")) for r, ids in devices.items()}
    status = {"physicalDevices": uuids} if uuids else None
    return factories.group(uid="u1", resources=counts, node="n1", devices=devices, status=status)


def pod() -> dict[str, Any]:
    """Pod ns/p of group g as created, before our webhook: no scheduler set yet."""
    return factories.pod("p", "g", containers=("app",), image="cuda", scheduler=None, phase=None)


def admitted(g: dict[str, Any], **kw: Any) -> tuple[dict[str, Any], Patch]:
    result = build_injection(pod(), g, **kw)
    assert isinstance(result, Patch), result
    return apply_operations(pod(), result.operations), result


def test_pods_are_told_uuids_where_the_inventory_knows_them_else_ids() -> None:
    out, _ = admitted(group({GPU: "0,1"}, {GPU: "GPU-a,GPU-b"}), node=node())
    assert out["spec"]["containers"][0]["env"] == [{"name": NVIDIA, "value": "GPU-a,GPU-b"}]
    out, _ = admitted(group({GPU: "0,1"}), node=node())
    assert out["spec"]["containers"][0]["env"] == [
        {"name": NVIDIA, "value": "0,1"},
        {"name": "CUDA_DEVICE_ORDER", "value": "PCI_BUS_ID"},
    ]
    # Explicitly by index: the UUIDs are not used.
    out, _ = admitted(
        group({GPU: "0,1"}, {GPU: "GPU-a,GPU-b"}), node=node(), delivery=Delivery("env", "index")
    )
    assert out["spec"]["containers"][0]["env"][0] == {"name": NVIDIA, "value": "0,1"}


def test_amd_cdi_names_are_indices_even_with_uuids() -> None:
    g = group({"amd.com/gpu": "1"}, {"amd.com/gpu": "0x1234abcd"})
    out, result = admitted(g, node=node(deviceshare_io_delivery="cdi"))
    annotations = out["metadata"]["annotations"]
    assert annotations["cdi-devices.noderesource.dev/container.app"] == '["amd.com/gpu=1"]'
    assert result.delivery == DeliveryChoice("cdi", "node label deviceshare.io/delivery=cdi")


def test_the_patch_carries_the_choice_runtimeclass_on_a_node_that_runs_it() -> None:
    out, result = admitted(
        group({GPU: "0"}, {GPU: "GPU-a"}), node=node(handlers=["nvidia"]), runtime_classes=rc()
    )
    assert out["spec"]["runtimeClassName"] == "nvidia"
    assert out["spec"]["containers"][0]["env"] == [{"name": NVIDIA, "value": "GPU-a"}]
    assert result.delivery is not None and result.delivery.mode == "runtimeclass"
    _, result = admitted(group({GPU: "0"}), node=node())
    assert result.delivery is not None and not result.delivery.verified

"""Delivery that matches the node's runtime, against the real API server: by default
(``--delivery auto``) RuntimeClass ``nvidia`` where the node lists its handler, env with
one Warning Event on the group and a ``sdg doctor`` warning where nothing says how the
node's runtime takes devices; UUIDs where the inventory knows them, indices (which
``sdg explain`` calls guessed) where it only counts; env with CUDA_DEVICE_ORDER, a
RuntimeClass set by the manager's settings, CDI annotations chosen by a node label; and
the records they leave on a pod (``deviceshare.io/devices``, CDI annotations) cannot
change afterwards (config/policy)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from api.constants import SDG_KIND
from cli import main as cli
from controllers.inventory import annotation_key
from sdgruntime import errors
from sdgruntime.client import Client
from sdgruntime.envtest import ControlPlane
from sdgruntime.kinds import EVENTS, NODES, PODS
from tests.e2e.harness import (
    GPU,
    MANAGER_NS,
    add_node,
    env_of,
    eventually,
    group,
    pod,
    remove_webhooks,
    run_sdg,
    wait_bound,
)

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

DEVICES = "deviceshare.io/devices"
CDI = "cdi-devices.noderesource.dev/container."  # the device-injector's current family
OLD_CDI = "cdi-devices.nri.io/container."  # its deprecated one, still read
MEMBERSHIP = "ValidatingAdmissionPolicy 'deviceshare-group-membership'"
WEBHOOK = 'admission webhook "mpod.deviceshare.io" denied the request'


def annotations(p: dict[str, Any]) -> dict[str, str]:
    return p["metadata"].get("annotations") or {}


def annotate(key: str, value: str | None) -> dict[str, Any]:
    return {"metadata": {"annotations": {key: value}}}


async def refused(call: Any) -> str:
    """The API server's membership policy refused the request; its message."""
    with pytest.raises(errors.ApiError) as info:
        await call
    assert info.value.code == 403, info.value.message
    assert MEMBERSHIP in info.value.message, info.value.message
    return info.value.message


def sidecar_pod(name: str, group_name: str) -> dict[str, Any]:
    """Two containers, an init container and a native sidecar (restartPolicy Always)."""
    p = pod(name, group_name, containers=2)
    p["spec"]["initContainers"] = [
        {"name": "setup", "image": "busybox", "command": ["true"]},
        {"name": "proxy", "image": "busybox", "restartPolicy": "Always"},
    ]
    return p


def every_container(p: dict[str, Any]) -> list[dict[str, Any]]:
    return [*p["spec"].get("initContainers", []), *p["spec"]["containers"]]


@contextlib.asynccontextmanager
async def runtime_class(cp: ControlPlane, name: str) -> AsyncIterator[None]:
    """A RuntimeClass (as the GPU Operator creates ``nvidia``): pods naming a missing one
    are refused by the API server itself."""
    cp.apply(
        {
            "apiVersion": "node.k8s.io/v1",
            "kind": "RuntimeClass",
            "metadata": {"name": name},
            "handler": name,
        }
    )
    try:
        yield
    finally:
        cp.delete("node.k8s.io/v1", "RuntimeClass", name)


async def sdg_cli(capsys: pytest.CaptureFixture[str], kubeconfig: str, *args: str) -> str:
    """``sdg ARGS`` (in a worker thread: it starts its own event loop); its stdout."""
    argv = ["--kubeconfig", kubeconfig, "--claims-namespace", MANAGER_NS, *args]
    code = await anyio.to_thread.run_sync(cli.main, argv)
    out = capsys.readouterr()
    assert (code, out.err) == (0, "") or args[0] == "doctor", (code, out.err)
    return out.out


async def doctor_checks(
    capsys: pytest.CaptureFixture[str], kubeconfig: str
) -> dict[str, dict[str, Any]]:
    """``sdg doctor -o json``, by check name."""
    out = await sdg_cli(capsys, kubeconfig, "doctor", "-o", "json")
    return {c["name"]: c for c in json.loads(out)}


async def unverified_events(client: Client, group_name: str) -> list[dict[str, Any]]:
    """The DeliveryUnverified Warnings on this group (by UID: Events outlive the groups
    of earlier tests; cluster-scoped objects' Events are in namespace default)."""
    uid = (await client.get(SDG_KIND, group_name))["metadata"]["uid"]
    events, _ = await client.list_all(EVENTS, "default")
    return [
        e
        for e in events
        if e["involvedObject"].get("uid") == uid
        and e["involvedObject"].get("kind") == "SharedDeviceGroup"
        and e.get("reason") == "DeliveryUnverified"
        and e.get("type") == "Warning"
    ]


async def test_env_mode_pods_carry_cuda_order_and_a_devices_record_that_cannot_change(
    cluster: ControlPlane, client: Client, namespace: str
) -> None:
    await add_node(client, "n1", 4)
    async with run_sdg(cluster):
        await client.create(SDG_KIND, group("g", {GPU: 2}))
        await wait_bound(client, "g")
        created = await client.create(PODS, sidecar_pod("member", "g"), namespace)
        for c in every_container(created):
            assert env_of({"spec": {"containers": [c]}}) == {
                "NVIDIA_VISIBLE_DEVICES": "0,1",
                "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            }, c["name"]
        assert annotations(created)[DEVICES] == '{"nvidia.com/gpu":"0,1"}'
        assert not [k for k in annotations(created) if k.startswith("cdi-devices.")]
        assert "runtimeClassName" not in created["spec"]
        plain = await client.create(PODS, pod("plain", None), namespace)
        busy = pod("busy", "g")
        busy["metadata"]["annotations"].update({f"a.example.com/k{i}": "v" for i in range(500)})
        await client.create(PODS, busy, namespace)
    remove_webhooks(cluster)  # nothing of SDG left but the API server's policy

    for value, verb in (('{"nvidia.com/gpu":"2,3"}', "changed"), (None, "removed")):
        msg = await refused(client.patch(PODS, "member", annotate(DEVICES, value), namespace))
        assert (
            f"annotation deviceshare.io/devices of pod {namespace}/member records the devices "
            f'SDG gave it when it was created ({{"nvidia.com/gpu":"0,1"}}); it cannot be {verb} '
            "afterwards"
        ) in msg
        await refused(
            client.patch(PODS, "member", annotate(DEVICES, value), namespace, subresource="status")
        )
    msg = await refused(client.patch(PODS, "plain", annotate(DEVICES, '{"a.b/c":"0"}'), namespace))
    assert "it cannot be added afterwards" in msg
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": "plain", "annotations": {DEVICES: '{"nvidia.com/gpu":"0"}'}},
        "target": {"apiVersion": "v1", "kind": "Node", "name": "n1"},
    }
    msg = await refused(
        client.request("POST", f"/api/v1/namespaces/{namespace}/pods/plain/binding", json=binding)
    )
    assert "sets annotation deviceshare.io/devices" in msg
    # Other annotations still change, also among many (within the CEL cost budget); the
    # record is as the webhook wrote it.
    await client.patch(PODS, "member", annotate("team", "ml"), namespace)
    await client.patch(PODS, "busy", annotate("a.example.com/k7", "w"), namespace)
    await refused(
        client.patch(PODS, "busy", annotate(CDI + "c0", '["nvidia.com/gpu=all"]'), namespace)
    )
    assert annotations(await client.get(PODS, "member", namespace))[DEVICES] == (
        '{"nvidia.com/gpu":"0,1"}'
    )
    assert annotations(plain).get(DEVICES) is None


async def test_uuids_from_the_inventory_reach_the_env_and_the_record_keeps_ids(
    cluster: ControlPlane,
    client: Client,
    namespace: str,
    kubeconfig: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    node = await add_node(client, "n1", 3)
    node["metadata"].setdefault("annotations", {})[annotation_key(GPU)] = "GPU-a,GPU-b,GPU-c"
    await client.update(NODES, node)
    async with run_sdg(cluster):  # --device-ids auto: UUIDs where known
        await client.create(SDG_KIND, group("g", {GPU: 2}))
        g = await wait_bound(client, "g")
        assert g["status"]["physicalDevices"] == {GPU: "GPU-a,GPU-b"}
        created = await client.create(PODS, pod("member", "g"), namespace)
        # UUIDs carry no numbering to keep: no CUDA_DEVICE_ORDER.
        assert env_of(created) == {"NVIDIA_VISIBLE_DEVICES": "GPU-a,GPU-b"}
        assert annotations(created)[DEVICES] == '{"nvidia.com/gpu":"0,1"}'
        text = await sdg_cli(capsys, kubeconfig, "explain", "g")
    assert "Devices:       nvidia.com/gpu 0,1 (NVIDIA_VISIBLE_DEVICES=GPU-a,GPU-b)" in text
    assert "Told by:       nvidia.com/gpu by UUID, from status.physicalDevices" in text


async def test_a_count_only_inventory_tells_pods_indices_and_explain_says_guessed(
    cluster: ControlPlane,
    client: Client,
    namespace: str,
    kubeconfig: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    await add_node(client, "n1", 3)  # status.allocatable only: IDs 0..2, no UUIDs
    async with run_sdg(cluster):
        await client.create(SDG_KIND, group("g", {GPU: 2}))
        g = await wait_bound(client, "g")
        assert "physicalDevices" not in g["status"]
        created = await client.create(PODS, pod("member", "g"), namespace)
        assert env_of(created) == {
            "NVIDIA_VISIBLE_DEVICES": "0,1",
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        }
        text = await sdg_cli(capsys, kubeconfig, "explain", "g")
        facts = json.loads(await sdg_cli(capsys, kubeconfig, "explain", "g", "-o", "json"))
    assert (
        "Told by:       nvidia.com/gpu by index: the inventory knows no UUID for every one; "
        "counted in status.allocatable: IDs are guessed"
    ) in text
    assert facts["deviceNames"] == {
        GPU: {
            "names": ["0", "1"],
            "by": "index",
            "reason": facts["deviceNames"][GPU]["reason"],
            "guessed": True,
        }
    }


async def test_a_node_that_runs_runtimeclass_nvidia_gets_it_by_default(
    cluster: ControlPlane,
    client: Client,
    namespace: str,
    kubeconfig: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """k3s, the GPU Operator 25.10+: RuntimeClass nvidia, and a kubelet that lists the
    nvidia handler beside runc's default; no label. Group pods run under it."""
    await add_node(client, "n1", 2)
    await client.patch(
        NODES,
        "n1",
        {"status": {"runtimeHandlers": [{"name": ""}, {"name": "nvidia"}]}},
        subresource="status",
    )
    async with runtime_class(cluster, "nvidia"), run_sdg(cluster):
        await client.create(SDG_KIND, group("g", {GPU: 1}))
        await wait_bound(client, "g")
        created = await client.create(PODS, pod("member", "g"), namespace)
        assert created["spec"]["runtimeClassName"] == "nvidia"
        assert env_of(created) == {"NVIDIA_VISIBLE_DEVICES": "0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
        text = await sdg_cli(capsys, kubeconfig, "explain", "g")
        checks = await doctor_checks(capsys, kubeconfig)
        assert not await unverified_events(client, "g")
    reason = (
        "RuntimeClass nvidia exists and node n1 lists its handler nvidia in status.runtimeHandlers"
    )
    assert f"Delivery:      runtimeclass ({reason})" in text
    assert checks["node n1: delivery"]["status"] == "ok"
    assert checks["node n1: delivery"]["detail"] == f"runtimeclass ({reason})"
    assert (
        "delivery auto chooses it where the node lists handler nvidia"
        in (checks["RuntimeClass"]["detail"])
    )


async def test_an_unlabelled_node_gets_env_one_warning_on_the_group_and_a_doctor_warning(
    cluster: ControlPlane,
    client: Client,
    namespace: str,
    kubeconfig: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    await add_node(client, "n1", 2)
    async with run_sdg(cluster):
        await client.create(SDG_KIND, group("g", {GPU: 1}))
        await wait_bound(client, "g")
        for name in ("a", "b", "c"):
            created = await client.create(PODS, pod(name, "g"), namespace)
            assert "runtimeClassName" not in created["spec"]
            assert env_of(created)["NVIDIA_VISIBLE_DEVICES"] == "0"
        events = await eventually(lambda: unverified_events(client, "g"), what="the Warning")
        checks = await doctor_checks(capsys, kubeconfig)
        text = await sdg_cli(capsys, kubeconfig, "explain", "g")
        await anyio.sleep(1.0)  # the other pods' Events, were there any, are written by now
        events = await unverified_events(client, "g")
    (event,) = events
    assert event.get("count", 1) == 1, event
    assert event["message"].startswith(
        "pods get their devices by env, unverified: nothing tells how node n1's "
        "runtime takes devices (no RuntimeClass nvidia; no label "
        "deviceshare.io/default-runtime; no label deviceshare.io/delivery)"
    )
    assert "kubectl label node n1 deviceshare.io/default-runtime=nvidia" in event["message"]
    check = checks["node n1: delivery"]
    assert check["status"] == "warning"
    assert check["detail"].startswith("env, unverified: nothing tells how node n1's runtime")
    assert "kubectl label node n1 deviceshare.io/default-runtime=nvidia" in check["fix"]
    assert "create RuntimeClass nvidia" in check["fix"]
    assert "Delivery:      env, unverified: nothing tells how node n1's runtime" in text
    assert "To settle it:  if NVIDIA's runtime is the node's default runtime, kubectl" in text

    # Labelled as a user would once they know NVIDIA's runtime is the default: settled.
    node = await client.get(NODES, "n1")
    node["metadata"]["labels"]["deviceshare.io/default-runtime"] = "nvidia"
    await client.update(NODES, node)
    checks = await doctor_checks(capsys, kubeconfig)
    assert checks["node n1: delivery"] == {
        "name": "node n1: delivery",
        "status": "ok",
        "ok": True,
        "detail": "env (node label deviceshare.io/default-runtime=nvidia: its default runtime "
        "reads NVIDIA_VISIBLE_DEVICES)",
        "fix": "",
    }


async def test_a_node_labelled_cdi_gets_cdi_annotations_and_empty_env(
    cluster: ControlPlane, client: Client, namespace: str
) -> None:
    await add_node(client, "n1", 4, labels={"deviceshare.io/delivery": "cdi"})
    async with run_sdg(cluster):  # the manager's default is env: the label decides
        await client.create(SDG_KIND, group("g", {GPU: 2}))
        await wait_bound(client, "g")
        p = sidecar_pod("member", "g")
        p["metadata"]["annotations"].update(
            {
                "cdi-devices.nri.io/pod": '["nvidia.com/gpu=all"]',  # would reach kubectl debug
                CDI + "c0": '["nvidia.com/gpu=3"]',  # the group decides
                OLD_CDI + "c1": '["nvidia.com/gpu=all"]',  # deprecated, still owned
                "team": "ml",
            }
        )
        created = await client.create(PODS, p, namespace)
        names = '["nvidia.com/gpu=0","nvidia.com/gpu=1"]'
        assert annotations(created) == {
            "deviceshare.io/group": "g",
            "team": "ml",
            DEVICES: '{"nvidia.com/gpu":"0,1"}',
            # What the API server's policy checked the stored pod against.
            "deviceshare.io/delivered": "mode=cdi env:NVIDIA_VISIBLE_DEVICES= "
            f"off:AMD_VISIBLE_DEVICES off:ASCEND_VISIBLE_DEVICES "
            f"domain:amd.com domain:huawei.com domain:nvidia.com cdi:{CDI}={names}",
            CDI + "setup": names,
            CDI + "proxy": names,
            CDI + "c0": names,
            CDI + "c1": names,
        }
        for c in every_container(created):
            # Empty: no device for every vendor's runtime, and it overrides an image's
            # NVIDIA_VISIBLE_DEVICES=all. The API server stores it as the name alone.
            assert c["env"] == [
                {"name": "NVIDIA_VISIBLE_DEVICES"},
                {"name": "CUDA_DEVICE_ORDER", "value": "PCI_BUS_ID"},
            ], c["name"]

        # kubectl debug: the debug container gets it empty too (no annotation can name it).
        dbg = {"name": "dbg", "image": "nvidia/cuda", "command": ["sleep", "60"]}
        dbg["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
        member = await client.patch(
            PODS,
            "member",
            {"spec": {"ephemeralContainers": [dbg]}},
            namespace,
            patch_type="strategic",
            subresource="ephemeralcontainers",
        )
        (debugged,) = member["spec"]["ephemeralContainers"]
        assert debugged["env"][0] == {"name": "NVIDIA_VISIBLE_DEVICES"}

        # The CDI annotations cannot change afterwards, with the manager running or not.
        for key, value in (
            (CDI + "c0", '["nvidia.com/gpu=all"]'),
            (CDI + "c1", None),
            ("cdi-devices.noderesource.dev/pod", '["nvidia.com/gpu=all"]'),
            (CDI + "dbg", '["nvidia.com/gpu=all"]'),
            (OLD_CDI + "dbg", '["nvidia.com/gpu=all"]'),
        ):
            msg = await refused(client.patch(PODS, "member", annotate(key, value), namespace))
            assert (
                f"pod {namespace}/member of SharedDeviceGroup 'g' gets its devices when it is "
                f"created; its device-injector annotation {key} cannot be added, changed or "
                "removed"
            ) in msg
        # A pod outside any group keeps its annotations its own.
        plain = await client.create(PODS, pod("plain", None), namespace)
        await client.patch(PODS, "plain", annotate(CDI + "c0", '["vendor.com/x=0"]'), namespace)
        assert annotations(plain).get(DEVICES) is None


async def test_group_pods_own_every_device_injector_family(
    cluster: ControlPlane, client: Client, namespace: str
) -> None:
    """NRI's device-injector also reads raw device nodes (devices.*) and mounts (mounts.*):
    refused on a group pod at creation; its own CDI annotations are removed in env mode;
    none can be added later, nor through a Binding, with or without the manager."""
    await add_node(client, "n1", 4)
    async with run_sdg(cluster):  # env mode
        await client.create(SDG_KIND, group("g", {GPU: 2}))
        await wait_bound(client, "g")
        p = pod("member", "g")
        p["metadata"]["annotations"].update(
            {
                "cdi-devices.noderesource.dev/pod": '["nvidia.com/gpu=all"]',
                OLD_CDI + "c0": '["nvidia.com/gpu=all"]',
            }
        )
        created = await client.create(PODS, p, namespace)
        assert not [k for k in annotations(created) if k.startswith("cdi-devices.")]
        assert env_of(created)["NVIDIA_VISIBLE_DEVICES"] == "0,1"

        for key in ("devices.noderesource.dev/container.c0", "mounts.nri.io/pod"):
            raw = pod(f"raw-{len(key)}", "g")
            raw["metadata"]["annotations"][key] = (
                "- path: /dev/nvidia3\n  type: c\n  major: 195\n  minor: 3"
            )
            with pytest.raises(errors.ApiError) as info:
                await client.create(PODS, raw, namespace)
            assert WEBHOOK in info.value.message
            assert (
                f"annotation {key} asks NRI's device-injector for device nodes or mounts in "
                "the pod's containers: a pod of SharedDeviceGroup 'g' sees exactly the "
                "group's devices"
            ) in info.value.message
            assert f"Remove {key}" in info.value.message
        await client.create(PODS, pod("plain", None), namespace)
    remove_webhooks(cluster)  # nothing of SDG left but the API server's policy

    for key in (
        "devices.noderesource.dev/container.c0",
        "devices.nri.io",
        "mounts.noderesource.dev/pod",
        "mounts.nri.io/container.c0",
        "cdi-devices.noderesource.dev/container.c0",
    ):
        msg = await refused(client.patch(PODS, "member", annotate(key, "- path: /dev"), namespace))
        assert f"its device-injector annotation {key} cannot be added, changed or removed" in msg
        await refused(
            client.patch(PODS, "member", annotate(key, "[]"), namespace, subresource="status")
        )
    # Look-alikes stay the pod's own; a pod outside any group keeps its annotations its own.
    await client.patch(
        PODS, "member", annotate("devices.noderesource.dev.example/x", "y"), namespace
    )
    await client.patch(PODS, "plain", annotate("devices.nri.io/pod", "- path: /dev/x"), namespace)
    # A Binding cannot tell whether its pod is in a group: refused for every pod.
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": "plain", "annotations": {"mounts.noderesource.dev/pod": "- x"}},
        "target": {"apiVersion": "v1", "kind": "Node", "name": "n1"},
    }
    path = f"/api/v1/namespaces/{namespace}/pods/plain/binding"
    msg = await refused(client.request("POST", path, json=binding))
    assert (
        f"the Binding of pod {namespace}/plain sets device-injector annotation "
        "mounts.noderesource.dev/pod, which the API server copies onto the pod"
    ) in msg
    binding["metadata"]["annotations"] = {"scheduled-by": "me"}
    await client.request("POST", path, json=binding)
    assert (await client.get(PODS, "plain", namespace))["spec"]["nodeName"] == "n1"
    member = await client.get(PODS, "member", namespace)
    assert [k for k in annotations(member) if k.startswith(("devices.", "mounts.", "cdi-"))] == [
        "devices.noderesource.dev.example/x"
    ]


async def test_a_runtimeclass_manager_sets_it_and_refuses_another(
    cluster: ControlPlane, client: Client, namespace: str
) -> None:
    await add_node(client, "n1", 2)
    async with (
        runtime_class(cluster, "nvidia"),
        runtime_class(cluster, "kata"),  # a missing one the API server refuses itself
        run_sdg(cluster, delivery="runtimeclass"),
    ):
        await client.create(SDG_KIND, group("g", {GPU: 1}))
        await wait_bound(client, "g")
        created = await client.create(PODS, pod("member", "g"), namespace)
        assert created["spec"]["runtimeClassName"] == "nvidia"
        assert env_of(created) == {"NVIDIA_VISIBLE_DEVICES": "0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
        assert annotations(created)[DEVICES] == '{"nvidia.com/gpu":"0"}'
        named = pod("named", "g", runtimeClassName="nvidia")
        assert (await client.create(PODS, named, namespace))["spec"]["runtimeClassName"] == (
            "nvidia"
        )

        with pytest.raises(errors.ApiError) as info:
            await client.create(PODS, pod("kata", "g", runtimeClassName="kata"), namespace)
        assert WEBHOOK in info.value.message
        assert (
            "pod sets runtimeClassName kata, but SharedDeviceGroup 'g' gets its devices on its "
            "node through RuntimeClass nvidia (delivery runtimeclass)"
        ) in info.value.message
        assert "Remove spec.runtimeClassName (SDG sets it) or set it to nvidia" in (
            info.value.message
        )

        # A node labelled env takes the env only, whatever the manager's default.
        node = await client.get(NODES, "n1")
        node["metadata"]["labels"]["deviceshare.io/delivery"] = "env"
        await client.update(NODES, node)

        made: list[str] = []

        async def env_only() -> dict[str, Any] | None:
            made.append(f"env-{len(made)}")
            p = await client.create(PODS, pod(made[-1], "g"), namespace)
            return p if "runtimeClassName" not in p["spec"] else None

        p = await eventually(env_only, what="the node label read by the webhook")
        assert env_of(p)["NVIDIA_VISIBLE_DEVICES"] == "0"


async def test_an_unknown_delivery_label_is_refused_naming_the_node(
    cluster: ControlPlane, client: Client, namespace: str
) -> None:
    await add_node(client, "n1", 1, labels={"deviceshare.io/delivery": "docker"})
    async with run_sdg(cluster):
        await client.create(SDG_KIND, group("g", {GPU: 1}))
        await wait_bound(client, "g")
        with pytest.raises(errors.ApiError) as info:
            await client.create(PODS, pod("member", "g"), namespace)
        assert WEBHOOK in info.value.message
        assert (
            "node n1 of SharedDeviceGroup 'g' has label deviceshare.io/delivery='docker', "
            "which is not a delivery mode SDG knows (env, runtimeclass, cdi)"
        ) in info.value.message

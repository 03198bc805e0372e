"""Ownership against every client: a pod's group is fixed once admitted (the API server's
own policy, with or without our manager), kubectl debug containers see only the group's
devices, group pods tolerate the shared-node taint, a disputed group takes no new pods,
and the API server itself keeps injected env from changing."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from api.constants import SDG_KIND
from sdgruntime import errors
from sdgruntime.client import Client
from sdgruntime.envtest import ControlPlane
from sdgruntime.kinds import PODS
from tests.e2e.harness import (
    GPU,
    add_node,
    bound_group_with_a_rogue_pod,
    devices_conflict,
    env_of,
    eventually,
    group,
    kubelet,
    pod,
    remove_webhooks,
    run_sdg,
    wait_bound,
)

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

KUBECTL = Path(sys.executable).parent / "kubectl"
KEY = "deviceshare.io/group"
MEMBERSHIP = "ValidatingAdmissionPolicy 'deviceshare-group-membership'"
EPHEMERAL = "ValidatingAdmissionPolicy 'deviceshare-ephemeral-container-devices'"
#: No effect: tolerates the shared taint with NoSchedule and NoExecute alike.
TOLERATION = {"key": "deviceshare.io/mode", "operator": "Equal", "value": "shared"}
#: Injected beside index-named NVIDIA GPUs, so CUDA numbers them as nvidia-smi does.
ORDER = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


async def refused(call: Any, policy: str = MEMBERSHIP) -> str:
    """The API server's policy refused the request (403 Forbidden); its message."""
    with pytest.raises(errors.ApiError) as info:
        await call
    assert info.value.code == 403, info.value.message
    assert policy in info.value.message, info.value.message
    return info.value.message


async def running(client: Client, name: str, namespace: str) -> dict[str, Any]:
    async def is_running() -> dict[str, Any] | None:
        p = await client.get(PODS, name, namespace)
        return p if (p.get("status") or {}).get("phase") == "Running" else None

    return await eventually(is_running, what=f"pod {name} Running")


def annotate(group_name: str | None) -> dict[str, Any]:
    return {"metadata": {"annotations": {KEY: group_name}}}


async def kubectl(cp: ControlPlane, *args: str) -> tuple[int, str]:
    """Run kubectl without blocking the event loop, which serves our webhooks; (rc, stderr)."""
    with anyio.fail_after(60):
        done = await anyio.run_process(
            [str(KUBECTL), "--kubeconfig", str(cp.kubeconfig_path), *args], check=False
        )
    return done.returncode, done.stderr.decode()


@pytest.mark.parametrize("manager", ["running", "stopped"])
async def test_a_pods_group_cannot_be_removed_switched_or_added(
    cluster: ControlPlane, client: Client, namespace: str, manager: str
) -> None:
    await add_node(client, "n1", 2)
    async with kubelet(client), contextlib.AsyncExitStack() as sdg:
        await sdg.enter_async_context(run_sdg(cluster))
        for name in ("a", "b"):
            await client.create(SDG_KIND, group(name, {GPU: 1}))
            await wait_bound(client, name)
        await client.create(PODS, pod("member-running", "a"), namespace)
        # No node matches its selector, so the pod scheduler leaves it Pending.
        await client.create(
            PODS, pod("member-pending", "a", nodeSelector={"zone": "nowhere"}), namespace
        )
        await client.create(PODS, pod("plain-running", None, nodeName="n1"), namespace)
        await client.create(PODS, pod("plain-pending", None), namespace)
        await running(client, "member-running", namespace)
        await running(client, "plain-running", namespace)
        if manager == "stopped":
            await sdg.aclose()
            remove_webhooks(cluster)  # nothing of SDG left but the API server's policy

        for name in ("member-running", "member-pending"):
            msg = await refused(client.patch(PODS, name, annotate(None), namespace))
            assert (
                f"pod {namespace}/{name} was admitted into SharedDeviceGroup 'a' and uses its "
                "devices; annotation deviceshare.io/group cannot be removed afterwards. Delete "
                "the pod and create it again without the annotation "
                f"(kubectl delete pod {name} -n {namespace})."
            ) in msg
            msg = await refused(client.patch(PODS, name, annotate("b"), namespace))
            assert "annotation deviceshare.io/group cannot be changed to 'b' afterwards" in msg
            assert "create it again with deviceshare.io/group: b" in msg
            # pods/status takes metadata changes too; the policy covers it.
            await refused(client.patch(PODS, name, annotate(None), namespace, subresource="status"))
        for name in ("plain-running", "plain-pending"):
            msg = await refused(client.patch(PODS, name, annotate("a"), namespace))
            assert (
                f"pod {namespace}/{name} was created outside any SharedDeviceGroup; annotation "
                "deviceshare.io/group cannot be added afterwards"
            ) in msg
            assert "create it again with deviceshare.io/group: a." in msg
            await refused(client.patch(PODS, name, annotate("a"), namespace, subresource="status"))
        # A Binding copies its annotations onto the pod: it cannot carry the group's.
        for name in ("member-pending", "plain-pending"):
            binding = {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {"name": name, "annotations": {KEY: "b"}},
                "target": {"apiVersion": "v1", "kind": "Node", "name": "n1"},
            }
            msg = await refused(
                client.request(
                    "POST", f"/api/v1/namespaces/{namespace}/pods/{name}/binding", json=binding
                )
            )
            assert "the Binding of pod" in msg and "Bind without that annotation" in msg

        for name, want in [
            ("member-running", "a"),
            ("member-pending", "a"),
            ("plain-running", None),
            ("plain-pending", None),
        ]:
            p = await client.get(PODS, name, namespace)
            assert (p["metadata"].get("annotations") or {}).get(KEY) == want
            assert not (name == "member-pending" and p["spec"].get("nodeName"))
        # Everything else about the pods still changes as before: other annotations, and
        # status (the kubelet's writes skip the policy).
        await client.patch(
            PODS, "member-running", {"metadata": {"annotations": {"x": "y"}}}, namespace
        )
        await client.patch(
            PODS,
            "member-running",
            {"status": {"conditions": [{"type": "Ready", "status": "True"}]}},
            namespace,
            patch_type="strategic",
            subresource="status",
        )


async def test_victim_and_thief_no_longer_share_a_gpu(
    cluster: ControlPlane, client: Client, namespace: str
) -> None:
    """The two kubectl commands of the ownership issue: the first one is now refused."""
    await add_node(client, "n1", 1)
    async with run_sdg(cluster), kubelet(client):
        await client.create(SDG_KIND, group("victim", {GPU: 1}))
        await wait_bound(client, "victim")
        await client.create(PODS, pod("victim-pod", "victim"), namespace)
        await running(client, "victim-pod", namespace)

        rc, err = await kubectl(
            cluster, "annotate", "pod", "victim-pod", "-n", namespace, f"{KEY}-"
        )
        assert rc != 0
        assert MEMBERSHIP in err and "cannot be removed" in err
        # The group still sees its pod, so the delete guard still holds.
        rc, err = await kubectl(cluster, "delete", "sdg", "victim", "--wait=false")
        assert rc != 0
        assert f"in use by 1 active pod(s): {namespace}/victim-pod" in err

        await client.create(SDG_KIND, group("thief", {GPU: 1}))

        async def judged() -> dict[str, Any] | None:
            g = await client.get(SDG_KIND, "thief")
            return g if (g.get("status") or {}).get("conditions") else None

        thief = await eventually(judged, what="thief judged")
        assert thief["status"]["phase"] == "Pending"
        victim = await client.get(SDG_KIND, "victim")
        assert victim["status"]["selectedDevices"] == {GPU: "0"}
        assert env_of(await client.get(PODS, "victim-pod", namespace)) == {
            "NVIDIA_VISIBLE_DEVICES": "0",
            **ORDER,
        }


def debugger(name: str, env: list[dict[str, str]] | None = None) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "image": "nvidia/cuda", "command": ["sleep", "60"]}
    if env is not None:
        c["env"] = env
    return c


async def add_ephemeral(
    client: Client, name: str, namespace: str, container: dict[str, Any]
) -> dict[str, Any]:
    """What kubectl debug sends: a strategic merge patch of pods/ephemeralcontainers."""
    return await client.patch(
        PODS,
        name,
        {"spec": {"ephemeralContainers": [container]}},
        namespace,
        patch_type="strategic",
        subresource="ephemeralcontainers",
    )


def ephemeral_env(p: dict[str, Any], name: str) -> dict[str, str]:
    (c,) = [c for c in p["spec"]["ephemeralContainers"] if c["name"] == name]
    return {e["name"]: e.get("value", "") for e in c.get("env") or []}


async def test_debug_containers_of_group_pods_get_the_groups_devices(
    cluster: ControlPlane, client: Client, namespace: str
) -> None:
    await add_node(client, "n1", 4)
    async with run_sdg(cluster), kubelet(client):
        await client.create(SDG_KIND, group("g", {GPU: 2}))
        await wait_bound(client, "g")
        await client.create(PODS, pod("member", "g"), namespace)
        await client.create(PODS, pod("plain", None, nodeName="n1"), namespace)
        await running(client, "member", namespace)

        rc, err = await kubectl(
            cluster, "debug", "member", "-n", namespace, "--image=nvidia/cuda", "--container=dbg"
        )
        assert rc == 0, err
        member = await client.get(PODS, "member", namespace)
        assert ephemeral_env(member, "dbg") == {"NVIDIA_VISIBLE_DEVICES": "0,1", **ORDER}

        # The value the image or the user asks for is replaced, like in the pod's containers.
        greedy = debugger("greedy", [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}])
        member = await add_ephemeral(client, "member", namespace, greedy)
        assert ephemeral_env(member, "greedy") == {"NVIDIA_VISIBLE_DEVICES": "0,1", **ORDER}
        assert ephemeral_env(member, "dbg") == {"NVIDIA_VISIBLE_DEVICES": "0,1", **ORDER}

        # A pod outside any group is none of SDG's business.
        plain = await add_ephemeral(client, "plain", namespace, debugger("dbg"))
        assert ephemeral_env(plain, "dbg") == {}


async def test_without_the_webhook_the_policy_demands_the_exact_device_env(
    cluster: ControlPlane, client: Client, namespace: str
) -> None:
    await add_node(client, "n1", 4)
    async with run_sdg(cluster):
        await client.create(SDG_KIND, group("g", {GPU: 2}))
        await wait_bound(client, "g")
        await client.create(PODS, pod("member", "g"), namespace)
        busy = pod("busy", "g")
        busy["spec"]["containers"][0]["env"] = [{"name": f"V{i}", "value": "x"} for i in range(500)]
        await client.create(PODS, busy, namespace)
    remove_webhooks(cluster)
    await client.create(PODS, pod("plain", None), namespace)

    for env in (None, [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]):
        msg = await refused(
            add_ephemeral(client, "member", namespace, debugger("dbg", env)), EPHEMERAL
        )
        assert (
            f"ephemeral container 'dbg' of pod {namespace}/member (SharedDeviceGroup 'g') must "
            "set exactly the device env of the pod's containers"
        ) in msg
        assert "NVIDIA_VISIBLE_DEVICES=0,1, no other *_VISIBLE_DEVICES" in msg
        assert (
            f"kubectl debug -it member -n {namespace} --image=IMAGE "
            "--env=NVIDIA_VISIBLE_DEVICES=0,1"
        ) in msg
    extra = [
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "0,1"},
        {"name": "AMD_VISIBLE_DEVICES", "value": "all"},
    ]
    await refused(add_ephemeral(client, "member", namespace, debugger("dbg", extra)), EPHEMERAL)

    exact = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "0,1"}, {"name": "TERM", "value": "xterm"}]
    member = await add_ephemeral(client, "member", namespace, debugger("dbg", exact))
    assert ephemeral_env(member, "dbg") == {"NVIDIA_VISIBLE_DEVICES": "0,1", "TERM": "xterm"}
    # Ephemeral containers never change: the one admitted does not hold up the next.
    member = await add_ephemeral(client, "member", namespace, debugger("dbg2", exact[:1]))
    assert sorted(c["name"] for c in member["spec"]["ephemeralContainers"]) == ["dbg", "dbg2"]

    plain = await add_ephemeral(client, "plain", namespace, debugger("dbg"))
    assert ephemeral_env(plain, "dbg") == {}

    # Large envs stay within the API server's CEL cost budget.
    many = [{"name": f"W{i}", "value": "x"} for i in range(500)] + exact[:1]
    busy = await add_ephemeral(client, "busy", namespace, debugger("dbg", many))
    assert ephemeral_env(busy, "dbg")["NVIDIA_VISIBLE_DEVICES"] == "0,1"
    await refused(add_ephemeral(client, "busy", namespace, debugger("dbg2", many[:-1])), EPHEMERAL)


async def test_group_pods_tolerate_the_shared_taint_and_land_on_a_tainted_node(
    cluster: ControlPlane, client: Client, namespace: str
) -> None:
    taint = {"key": "deviceshare.io/mode", "value": "shared", "effect": "NoSchedule"}
    await add_node(client, "n1", 2, taints=[taint])
    async with run_sdg(cluster), kubelet(client):
        await client.create(SDG_KIND, group("g", {GPU: 1}))
        await wait_bound(client, "g")
        own = {"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}
        created = await client.create(PODS, pod("member", "g", tolerations=[own]), namespace)
        assert own in created["spec"]["tolerations"]
        assert created["spec"]["tolerations"].count(TOLERATION) == 1
        p = await running(client, "member", namespace)
        assert p["spec"]["nodeName"] == "n1"
        assert env_of(p)["NVIDIA_VISIBLE_DEVICES"] == "0"
        plain = await client.create(PODS, pod("plain", None), namespace)
        assert TOLERATION not in (plain["spec"].get("tolerations") or [])


async def test_injected_device_env_cannot_be_changed_by_a_pod_update(
    cluster: ControlPlane, client: Client, namespace: str
) -> None:
    """The API server's own pod validation: no policy of ours is involved."""
    await add_node(client, "n1", 2)
    async with run_sdg(cluster):
        await client.create(SDG_KIND, group("g", {GPU: 1}))
        await wait_bound(client, "g")
        created = await client.create(PODS, pod("member", "g"), namespace)
    remove_webhooks(cluster)
    assert env_of(created) == {"NVIDIA_VISIBLE_DEVICES": "0", **ORDER}
    for ops in (
        [{"op": "replace", "path": "/spec/containers/0/env/0/value", "value": "all"}],
        [{"op": "remove", "path": "/spec/containers/0/env/0"}],
        [
            {
                "op": "add",
                "path": "/spec/containers/0/env/-",
                "value": {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
            }
        ],
    ):
        with pytest.raises(errors.ApiError) as info:
            await client.patch(PODS, "member", ops, namespace, patch_type="json")
        assert info.value.code == 422
        assert "pod updates may not change fields other than" in info.value.message
    assert env_of(await client.get(PODS, "member", namespace)) == {
        "NVIDIA_VISIBLE_DEVICES": "0",
        **ORDER,
    }


async def test_a_group_with_a_devices_conflict_takes_no_new_pods(
    cluster: ControlPlane, client: Client, namespace: str
) -> None:
    held = await bound_group_with_a_rogue_pod(cluster, client, namespace)
    async with run_sdg(cluster):
        ready = await eventually(
            lambda: devices_conflict(client, "checked"), what="DevicesConflict"
        )
        with pytest.raises(errors.ApiError) as info:
            await client.create(PODS, pod("newcomer", "checked"), namespace)
        msg = info.value.message
        assert 'admission webhook "mpod.deviceshare.io" denied the request' in msg
        assert (
            "SharedDeviceGroup 'checked' takes no new pods while its devices are disputed: "
            "Ready=False, reason DevicesConflict: "
        ) in msg
        assert ready["message"].rstrip(".") in msg
        assert "Resolve that first (kubectl describe sdg checked)" in msg

        await client.delete(PODS, "rogue", namespace, grace_period_seconds=0)

        async def admitted() -> dict[str, Any] | None:
            with contextlib.suppress(errors.ApiError):
                return await client.create(PODS, pod("newcomer", "checked"), namespace)
            await anyio.sleep(0.2)
            return None

        created = await eventually(admitted, what="newcomer admitted once resolved")
        assert env_of(created)["NVIDIA_VISIBLE_DEVICES"] == held

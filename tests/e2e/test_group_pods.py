"""The API server checks a group pod as it is finally stored (config/policy/group_pods.yaml):
no way around the group's devices to the host's (privileged, SYS_ADMIN, hostPath under
/dev, hostPID, kubectl debug --profile=sysadmin) unless the group allows host access, and
no change to the delivered devices by a mutating webhook that runs after SDG's."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from api.constants import SDG_KIND
from sdgruntime import errors
from sdgruntime.client import Client
from sdgruntime.envtest import ControlPlane
from sdgruntime.envtest.controlplane import free_port
from sdgruntime.kinds import PODS
from sdgruntime.webhook import AdmissionRequest, AdmissionResponse, WebhookServer, patch_ops
from tests.e2e.harness import GPU, add_node, group, kubelet, pod, run_sdg, wait_bound
from tests.e2e.test_delivery import runtime_class
from tests.e2e.test_membership import add_ephemeral, debugger, kubectl, running

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

POLICY = "ValidatingAdmissionPolicy 'deviceshare-group-pods'"
HOST_ACCESS = "deviceshare.io/host-access"
DELIVERED = "deviceshare.io/delivered"


async def refused(call: Any, by: str = POLICY) -> str:
    """The request was refused (403) by ``by``; its message."""
    with pytest.raises(errors.ApiError) as info:
        await call
    assert info.value.code == 403, info.value.message
    assert by in info.value.message, info.value.message
    return info.value.message


def with_container(name: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "image": "busybox", "command": ["sleep", "3600"], **fields}


def host_access_cases() -> list[tuple[str, dict[str, Any], str]]:
    """(pod name, pod spec fields, what the refusal names and says to remove)."""
    return [
        (
            "privileged",
            {"containers": [with_container("app", securityContext={"privileged": True})]},
            "container 'app' is privileged (remove securityContext.privileged)",
        ),
        (
            "sysadmin",
            {
                "containers": [with_container("app")],
                "initContainers": [
                    with_container(
                        "setup", securityContext={"capabilities": {"add": ["NET_RAW", "SYS_ADMIN"]}}
                    )
                ],
            },
            "container 'setup' adds capability SYS_ADMIN (remove it from "
            "securityContext.capabilities.add)",
        ),
        (
            "all-caps",
            {
                "containers": [
                    with_container("app", securityContext={"capabilities": {"add": ["ALL"]}})
                ]
            },
            "container 'app' adds capability ALL",
        ),
        (
            "dev-gpu",
            {
                "containers": [with_container("app")],
                "volumes": [{"name": "gpu", "hostPath": {"path": "/dev/nvidia3"}}],
            },
            "volume 'gpu' is hostPath /dev/nvidia3 (remove the volume)",
        ),
        (
            "dev",
            {
                "containers": [with_container("app")],
                "volumes": [{"name": "devices", "hostPath": {"path": "/dev", "type": "Directory"}}],
            },
            "volume 'devices' is hostPath /dev (remove the volume)",
        ),
        (
            "host-pid",
            {"containers": [with_container("app")], "hostPID": True},
            "hostPID is true (remove spec.hostPID)",
        ),
    ]


def group_pod(name: str, group_name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": {"deviceshare.io/group": group_name}},
        "spec": spec,
    }


async def test_host_access_is_refused_unless_the_group_allows_it(
    cluster: ControlPlane, client: Client, namespace: str
) -> None:
    await add_node(client, "n1", 4)
    async with run_sdg(cluster), kubelet(client):
        await client.create(SDG_KIND, group("closed", {GPU: 1}))
        await client.create(SDG_KIND, group("open", {GPU: 1}, allowHostAccess=True))
        await wait_bound(client, "closed")
        await wait_bound(client, "open")

        for name, spec, what in host_access_cases():
            msg = await refused(client.create(PODS, group_pod(name, "closed", spec), namespace))
            assert (
                f"pod {namespace}/{name} of SharedDeviceGroup 'closed' would reach every device "
                f"of its node, not only the group's: {what}"
            ) in msg
            assert (
                "Remove it, or, to leave to yourself which devices the group's pods use, let the "
                "group allow host access: kubectl patch sdg closed --type=merge -p "
                """'{"spec":{"allowHostAccess":true}}' (pods created afterwards are admitted)."""
            ) in msg
            # A group that allows host access admits the same pod, stamped so.
            created = await client.create(PODS, group_pod(name, "open", spec), namespace)
            assert created["metadata"]["annotations"][HOST_ACCESS] == "allowed"
        # Several at once are named together.
        spec = {
            "containers": [with_container("app", securityContext={"privileged": True})],
            "hostPID": True,
        }
        msg = await refused(client.create(PODS, group_pod("both", "closed", spec), namespace))
        assert "is privileged (remove securityContext.privileged); hostPID is true" in msg
        assert ". Remove them, or" in msg
        # Look-alikes are not the host's devices.
        spec = {
            "containers": [with_container("app", securityContext={"privileged": False})],
            "volumes": [{"name": "d", "hostPath": {"path": "/devices"}}],
        }
        fine = await client.create(PODS, group_pod("lookalike", "closed", spec), namespace)
        assert HOST_ACCESS not in fine["metadata"]["annotations"]
        # A pod cannot stamp itself: SDG's webhook refuses it, saying what to remove.
        forged = group_pod("forged", "closed", host_access_cases()[0][1])
        forged["metadata"]["annotations"][HOST_ACCESS] = "allowed"
        msg = await refused(
            client.create(PODS, forged, namespace), 'admission webhook "mpod.deviceshare.io"'
        )
        assert "pod sets annotation deviceshare.io/host-access, which only SDG sets" in msg
        assert "SharedDeviceGroup 'closed' does not allow host access. Remove the annotation" in msg
        # Nor add the stamp later (the membership policy).
        msg = await refused(
            client.patch(
                PODS,
                "lookalike",
                {"metadata": {"annotations": {HOST_ACCESS: "allowed"}}},
                namespace,
            ),
            "ValidatingAdmissionPolicy 'deviceshare-group-membership'",
        )
        assert "annotation deviceshare.io/host-access of pod" in msg
        assert "cannot be added, changed or removed afterwards" in msg
        # Pods outside any group are not SDG's business.
        plain = {
            **group_pod("plain", "x", host_access_cases()[0][1]),
            "metadata": {"name": "plain"},
        }
        await client.create(PODS, plain, namespace)


async def test_kubectl_debug_sysadmin_is_refused_on_a_group_pod_that_has_no_host_access(
    cluster: ControlPlane, client: Client, namespace: str
) -> None:
    await add_node(client, "n1", 4)
    async with run_sdg(cluster), kubelet(client):
        await client.create(SDG_KIND, group("closed", {GPU: 1}))
        await client.create(SDG_KIND, group("open", {GPU: 1}, allowHostAccess=True))
        await wait_bound(client, "closed")
        await wait_bound(client, "open")
        await client.create(PODS, pod("member", "closed"), namespace)
        await client.create(PODS, pod("trusted", "open"), namespace)
        await running(client, "member", namespace)
        await running(client, "trusted", namespace)

        debug = ("debug", "-n", namespace, "--image=busybox", "--profile=sysadmin")
        rc, err = await kubectl(cluster, *debug, "member", "--container=dbg")
        assert rc != 0
        assert POLICY in err, err
        assert (
            f"pod {namespace}/member of SharedDeviceGroup 'closed' cannot get that ephemeral "
            "container: it would reach every device of its node, not only the group's: "
            "container 'dbg' is privileged (remove securityContext.privileged). Remove it "
            "(kubectl debug --profile=general instead of sysadmin)"
        ) in " ".join(err.split())
        member = await client.get(PODS, "member", namespace)
        assert not member["spec"].get("ephemeralContainers")
        # An unprivileged debug container is fine, and does not hold up the next check.
        rc, err = await kubectl(
            cluster, *debug[:-1], "--profile=general", "member", "--container=ok"
        )
        assert rc == 0, err
        await refused(
            add_ephemeral(
                client,
                "member",
                namespace,
                debugger("dbg2") | {"securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}},
            )
        )
        # A pod of a group that allows host access takes it.
        rc, err = await kubectl(cluster, *debug, "trusted", "--container=dbg")
        assert rc == 0, err
        trusted = await client.get(PODS, "trusted", namespace)
        (dbg,) = trusted["spec"]["ephemeralContainers"]
        assert dbg["securityContext"]["privileged"] is True


class LateWebhook:
    """A mutating webhook that runs after SDG's (and again after SDG's reinvocation): what
    the pod's annotation ``late.example.com/do`` asks for."""

    async def mutate(self, request: AdmissionRequest) -> AdmissionResponse:
        pod_obj = request.object or {}
        annotations = (pod_obj.get("metadata") or {}).get("annotations") or {}
        do = annotations.get("late.example.com/do")
        ops: list[dict[str, Any]] = []
        if do == "env":
            env = pod_obj["spec"]["containers"][0].get("env") or []
            for i, e in enumerate(env):
                if e.get("name") == "NVIDIA_VISIBLE_DEVICES" and e.get("value") != "all":
                    ops.append(
                        {
                            "op": "replace",
                            "path": f"/spec/containers/0/env/{i}/value",
                            "value": "all",
                        }
                    )
        elif do == "cdi" and "cdi-devices.noderesource.dev/pod" not in annotations:
            ops.append(
                {
                    "op": "add",
                    "path": "/metadata/annotations/cdi-devices.noderesource.dev~1pod",
                    "value": '["nvidia.com/gpu=all"]',
                }
            )
        elif do == "strip" and DELIVERED in annotations:
            ops.append({"op": "remove", "path": "/metadata/annotations/deviceshare.io~1delivered"})
        return patch_ops(ops)


@contextlib.asynccontextmanager
async def late_webhook(cp: ControlPlane, namespace: str) -> AsyncIterator[None]:
    port = free_port()
    server = WebhookServer("127.0.0.1", port, cp.webhook_cert_dir())
    server.register("/late", LateWebhook())
    config = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        # Configurations are called in name order: after deviceshare-mutating-...
        "metadata": {"name": "zz-late-gpu-webhook"},
        "webhooks": [
            {
                "name": "late.example.com",
                "admissionReviewVersions": ["v1"],
                "clientConfig": {"service": {"name": "late", "namespace": "x", "path": "/late"}},
                "rules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE"],
                        "resources": ["pods"],
                    }
                ],
                "failurePolicy": "Fail",
                "sideEffects": "None",
                "reinvocationPolicy": "IfNeeded",
            }
        ],
    }
    async with anyio.create_task_group() as tg:
        await tg.start(server.serve)
        with cp.webhooks([config], port, namespace):
            try:
                yield
            finally:
                tg.cancel_scope.cancel()


async def test_a_later_webhook_cannot_change_a_group_pods_devices_unseen(
    cluster: ControlPlane, client: Client, namespace: str
) -> None:
    await add_node(client, "n1", 4)
    async with run_sdg(cluster), late_webhook(cluster, namespace):
        await client.create(SDG_KIND, group("g", {GPU: 2}))
        await wait_bound(client, "g")

        def late(name: str, do: str) -> dict[str, Any]:
            p = pod(name, "g", containers=2)
            p["metadata"]["annotations"]["late.example.com/do"] = do
            return p

        msg = await refused(client.create(PODS, late("env", "env"), namespace))
        assert (
            f"pod {namespace}/env of SharedDeviceGroup 'g': container 'c0' does not carry "
            "exactly the device env SDG gave it (NVIDIA_VISIBLE_DEVICES=0,1; no device in "
            "AMD_VISIBLE_DEVICES, ASCEND_VISIBLE_DEVICES), as annotation "
            "deviceshare.io/delivered records"
        ) in msg
        assert "Stop that webhook from setting these variables" in msg
        msg = await refused(client.create(PODS, late("cdi", "cdi"), namespace))
        assert (
            f"pod {namespace}/cdi of SharedDeviceGroup 'g': device-injector annotation "
            "cdi-devices.noderesource.dev/pod is not what SDG's pod webhook gave it (none: its "
            "devices come by env"
        ) in msg
        msg = await refused(client.create(PODS, late("strip", "strip"), namespace))
        assert (
            f"pod {namespace}/strip of SharedDeviceGroup 'g' has annotation "
            "deviceshare.io/devices but not deviceshare.io/delivered"
        ) in msg
        # What the late webhook leaves alone is admitted as SDG stamped it.
        ok = await client.create(PODS, late("ok", "nothing"), namespace)
        assert ok["metadata"]["annotations"][DELIVERED] == (
            "mode=env env:NVIDIA_VISIBLE_DEVICES=0,1 off:AMD_VISIBLE_DEVICES "
            "off:ASCEND_VISIBLE_DEVICES domain:amd.com domain:huawei.com domain:nvidia.com"
        )
        for c in ok["spec"]["containers"]:
            assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "0,1"} in c["env"]


async def test_what_a_late_webhook_could_leave_is_refused_with_sdg_down(
    cluster: ControlPlane, client: Client, namespace: str
) -> None:
    """The API server alone (no SDG webhook, no manager): pods stamped as SDG stamps them,
    then changed as a later mutating webhook could."""
    stamp = (
        "mode=runtimeclass runtimeClassName=nvidia env:NVIDIA_VISIBLE_DEVICES=GPU-aaa "
        "off:AMD_VISIBLE_DEVICES domain:amd.com domain:nvidia.com"
    )

    def stamped(name: str, **container: Any) -> dict[str, Any]:
        env = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "GPU-aaa"}]
        p = group_pod(name, "g", {"containers": [with_container("app", env=env, **container)]})
        p["metadata"]["annotations"].update(
            {"deviceshare.io/devices": '{"nvidia.com/gpu":"0"}', DELIVERED: stamp}
        )
        p["spec"]["runtimeClassName"] = "nvidia"
        return p

    async with runtime_class(cluster, "nvidia"), runtime_class(cluster, "runc"):
        await judge_stamped(client, namespace, stamped)


async def judge_stamped(client: Client, namespace: str, stamped: Any) -> None:
    await client.create(PODS, stamped("as-stamped"), namespace)
    gpu = stamped("gpu", resources={"limits": {"nvidia.com/mig-1g.10gb": "1"}})
    msg = await refused(client.create(PODS, gpu, namespace))
    assert (
        f"pod {namespace}/gpu of SharedDeviceGroup 'g': container 'app' asks for devices (a "
        "resource of amd.com/*, nvidia.com/*, or a DRA claim) that SDG's pod webhook admitted "
        "it without"
    ) in msg
    other = stamped("other-runtime")
    other["spec"]["runtimeClassName"] = "runc"
    msg = await refused(client.create(PODS, other, namespace))
    assert (
        f"pod {namespace}/other-runtime of SharedDeviceGroup 'g' gets its devices through "
        "RuntimeClass nvidia, but spec.runtimeClassName is runc"
    ) in msg
    amd = stamped("amd")
    amd["spec"]["containers"][0]["env"].append({"name": "AMD_VISIBLE_DEVICES", "value": "all"})
    msg = await refused(client.create(PODS, amd, namespace))
    assert "container 'app' does not carry exactly the device env SDG gave it" in msg
    assert "no device in AMD_VISIBLE_DEVICES" in msg
    # A value that names no device is what SDG admits too; other variables are the pod's.
    quiet = stamped("quiet")
    quiet["spec"]["containers"][0]["env"] += [
        {"name": "AMD_VISIBLE_DEVICES", "value": "void"},
        {"name": "CUDA_VISIBLE_DEVICES", "value": "0"},
    ]
    await client.create(PODS, quiet, namespace)
    # From another source (valueFrom) the group's variable could say anything.
    indirect = stamped("indirect")
    indirect["spec"]["containers"][0]["env"] = [
        {
            "name": "NVIDIA_VISIBLE_DEVICES",
            "valueFrom": {"configMapKeyRef": {"name": "gpus", "key": "all"}},
        }
    ]
    await refused(client.create(PODS, indirect, namespace))

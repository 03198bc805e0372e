"""Every denial reaches the user with what to do; env names per vendor; group validation."""

from __future__ import annotations

import pytest

from api.constants import FINALIZER, SDG_KIND
from controllers.app import GROUP_WEBHOOK_PATH
from sdgruntime import errors, metrics
from sdgruntime.client import Client
from sdgruntime.envtest import ControlPlane
from sdgruntime.kinds import PODS
from tests.e2e.harness import GPU, add_node, env_of, eventually, group, pod, run_sdg, wait_bound

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


async def _denied(client: Client, namespace: str, obj: dict) -> str:
    with pytest.raises(errors.ApiError) as info:
        await client.create(PODS, obj, namespace)
    assert info.value.code in (400, 403)
    assert 'admission webhook "mpod.deviceshare.io" denied the request' in info.value.message
    return info.value.message


async def test_pod_denials_say_what_to_do(
    cluster: ControlPlane, client: Client, namespace: str
) -> None:
    await add_node(client, "n1", 1)
    async with run_sdg(cluster):
        msg = await _denied(client, namespace, pod("p1", "no-such-group"))
        assert "SharedDeviceGroup 'no-such-group' not found; create it first" in msg

        await client.create(SDG_KIND, group("too-big", {GPU: 4}))
        await eventually(
            lambda: client.get(SDG_KIND, "too-big"),
            what="group exists",
        )

        async def judged() -> bool:
            g = await client.get(SDG_KIND, "too-big")
            return bool((g.get("status") or {}).get("conditions"))

        await eventually(judged, what="too-big judged")
        msg = await _denied(client, namespace, pod("p2", "too-big"))
        assert "SharedDeviceGroup 'too-big' is Pending: 0/1 nodes are available" in msg
        assert "have 1 free nvidia.com/gpu (need 4)" in msg

        await client.create(SDG_KIND, group("ok", {GPU: 1}))
        await wait_bound(client, "ok")
        greedy = pod("p3", "ok")
        greedy["spec"]["containers"][0]["resources"] = {"limits": {GPU: "1"}}
        msg = await _denied(client, namespace, greedy)
        assert "nvidia.com/gpu" in msg and "device plugin" in msg

        msg = await _denied(
            client, namespace, pod("p4", None, schedulerName="deviceshare-scheduler")
        )
        assert "has no deviceshare.io/group annotation" in msg

        msg = await _denied(client, namespace, pod("p5", "Not_A_Name"))
        assert "is not a valid SharedDeviceGroup name" in msg

        # A pod that neither names a group nor our scheduler never reaches the webhook.
        plain = await client.create(PODS, pod("plain", None), namespace)
        assert "env" not in plain["spec"]["containers"][0]


async def test_a_group_still_binding_is_waited_for(
    cluster: ControlPlane, client: Client, namespace: str
) -> None:
    await add_node(client, "n1", 2)
    async with run_sdg(cluster):
        await client.create(SDG_KIND, group("fresh", {GPU: 2}))
        created = await client.create(PODS, pod("early", "fresh"), namespace)
        assert env_of(created)["NVIDIA_VISIBLE_DEVICES"] == "0,1"


async def test_vendor_env_names_and_user_values_replaced(
    cluster: ControlPlane, client: Client, namespace: str
) -> None:
    await add_node(client, "amd", 0, extra={"amd.com/gpu": 2, "huawei.com/Ascend910": 4})
    async with run_sdg(cluster):
        await client.create(SDG_KIND, group("mixed", {"amd.com/gpu": 1, "huawei.com/Ascend910": 2}))
        await wait_bound(client, "mixed")
        p = pod("vendor", "mixed")
        p["spec"]["initContainers"] = [{"name": "init", "image": "busybox"}]
        p["spec"]["containers"][0]["env"] = [
            {"name": "KEEP", "value": "me"},
            {"name": "AMD_VISIBLE_DEVICES", "value": "7"},
        ]
        created = await client.create(PODS, p, namespace)
        env = env_of(created)
        assert env["KEEP"] == "me"
        assert env["AMD_VISIBLE_DEVICES"] == "0"
        assert env["ASCEND_VISIBLE_DEVICES"] == "0,1"
        init_env = env_of(created, 0, "initContainers")
        assert init_env["AMD_VISIBLE_DEVICES"] == "0"
        assert init_env["ASCEND_VISIBLE_DEVICES"] == "0,1"


async def test_group_pods_asking_for_other_devices_are_refused_saying_why(
    cluster: ControlPlane, client: Client, namespace: str
) -> None:
    """Any device resource (another vendor's, an alias of NVIDIA's own), DRA claims, or
    another vendor's device variable: the pod would see devices beside its group's."""
    await add_node(client, "n1", 2, extra={"amd.com/gpu": 2})
    async with run_sdg(cluster):
        await client.create(SDG_KIND, group("g", {GPU: 1}))
        await wait_bound(client, "g")
        for res in ("amd.com/gpu", "nvidia.com/mig-1g.10gb", "nvidia.com/gpu.shared"):
            p = pod(f"wants-{res.replace('/', '-').replace('.', '-')}", "g")
            p["spec"]["containers"][0]["resources"] = {"limits": {res: "1"}}
            msg = await _denied(client, namespace, p)
            assert (
                f"container 'c0' requests {res} in resources.limits, a device resource: a "
                "pod of SharedDeviceGroup 'g' sees exactly the group's devices "
                "(nvidia.com/gpu)"
            ) in msg
            assert f"Remove the {res} limit and request, or run the pod outside the group" in msg

        claims = pod("claims", "g")
        claims["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "mine"}]
        msg = await _denied(client, namespace, claims)
        assert "pod asks for devices through spec.resourceClaims (gpu)" in msg
        assert "Remove spec.resourceClaims (and the containers' resources.claims)" in msg

        amd = pod("amd-env", "g")
        amd["spec"]["containers"][0]["env"] = [{"name": "AMD_VISIBLE_DEVICES", "value": "all"}]
        msg = await _denied(client, namespace, amd)
        assert (
            "container 'c0' sets AMD_VISIBLE_DEVICES=all, the device variable of amd.com/gpu, "
            "which SharedDeviceGroup 'g' does not hold"
        ) in msg
        assert (
            "Remove AMD_VISIBLE_DEVICES (SDG sets the group's own: NVIDIA_VISIBLE_DEVICES), "
            'or set it to ""'
        ) in msg

        # Saying "no device" for another vendor is fine, as is CUDA's own filter.
        quiet = pod("quiet", "g")
        quiet["spec"]["containers"][0]["env"] = [
            {"name": "AMD_VISIBLE_DEVICES", "value": "void"},
            {"name": "CUDA_VISIBLE_DEVICES", "value": "0"},
        ]
        created = await client.create(PODS, quiet, namespace)
        assert env_of(created)["NVIDIA_VISIBLE_DEVICES"] == "0"
        assert env_of(created)["AMD_VISIBLE_DEVICES"] == "void"


async def test_group_validation(cluster: ControlPlane, client: Client, namespace: str) -> None:
    await add_node(client, "n1", 4, labels={"zone": "a"})
    async with run_sdg(cluster):
        await client.create(SDG_KIND, group("fixed", {GPU: 1}, nodeSelector={"zone": "a"}))
        g = await wait_bound(client, "fixed")
        g["spec"]["resources"] = {GPU: 2}
        with pytest.raises(errors.ApiError) as info:
            await client.update(SDG_KIND, g)
        # The CRD's transition rule answers first; the webhook says the same for servers
        # whose CRD predates the rule.
        assert "cannot change once the group is Bound" in info.value.message
        assert "delete the group and create" in info.value.message.lower()
        with pytest.raises(errors.ApiError) as info:
            await client.patch(SDG_KIND, "fixed", {"spec": {"nodeSelector": {"zone": "b"}}})
        assert "cannot change once the group is Bound" in info.value.message
        g = await client.get(SDG_KIND, "fixed")
        assert g["spec"] == {
            "resources": {GPU: 1},
            "nodeSelector": {"zone": "a"},
            "schedulingStrategy": "binpack",
        }


async def test_delete_guard_lists_pods_and_finalizer_holds_without_webhook(
    cluster: ControlPlane, client: Client, namespace: str
) -> None:
    from tests.e2e.harness import kubelet, remove_webhooks

    await add_node(client, "n1", 2)
    async with run_sdg(cluster), kubelet(client):
        await client.create(SDG_KIND, group("busy", {GPU: 2}))
        await wait_bound(client, "busy")
        for i in range(6):
            await client.create(PODS, pod(f"user-{i}", "busy"), namespace)
        with pytest.raises(errors.ApiError) as info:
            await client.delete(SDG_KIND, "busy")
        msg = info.value.message
        assert "is in use by 6 active pod(s)" in msg
        assert f"{namespace}/user-0" in msg and "and 1 more" in msg
        assert "Delete those pods first" in msg

        remove_webhooks(cluster)
        await client.delete(SDG_KIND, "busy")  # no webhook: accepted, but held
        g = await client.get(SDG_KIND, "busy")
        assert g["metadata"]["deletionTimestamp"]
        assert "deviceshare.io/protection" in g["metadata"]["finalizers"]
        # A new group cannot take the devices while the old one is held.
        await client.create(SDG_KIND, group("next", {GPU: 2}))

        async def next_pending() -> bool:
            n = await client.get(SDG_KIND, "next")
            return bool((n.get("status") or {}).get("conditions"))

        await eventually(next_pending, what="next judged")
        assert (await client.get(SDG_KIND, "next"))["status"]["phase"] == "Pending"

        for i in range(6):
            await client.delete(PODS, f"user-{i}", namespace)

        async def gone() -> bool:
            try:
                await client.get(SDG_KIND, "busy")
            except errors.NotFound:
                return True
            return False

        await eventually(gone, what="group deleted after its pods")
        n = await wait_bound(client, "next")
        assert n["status"]["selectedDevices"] == {GPU: "0,1"}  # the devices were reused


def _group_reviews() -> float:
    """Group reviews the manager's webhook has answered (all codes), from its metrics."""
    return sum(
        sample.value
        for metric in metrics.WEBHOOK_REQUESTS.collect()
        for sample in metric.samples
        if sample.name.endswith("_total") and sample.labels["webhook"] == GROUP_WEBHOOK_PATH
    )


async def test_only_creates_deletes_and_spec_changes_reach_the_group_webhook(
    cluster: ControlPlane, client: Client
) -> None:
    """The manager's own finalizer write (and any label or annotation edit) is not sent
    to the group webhook; what it judges still is."""
    await add_node(client, "n1", 4)
    async with run_sdg(cluster):
        before = _group_reviews()
        await client.create(SDG_KIND, group("quiet", {GPU: 1}))
        reviewed = _group_reviews()  # answered before the create returned
        assert reviewed > before
        await wait_bound(client, "quiet")
        assert _group_reviews() == reviewed
        await client.patch(SDG_KIND, "quiet", {"metadata": {"labels": {"team": "a"}}})
        assert _group_reviews() == reviewed
        await client.patch(SDG_KIND, "quiet", {"spec": {"schedulingStrategy": "spread"}})
        assert _group_reviews() > reviewed
        reviewed = _group_reviews()
        await client.delete(SDG_KIND, "quiet")
        assert _group_reviews() > reviewed


async def test_a_group_is_protected_from_its_creation(
    cluster: ControlPlane, client: Client
) -> None:
    """The protection finalizer comes with the create (no write of the manager's own
    before it binds), next to any finalizer the user set."""
    await add_node(client, "n1", 4)
    async with run_sdg(cluster):
        created = await client.create(SDG_KIND, group("guarded", {GPU: 1}))
        assert created["metadata"]["finalizers"] == [FINALIZER]
        theirs = group("theirs", {GPU: 1})
        theirs["metadata"]["finalizers"] = ["example.com/keep"]
        created = await client.create(SDG_KIND, theirs)
        assert created["metadata"]["finalizers"] == ["example.com/keep", FINALIZER]
        bound = await wait_bound(client, "guarded")
        assert bound["metadata"]["finalizers"] == [FINALIZER]
    # With SDG down the group is created all the same; the manager adds the finalizer
    # before it binds it.
    created = await client.create(SDG_KIND, group("while-down", {GPU: 1}))
    assert not created["metadata"].get("finalizers")
    async with run_sdg(cluster):
        bound = await wait_bound(client, "while-down")
        assert bound["metadata"]["finalizers"] == [FINALIZER]

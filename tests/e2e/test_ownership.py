"""Ownership holds against every client: pods outside any group that use devices, decoy
and mislabelled records, groups recreated under the same name, recovery writes that fail
for one group, and conflicts that keep new pods out."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest

from api.constants import SDG_KIND
from controllers import metrics as sdg_metrics
from controllers.ledger.records import record_name
from sdgruntime import errors
from sdgruntime.client import Client
from sdgruntime.envtest import ControlPlane
from sdgruntime.kinds import CONFIGMAPS, EVENTS, PODS, Kind
from tests.e2e.harness import (
    GPU,
    MANAGER_NS,
    add_node,
    eventually,
    group,
    pod,
    run_sdg,
    wait_bound,
)

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

VAP = Kind(
    "admissionregistration.k8s.io",
    "v1",
    "ValidatingAdmissionPolicy",
    "validatingadmissionpolicies",
    namespaced=False,
)
VAP_BINDING = Kind(
    "admissionregistration.k8s.io",
    "v1",
    "ValidatingAdmissionPolicyBinding",
    "validatingadmissionpolicybindings",
    namespaced=False,
)


def condition(g: dict[str, Any], type_: str) -> dict[str, Any]:
    return next(
        (c for c in (g.get("status") or {}).get("conditions") or [] if c["type"] == type_), {}
    )


async def ready_reason(client: Client, name: str, reason: str) -> dict[str, Any] | None:
    g = await client.get(SDG_KIND, name)
    return g if condition(g, "Ready").get("reason") == reason else None


def foreign_pod(name: str, node: str, **container: Any) -> dict[str, Any]:
    """A pod outside any group, bound to ``node`` by hand (no scheduler involved)."""
    body = pod(name, None, nodeName=node)
    body["spec"]["containers"][0].update(container)
    return body


async def warnings_for(client: Client, namespace: str, pod_name: str) -> list[dict[str, Any]]:
    evs, _ = await client.list_all(EVENTS, namespace)
    return [
        e
        for e in evs
        if e["involvedObject"].get("name") == pod_name
        and e["type"] == "Warning"
        and e["reason"] == "ForeignDevicePod"
    ]


@pytest.mark.parametrize(
    "container",
    [
        {"env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]},
        {"resources": {"limits": {GPU: "1"}, "requests": {GPU: "1"}}},
    ],
    ids=["env-all", "device-plugin-limit"],
)
async def test_pods_outside_any_group_are_seen_and_placement_backs_off(
    cluster: ControlPlane, client: Client, namespace: str, container: dict[str, Any]
) -> None:
    await add_node(client, "shared-1", 8)
    async with run_sdg(cluster):
        await client.create(SDG_KIND, group("held", {GPU: 2}))
        await wait_bound(client, "held")
        await client.create(PODS, foreign_pod("rogue", "shared-1", **container), namespace)

        held = await eventually(
            lambda: ready_reason(client, "held", "ForeignDevicePods"), what="held flagged"
        )
        message = condition(held, "Ready")["message"]
        assert f"{namespace}/rogue" in message and "kubectl taint node shared-1" in message
        assert condition(held, "Ready")["status"] == "False"
        events = await eventually(
            lambda: warnings_for(client, namespace, "rogue"), what="Warning on the pod"
        )
        assert "shared node shared-1 without a SharedDeviceGroup" in events[0]["message"]
        assert sdg_metrics.FOREIGN_DEVICE_PODS.labels("shared-1")._value.get() == 1

        # No new group of that resource is placed there while the pod runs (6 GPUs free).
        await client.create(SDG_KIND, group("next", {GPU: 1}))

        async def judged() -> dict[str, Any] | None:
            g = await client.get(SDG_KIND, "next")
            return g if condition(g, "Scheduled") else None

        nxt = await eventually(judged, what="next judged")
        assert nxt["status"]["phase"] == "Pending"
        assert (
            f"have {GPU} in use by pods outside any group" in condition(nxt, "Scheduled")["message"]
        )

        # The pod goes: the flag clears and the Pending group binds.
        await client.delete(PODS, "rogue", namespace, grace_period_seconds=0)
        await eventually(lambda: ready_reason(client, "held", "Ready"), what="held Ready again")
        bound = await wait_bound(client, "next")
        assert bound["status"]["selectedDevices"] == {GPU: "2"}
        assert ("shared-1",) not in {
            tuple(s.labels.values())
            for m in sdg_metrics.FOREIGN_DEVICE_PODS.collect()
            for s in m.samples
        }


async def test_device_env_that_shows_no_device_is_not_foreign(
    cluster: ControlPlane, client: Client, namespace: str
) -> None:
    await add_node(client, "shared-1", 2)
    async with run_sdg(cluster):
        env = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]
        await client.create(PODS, foreign_pod("harmless", "shared-1", env=env), namespace)
        await client.create(SDG_KIND, group("g", {GPU: 2}))
        g = await wait_bound(client, "g")
        assert g["status"]["nodeName"] == "shared-1"


async def _labelled_record(client: Client, name: str, node: str, claims: str = "{}") -> None:
    await client.create(
        CONFIGMAPS,
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": name,
                "namespace": MANAGER_NS,
                "labels": {"deviceshare.io/claims": "node"},
            },
            "data": {"node": node, "claims": claims},
        },
        MANAGER_NS,
    )


@pytest.mark.parametrize(
    ("cm_name", "names_node"),
    [("decoy", "n0"), (record_name("n0"), "elsewhere")],
    ids=["labelled-decoy", "record-naming-another-node"],
)
async def test_a_record_whose_name_and_contents_disagree_blocks_never_fences(
    cluster: ControlPlane, client: Client, cm_name: str, names_node: str
) -> None:
    await add_node(client, "n0", 4, labels={"spare": "no"})
    await add_node(client, "n1", 1, labels={"spare": "yes"})
    async with run_sdg(cluster):
        await client.create(SDG_KIND, group("first", {GPU: 1}, nodeSelector={"spare": "yes"}))
        await wait_bound(client, "first")
        await client.create(SDG_KIND, group("resident", {GPU: 1}, nodeSelector={"spare": "no"}))
        await wait_bound(client, "resident")
        # A decoy that says n0 is empty (or n0's real record edited to describe another node).
        try:
            record = await client.get(CONFIGMAPS, cm_name, MANAGER_NS)
        except errors.NotFound:
            await _labelled_record(client, cm_name, names_node)
        else:
            record["data"]["node"] = names_node
            await client.update(CONFIGMAPS, record)
        await client.create(SDG_KIND, group("second", {GPU: 1}))

        async def judged() -> dict[str, Any] | None:
            g = await client.get(SDG_KIND, "second")
            return g if condition(g, "Scheduled") else None

        second = await eventually(judged, what="second judged")
        assert second["status"]["phase"] == "Pending"  # n0 blocked, n1 full
        assert "1 have a malformed claim record" in condition(second, "Scheduled")["message"]
        # The group already on n0 keeps its devices and is told why nothing more goes there.
        resident = await eventually(
            lambda: ready_reason(client, "resident", "ClaimRecordMalformed"), what="told"
        )
        assert f"{MANAGER_NS}/{cm_name}" in condition(resident, "Ready")["message"]
        # Removing the bad object lifts the block.
        await client.delete(CONFIGMAPS, cm_name, MANAGER_NS)
        g = await wait_bound(client, "second")
        assert g["status"]["nodeName"] == "n0"
        await eventually(lambda: ready_reason(client, "resident", "Ready"), what="resident Ready")


async def test_group_recreated_under_the_same_name_never_inherits_the_old_claim(
    cluster: ControlPlane, client: Client
) -> None:
    await add_node(client, "small", 1, labels={"size": "small"})
    await add_node(client, "big", 4, labels={"size": "big"})
    # A half-finished bind of an earlier group "g" (its UID recorded) on node small: the
    # claim landed, the group was deleted before its status was written.
    await _labelled_record(
        client,
        record_name("small"),
        "small",
        claims=json.dumps({"g": {GPU: "0"}}, separators=(",", ":")),
    )
    cm = await client.get(CONFIGMAPS, record_name("small"), MANAGER_NS)
    cm["data"]["uids"] = json.dumps({"g": "uid-of-an-earlier-g"})
    await client.update(CONFIGMAPS, cm)
    # The new "g" has the same request but wants another node.
    await client.create(SDG_KIND, group("g", {GPU: 1}, nodeSelector={"size": "big"}))
    async with run_sdg(cluster):
        g = await wait_bound(client, "g")
        assert g["status"]["nodeName"] == "big"

        async def released() -> bool:
            record = await client.get(CONFIGMAPS, record_name("small"), MANAGER_NS)
            return json.loads(record["data"]["claims"]) == {}

        await eventually(released, what="the earlier g's claim released")
        big = await client.get(CONFIGMAPS, record_name("big"), MANAGER_NS)
        assert json.loads(big["data"]["uids"]) == {"g": g["metadata"]["uid"]}


async def test_a_claim_of_the_same_group_on_a_node_that_no_longer_fits_is_not_adopted(
    cluster: ControlPlane, client: Client
) -> None:
    await add_node(client, "old", 2, labels={"zone": "a"})
    await add_node(client, "new", 2, labels={"zone": "b"})
    created = await client.create(SDG_KIND, group("g", {GPU: 1}, nodeSelector={"zone": "b"}))
    # The group's own interrupted bind on a node its (edited) selector no longer matches.
    await _labelled_record(client, record_name("old"), "old", claims='{"g":{"nvidia.com/gpu":"1"}}')
    cm = await client.get(CONFIGMAPS, record_name("old"), MANAGER_NS)
    cm["data"]["uids"] = json.dumps({"g": created["metadata"]["uid"]})
    await client.update(CONFIGMAPS, cm)
    async with run_sdg(cluster):
        g = await wait_bound(client, "g")
        assert g["status"]["nodeName"] == "new"


@contextlib.asynccontextmanager
async def deny_record_writes(client: Client, node: str):  # type: ignore[no-untyped-def]
    """An admission policy that refuses every write of ``node``'s claim record."""
    name = "test-deny-claim-record"
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": ["configmaps"],
                    }
                ]
            },
            "validations": [
                {
                    "expression": f"object.metadata.name != '{record_name(node)}'",
                    "message": "writes of this record are refused (test)",
                }
            ],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"]},
    }
    await client.create(VAP, policy)
    await client.create(VAP_BINDING, binding)
    try:
        # The API server applies policies from its informer: wait until it refuses.
        probe = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": record_name(node), "namespace": "default"},
        }

        async def refusing() -> bool:
            try:
                await client.create(CONFIGMAPS, probe, "default", dry_run=True)
            except errors.ApiError:
                return True
            return False

        await eventually(refusing, what="policy in force")
        yield
    finally:
        with contextlib.suppress(errors.NotFound):
            await client.delete(VAP_BINDING, name)
        with contextlib.suppress(errors.NotFound):
            await client.delete(VAP, name)


async def test_recovery_write_failing_for_one_group_does_not_stall_the_others(
    cluster: ControlPlane, client: Client
) -> None:
    await add_node(client, "stuck", 2, labels={"n": "stuck"})
    await add_node(client, "fine", 2, labels={"n": "fine"})
    async with run_sdg(cluster):
        await client.create(SDG_KIND, group("a", {GPU: 2}, nodeSelector={"n": "stuck"}))
        await wait_bound(client, "a")
    # While the manager is down, a's record is lost and cannot be written back.
    await client.delete(CONFIGMAPS, record_name("stuck"), MANAGER_NS)
    async with deny_record_writes(client, "stuck"):
        await client.create(SDG_KIND, group("b", {GPU: 2}, nodeSelector={"n": "fine"}))
        async with run_sdg(cluster):
            await wait_bound(client, "b")  # placed although a's recovery fails
            a = await eventually(
                lambda: ready_reason(client, "a", "RecoveryFailed"), what="a reported"
            )
            assert "refused (test)" in condition(a, "Ready")["message"]
            assert a["status"]["phase"] == "Bound"  # its devices stay its own
        async with run_sdg(cluster):
            await eventually(
                lambda: ready_reason(client, "a", "RecoveryFailed"), what="still reported"
            )
    # The policy is gone: a's retry writes its record back and it is Ready again.
    async with run_sdg(cluster):
        await eventually(lambda: ready_reason(client, "a", "Ready"), what="a recovered", within=60)
        record = await client.get(CONFIGMAPS, record_name("stuck"), MANAGER_NS)
        assert json.loads(record["data"]["claims"]) == {"a": {GPU: "0,1"}}


async def test_conflicted_group_gets_no_pod_bound(
    cluster: ControlPlane, client: Client, namespace: str
) -> None:
    await add_node(client, "shared-1", 4)
    async with run_sdg(cluster, webhooks=False):
        await client.create(SDG_KIND, group("g", {GPU: 1}))
        await wait_bound(client, "g")
        await client.create(
            PODS,
            foreign_pod(
                "rogue", "shared-1", env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
            ),
            namespace,
        )
        await eventually(lambda: ready_reason(client, "g", "ForeignDevicePods"), what="flagged")
        member = pod("member", "g", schedulerName="deviceshare-scheduler")
        member["spec"]["containers"][0]["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "0"}]
        await client.create(PODS, member, namespace)

        async def refused() -> str | None:
            p = await client.get(PODS, "member", namespace)
            for c in (p.get("status") or {}).get("conditions") or []:
                if c["type"] == "PodScheduled" and c["status"] == "False":
                    return str(c["message"])
            return None

        message = await eventually(refused, what="member refused")
        assert "is not Ready (ForeignDevicePods:" in message
        assert not (await client.get(PODS, "member", namespace))["spec"].get("nodeName")
        # Resolved: the pod is bound.
        await client.delete(PODS, "rogue", namespace, grace_period_seconds=0)

        async def bound() -> bool:
            p = await client.get(PODS, "member", namespace)
            return p["spec"].get("nodeName") == "shared-1"

        await eventually(bound, what="member bound once resolved", within=40)

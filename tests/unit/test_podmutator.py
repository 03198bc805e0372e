"""The pod webhook: its group and node lookups (cache first, the API server when the cache
cannot say), the delivery settings it is given, and which requests it judges."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from api.constants import SDG_KIND
from sdgruntime.cache import Cache
from sdgruntime.envtest import FakeClient, FakeRecorder
from sdgruntime.kinds import NODES, RUNTIMECLASSES, Kind
from sdgruntime.webhook import AdmissionRequest
from tests import factories
from tests.factories import GPU, as_client, running_cache, settle
from webhooks import podmutator
from webhooks.delivery import Delivery
from webhooks.podmutator import PodMutator

pytestmark = pytest.mark.anyio

BOUND = factories.group("g", {GPU: 1}, node="n1", devices={GPU: "0"})
#: Read names as the old fakes logged them: a group by name, others as Kind/name.
KINDS = {NODES.name: "Node", RUNTIMECLASSES.name: "RuntimeClass"}


def unsynced() -> Cache:
    """A cache that has not synced yet: every read raises CacheNotSynced."""
    return Cache(as_client(FakeClient()))


def live(*objects: tuple[Kind, dict[str, Any]]) -> FakeClient:
    """The API server, holding ``objects``, for the mutator's live reads."""
    return FakeClient(objects)


def gets(client: FakeClient) -> list[str]:
    """What was read from the API server, in order."""
    return [
        (a.name or "") if a.kind == SDG_KIND.name else f"{KINDS[a.kind]}/{a.name}"
        for a in client.actions
        if a.verb == "get"
    ]


class RecordingCache(Cache):
    """The manager's cache, recording each read (``gets``, named as :func:`gets`)."""

    def __init__(self, client: FakeClient) -> None:
        super().__init__(as_client(client))
        self.gets: list[str] = []

    def find(
        self, kind: Kind, name: str, namespace: str | None = None, *, copy: bool = True
    ) -> dict[str, Any] | None:  # get reads through find
        self.gets.append(name if kind == SDG_KIND else f"{kind.kind}/{name}")
        return super().find(kind, name, namespace, copy=copy)


@asynccontextmanager
async def cached(
    *objects: tuple[Kind, dict[str, Any]],
) -> AsyncIterator[tuple[RecordingCache, FakeClient]]:
    """A synced cache of groups, nodes and RuntimeClasses over an API server of its own
    holding ``objects`` (the informer's copy, apart from the live reads), and that server,
    where a test adds what the informer then delivers."""
    server = FakeClient(objects)
    async with running_cache(RecordingCache(server), SDG_KIND, NODES, RUNTIMECLASSES) as cache:
        yield cache, server


async def test_unsynced_cache_falls_back_to_a_live_get() -> None:
    client = live((SDG_KIND, BOUND))
    mutator = PodMutator(unsynced(), as_client(client), binding_wait=0)
    group = await mutator._group("g")
    assert group is not None and group["status"] == BOUND["status"]
    assert await mutator._group("missing") is None
    assert gets(client) == ["g", "missing"]


async def test_unsynced_cache_while_waiting_keeps_the_live_answer() -> None:
    binding = {"metadata": {"name": "g"}, "status": {}}  # not decided yet: the webhook waits
    mutator = PodMutator(unsynced(), as_client(live((SDG_KIND, binding))), binding_wait=0.1)
    group = await mutator._group("g")
    assert group is not None and group["status"] == {}


def review(
    operation: str,
    pod: dict[str, Any],
    old: dict[str, Any] | None = None,
    sub: str = "",
    dry_run: bool = False,
) -> AdmissionRequest:
    return AdmissionRequest.from_dict(
        {
            "uid": "u",
            "operation": operation,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "subResource": sub,
            "namespace": "ns",
            "name": "p",
            "object": pod,
            "oldObject": old,
            "dryRun": dry_run,
        }
    )


def group_pod(ephemeral: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [
            {"name": "app", "image": "x", "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "0"}]}
        ]
    }
    if ephemeral:
        spec["ephemeralContainers"] = ephemeral
    return {
        "metadata": {"name": "p", "namespace": "ns", "annotations": {"deviceshare.io/group": "g"}},
        "spec": spec,
    }


async def test_kubectl_debug_on_a_group_pod_gets_the_device_env() -> None:
    async with cached((SDG_KIND, BOUND)) as (cache, _):
        mutator = PodMutator(cache, as_client(live()))
        new = group_pod([{"name": "dbg", "image": "cuda"}])
        response = await mutator.mutate(review("UPDATE", new, group_pod(), "ephemeralcontainers"))
    assert response.allowed
    assert response.patch == [
        {
            "op": "add",
            "path": "/spec/ephemeralContainers/0/env",
            "value": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "0"}],
        }
    ]


async def test_other_pod_updates_are_not_judged_by_the_webhook() -> None:
    """Membership on UPDATE is the API server's policy (config/policy), not ours."""
    async with cached((SDG_KIND, BOUND)) as (cache, _):
        mutator = PodMutator(cache, as_client(live()))
        moved = group_pod()
        moved["metadata"]["annotations"]["deviceshare.io/group"] = "other"
        response = await mutator.mutate(review("UPDATE", moved, group_pod()))
        assert response.allowed and not response.patch
        response = await mutator.mutate(review("UPDATE", group_pod(), group_pod(), "status"))
        assert response.allowed and not response.patch
        plain = {"metadata": {"name": "p", "namespace": "ns"}, "spec": {"containers": []}}
        debugged = {**plain, "spec": {**plain["spec"], "ephemeralContainers": [{"name": "d"}]}}
        response = await mutator.mutate(review("UPDATE", debugged, plain, "ephemeralcontainers"))
        assert response.allowed and not response.patch
    assert cache.gets == []  # none of these needed the group


def labelled(name: str, mode: str | None) -> dict[str, Any]:
    labels = {"deviceshare.io/delivery": mode} if mode else {}
    return {"metadata": {"name": name, "labels": labels}}


def new_pod() -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "ns", "annotations": {"deviceshare.io/group": "g"}},
        "spec": {"containers": [{"name": "app", "image": "x"}]},
    }


def annotations_of(patch: list[dict[str, Any]] | None) -> dict[str, Any]:
    prefix = "/metadata/annotations/"
    return {
        op["path"][len(prefix) :]: op["value"]
        for op in patch or []
        if op["path"].startswith(prefix)
    }


async def test_the_groups_node_label_chooses_the_delivery() -> None:
    client = live()
    async with cached((SDG_KIND, BOUND), (NODES, labelled("n1", "cdi"))) as (cache, _):
        mutator = PodMutator(cache, as_client(client))
        response = await mutator.mutate(review("CREATE", new_pod()))
    assert response.allowed
    assert annotations_of(response.patch)["cdi-devices.noderesource.dev~1container.app"] == (
        '["nvidia.com/gpu=0"]'
    )
    # The group, its node and the RuntimeClass the choice looks for: all from the cache.
    assert cache.gets == ["g", "Node/n1", "RuntimeClass/nvidia"]
    assert gets(client) == []


async def test_a_group_pods_own_cdi_annotation_is_removed_with_a_warning() -> None:
    pod = new_pod()
    pod["metadata"]["annotations"]["cdi-devices.nri.io/pod"] = '["nvidia.com/gpu=all"]'
    async with cached((SDG_KIND, BOUND)) as (cache, _):
        mutator = PodMutator(cache, as_client(live()))
        response = await mutator.mutate(review("CREATE", pod))
    assert response.allowed
    assert {"op": "remove", "path": "/metadata/annotations/cdi-devices.nri.io~1pod"} in (
        response.patch or []
    )
    assert response.warnings and response.warnings[0].startswith(
        "SDG replaced or removed CDI device annotation cdi-devices.nri.io/pod"
    )


async def test_the_managers_delivery_settings_are_used_without_a_label() -> None:
    rc = Delivery("runtimeclass", runtime_class_name="gpu")
    async with cached((SDG_KIND, BOUND), (NODES, labelled("n1", None))) as (cache, _):
        mutator = PodMutator(cache, as_client(live()), delivery=rc)
        response = await mutator.mutate(review("CREATE", new_pod()))
    assert {"op": "add", "path": "/spec/runtimeClassName", "value": "gpu"} in (response.patch or [])
    assert annotations_of(response.patch) == {
        "deviceshare.io~1devices": '{"nvidia.com/gpu":"0"}',
        "deviceshare.io~1delivered": "mode=runtimeclass runtimeClassName=gpu "
        "env:NVIDIA_VISIBLE_DEVICES=0 off:AMD_VISIBLE_DEVICES off:ASCEND_VISIBLE_DEVICES"
        " domain:amd.com domain:huawei.com domain:nvidia.com",
    }


async def test_a_node_the_cache_has_not_seen_is_read_live_and_a_gone_one_is_none() -> None:
    client = live((NODES, labelled("n1", "bogus")))
    async with cached((SDG_KIND, BOUND)) as (cache, _):
        mutator = PodMutator(cache, as_client(client))
        response = await mutator.mutate(review("CREATE", new_pod()))
        assert not response.allowed
        assert "node n1 of SharedDeviceGroup 'g' has label deviceshare.io/delivery='bogus'" in (
            response.message
        )
        assert gets(client) == ["Node/n1"]
        # The node is gone: the manager's mode (the pod scheduler says the node is gone).
        mutator = PodMutator(cache, as_client(live()))
        response = await mutator.mutate(review("CREATE", new_pod()))
    assert response.allowed
    assert annotations_of(response.patch) == {
        "deviceshare.io~1devices": '{"nvidia.com/gpu":"0"}',
        "deviceshare.io~1delivered": "mode=env env:NVIDIA_VISIBLE_DEVICES=0 "
        "off:AMD_VISIBLE_DEVICES off:ASCEND_VISIBLE_DEVICES "
        "domain:amd.com domain:huawei.com domain:nvidia.com",
    }


async def test_a_debug_container_warning_reaches_the_response() -> None:
    pod = new_pod()
    pod["metadata"]["annotations"]["deviceshare.io/devices"] = '{"nvidia.com/gpu":"0"}'
    pod["spec"]["containers"][0]["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]
    new = {**pod, "spec": {**pod["spec"], "ephemeralContainers": [{"name": "dbg"}]}}
    async with cached((SDG_KIND, BOUND)) as (cache, _):
        mutator = PodMutator(cache, as_client(live()))
        response = await mutator.mutate(review("UPDATE", new, pod, "ephemeralcontainers"))
    assert response.allowed
    assert response.patch == [
        {
            "op": "add",
            "path": "/spec/ephemeralContainers/0/env",
            "value": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}],
        }
    ]
    assert (
        response.warnings
        and "sees none of SharedDeviceGroup 'g''s devices" in (response.warnings[0])
    )


@pytest.mark.parametrize("mode", ["env", "runtimeclass", "cdi"])
async def test_admission_never_edits_the_cached_group_or_node(mode: str) -> None:
    """The mutator reads cached objects without a copy: editing one would change the
    cache under every other reader."""
    async with cached((SDG_KIND, BOUND), (NODES, labelled("n1", mode))) as (cache, _):
        before = (cache.get(SDG_KIND, "g"), cache.get(NODES, "n1"))  # copies
        mutator = PodMutator(cache, as_client(live()))
        response = await mutator.mutate(review("CREATE", new_pod()))
        assert response.allowed and response.patch
        debug = new_pod()
        debug["spec"]["ephemeralContainers"] = [{"name": "dbg", "image": "busybox"}]
        await mutator.mutate(review("UPDATE", debug, new_pod(), sub="ephemeralcontainers"))
        assert (cache.get(SDG_KIND, "g"), cache.get(NODES, "n1")) == before


class Recorder(FakeRecorder):
    @property
    def events(self) -> list[tuple[str, str, str, str]]:
        """(name, type, reason, message) of each event, in order."""
        return [(e.name, e.type, e.reason, e.message) for e in self.recorded]


def bound(name: str, uid: str) -> dict[str, Any]:
    return factories.group(name, {GPU: 1}, uid=uid, node="n1", devices={GPU: "0"})


async def test_unverified_delivery_warns_once_per_group_and_never_on_a_dry_run() -> None:
    groups = [(SDG_KIND, bound("g", "u1")), (SDG_KIND, bound("h", "u2"))]
    recorder = Recorder()
    async with cached(*groups, (NODES, labelled("n1", None))) as (cache, _):
        mutator = PodMutator(cache, as_client(live()), recorder=recorder)
        assert (await mutator.mutate(review("CREATE", new_pod(), dry_run=True))).allowed
        assert recorder.events == []
        for _ in range(3):
            assert (await mutator.mutate(review("CREATE", new_pod()))).allowed
        other = new_pod()
        other["metadata"]["annotations"]["deviceshare.io/group"] = "h"
        assert (await mutator.mutate(review("CREATE", other))).allowed
    assert [(g, t, r) for g, t, r, _ in recorder.events] == [
        ("g", "Warning", "DeliveryUnverified"),
        ("h", "Warning", "DeliveryUnverified"),
    ]
    assert recorder.events[0][3].startswith(
        "pods get their devices by env, unverified: nothing tells how node n1's runtime"
    )


async def test_a_cached_runtime_class_the_node_runs_chooses_it_without_a_warning() -> None:
    node = labelled("n1", None)
    node["status"] = {"runtimeHandlers": [{"name": ""}, {"name": "nvidia"}]}
    nvidia = {"metadata": {"name": "nvidia"}, "handler": "nvidia"}
    recorder = Recorder()
    objects = [(SDG_KIND, bound("g", "u1")), (NODES, node), (RUNTIMECLASSES, nvidia)]
    async with cached(*objects) as (cache, _):
        mutator = PodMutator(cache, as_client(live()), recorder=recorder)
        response = await mutator.mutate(review("CREATE", new_pod()))
    assert {"op": "add", "path": "/spec/runtimeClassName", "value": "nvidia"} in (
        response.patch or []
    )
    assert recorder.events == []


async def test_the_warning_keeps_its_fix_whole_within_an_events_1024_bytes() -> None:
    """Events keep 1024 bytes of message: the fix, at the end, must fit with the longest
    node name (63 characters) and a RuntimeClass the node cannot run."""
    name = "n" * 63
    g = bound("g", "u1")
    g["status"]["nodeName"] = name
    node = labelled(name, None)
    node["status"] = {"runtimeHandlers": [{"name": ""}, {"name": "runc"}, {"name": "crun"}]}
    nvidia = {"metadata": {"name": "nvidia"}, "handler": "nv"}
    recorder = Recorder()
    async with cached((SDG_KIND, g), (NODES, node), (RUNTIMECLASSES, nvidia)) as (cache, _):
        mutator = PodMutator(cache, as_client(live()), recorder=recorder)
        assert (await mutator.mutate(review("CREATE", new_pod()))).allowed
    ((_, _, _, message),) = recorder.events
    assert len(message.encode()) <= 1024, len(message.encode())
    assert message.endswith(
        f"kubectl label node {name} deviceshare.io/delivery=<env|runtimeclass|cdi>"
    )


async def test_a_missing_group_is_asked_for_once_a_second_and_found_once_cached() -> None:
    """Reviews naming a group that does not exist cost one live GET per name and
    MISSING_TTL (a flood of them cannot keep the API client busy); once the group is
    created and cached, the next pod is admitted at once."""
    client = live()
    async with cached() as (cache, server):
        mutator = PodMutator(cache, as_client(client), binding_wait=0)
        for _ in range(50):
            assert await mutator._group("ghost") is None
        assert gets(client) == ["ghost"]
        await server.create(SDG_KIND, {**BOUND, "metadata": {"name": "ghost"}})
        await settle()  # the informer delivers the new group
        ghost = await mutator._group("ghost")
        assert ghost is not None and ghost["status"] == BOUND["status"]
    assert gets(client) == ["ghost"]


async def test_the_missing_names_are_bounded_and_expire(monkeypatch: pytest.MonkeyPatch) -> None:
    client = live()
    mutator = PodMutator(unsynced(), as_client(client), binding_wait=0)
    for i in range(podmutator.MAX_MISSING + 10):
        await mutator._group(f"g{i}")
    assert len(mutator._missing) == podmutator.MAX_MISSING
    now = time.monotonic()
    monkeypatch.setattr(time, "monotonic", lambda: now + podmutator.MISSING_TTL + 1)
    client.actions.clear()
    await mutator._group(f"g{podmutator.MAX_MISSING}")
    assert gets(client) == [f"g{podmutator.MAX_MISSING}"]  # expired: asked again


def template_pod(name: str, uid: str) -> dict[str, Any]:
    """A pod of one template (a Deployment's, a Job's): only its identity differs."""
    pod = new_pod()
    pod["metadata"].update(
        name=name,
        uid=uid,
        creationTimestamp=f"2026-12-06T00:00:0{len(name) % 10}Z",
        managedFields=[{"manager": "kubectl", "time": uid}],
    )
    return pod


def devices_in(patch: list[dict[str, Any]] | None) -> str:
    return str(annotations_of(patch)["deviceshare.io~1devices"])


async def test_pods_of_one_template_reuse_one_decision_until_an_input_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The second pod of a template is admitted from the first one's decision; a new
    count of the group's pods keeps it, while a new device, node label or RuntimeClass
    decides afresh (no pod gets a stale patch)."""
    decided: list[str] = []
    real = podmutator.build_injection

    def counting(pod: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        decided.append(pod["metadata"]["name"])
        return real(pod, *args, **kwargs)

    monkeypatch.setattr(podmutator, "build_injection", counting)
    node = labelled("n1", None)
    async with cached((SDG_KIND, BOUND), (NODES, node)) as (cache, server):
        mutator = PodMutator(cache, as_client(live()))

        async def admit(name: str) -> list[dict[str, Any]]:
            response = await mutator.mutate(review("CREATE", template_pod(name, name)))
            assert response.allowed and response.patch
            return response.patch

        first = await admit("p1")
        assert await admit("p2") == first
        assert decided == ["p1"]

        counted = factories.group("g", {GPU: 1}, node="n1", devices={GPU: "0"}, pods=["ns/p1"])
        await server.update_status(SDG_KIND, counted)
        await settle()
        assert await admit("p3") == first
        assert decided == ["p1"]

        moved = factories.group("g", {GPU: 1}, node="n1", devices={GPU: "3"}, pods=["ns/p1"])
        await server.update_status(SDG_KIND, moved)
        await settle()
        assert devices_in(await admit("p4")) == '{"nvidia.com/gpu":"3"}'
        assert decided == ["p1", "p4"]

        await server.update(NODES, labelled("n1", "cdi"))
        await settle()
        cdi = annotations_of(await admit("p5"))
        assert cdi["cdi-devices.noderesource.dev~1container.app"] == '["nvidia.com/gpu=3"]'
        assert decided == ["p1", "p4", "p5"]


async def test_denials_are_decided_every_time_and_the_decisions_are_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(podmutator, "MAX_DECISIONS", 2)
    monkeypatch.setattr(podmutator, "MAX_GROUP_PARTS", 2)
    groups = [(SDG_KIND, bound(name, f"u-{name}")) for name in ("g", "h", "k")]
    async with cached(*groups) as (cache, _):
        mutator = PodMutator(cache, as_client(live()))
        for name in ("g", "h", "k"):
            pod = new_pod()
            pod["metadata"]["annotations"]["deviceshare.io/group"] = name
            assert (await mutator.mutate(review("CREATE", pod))).allowed
        assert len(mutator._decisions) == 2 and len(mutator._group_parts) == 2
        bad = new_pod()
        bad["spec"]["nodeName"] = "elsewhere"
        for _ in range(2):
            response = await mutator.mutate(review("CREATE", bad))
            assert not response.allowed and "spec.nodeName elsewhere" in response.message
        assert len(mutator._decisions) == 2


async def test_the_decisions_kept_are_bounded_in_bytes_too() -> None:
    """Pods of many containers have patches as large: the kept ones stay within
    MAX_DECISION_BYTES, however many such shapes come."""
    async with cached((SDG_KIND, BOUND)) as (cache, _):
        mutator = PodMutator(cache, as_client(live()))
        wide = new_pod()
        wide["spec"]["containers"] = [{"name": f"c{i}", "image": "x"} for i in range(40)]
        first = await mutator.mutate(review("CREATE", wide))
        one = mutator._decisions.weight
        assert first.allowed and one > 2000  # the env of 40 containers
        assert mutator._decisions.max_weight == podmutator.MAX_DECISION_BYTES
        mutator._decisions.max_weight = 3 * one
        for image in ("y", "z", "w", "v"):  # four more shapes of the same size
            for c in wide["spec"]["containers"]:
                c["image"] = image
            assert (await mutator.mutate(review("CREATE", wide))).patch == first.patch
        assert len(mutator._decisions) == 3 and mutator._decisions.weight == 3 * one
        mutator._decisions.max_weight = one - 1
        wide["spec"]["containers"][0]["image"] = "u"
        assert (await mutator.mutate(review("CREATE", wide))).patch == first.patch
        assert len(mutator._decisions) == 3  # too large alone: decided, not kept

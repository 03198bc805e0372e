"""One pass over a bound group's pods (``controllers.grouppods.survey``), and the event
filters that decide when the group scheduler looks at them at all."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from api.constants import DEFAULT_ENV_TABLE, DEVICES_ANNOTATION, SDG_KIND
from api.pods import POD_GROUP_INDEX, delivered_devices, index_by_group, is_active, pod_key
from controllers import watches
from controllers.grouppods import survey
from controllers.watches import group_changed, group_reading_pod, pod_matters_to_group, pod_moved
from sdgruntime.cache import Cache
from sdgruntime.envtest import FakeClient
from sdgruntime.handler import EnqueueRequestsFromMapFunc as MapTo
from sdgruntime.kinds import PODS, Kind
from sdgruntime.reconcile import Request
from tests import factories
from tests.factories import as_client
from tests.runtime.helpers import running_cache

GPU = "nvidia.com/gpu"
RES = {GPU: 2}
HELD = {GPU: [0, 1]}
ANNOTATION = '{"nvidia.com/gpu":"0,1"}'


def pod(
    name: str,
    node: str | None = "n0",
    phase: str = "Running",
    annotation: str | None = ANNOTATION,
    env: str | None = None,
    group: str = "g",
) -> dict[str, Any]:
    """A pod of ``group`` on ``node``, its devices told by ``annotation`` (as the webhook
    records them) and, where given, by the NVIDIA env var ``env``."""
    return factories.pod(
        name,
        group,
        node=node,
        phase=phase,
        annotations=None if annotation is None else {DEVICES_ANNOTATION: annotation},
        env=None if env is None else {"NVIDIA_VISIBLE_DEVICES": env},
    )


def test_active_pods_are_counted_bound_or_not_terminal_ones_are_not() -> None:
    pods = [
        pod("a"),
        pod("b", node=None, phase="Pending"),
        pod("c", phase="Succeeded"),
        pod("d", phase="Failed", node="elsewhere"),  # done: neither counted nor odd
    ]
    assert survey(pods, "n0", HELD, RES, DEFAULT_ENV_TABLE).active == 2
    assert survey(pods, "n0", HELD, RES, DEFAULT_ENV_TABLE).odd == []


def test_pods_elsewhere_or_with_other_devices_are_odd() -> None:
    pods = [
        pod("same"),
        pod("spaced", annotation='{"nvidia.com/gpu": "1,0"}'),  # same devices, other text
        pod("moved", node="n1"),
        pod("other", annotation='{"nvidia.com/gpu":"2,3"}'),
        pod("extra", annotation='{"nvidia.com/gpu":"0,1","amd.com/gpu":"0"}'),
    ]
    out = survey(pods, "n0", HELD, RES, DEFAULT_ENV_TABLE)
    assert out.active == 5
    assert out.odd == [
        "ns/extra on n0 with {'nvidia.com/gpu': [0, 1], 'amd.com/gpu': [0]}",
        "ns/moved on n1 with {'nvidia.com/gpu': [0, 1]}",
        "ns/other on n0 with {'nvidia.com/gpu': [2, 3]}",
    ]


def test_pods_without_the_annotation_are_judged_by_their_env() -> None:
    pods = [
        pod("env-same", annotation=None, env="0,1"),
        pod("env-other", annotation=None, env="1"),
        pod("unknown", annotation=None),  # cannot be told: odd only elsewhere
        pod("unknown-away", annotation=None, node="n1"),
        pod("malformed", annotation="{"),
    ]
    out = survey(pods, "n0", HELD, RES, DEFAULT_ENV_TABLE)
    assert out.odd == [
        "ns/env-other on n0 with {'nvidia.com/gpu': [1]}",
        "ns/unknown-away on n1 with None",
    ]


def _two_passes(pods: list[dict[str, Any]], node: str) -> tuple[int, list[str]]:
    """What ``_check_bound`` computed before: a count, then a walk of the bound pods."""
    active = sum(1 for p in pods if is_active(p))
    odd = []
    for p in pods:
        if not (is_active(p) and p["spec"].get("nodeName")):
            continue
        where = p["spec"]["nodeName"]
        seen = delivered_devices(p, RES, DEFAULT_ENV_TABLE)
        if where != node or (seen is not None and seen != HELD):
            odd.append(f"{pod_key(p)} on {where} with {seen}")
    return active, sorted(odd)


annotations = st.sampled_from(
    [ANNOTATION, None, '{"nvidia.com/gpu":"1"}', '{"nvidia.com/gpu": "0,1"}', "{", "[]"]
)
pods_st = st.lists(
    st.builds(
        pod,
        name=st.text("abc", min_size=1, max_size=3),
        node=st.sampled_from(["n0", "n1", None]),
        phase=st.sampled_from(["Pending", "Running", "Succeeded", "Failed", "Unknown"]),
        annotation=annotations,
        env=st.sampled_from([None, "0,1", "1", "void"]),
    ),
    max_size=8,
)


@given(pods_st)
def test_one_pass_decides_as_the_two_passes_did(pods: list[dict[str, Any]]) -> None:
    out = survey(pods, "n0", HELD, RES, DEFAULT_ENV_TABLE)
    assert (out.active, out.odd) == _two_passes(pods, "n0")


# --- what wakes the group scheduler ------------------------------------------------------
def test_pod_churn_the_group_scheduler_does_not_read_does_not_wake_it() -> None:
    base = pod("a", phase="Pending")
    running = pod("a", phase="Running")
    running["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    terminating = pod("a", phase="Running")
    terminating["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert not pod_matters_to_group.update(base, running)
    assert not pod_matters_to_group.update(running, terminating)
    # ... while the status controller still hears of phase and deletion changes.
    assert pod_moved.update(base, running) and pod_moved.update(running, terminating)


def test_pod_changes_the_group_scheduler_reads_wake_it() -> None:
    unbound = pod("a", node=None, phase="Pending")
    bound = pod("a", phase="Pending")
    assert pod_matters_to_group.update(unbound, bound)  # bound to a node
    assert pod_matters_to_group.update(bound, pod("a", phase="Succeeded"))  # no longer active
    assert pod_matters_to_group.update(bound, pod("a", phase="Pending", annotation="{}"))
    assert pod_matters_to_group.update(bound, pod("a", phase="Pending", group="h"))
    assert pod_matters_to_group.create(bound) and pod_matters_to_group.delete(bound)


def sdg(**status: Any) -> dict[str, Any]:
    return factories.group(
        uid="u", rv=5, finalizers=["f"], node="n0", status={"podCount": 1, **status}
    )


def test_the_status_controllers_pod_list_writes_do_not_wake_the_group_scheduler() -> None:
    old = sdg(allocatedPods=["ns/a"])
    new = sdg(allocatedPods=["ns/a", "ns/b"], podCount=2)
    new["metadata"]["resourceVersion"] = "6"
    assert not group_changed.update(old, new)


def test_every_other_group_change_wakes_it() -> None:
    old = sdg()
    changed = [
        sdg(conditions=[{"type": "Ready", "status": "False"}]),
        sdg(phase="Pending"),
        {**sdg(), "spec": {"resources": {GPU: 2}}},
        {**sdg(), "metadata": {**sdg()["metadata"], "finalizers": []}},
        {**sdg(), "metadata": {**sdg()["metadata"], "deletionTimestamp": "2026-01-01T00:00:00Z"}},
        {**sdg(), "metadata": {**sdg()["metadata"], "uid": "other"}},
    ]
    for new in changed:
        assert group_changed.update(old, new), new
    assert group_changed.create(old) and group_changed.delete(old)


# --- which pod events reach the group scheduler at all ------------------------------------
@asynccontextmanager
async def groups_and_pods(*objects: tuple[Kind, dict[str, Any]]) -> AsyncIterator[Cache]:
    """A synced cache of groups and pods (indexed by group, as the manager's)."""
    cache = Cache(as_client(FakeClient(objects)))
    cache.add_index(PODS, POD_GROUP_INDEX, index_by_group)
    async with running_cache(cache, SDG_KIND, PODS) as synced:
        yield synced


@pytest.mark.anyio
async def test_a_pod_with_no_node_does_not_wake_its_bound_group() -> None:
    bound = factories.group("g", node="n0", devices={GPU: "0,1"})
    unbound = pod("a", node=None, phase="Pending")
    async with groups_and_pods((SDG_KIND, bound), (PODS, unbound)) as cache:
        wake = group_reading_pod(cache, DEFAULT_ENV_TABLE)
        assert wake(unbound) == []
        assert wake(pod("a")) == []  # bound to the group's node with its devices


@pytest.mark.anyio
async def test_a_bound_pod_wakes_its_bound_group_only_where_survey_finds_it_odd() -> None:
    bound = factories.group("g", node="n0", devices={GPU: "0,1"})
    async with groups_and_pods((SDG_KIND, bound)) as cache:
        wake = group_reading_pod(cache, DEFAULT_ENV_TABLE)
        assert wake(pod("same", annotation='{"nvidia.com/gpu": "1,0"}')) == []  # same IDs
        assert wake(pod("told-by-env", annotation=None, env="0,1")) == []
        assert wake(pod("untold", annotation=None)) == []  # survey cannot tell either
        # DevicesConflict: its reconcile must see these (and see them go).
        assert wake(pod("moved", node="n1")) == [Request("g")]
        assert wake(pod("other", annotation='{"nvidia.com/gpu":"2,3"}')) == [Request("g")]
        assert wake(pod("other-env", annotation=None, env="2")) == [Request("g")]
        assert wake(pod("done", node="n1", phase="Succeeded")) == []  # not active


@pytest.mark.anyio
async def test_an_odd_pod_that_ends_or_goes_wakes_its_group_to_clear_the_conflict() -> None:
    bound = factories.group("g", node="n0", devices={GPU: "0,1"})
    odd, ended = pod("x", node="n1"), pod("x", node="n1", phase="Failed")
    async with groups_and_pods((SDG_KIND, bound)) as cache:
        handler = MapTo(group_reading_pod(cache, DEFAULT_ENV_TABLE))
        assert list(handler.update(odd, ended)) == [Request("g")]
        assert list(handler.delete(odd)) == [Request("g")]
        assert list(handler.update(pod("a", node=None), pod("a"))) == []  # a plain bind


@pytest.mark.anyio
async def test_a_group_whose_devices_do_not_parse_is_woken_to_report_it() -> None:
    broken = factories.group("g", node="n0", devices={GPU: "0,1"})
    broken["status"]["selectedDevices"] = {GPU: "zero"}
    async with groups_and_pods((SDG_KIND, broken)) as cache:
        assert group_reading_pod(cache, DEFAULT_ENV_TABLE)(pod("a")) == [Request("g")]


@pytest.mark.anyio
async def test_a_pod_with_no_node_wakes_a_group_that_reads_it() -> None:
    deleting = factories.group("t", node="n0", devices={GPU: "0,1"}, deleting=True)
    pending = factories.group("p")
    async with groups_and_pods((SDG_KIND, deleting), (SDG_KIND, pending)) as cache:
        wake = group_reading_pod(cache, DEFAULT_ENV_TABLE)
        # The finalizer of a deleted group waits for every active pod, bound or not.
        assert wake(pod("a", node=None, phase="Pending", group="t")) == [Request("t")]
        # A Pending group's scheduling reads no pod without a node.
        assert wake(pod("b", node=None, phase="Pending", group="p")) == []
        # A group the cache does not hold is looked at as before (its claims, if any).
        assert wake(pod("c", node=None, phase="Pending", group="gone")) == [Request("gone")]
        assert wake(factories.pod("d", None)) == []  # no group at all


@pytest.mark.anyio
async def test_a_pod_left_from_an_earlier_binding_wakes_its_pending_group() -> None:
    # Pods with a node keep a group that is not Bound Pending ("still run from an earlier
    # binding"); each of their events, the last one going above all, must wake it.
    pending = factories.group("p")
    stranded = pod("a", group="p")
    async with groups_and_pods((SDG_KIND, pending), (PODS, stranded)) as cache:
        handler = MapTo(group_reading_pod(cache, DEFAULT_ENV_TABLE))
        assert list(handler.delete(stranded)) == [Request("p")]
        ended = pod("a", group="p", phase="Succeeded")
        assert list(handler.update(stranded, ended)) == [Request("p")]


@pytest.mark.anyio
async def test_an_unsynced_group_cache_lets_every_pod_event_through() -> None:
    cache = Cache(as_client(FakeClient()))
    wake = group_reading_pod(cache, DEFAULT_ENV_TABLE)
    assert wake(pod("a", node=None, phase="Pending")) == [Request("g")]


@pytest.mark.anyio
async def test_unbound_pods_wake_a_group_whose_pod_list_is_truncated(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Their count decides PodsListed beyond MAX_ALLOCATED_PODS (2 here).
    monkeypatch.setattr(watches, "MAX_ALLOCATED_PODS", 2)
    bound = factories.group("g", node="n0", devices={GPU: "0,1"})
    one, two = pod("a", node=None, phase="Pending"), pod("b", node=None, phase="Pending")
    async with groups_and_pods((SDG_KIND, bound), (PODS, one)) as cache:
        assert group_reading_pod(cache, DEFAULT_ENV_TABLE)(one) == []
    async with groups_and_pods((SDG_KIND, bound), (PODS, one), (PODS, two)) as cache:
        assert group_reading_pod(cache, DEFAULT_ENV_TABLE)(two) == [Request("g")]

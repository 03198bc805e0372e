"""One pass over a bound group's pods (``controllers.grouppods.survey``), and the event
filters that decide when the group scheduler looks at them at all."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from api.constants import DEFAULT_ENV_TABLE, DEVICES_ANNOTATION
from api.pods import delivered_devices, is_active, pod_key
from controllers.grouppods import survey
from controllers.watches import group_changed, pod_matters_to_group, pod_moved
from tests import factories

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

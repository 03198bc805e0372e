"""The SharedDeviceGroup CRD as the real API server enforces and prints it."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from api.constants import MAX_ALLOCATED_PODS, MAX_DEVICES_PER_RESOURCE, SDG_KIND
from api.validation import COUNT_TOO_LARGE, validate_spec
from sdgruntime.envtest.controlplane import ControlPlane

pytestmark = pytest.mark.integration

GPU = "nvidia.com/gpu"
KUBECTL = Path(sys.executable).parent / "kubectl"


def sdg(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": SDG_KIND.api_version,
        "kind": SDG_KIND.kind,
        "metadata": {"name": name},
        "spec": spec,
    }


@pytest.fixture
def api(control_plane: ControlPlane) -> Iterator[httpx.Client]:
    yield control_plane.http


@pytest.fixture
def name(api: httpx.Client) -> Iterator[str]:
    """A fresh group name; the group (if created) is deleted afterwards."""
    value = f"g-{uuid.uuid4().hex[:10]}"
    yield value
    api.delete(SDG_KIND.path(name=value))


def create(api: httpx.Client, obj: dict[str, Any]) -> httpx.Response:
    return api.post(SDG_KIND.path(), json=obj)


def rejection(api: httpx.Client, obj: dict[str, Any]) -> str:
    r = create(api, obj)
    assert r.status_code == 422, r.text
    body = r.json()
    assert body["reason"] == "Invalid"
    return str(body["message"])


def bind(api: httpx.Client, name: str, node: str = "n1", pods: int = 0) -> dict[str, Any]:
    current = api.get(SDG_KIND.path(name=name)).json()
    current["status"] = {
        "phase": "Bound",
        "nodeName": node,
        "selectedDevices": {GPU: "0,1"},
        "deviceSummary": f"{GPU}=0,1",
        "allocatedPods": [f"ns/p{i}" for i in range(pods)],
        "podCount": pods,
        "conditions": [
            {
                "type": "Scheduled",
                "status": "True",
                "reason": "Bound",
                "message": f"bound to {node}",
                "lastTransitionTime": "2025-01-01T00:00:00Z",
            },
            {
                "type": "Ready",
                "status": "True",
                "reason": "Ready",
                "message": "bound, node healthy",
                "lastTransitionTime": "2025-01-01T00:00:00Z",
            },
        ],
    }
    r = api.put(SDG_KIND.path(name=name, subresource="status"), json=current)
    assert r.status_code == 200, r.text
    return dict(r.json())


def test_valid_group_is_accepted_with_defaults(api: httpx.Client, name: str) -> None:
    spec = {"resources": {GPU: 2, "huawei.com/Ascend910": 1}, "nodeSelector": {"gpu": "a100"}}
    r = create(api, sdg(name, spec))
    assert r.status_code == 201, r.text
    created = r.json()
    assert created["spec"]["schedulingStrategy"] == "binpack"
    assert created["metadata"]["generation"] == 1
    assert "namespace" not in created["metadata"]  # cluster-scoped


def test_status_is_a_subresource(api: httpx.Client, name: str) -> None:
    assert create(api, sdg(name, {"resources": {GPU: 2}})).status_code == 201
    with_status = api.get(SDG_KIND.path(name=name)).json()
    with_status["status"] = {"phase": "Bound"}
    r = api.put(SDG_KIND.path(name=name), json=with_status)
    assert r.status_code == 200 and "status" not in r.json()  # main endpoint ignores status
    bound = bind(api, name, pods=2)
    assert bound["status"]["phase"] == "Bound" and bound["status"]["podCount"] == 2


@pytest.mark.parametrize(
    ("spec", "fragments"),
    [
        ({"resources": {GPU: 0}}, ["should be greater than or equal to 1"]),
        ({"resources": {GPU: -2}}, ["device counts must be positive integers"]),
        ({"resources": {}}, ["must name at least one device resource"]),
        ({}, ["spec.resources: Required value"]),
        ({"resources": {GPU: 1}, "schedulingStrategy": "random"}, ['Unsupported value: "random"']),
        ({"resources": {"gpu": 1}}, ["resource names must be extended resource names"]),
        ({"resources": {"NVIDIA.com/gpu": 1}}, ["resource names must be extended resource names"]),
        ({"resources": {"nvidia.com/gpu/x": 1}}, ["resource names must be extended resource"]),
        ({"resources": {GPU: "2"}}, ["spec.resources.nvidia.com/gpu: Invalid value"]),
        (
            {"resources": {GPU: 1}, "nodeSelector": {"bad key": "v"}},
            ["nodeSelector keys must be label keys"],
        ),
        (
            {"resources": {f"r{i}.io/gpu": 1 for i in range(17)}},
            ["must have at most 16 items"],
        ),
        (
            {"resources": {GPU: 5000}},
            ["should be less than or equal to 1024", COUNT_TOO_LARGE],
        ),
        ({"resources": {GPU: 2**62}}, [COUNT_TOO_LARGE]),
    ],
)
def test_invalid_groups_are_rejected(
    api: httpx.Client, name: str, spec: dict[str, Any], fragments: list[str]
) -> None:
    message = rejection(api, sdg(name, spec))
    for fragment in fragments:
        assert fragment in message, message


def test_missing_spec_is_rejected(api: httpx.Client, name: str) -> None:
    obj = sdg(name, {})
    del obj["spec"]
    assert "spec: Required value" in rejection(api, obj)


def test_spec_can_change_while_pending_but_not_once_bound(api: httpx.Client, name: str) -> None:
    assert create(api, sdg(name, {"resources": {GPU: 2}})).status_code == 201
    path = SDG_KIND.path(name=name)
    merge = {"Content-Type": "application/merge-patch+json"}
    r = api.patch(path, json={"spec": {"resources": {GPU: 1}}}, headers=merge)
    assert r.status_code == 200, r.text
    bind(api, name)
    r = api.patch(path, json={"spec": {"resources": {GPU: 4}}}, headers=merge)
    assert r.status_code == 422, r.text
    assert "cannot change once the group is Bound" in r.json()["message"]
    r = api.patch(path, json={"spec": {"nodeSelector": {"a": "b"}}}, headers=merge)
    assert r.status_code == 422, r.text
    r = api.patch(path, json={"spec": {"schedulingStrategy": "spread"}}, headers=merge)
    assert r.status_code == 200, r.text
    r = api.patch(path, json={"metadata": {"labels": {"team": "ml"}}}, headers=merge)
    assert r.status_code == 200, r.text


def test_printer_columns(api: httpx.Client, name: str) -> None:
    assert create(api, sdg(name, {"resources": {GPU: 2}})).status_code == 201
    bind(api, name, node="gpu-node-1", pods=3)
    r = api.get(
        SDG_KIND.path(name=name),
        headers={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"},
    )
    assert r.status_code == 200, r.text
    table = r.json()
    columns = [c["name"] for c in table["columnDefinitions"] if c["priority"] == 0]
    assert columns == ["Name", "Phase", "Ready", "Node", "Devices", "Pods", "Age"]
    cells = dict(
        zip([c["name"] for c in table["columnDefinitions"]], table["rows"][0]["cells"], strict=True)
    )
    assert cells["Name"] == name
    assert cells["Phase"] == "Bound"
    assert cells["Node"] == "gpu-node-1"
    assert cells["Ready"] == "True"
    assert cells["Devices"] == "nvidia.com/gpu=0,1"
    assert cells["Pods"] == 3
    assert cells["Strategy"] == "binpack"


def test_kubectl_get_by_short_name(kubeconfig: str, api: httpx.Client, name: str) -> None:
    assert create(api, sdg(name, {"resources": {GPU: 2}})).status_code == 201
    bind(api, name, pods=1)
    out = subprocess.run(
        [str(KUBECTL), "--kubeconfig", kubeconfig, "get", "sdg", name],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.splitlines()
    assert out[0].split() == ["NAME", "PHASE", "READY", "NODE", "DEVICES", "PODS", "AGE"]
    assert out[1].split()[:6] == [name, "Bound", "True", "n1", "nvidia.com/gpu=0,1", "1"]


@pytest.mark.parametrize(
    "spec",
    [
        {"resources": {GPU: 1}},
        {"resources": {"a/b": 1}, "schedulingStrategy": "spread"},
        {"resources": {"example.com/x_y.z-1": 3}, "nodeSelector": {"k8s.io/zone": ""}},
        {"resources": {GPU: 0}},
        {"resources": {}},
        {"resources": {"gpu": 1}},
        {"resources": {"Nvidia.com/gpu": 1}},
        {"resources": {"nvidia.com/-gpu": 1}},
        {"resources": {"nvidia..com/gpu": 1}},
        {"resources": {"nvidia.com/" + "g" * 64: 1}},
        {"resources": {"a" * 254 + "/gpu": 1}},
        {"resources": {GPU: 1}, "nodeSelector": {"a/b/c": "x"}},
        {"resources": {GPU: 1}, "nodeSelector": {"k": "v" * 64}},
        {"resources": {GPU: 1}, "nodeSelector": {"k": "-v"}},
        {"resources": {GPU: MAX_DEVICES_PER_RESOURCE}},
        {"resources": {GPU: MAX_DEVICES_PER_RESOURCE + 1}},
    ],
)
def test_python_validation_agrees_with_the_api_server(
    api: httpx.Client, name: str, spec: dict[str, Any]
) -> None:
    accepted = create(api, sdg(name, spec)).status_code == 201
    assert accepted == (validate_spec(spec) == []), validate_spec(spec)


def put_status(api: httpx.Client, name: str, status: dict[str, Any]) -> httpx.Response:
    current = api.get(SDG_KIND.path(name=name)).json()
    current["status"] = status
    return api.put(SDG_KIND.path(name=name, subresource="status"), json=current)


def condition(type_: str, message: str = "") -> dict[str, Any]:
    return {
        "type": type_,
        "status": "False",
        "reason": "Unschedulable",
        "message": message,
        "lastTransitionTime": "2025-01-01T00:00:00Z",
    }


def test_status_bounds_are_enforced(api: httpx.Client, name: str) -> None:
    assert create(api, sdg(name, {"resources": {GPU: 2}})).status_code == 201
    pods = [f"ns/p{i:04d}" for i in range(MAX_ALLOCATED_PODS)]
    longest = f"{'n' * 63}/{'p' * 253}"
    full = {"allocatedPods": [*pods[:-1], longest], "podCount": 5000}
    assert put_status(api, name, full).status_code == 200
    all_ids = ",".join(str(i) for i in range(MAX_DEVICES_PER_RESOURCE))
    bound = {"phase": "Bound", "nodeName": "n1", "selectedDevices": {GPU: all_ids}}
    assert put_status(api, name, bound).status_code == 200
    message = "x" * 32768
    r = put_status(api, name, {"conditions": [condition("Scheduled", message)]})
    assert r.status_code == 200, r.text
    for status, fragment in [
        ({"allocatedPods": [*pods, "ns/one-more"]}, "must have at most 1000 items"),
        ({"allocatedPods": [longest + "x"]}, "may not be more than 317"),
        ({"conditions": [condition("Scheduled", message + "x")]}, "may not be more than 32768"),
        ({"conditions": [condition(f"T{i}") for i in range(17)]}, "must have at most 16 items"),
        ({"selectedDevices": {f"r{i}.io/gpu": "0" for i in range(17)}}, "at most 16 items"),
    ]:
        r = put_status(api, name, status)
        assert r.status_code == 422, r.text
        assert fragment in r.json()["message"], r.json()["message"]

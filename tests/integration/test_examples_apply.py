"""examples/ and config/samples/ are valid: what a user applies is accepted.

Schema level only (the end-to-end flow of each example runs with the manager elsewhere):
every document parses and names itself; every SharedDeviceGroup passes the real API
server's CRD validation (``dryRun=All``); every pod and pod template passes the server's
Pod validation and the pod webhook's rules once its group is bound.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from api.constants import GROUP_ANNOTATION, SCHEDULER_NAME, SDG_KIND
from api.v1alpha1 import SharedDeviceGroup
from sdgruntime.envtest.controlplane import ControlPlane
from webhooks.injection import Patch, apply_operations, build_injection

ROOT = Path(__file__).resolve().parents[2]
FILES = sorted((ROOT / "examples").glob("*.yaml")) + sorted(
    p for p in (ROOT / "config" / "samples").glob("*.yaml") if p.name != "kustomization.yaml"
)
EXPECTED_EXAMPLES = {
    "multi-gpu-group.yaml",
    "single-gpu-group.yaml",
    "deployment-shared-group.yaml",
    "sidecar-shared-gpus.yaml",
    "amd-group.yaml",
    "nodeselector-group.yaml",
    "pinned-group.yaml",
}

Obj = dict[str, Any]


def docs(path: Path) -> list[Obj]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def ids(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def all_docs() -> Iterator[tuple[Path, Obj]]:
    for path in FILES:
        for doc in docs(path):
            yield path, doc


def groups() -> list[Obj]:
    return [d for _, d in all_docs() if d.get("kind") == SDG_KIND.kind]


def pod_templates(doc: Obj) -> list[Obj]:
    """Pods, or the pod templates of workloads, as Pod objects."""
    if doc["kind"] == "Pod":
        return [doc]
    template = (doc.get("spec") or {}).get("template")
    if template:
        meta = {"name": doc["metadata"]["name"], **(template.get("metadata") or {})}
        return [{"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": template["spec"]}]
    return []


def bound(group: Obj) -> Obj:
    """The group as the scheduler leaves it: Bound with device IDs 0..n-1."""
    out = copy.deepcopy(group)
    out["status"] = {
        "phase": "Bound",
        "nodeName": "gpu-node-1",
        "selectedDevices": {
            res: ",".join(str(i) for i in range(n)) for res, n in group["spec"]["resources"].items()
        },
    }
    return out


def test_the_promised_examples_exist() -> None:
    assert {p.name for p in FILES} >= EXPECTED_EXAMPLES


@pytest.mark.parametrize("path", FILES, ids=ids)
def test_every_document_parses_and_names_itself(path: Path) -> None:
    found = docs(path)
    assert found, f"{path.name} is empty"
    for doc in found:
        assert isinstance(doc, dict)
        assert doc.get("apiVersion") and doc.get("kind"), doc
        assert (doc.get("metadata") or {}).get("name"), doc
        # Namespaced examples leave the namespace to `kubectl apply -n`.
        assert "namespace" not in doc["metadata"]


def test_group_names_are_unique_so_examples_can_be_applied_together() -> None:
    names = [g["metadata"]["name"] for g in groups()]
    assert len(names) == len(set(names)), names


@pytest.mark.parametrize("path", FILES, ids=ids)
def test_every_group_is_valid_for_the_api_models(path: Path) -> None:
    for doc in docs(path):
        if doc["kind"] == SDG_KIND.kind:
            SharedDeviceGroup.from_dict(doc)


@pytest.mark.parametrize("path", FILES, ids=ids)
def test_every_pod_joins_a_group_of_its_file_and_passes_the_webhook(path: Path) -> None:
    """Each pod names a group defined next to it, uses our scheduler, and would be
    admitted by the pod webhook with the group's devices in every container."""
    found = docs(path)
    by_name = {d["metadata"]["name"]: d for d in found if d["kind"] == SDG_KIND.kind}
    for doc in found:
        for pod in pod_templates(doc):
            group = by_name[pod["metadata"]["annotations"][GROUP_ANNOTATION]]
            assert pod["spec"]["schedulerName"] == SCHEDULER_NAME
            decision = build_injection(pod, bound(group))
            assert isinstance(decision, Patch), decision
            mutated = apply_operations(pod, decision.operations)
            for c in mutated["spec"]["containers"]:
                assert {e["name"] for e in c["env"]}, c["name"]


# --- against the real API server -----------------------------------------------------------


@pytest.mark.integration
@pytest.mark.parametrize("group", groups(), ids=lambda g: g["metadata"]["name"])
def test_group_is_accepted_by_the_crd(group: Obj, control_plane: ControlPlane) -> None:
    r = control_plane.http.post(SDG_KIND.path(), params={"dryRun": "All"}, json=group)
    assert r.status_code == 201, r.text
    assert r.json()["spec"]["resources"] == group["spec"]["resources"]


@pytest.mark.integration
@pytest.mark.parametrize("path", FILES, ids=ids)
def test_pods_and_workloads_are_accepted_by_the_api_server(
    path: Path, control_plane: ControlPlane, namespace: str
) -> None:
    """Dry-run creates of the non-group objects. The group annotation and schedulerName
    are dropped first, so a pod webhook another test may have registered in this shared
    control plane never judges pods whose group was only dry-run created; the webhook's
    rules are checked purely above."""
    for doc in docs(path):
        if doc["kind"] == SDG_KIND.kind:
            continue
        obj = copy.deepcopy(doc)
        pod = obj if obj["kind"] == "Pod" else obj["spec"]["template"]
        pod["metadata"].pop("annotations", None)
        pod["spec"].pop("schedulerName", None)
        api = "/api/v1" if obj["apiVersion"] == "v1" else f"/apis/{obj['apiVersion']}"
        plural = {"Pod": "pods", "Deployment": "deployments"}[obj["kind"]]
        r = control_plane.http.post(
            f"{api}/namespaces/{namespace}/{plural}", params={"dryRun": "All"}, json=obj
        )
        assert r.status_code == 201, r.text

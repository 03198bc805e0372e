"""config/rbac's roles for people, judged by the real API server's RBAC authorizer.

``shareddevicegroup-viewer-role`` and ``-editor-role`` carry the labels that aggregate them
into the built-in ``view`` and ``edit`` ClusterRoles. The aggregation itself is done by a
controller in kube-controller-manager, which this control plane does not run, so the roles
are bound directly to test users here; what a ``view``/``edit`` user gets is these rules.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from sdgruntime.envtest import ControlPlane

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
KUBECTL = Path(sys.executable).parent / "kubectl"
GROUPS_API = "/apis/deviceshare.io/v1alpha1/shareddevicegroups"
VIEWER, EDITOR = "shareddevicegroup-viewer-role", "shareddevicegroup-editor-role"

# (subresource, verb) -> allowed for the viewer, for the editor. Status is the manager's.
MATRIX = {
    ("", "get"): (True, True),
    ("", "list"): (True, True),
    ("", "watch"): (True, True),
    ("", "create"): (False, True),
    ("", "update"): (False, True),
    ("", "patch"): (False, True),
    ("", "delete"): (False, True),
    ("status", "get"): (True, True),
    ("status", "update"): (False, False),
    ("status", "patch"): (False, False),
}


def kubectl(
    kubeconfig: Path, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(KUBECTL), "--kubeconfig", str(kubeconfig), *args],
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def group(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "deviceshare.io/v1alpha1",
        "kind": "SharedDeviceGroup",
        "metadata": {"name": name},
        "spec": {"resources": {"nvidia.com/gpu": 1}},
    }


@pytest.fixture(scope="module")
def roles(control_plane: ControlPlane) -> dict[str, dict[str, Any]]:
    """The two ClusterRoles as config/default installs them, stored."""
    out = subprocess.run(
        [str(KUBECTL), "kustomize", str(ROOT / "config" / "default")],
        capture_output=True,
        text=True,
        check=True,
    )
    built = {
        d["metadata"]["name"]: d
        for d in yaml.safe_load_all(out.stdout)
        if d and d["kind"] == "ClusterRole"
    }
    return {name: control_plane.apply(built[name]) for name in (VIEWER, EDITOR)}


@pytest.fixture
def bound(control_plane: ControlPlane, roles: dict[str, Any]) -> Iterator[dict[str, str]]:
    """role name -> a fresh user bound to it (cluster-wide: groups are cluster-scoped)."""
    users = {role: f"{role.split('-')[1]}-{uuid.uuid4().hex[:8]}" for role in roles}
    for role, user in users.items():
        control_plane.apply(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": user},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": role,
                },
                "subjects": [
                    {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}
                ],
            }
        )
    yield users
    for user in users.values():
        control_plane.delete("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", user)


def allowed(cp: ControlPlane, user: str, verb: str, subresource: str) -> bool:
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": user,
            "resourceAttributes": {
                "group": "deviceshare.io",
                "resource": "shareddevicegroups",
                "subresource": subresource,
                "verb": verb,
                "name": "any",
            },
        },
    }
    r = cp.http.post("/apis/authorization.k8s.io/v1/subjectaccessreviews", json=review)
    assert r.status_code == 201, r.text
    return bool(r.json()["status"]["allowed"])


def test_roles_grant_exactly_their_verbs(
    control_plane: ControlPlane, bound: dict[str, str]
) -> None:
    got = {
        key: (
            allowed(control_plane, bound[VIEWER], key[1], key[0]),
            allowed(control_plane, bound[EDITOR], key[1], key[0]),
        )
        for key in MATRIX
    }
    assert got == MATRIX
    # The control: a user bound to neither may do nothing.
    assert not allowed(control_plane, f"nobody-{uuid.uuid4().hex[:8]}", "get", "")


def test_viewer_reads_groups_and_cannot_change_them(
    control_plane: ControlPlane, bound: dict[str, str]
) -> None:
    name = f"viewed-{uuid.uuid4().hex[:8]}"
    r = control_plane.http.post(GROUPS_API, json=group(name))
    assert r.status_code == 201, r.text
    try:
        kc = control_plane.user_kubeconfig(bound[VIEWER])
        listed = kubectl(kc, "get", "sdg", "-o", "name")
        assert listed.returncode == 0, listed.stderr
        assert f"shareddevicegroup.deviceshare.io/{name}" in listed.stdout.split()
        got = kubectl(kc, "get", "sdg", name, "-o", "yaml")
        assert got.returncode == 0, got.stderr
        assert yaml.safe_load(got.stdout)["spec"]["resources"] == {"nvidia.com/gpu": 1}

        for args in (["delete", "sdg", name], ["label", "sdg", name, "x=y"]):
            refused = kubectl(kc, *args)
            assert refused.returncode != 0
            assert "Forbidden" in refused.stderr and bound[VIEWER] in refused.stderr
        refused = kubectl(kc, "create", "-f", "-", stdin=yaml.safe_dump(group(f"{name}-2")))
        assert refused.returncode != 0 and "Forbidden" in refused.stderr
    finally:
        control_plane.http.delete(f"{GROUPS_API}/{name}")


def test_editor_creates_changes_and_deletes_groups(
    control_plane: ControlPlane, bound: dict[str, str]
) -> None:
    name = f"edited-{uuid.uuid4().hex[:8]}"
    kc = control_plane.user_kubeconfig(bound[EDITOR])
    try:
        created = kubectl(kc, "create", "-f", "-", stdin=yaml.safe_dump(group(name)))
        assert created.returncode == 0, created.stderr
        stored = control_plane.http.get(f"{GROUPS_API}/{name}")
        assert stored.status_code == 200 and stored.json()["spec"]["resources"] == {
            "nvidia.com/gpu": 1
        }
        labelled = kubectl(kc, "label", "sdg", name, "team=a")
        assert labelled.returncode == 0, labelled.stderr
        # What SDG decided stays SDG's: the editor cannot write a group's status.
        refused = kubectl(
            kc,
            "patch",
            "sdg",
            name,
            "--subresource=status",
            "--type=merge",
            "-p",
            '{"status": {"phase": "Bound", "nodeName": "n1"}}',
        )
        assert refused.returncode != 0 and "Forbidden" in refused.stderr, refused.stderr
        deleted = kubectl(kc, "delete", "sdg", name, "--wait=false")
        assert deleted.returncode == 0, deleted.stderr
    finally:
        control_plane.http.delete(f"{GROUPS_API}/{name}")

"""discover_kind against the real API server: a CRD's plural, scope and version from its
discovery (preferred version first), the built-in kinds equal to sdgruntime's constants,
errors that say what is served; and a manager whose Kind has a wrong plural or group
says which, instead of guessing "CRD not installed?"."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml

from sdgruntime.cache import CacheSyncError, KindOptions
from sdgruntime.client import Client
from sdgruntime.discovery import NoKindMatchError, discover_kind, explain_missing
from sdgruntime.envtest import ControlPlane
from sdgruntime.kinds import CONFIGMAPS, LEASES, NAMESPACES, Kind
from sdgruntime.manager import Manager, ManagerOptions
from sdgruntime.reconcile import Request

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

GROUP = "discovery.example.com"
SCHEMA = {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}
# An irregular plural, so nothing that guesses "<kind>s" finds it; two versions, v1 the
# stored and preferred one.
CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": f"gizmoes.{GROUP}"},
    "spec": {
        "group": GROUP,
        "scope": "Namespaced",
        "names": {"plural": "gizmoes", "singular": "gizmo", "kind": "Gizmo"},
        "versions": [
            {"name": "v1beta1", "served": True, "storage": False, "schema": SCHEMA},
            {"name": "v1", "served": True, "storage": True, "schema": SCHEMA},
        ],
    },
}
GIZMOES = Kind(GROUP, "v1", "Gizmo", "gizmoes", namespaced=True)


@pytest.fixture(scope="module")
def gizmo_crd(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> None:
    path: Path = tmp_path_factory.mktemp("crd") / "gizmoes.yaml"
    path.write_text(yaml.safe_dump(CRD))
    control_plane.install_crds([path])  # waits until its first version is served
    deadline = time.monotonic() + 30
    while control_plane.http.get(f"/apis/{GROUP}/v1").status_code != 200:
        assert time.monotonic() < deadline, f"{GROUP}/v1 not served"
        time.sleep(0.1)


async def test_a_crds_kind_is_found_with_its_plural_scope_and_preferred_version(
    client: Client, namespace: str, gizmo_crd: None
) -> None:
    found = await discover_kind(client, GROUP, "Gizmo")
    assert found == GIZMOES
    older = await discover_kind(client, GROUP, "Gizmo", version="v1beta1")
    assert older == Kind(GROUP, "v1beta1", "Gizmo", "gizmoes", namespaced=True)
    # and it is a Kind that works
    obj = {"apiVersion": found.api_version, "kind": "Gizmo", "metadata": {"name": "g"}}
    await client.create(found, obj, namespace)
    assert (await client.get(found, "g", namespace))["metadata"]["name"] == "g"


async def test_built_in_kinds_are_sdgruntimes_constants(client: Client) -> None:
    assert await discover_kind(client, "", "ConfigMap") == CONFIGMAPS
    assert await discover_kind(client, "", "Namespace") == NAMESPACES  # cluster-scoped
    assert await discover_kind(client, "coordination.k8s.io", "Lease") == LEASES


async def test_what_is_not_served_is_named_with_what_is(client: Client, gizmo_crd: None) -> None:
    with pytest.raises(NoKindMatchError, match=r"no kind 'gizmo' \(did you mean 'Gizmo'\?\)"):
        await discover_kind(client, GROUP, "gizmo")
    with pytest.raises(NoKindMatchError, match=r"serves versions v1, v1beta1, not 'v2'"):
        await discover_kind(client, GROUP, "Gizmo", version="v2")
    with pytest.raises(
        NoKindMatchError,
        match=r"serves no API group 'nowhere\.example\.com': is its CustomResourceDefinition",
    ):
        await discover_kind(client, "nowhere.example.com", "Gizmo")
    with pytest.raises(ValueError, match="needs a kind"):
        await discover_kind(client, GROUP, "")


async def test_explain_missing_says_which_part_of_a_kind_is_wrong(
    client: Client, gizmo_crd: None
) -> None:
    plural = await explain_missing(client, Kind(GROUP, "v1", "Gizmo", "gizmos", True))
    assert plural == (
        f"{GROUP}/v1 serves Gizmo as 'gizmoes', not 'gizmos': set the Kind's plural to "
        f"'gizmoes', or find the Kind with discover_kind(client, '{GROUP}', 'Gizmo')"
    )
    version = await explain_missing(client, Kind(GROUP, "v2", "Gizmo", "gizmoes", True))
    assert version == f"API group '{GROUP}' serves versions v1, v1beta1, not 'v2'"
    scope = await explain_missing(client, Kind("", "v1", "Namespace", "namespaces", True))
    assert scope == "namespaces in v1 is cluster-scoped: Kind(..., namespaced=False)"
    unknown = await explain_missing(client, Kind(GROUP, "v1", "Widget", "widgets", True))
    assert unknown == f"{GROUP}/v1 has no resource 'widgets'; it serves: gizmoes (Gizmo)"


async def noop(request: Request) -> None:
    return None


@pytest.mark.parametrize(
    ("kind", "says"),
    [
        (
            Kind(GROUP, "v1", "Gizmo", "gizmos", namespaced=True),
            "serves Gizmo as 'gizmoes', not 'gizmos'",
        ),
        (
            Kind("missing.example.com", "v1", "Gizmo", "gizmoes", namespaced=True),
            "serves no API group 'missing.example.com': is its CustomResourceDefinition installed",
        ),
    ],
    ids=["wrong-plural", "no-crd"],
)
async def test_a_manager_whose_kind_is_not_served_says_why(
    client: Client, namespace: str, gizmo_crd: None, kind: Kind, says: str
) -> None:
    mgr = Manager(
        client,
        options=ManagerOptions(
            metrics_bind_address="0",
            health_probe_bind_address="0",
            cache_by_kind={kind: KindOptions(namespace=namespace)},
        ),
    )
    mgr.controller("gizmo").for_(kind).complete(noop)
    with anyio.fail_after(30), pytest.raises(CacheSyncError) as failed:
        await mgr.run_until_cancelled()
    assert says in str(failed.value)
    assert "CRD not installed" not in str(failed.value)  # the guess, replaced by the answer

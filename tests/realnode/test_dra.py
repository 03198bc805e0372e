"""A DRA driver on the real node (``gpusim dra``: ResourceSlices in the shape of NVIDIA's
current DRA driver, claims prepared as CDI specs): kube-scheduler allocates a claim, the
kubelet has the driver prepare it, and the container sees exactly what the allocation
names."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from hack.node.simulators import DRA_DRIVER, DraDriverSim, make_gpus
from sdgruntime.client import Client
from sdgruntime.envtest import ControlPlane
from sdgruntime.envtest.node import Node
from sdgruntime.kinds import PODS
from tests.e2e.harness import eventually
from tests.realnode.conftest import container_report, report_pod

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

GPUS = make_gpus(3, seed="dra")
RESOURCE = "/apis/resource.k8s.io/v1"


@pytest.fixture(scope="module")
def driver(node: Node, real_cp: ControlPlane) -> Iterator[DraDriverSim]:
    """The driver's kubelet plugin for 3 GPUs, and the DeviceClass its chart installs."""
    real_cp.apply(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": DRA_DRIVER},
            "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{DRA_DRIVER}'"}}]},
        }
    )
    sim = DraDriverSim(
        GPUS,
        node.work_dir / "gpusim",
        kubeconfig=real_cp.kubeconfig_path,
        node_name=node.name,
        kubelet_root_dir=node.root_dir,
        cdi_dir=node.cdi_dir,
    )
    sim.start()
    yield sim
    sim.stop()


def request(count: int) -> dict[str, Any]:
    return {
        "requests": [{"name": "gpu", "exactly": {"deviceClassName": DRA_DRIVER, "count": count}}]
    }


def create(cp: ControlPlane, namespace: str, kind: str, name: str, spec: dict[str, Any]) -> None:
    """Create a ResourceClaim or ResourceClaimTemplate in ``namespace``."""
    obj = {"apiVersion": "resource.k8s.io/v1", "kind": kind, "metadata": {"name": name}}
    r = cp.http.post(
        f"{RESOURCE}/namespaces/{namespace}/{kind.lower()}s", json={**obj, "spec": spec}
    )
    assert r.status_code == 201, r.text


def claiming_pod(name: str, source: dict[str, str]) -> dict[str, Any]:
    pod = report_pod(name)
    pod["spec"]["resourceClaims"] = [{"name": "gpu", **source}]
    pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    return pod


def allocated_uuids(cp: ControlPlane, driver: DraDriverSim, claim: dict[str, Any]) -> list[str]:
    """The UUIDs of the devices the claim's allocation names, from the driver's slices."""
    by_name = {
        d["name"]: d["attributes"]["uuid"]["string"]
        for s in driver.resource_slices()
        for d in s["spec"]["devices"]
    }
    results = claim["status"]["allocation"]["devices"]["results"]
    assert all(r["driver"] == DRA_DRIVER for r in results)
    return [by_name[r["device"]] for r in results]


def claim_of(cp: ControlPlane, namespace: str, name: str) -> dict[str, Any] | None:
    r = cp.http.get(f"{RESOURCE}/namespaces/{namespace}/resourceclaims/{name}")
    if r.status_code != 200:
        return None
    claim = r.json()
    return claim if (claim.get("status") or {}).get("allocation") else None


async def test_a_claims_pod_sees_what_its_allocation_names(
    driver: DraDriverSim, real_cp: ControlPlane, rclient: Client, rns: str
) -> None:
    create(real_cp, rns, "ResourceClaim", "two-gpus", {"devices": request(2)})
    await rclient.create(PODS, claiming_pod("trainer", {"resourceClaimName": "two-gpus"}), rns)
    report = await container_report(real_cp, rclient, rns, "trainer")
    claim = await eventually(lambda: claim_of(real_cp, rns, "two-gpus"), what="allocated")
    uuids = allocated_uuids(real_cp, driver, claim)
    assert len(uuids) == 2
    assert sorted(report.env["NVIDIA_VISIBLE_DEVICES"].split(",")) == sorted(uuids)
    given = [g for g in GPUS if report.env.get(f"SIM_GPU_{g.minor}") == g.uuid]
    assert sorted(g.uuid for g in given) == sorted(uuids)
    assert sorted(d for d in report.dev if d.startswith("nvidia")) == sorted(
        f"nvidia{g.minor}" for g in given
    )


async def test_a_claim_template_is_made_into_a_claim_by_the_controller_manager(
    driver: DraDriverSim, real_cp: ControlPlane, rclient: Client, rns: str
) -> None:
    create(real_cp, rns, "ResourceClaimTemplate", "one-gpu", {"spec": {"devices": request(1)}})
    pod = claiming_pod("notebook", {"resourceClaimTemplateName": "one-gpu"})
    await rclient.create(PODS, pod, rns)
    report = await container_report(real_cp, rclient, rns, "notebook")
    got = await rclient.get(PODS, "notebook", rns)
    statuses = got["status"]["resourceClaimStatuses"]
    claim = claim_of(real_cp, rns, statuses[0]["resourceClaimName"])
    assert claim is not None
    assert report.env["NVIDIA_VISIBLE_DEVICES"] == allocated_uuids(real_cp, driver, claim)[0]

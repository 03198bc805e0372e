"""The manager as a real pod on the real node, from the project's image (built here by
hack/image.py, imported into the node's containerd): it runs as its non-root user under
its ServiceAccount's RBAC, becomes ready and takes the leader Lease."""

from __future__ import annotations

import os
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from hack.image import build_image, cannot_build, save_image
from sdgruntime.client import Client
from sdgruntime.envtest import ControlPlane
from sdgruntime.envtest.controlplane import free_port
from sdgruntime.envtest.images import Image
from sdgruntime.envtest.node import Node
from sdgruntime.kinds import PODS
from tests.e2e.harness import MANAGER_NS, eventually, manager_kubeconfig
from tests.realnode.conftest import cannot_run

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

UID = 65532  # the image's USER


@pytest.fixture(scope="module")
def manager_image(node: Node) -> Iterator[str]:
    """The image, built or found up to date, imported into the node's containerd."""
    reason = cannot_build()
    if reason:
        cannot_run(reason)
    tag = build_image()
    tar = save_image(tag, node.work_dir / "sdg-manager.tar")
    node.import_image(Image(tag, tar))
    yield tag


def leader(cp: ControlPlane) -> str | None:
    """The holder of the manager's leader Lease, if there is one."""
    path = f"/apis/coordination.k8s.io/v1/namespaces/{MANAGER_NS}/leases/deviceshare-manager"
    r = cp.http.get(path)
    return r.json()["spec"].get("holderIdentity") if r.status_code == 200 else None


def owned_copy(src: Path, dst: Path) -> Path:
    """``src`` copied for the image's user to read (a hostPath keeps owners and modes)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)
    os.chown(dst, UID, UID)
    dst.chmod(0o400)
    return dst


async def test_the_manager_runs_as_a_pod_from_the_image(
    manager_image: str, node: Node, real_cp: ControlPlane, rclient: Client
) -> None:
    files = node.work_dir / "manager-files"
    owned_copy(Path(manager_kubeconfig(real_cp)), files / "kubeconfig")
    certs = real_cp.webhook_cert_dir()
    for name in ("tls.crt", "tls.key"):
        owned_copy(certs / name, files / "certs" / name)
    probe = free_port()
    before = leader(real_cp)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "deviceshare-manager"},
        "spec": {
            "hostNetwork": True,  # the local API server listens on 127.0.0.1
            "terminationGracePeriodSeconds": 5,
            "containers": [
                {
                    "name": "manager",
                    "image": manager_image,
                    "imagePullPolicy": "Never",
                    "args": [
                        "--kubeconfig=/etc/sdg/kubeconfig",
                        f"--health-probe-bind-address=127.0.0.1:{probe}",
                        "--metrics-bind-address=127.0.0.1:0",
                        "--webhook-host=127.0.0.1",
                        f"--webhook-port={free_port()}",
                        "--webhook-cert-dir=/etc/sdg/certs",
                        "--leader-elect",
                        f"--leader-election-namespace={MANAGER_NS}",
                        f"--claims-namespace={MANAGER_NS}",
                    ],
                    "volumeMounts": [{"name": "files", "mountPath": "/etc/sdg", "readOnly": True}],
                    "securityContext": {"runAsNonRoot": True, "allowPrivilegeEscalation": False},
                }
            ],
            "volumes": [{"name": "files", "hostPath": {"path": str(files), "type": "Directory"}}],
        },
    }
    await rclient.create(PODS, pod, MANAGER_NS)
    try:

        async def ready() -> bool:
            try:
                async with httpx.AsyncClient(timeout=2) as http:
                    r = await http.get(f"http://127.0.0.1:{probe}/readyz")
            except httpx.HTTPError:
                return False
            return r.status_code == 200

        await eventually(ready, within=90, interval=0.5, what="the manager pod's /readyz")
        running = await rclient.get(PODS, "deviceshare-manager", MANAGER_NS)
        assert running["status"]["phase"] == "Running"
        assert running["spec"]["nodeName"] == node.name
        user = running["status"]["containerStatuses"][0].get("user", {}).get("linux", {})
        assert user.get("uid") == UID, running["status"]["containerStatuses"]

        holder = await eventually(
            lambda: (h := leader(real_cp)) != before and h, within=30, what="the leader Lease"
        )
        # hostname_<uuid>: a hostNetwork pod has the machine's hostname.
        assert holder.startswith(f"{socket.gethostname()}_"), holder
    finally:
        real_cp.http.delete(
            f"/api/v1/namespaces/{MANAGER_NS}/pods/deviceshare-manager",
            params={"gracePeriodSeconds": 0},
        )

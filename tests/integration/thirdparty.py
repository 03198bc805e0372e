"""The test stand-ins of third-party CRDs (hack/testdata), installed and removed on demand.

config/default must apply where only cert-manager is installed, and the prometheus
overlays need the Prometheus Operator's ServiceMonitor: tests set the session's API server
to exactly the CRDs the case under test assumes, whatever an earlier test installed.
"""

from __future__ import annotations

import time
from pathlib import Path

from sdgruntime.envtest import ControlPlane
from sdgruntime.envtest.controlplane import load_manifests

TESTDATA = Path(__file__).resolve().parents[2] / "hack" / "testdata"
CERT_MANAGER = TESTDATA / "cert-manager-crds.yaml"
MONITORING = TESTDATA / "monitoring-crds.yaml"
MONITORING_API = "/apis/monitoring.coreos.com/v1"


def install(cp: ControlPlane, path: Path) -> None:
    cp.install_crds([path])


def remove(cp: ControlPlane, path: Path, timeout: float = 30.0) -> None:
    """Delete the CRDs in ``path`` and wait until the API server no longer serves them."""
    crds = [d for d in load_manifests([path]) if d["kind"] == "CustomResourceDefinition"]
    for crd in crds:
        cp.delete("apiextensions.k8s.io/v1", "CustomResourceDefinition", crd["metadata"]["name"])
    deadline = time.monotonic() + timeout
    for crd in crds:
        gv = f"/apis/{crd['spec']['group']}/{crd['spec']['versions'][0]['name']}"
        url = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd['metadata']['name']}"
        while cp.http.get(url).status_code != 404 or cp.http.get(gv).status_code != 404:
            assert time.monotonic() < deadline, f"{crd['metadata']['name']} still served"
            time.sleep(0.1)

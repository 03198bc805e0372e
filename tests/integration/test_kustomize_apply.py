"""``kubectl apply --server-side -k config/default`` for real, stored by the local API server.

The dry-run tests (test_kustomize.py) check every overlay; this one stores the default
install on a server with cert-manager's CRDs and no Prometheus Operator (the ServiceMonitor
CRD is removed first, whatever an earlier test installed), checks what the server kept, and
removes what could affect other tests (the webhook configurations point at a Service with
no endpoints here). The CRD, RBAC, the admission policies and the namespace stay: they are
the same objects the e2e tests install.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sdgruntime.envtest import ControlPlane
from tests.integration import thirdparty

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
KUBECTL = Path(sys.executable).parent / "kubectl"


def kubectl(kubeconfig: Path, *args: str, stdin: str | None = None) -> str:
    out = subprocess.run(
        [str(KUBECTL), "--kubeconfig", str(kubeconfig), *args],
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert out.returncode == 0, f"kubectl {' '.join(args)}:\n{out.stderr}"
    return out.stdout


def test_apply_k_config_default_is_stored(control_plane: ControlPlane) -> None:
    # A cluster with cert-manager only: config/default must not need the Prometheus Operator.
    thirdparty.install(control_plane, thirdparty.CERT_MANAGER)
    thirdparty.remove(control_plane, thirdparty.MONITORING)
    assert control_plane.http.get(thirdparty.MONITORING_API).status_code == 404
    kc = control_plane.kubeconfig_path
    built = [
        d
        for d in yaml.safe_load_all(kubectl(kc, "kustomize", str(ROOT / "config" / "default")))
        if d
    ]
    transient = [
        d
        for d in built
        if d["kind"]
        not in (
            "CustomResourceDefinition",
            "Namespace",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
            "ServiceAccount",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
        )
    ]
    try:
        kubectl(
            kc,
            "apply",
            "--server-side",
            "--force-conflicts",
            "-k",
            str(ROOT / "config" / "default"),
        )
        deploy = yaml.safe_load(
            kubectl(
                kc, "-n", "deviceshare-system", "get", "deploy", "deviceshare-manager", "-o", "yaml"
            )
        )
        container = deploy["spec"]["template"]["spec"]["containers"][0]
        assert container["command"] == ["sdg-manager"]
        # The metrics Service stays in config/default: any scraper can use it.
        metrics = yaml.safe_load(
            kubectl(
                kc,
                "-n",
                "deviceshare-system",
                "get",
                "service",
                "deviceshare-manager-metrics-service",
                "-o",
                "yaml",
            )
        )
        assert metrics["spec"]["ports"][0]["targetPort"] == "metrics"
        assert "--leader-elect" in container["args"]
        assert deploy["spec"]["template"]["spec"]["serviceAccountName"] == "deviceshare-manager"
        hook = yaml.safe_load(
            kubectl(
                kc,
                "get",
                "mutatingwebhookconfiguration",
                "deviceshare-mutating-webhook-configuration",
                "-o",
                "yaml",
            )
        )
        cert = next(d for d in built if d["kind"] == "Certificate")
        assert hook["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == (
            f"deviceshare-system/{cert['metadata']['name']}"
        )
        service = hook["webhooks"][0]["clientConfig"]["service"]
        assert (service["namespace"], service["name"]) == (
            "deviceshare-system",
            "deviceshare-webhook-service",
        )
        assert hook["webhooks"][0]["matchConditions"][0]["name"] == "joins-a-shared-device-group"
        names = kubectl(kc, "get", "crd", "-o", "name")
        assert (
            "customresourcedefinition.apiextensions.k8s.io/shareddevicegroups.deviceshare.io"
            in (names)
        )
        # Stored as written: the API server compiled every CEL expression on the way in.
        for name in (
            "deviceshare-group-membership",
            "deviceshare-ephemeral-container-devices",
            "deviceshare-group-pods",
        ):
            policy = yaml.safe_load(
                kubectl(kc, "get", "validatingadmissionpolicy", name, "-o", "yaml")
            )
            assert "namespace" not in policy["metadata"]
            assert policy["spec"]["failurePolicy"] == "Fail"
            binding = yaml.safe_load(
                kubectl(kc, "get", "validatingadmissionpolicybinding", name, "-o", "yaml")
            )
            assert binding["spec"]["policyName"] == name
        role = yaml.safe_load(
            kubectl(kc, "get", "clusterrole", "deviceshare-manager-role", "-o", "yaml")
        )
        assert {"apiGroups": [""], "resources": ["pods/binding"], "verbs": ["create"]} in (
            role["rules"]
        )
    finally:
        with contextlib.suppress(AssertionError):
            kubectl(
                kc,
                "delete",
                "--ignore-not-found",
                "--wait=false",
                "-f",
                "-",
                stdin=yaml.safe_dump_all(transient),
            )

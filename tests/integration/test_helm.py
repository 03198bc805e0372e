"""The Helm chart (charts/shared-device-group) with a helm built from hack/helm.

- ``helm lint --strict``, and a packaged chart that renders like the chart folder;
- ``helm template`` applied to the session's API server with ``--dry-run=server``: every
  object is decoded, validated (unknown fields fail) and admitted, nothing is stored;
- the rendered objects are config/default's (with monitoring on: overlays/prometheus's),
  compared as the API server answers for both (so defaults do not count as differences):
  kinds and names, and every object whole, except labels Helm adds, cert material and
  args, which are compared as the manager's own flag parser reads them;
- values reach the manager as the flags they name, and a namespace is templated everywhere;
- ``helm install``/``upgrade``/``uninstall`` for real, once with the chart's generated
  certificates and once with cert-manager's (test stand-ins of its CRDs, no controller).

Install/upgrade/uninstall each get their own control plane instead of the session's: the
chart makes cluster-scoped singletons (CRD, ClusterRole, webhook configurations, admission
policies) that the session's other tests install under the same names, and uninstalling
them there would take them from those tests. Nothing here creates a pod or a group while
the chart's webhook configurations exist: the API server would try to call the webhook
Service, whose ClusterIP reaches nothing on this machine.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_pem_private_key
from cryptography.x509.oid import ExtendedKeyUsageOID

from controllers.settings import parse
from sdgruntime.envtest import ControlPlane
from sdgruntime.envtest.helm import ensure_helm
from tests.integration import thirdparty

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "shared-device-group"
KUBECTL = Path(sys.executable).parent / "kubectl"
NAMESPACE = "deviceshare-system"
RELEASE = "sdg"
CRD = "shareddevicegroups.deviceshare.io"
PRODUCTION_VALUES = CHART / "examples" / "production-values.yaml"
# config/default's certificate is cert-manager's; overlays/prometheus adds monitoring.
LIKE_CONFIG_DEFAULT = ["--set=certificates.source=cert-manager"]
WITH_MONITORING = [
    "--set=metrics.serviceMonitor.enabled=true",
    "--set=grafana.dashboard.enabled=true",
]
# Each kustomize build and the chart values that should make exactly its objects.
COMPARED = {
    "default": LIKE_CONFIG_DEFAULT,
    "overlays/prometheus": LIKE_CONFIG_DEFAULT + WITH_MONITORING,
    "overlays/network-policy": [*LIKE_CONFIG_DEFAULT, "--set=networkPolicy.enabled=true"],
    "overlays/production": [*LIKE_CONFIG_DEFAULT, "-f", str(PRODUCTION_VALUES)],
}
# Labels the chart adds (Helm's conventions) or sets differently (managed-by).
HELM_LABELS = {
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/managed-by",
    "helm.sh/chart",
}
CLUSTER_SCOPED = {
    "ClusterRole",
    "ClusterRoleBinding",
    "CustomResourceDefinition",
    "MutatingWebhookConfiguration",
    "PriorityClass",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
    "ValidatingWebhookConfiguration",
}

Obj = dict[str, Any]


class Helm:
    """The helm binary with its own config/cache/data folders (never the user's)."""

    def __init__(self, binary: Path, home: Path) -> None:
        self.binary = binary
        self.env = {
            **os.environ,
            "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_DATA_HOME": str(home / "data"),
        }

    def run(self, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        out = subprocess.run(
            [str(self.binary), *args],
            capture_output=True,
            text=True,
            check=False,
            env=self.env,
            timeout=180,
        )
        if ok:
            assert out.returncode == 0, f"helm {' '.join(args)}:\n{out.stderr}"
        return out

    def template(
        self, *args: str, namespace: str = NAMESPACE, chart: Path = CHART, tests: bool = False
    ) -> list[Obj]:
        """The chart's objects; its `helm test` hooks only with ``tests``."""
        skip = () if tests else ("--skip-tests",)
        out = self.run("template", RELEASE, str(chart), "--namespace", namespace, *skip, *args)
        return [d for d in yaml.safe_load_all(out.stdout) if d]


@pytest.fixture(scope="module")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(ensure_helm(), tmp_path_factory.mktemp("helm-home"))


def kubectl(kubeconfig: Path | str, *args: str, stdin: str | None = None) -> str:
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


def kustomize(overlay: str) -> list[Obj]:
    out = subprocess.run(
        [str(KUBECTL), "kustomize", str(ROOT / "config" / overlay)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def dry_run(kubeconfig: Path | str, docs: list[Obj], manager: str) -> list[Obj]:
    """What the API server makes of the objects (server-side apply, ``--dry-run=server``)."""
    out = kubectl(
        kubeconfig,
        "apply",
        "--server-side",
        "--dry-run=server",
        # Other tests store some of these objects under other field managers.
        "--force-conflicts",
        f"--field-manager={manager}",
        "-o",
        "json",
        "-f",
        "-",
        stdin=yaml.safe_dump_all(docs),
    )
    result = json.loads(out)
    return result["items"] if result.get("kind") == "List" else [result]


def by_key(objs: list[Obj]) -> dict[tuple[str, str], Obj]:
    keyed = {(o["kind"], o["metadata"]["name"]): o for o in objs}
    assert len(keyed) == len(objs), "two objects of one kind and name"
    return keyed


def one(objs: list[Obj], kind: str, name: str | None = None) -> Obj:
    found = [o for o in objs if o["kind"] == kind and name in (None, o["metadata"]["name"])]
    assert len(found) == 1, f"expected one {kind} {name or ''}, got {len(found)}"
    return found[0]


def container(objs: list[Obj]) -> Obj:
    (c,) = one(objs, "Deployment", "deviceshare-manager")["spec"]["template"]["spec"]["containers"]
    return dict(c)


def settings_of(c: Obj, namespace: str = NAMESPACE) -> Any:
    """The manager's settings exactly as its flag parser reads this container's args + env."""
    env = {e["name"]: e["value"] for e in c.get("env", []) if "value" in e}
    return parse(c["args"], environ={"POD_NAMESPACE": namespace, **env})


def without_helm_labels(labels: dict[str, str] | None) -> dict[str, str]:
    return {k: v for k, v in (labels or {}).items() if k not in HELM_LABELS}


def comparable(obj: Obj) -> Obj:
    """The object as the API server answered, minus what legitimately differs."""
    obj = json.loads(json.dumps(obj))
    meta = obj.pop("metadata")
    obj.pop("status", None)
    obj["metadata"] = {"name": meta["name"], "namespace": meta.get("namespace")}
    kind = obj["kind"]
    if kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        for hook in obj["webhooks"]:
            hook["clientConfig"].pop("caBundle", None)
    elif kind == "Service":  # allocated by the server on each (dry) run
        for field in ("clusterIP", "clusterIPs"):
            obj["spec"].pop(field, None)
    elif kind == "Deployment":
        template = obj["spec"]["template"]
        template["metadata"]["labels"] = without_helm_labels(template["metadata"]["labels"])
        (c,) = template["spec"]["containers"]
        c["args"] = settings_of(c).model_dump()
    elif kind == "ConfigMap":
        obj["data"] = {k: json.loads(v) for k, v in obj["data"].items()}
    return obj


@pytest.fixture(scope="module")
def cluster(control_plane: ControlPlane) -> ControlPlane:
    """The session's control plane with the third-party CRD stand-ins and the namespace."""
    thirdparty.install(control_plane, thirdparty.CERT_MANAGER)
    thirdparty.install(control_plane, thirdparty.MONITORING)  # for overlays/prometheus
    r = control_plane.http.post(
        "/api/v1/namespaces",
        json={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
    )
    assert r.status_code in (201, 409), r.text
    return control_plane


# --- lint, package ------------------------------------------------------------------------


def test_lint(helm: Helm, tmp_path: Path) -> None:
    out = helm.run("lint", "--strict", str(CHART))
    assert "1 chart(s) linted, 0 chart(s) failed" in out.stdout
    values = {
        "replicaCount": 2,
        "podDisruptionBudget": {"enabled": True},
        "deviceEnv": {"example.com/npu": "NPU_VISIBLE_DEVICES"},
        "delivery": {"mode": "runtimeclass", "runtimeClassName": "nvidia-cdi"},
        "draDrivers": {"gpu.example.com": "example.com/gpu"},
        "metrics": {"serviceMonitor": {"enabled": True}},
        "grafana": {"dashboard": {"enabled": True}},
        "certificates": {"source": "cert-manager"},
    }
    (tmp_path / "values.yaml").write_text(yaml.safe_dump(values))
    helm.run("lint", "--strict", str(CHART), "-f", str(tmp_path / "values.yaml"))


def test_schema_and_guards_refuse_bad_values(helm: Helm) -> None:
    cases = {
        ("--set=delivery.mode=nvidia",): "value must be one of",
        ("--set=replicas=2",): "additional properties 'replicas' not allowed",
        ("--set=logLevel=trace",): "value must be one of",
        ("--set-string=deviceEnv.nvidia\\.com/gpu=bad-name",): "does not match pattern",
        ("--set=replicaCount=2", "--set=leaderElection.enabled=false"): "needs leaderElection",
    }
    for args, message in cases.items():
        out = helm.run("template", RELEASE, str(CHART), *args, ok=False)
        assert out.returncode != 0 and message in out.stderr, (args, out.stderr)


def test_packaged_chart_is_self_contained(helm: Helm, tmp_path: Path) -> None:
    """files/ links into config/; `helm package` must carry the linked files themselves."""
    helm.run("package", str(CHART), "--destination", str(tmp_path))
    (tgz,) = tmp_path.glob("shared-device-group-*.tgz")
    with tarfile.open(tgz) as tar:
        members = tar.getmembers()
    assert all(m.isfile() for m in members), [m.name for m in members if not m.isfile()]
    names = {m.name.removeprefix("shared-device-group/") for m in members}
    assert {"files/crd/deviceshare.io_shareddevicegroups.yaml", "files/rbac/role.yaml"} <= names
    assert not any(n.endswith("kustomization.yaml") for n in names)

    from_dir = by_key(helm.template(*COMPARED["overlays/prometheus"]))
    from_tgz = by_key(helm.template(*COMPARED["overlays/prometheus"], chart=tgz))
    assert from_dir.keys() == from_tgz.keys()
    for key in (("CustomResourceDefinition", CRD), ("ClusterRole", "deviceshare-manager-role")):
        assert from_dir[key] == from_tgz[key]


# --- the same objects as config/default ---------------------------------------------------


@pytest.fixture(scope="module", params=list(COMPARED))
def answered(
    request: pytest.FixtureRequest, helm: Helm, cluster: ControlPlane
) -> tuple[list[Obj], list[Obj]]:
    """(a kustomize build, the chart like it) as the API server's dry run answers them."""
    kc = cluster.kubeconfig_path
    config = dry_run(kc, kustomize(request.param), "sdg-helm-test-kustomize")
    chart = dry_run(kc, helm.template(*COMPARED[request.param]), "sdg-helm-test-chart")
    return config, chart


def test_chart_makes_the_objects_of_config_default(
    answered: tuple[list[Obj], list[Obj]],
) -> None:
    config, chart = answered
    config_keys = {k for k in by_key(config) if k[0] != "Namespace"}
    # A chart installs into its release namespace (helm install --create-namespace).
    assert ("Namespace", NAMESPACE) in by_key(config)
    assert set(by_key(chart)) == config_keys
    config_objs = by_key(config)
    for key, obj in by_key(chart).items():
        expected = config_objs[key]
        labels = obj["metadata"].get("labels") or {}
        annotations = obj["metadata"].get("annotations") or {}
        for k, v in without_helm_labels(expected["metadata"].get("labels")).items():
            assert labels.get(k) == v, (key, k)
        for k, v in (expected["metadata"].get("annotations") or {}).items():
            assert annotations.get(k) == v, (key, k)
        assert comparable(obj) == comparable(expected), key


def test_rbac_webhooks_and_security_context_match_exactly(
    answered: tuple[list[Obj], list[Obj]],
) -> None:
    """The parts whose drift would matter most, spelled out (the whole-object test above
    covers them too)."""
    config, chart = answered
    for kind in ("ClusterRole", "Role", "ClusterRoleBinding", "RoleBinding"):
        fields = ("rules",) if kind.endswith("Role") else ("roleRef", "subjects")

        def of(objs: list[Obj], kind: str = kind, fields: tuple[str, ...] = fields) -> Obj:
            return {
                o["metadata"]["name"]: [o.get(f) for f in fields] for o in objs if o["kind"] == kind
            }

        assert of(chart) == of(config), kind
    # Aggregated into view/edit/admin by these labels.
    for name in ("shareddevicegroup-viewer-role", "shareddevicegroup-editor-role"):
        want = one(config, "ClusterRole", name)["metadata"]["labels"]
        got = one(chart, "ClusterRole", name)["metadata"]["labels"]
        assert {k: v for k, v in want.items() if k.startswith("rbac.")}.items() <= got.items()
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        hooks, wanted = one(chart, kind)["webhooks"], one(config, kind)["webhooks"]
        assert [h["name"] for h in hooks] == [w["name"] for w in wanted], kind
        for hook, want in zip(hooks, wanted, strict=True):
            for field in ("rules", "failurePolicy", "sideEffects", "timeoutSeconds"):
                assert hook[field] == want[field], (kind, hook["name"], field)
            assert hook.get("matchConditions") == want.get("matchConditions"), hook["name"]
            assert hook["clientConfig"]["service"] == want["clientConfig"]["service"]
    spec = one(chart, "Deployment")["spec"]["template"]["spec"]
    want_spec = one(config, "Deployment")["spec"]["template"]["spec"]
    assert spec["securityContext"] == want_spec["securityContext"]
    assert container(chart)["securityContext"] == container(config)["securityContext"]
    assert container(chart)["args"][0] == "--leader-elect"
    assert settings_of(container(chart)) == settings_of(container(config))
    for kind in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"):
        assert {o["metadata"]["name"]: o["spec"] for o in chart if o["kind"] == kind} == {
            o["metadata"]["name"]: o["spec"] for o in config if o["kind"] == kind
        }
    crd = one(chart, "CustomResourceDefinition")
    assert crd["spec"] == one(config, "CustomResourceDefinition")["spec"]
    holder_class = one(chart, "PriorityClass")
    want_class = one(config, "PriorityClass")
    for key in ("value", "preemptionPolicy"):
        assert holder_class[key] == want_class[key]


def test_self_signed_path_is_accepted_by_the_api_server(helm: Helm, cluster: ControlPlane) -> None:
    rendered = helm.template(
        "--set=certificates.source=helm", "--set=podDisruptionBudget.enabled=true"
    )
    answer = dry_run(cluster.kubeconfig_path, rendered, "sdg-helm-test-chart")
    assert [(o["kind"], o["metadata"]["name"]) for o in answer] == [
        (o["kind"], o["metadata"]["name"]) for o in rendered
    ]
    kinds = {o["kind"] for o in answer}
    assert {"Secret", "PodDisruptionBudget"} <= kinds
    assert not {"Certificate", "Issuer", "ServiceMonitor"} & kinds
    for obj in answer:
        assert obj["metadata"].get("namespace") == (
            None if obj["kind"] in CLUSTER_SCOPED else NAMESPACE
        ), obj["kind"]


# --- certificates -------------------------------------------------------------------------


def check_serving_pair(tls: dict[str, str], namespace: str) -> x509.Certificate:
    """The Secret's pair is a serving certificate for the webhook Service, signed by its CA."""
    ca = x509.load_pem_x509_certificate(base64.b64decode(tls["ca.crt"]))
    leaf = x509.load_pem_x509_certificate(base64.b64decode(tls["tls.crt"]))
    leaf.verify_directly_issued_by(ca)
    svc = f"deviceshare-webhook-service.{namespace}.svc"
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == [svc, f"{svc}.cluster.local"]
    eku = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.SERVER_AUTH in eku
    key = load_pem_private_key(base64.b64decode(tls["tls.key"]), password=None)
    assert key.public_key() == leaf.public_key()
    # P-256, not RSA: the webhook signs in every TLS handshake the API server dials.
    assert isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.name == "secp256r1"
    return ca


def test_certificate_source(helm: Helm) -> None:
    """auto: cert-manager where the cluster serves it, else the chart's own CA and pair."""
    for args in ((), ("--set=certificates.source=helm",)):
        objs = helm.template(*args)
        secret = one(objs, "Secret", "webhook-server-cert")
        assert secret["type"] == "kubernetes.io/tls"
        check_serving_pair(secret["data"], NAMESPACE)
        assert not [o for o in objs if o["kind"] in ("Certificate", "Issuer")]
        for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            config = one(objs, kind)
            assert "cert-manager.io/inject-ca-from" not in (
                config["metadata"].get("annotations") or {}
            )
            for hook in config["webhooks"]:
                assert hook["clientConfig"]["caBundle"] == secret["data"]["ca.crt"]

    for args in (("--api-versions=cert-manager.io/v1/Certificate",), LIKE_CONFIG_DEFAULT):
        objs = helm.template(*args)
        assert not [o for o in objs if o["kind"] == "Secret"]
        cert = one(objs, "Certificate")
        assert cert["spec"]["secretName"] == "webhook-server-cert"
        assert cert["spec"]["privateKey"] == {
            "algorithm": "ECDSA",
            "size": 256,
            "rotationPolicy": "Always",
        }
        for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            config = one(objs, kind)
            ref = config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
            assert ref == f"{NAMESPACE}/{cert['metadata']['name']}"
            assert all("caBundle" not in h["clientConfig"] for h in config["webhooks"])

    # An Issuer of the cluster's instead of the chart's self-signed one.
    objs = helm.template(
        "--set=certificates.source=cert-manager",
        "--set=certificates.certManager.issuerRef.kind=ClusterIssuer",
        "--set=certificates.certManager.issuerRef.name=corporate-ca",
    )
    assert not [o for o in objs if o["kind"] == "Issuer"]
    assert one(objs, "Certificate")["spec"]["issuerRef"] == {
        "kind": "ClusterIssuer",
        "name": "corporate-ca",
    }


# --- values -------------------------------------------------------------------------------


def test_values_become_manager_flags_only_when_set(helm: Helm) -> None:
    default = container(helm.template())
    for flag in (
        "--device-env",
        "--delivery",
        "--device-ids",
        "--runtime-class-name",
        "--cdi-annotation-prefix",
        "--resource-slices",
        "--dra-drivers",
    ):
        assert not [a for a in default["args"] if a.startswith(flag)], flag

    values = [
        "--set-string=deviceEnv.example\\.com/npu=NPU_VISIBLE_DEVICES",
        "--set-string=deviceEnv.vendor\\.io/accel*=ACCEL_VISIBLE_DEVICES",
        "--set=delivery.mode=cdi",
        "--set=delivery.deviceIds=uuid",
        "--set=delivery.runtimeClassName=nvidia-cdi",
        "--set=delivery.cdiAnnotationPrefix=cdi.k8s.io/",
        "--set=resourceSlices=off",
        "--set-string=draDrivers.gpu\\.example\\.com=example.com/gpu",
        "--set-string=draDrivers.npu\\.example\\.com=example.com/npu",
        "--set=logLevel=debug",
        "--set=logFormat=text",
        "--set=schedulerName=gpu-share-scheduler",
        "--set=leaderElection.id=sdg-leader",
        "--set=extraArgs[0]=--pod-workers=16",
    ]
    objs = helm.template(*values)
    s = settings_of(container(objs))
    assert s.env_table()["example.com/npu"] == "NPU_VISIBLE_DEVICES"
    assert s.env_table()["vendor.io/accel*"] == "ACCEL_VISIBLE_DEVICES"
    assert s.env_table()["nvidia.com/gpu"] == "NVIDIA_VISIBLE_DEVICES"  # built-ins stay
    assert (s.delivery, s.device_ids, s.runtime_class_name, s.cdi_annotation_prefix) == (
        "cdi",
        "uuid",
        "nvidia-cdi",
        "cdi.k8s.io/",
    )
    assert s.resource_slices == "off"
    drivers = s.dra_driver_table()
    assert drivers["gpu.example.com"] == "example.com/gpu"
    assert drivers["npu.example.com"] == "example.com/npu"
    assert (s.log_level, s.log_format) == ("debug", "text")
    assert (s.scheduler_name, s.leader_elect, s.leader_election_id) == (
        "gpu-share-scheduler",
        True,
        "sdg-leader",
    )
    assert s.pod_workers == 16
    # The pod webhook's matchConditions follow the scheduler name.
    (cond,) = one(objs, "MutatingWebhookConfiguration")["webhooks"][0]["matchConditions"]
    assert "object.spec.schedulerName == 'gpu-share-scheduler'" in cond["expression"]
    assert "deviceshare-scheduler" not in cond["expression"]

    assert (
        settings_of(container(helm.template("--set=leaderElection.enabled=false"))).leader_elect
        is False
    )


def test_pod_values(helm: Helm, tmp_path: Path) -> None:
    values = {
        "image": {
            "repository": "registry.example/sdg",
            "tag": "1.2.3",
            "digest": "sha256:" + "a" * 64,
        },
        "replicaCount": 2,
        "strategy": {
            "type": "RollingUpdate",
            "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
        },
        "resources": {
            "requests": {"cpu": "200m", "memory": "256Mi"},
            "limits": {"cpu": "2", "memory": "1Gi"},
        },
        "nodeSelector": {"node-role.kubernetes.io/control-plane": ""},
        "tolerations": [{"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}],
        "affinity": {
            "podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 100,
                        "podAffinityTerm": {
                            "topologyKey": "kubernetes.io/hostname",
                            "labelSelector": {
                                "matchLabels": {"app.kubernetes.io/component": "manager"}
                            },
                        },
                    }
                ]
            }
        },
        "priorityClassName": "system-cluster-critical",
        "podDisruptionBudget": {"enabled": True, "minAvailable": 1},
        "serviceAccount": {"annotations": {"example.com/role": "sdg"}},
    }
    (tmp_path / "values.yaml").write_text(yaml.safe_dump(values))
    objs = helm.template("-f", str(tmp_path / "values.yaml"))
    deploy = one(objs, "Deployment")
    spec = deploy["spec"]["template"]["spec"]
    c = container(objs)
    assert c["image"] == "registry.example/sdg:1.2.3@sha256:" + "a" * 64
    assert deploy["spec"]["replicas"] == 2
    assert deploy["spec"]["strategy"] == values["strategy"]
    assert c["resources"] == values["resources"]
    for field in ("nodeSelector", "tolerations", "affinity", "priorityClassName"):
        assert spec[field] == values[field], field
    pdb = one(objs, "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == deploy["spec"]["selector"]["matchLabels"]
    assert one(objs, "ServiceAccount")["metadata"]["annotations"] == {"example.com/role": "sdg"}
    assert "PodDisruptionBudget" not in {o["kind"] for o in helm.template()}


def test_webhook_port_only_from_the_api_servers_cidrs(helm: Helm, cluster: ControlPlane) -> None:
    """networkPolicy.webhookFrom: the webhook port only from those CIDRs (the API server
    accepts them), else from anywhere; a value that is no CIDR is refused by the schema."""
    webhook = "deviceshare-allow-webhook-traffic"
    anywhere = one(helm.template("--set=networkPolicy.enabled=true"), "NetworkPolicy", webhook)
    assert anywhere["spec"]["ingress"] == [{"ports": [{"port": 9443, "protocol": "TCP"}]}]
    objs = helm.template(
        "--set=networkPolicy.enabled=true",
        "--set=networkPolicy.webhookFrom={10.0.0.0/28,fd00::/64}",
    )
    policy = one(objs, "NetworkPolicy", webhook)
    assert policy["spec"]["ingress"] == [
        {
            "ports": [{"port": 9443, "protocol": "TCP"}],
            "from": [{"ipBlock": {"cidr": "10.0.0.0/28"}}, {"ipBlock": {"cidr": "fd00::/64"}}],
        }
    ]
    (answered,) = dry_run(cluster.kubeconfig_path, [policy], "sdg-helm-test-webhook-from")
    assert answered["spec"]["ingress"][0]["from"] == policy["spec"]["ingress"][0]["from"]
    out = helm.run(
        "template", RELEASE, str(CHART), "--set=networkPolicy.webhookFrom={10.0.0.1}", ok=False
    )
    assert out.returncode != 0 and "does not match pattern" in out.stderr, out.stderr


def test_release_namespace_is_used_everywhere(helm: Helm) -> None:
    ns = "gpu-sharing"
    objs = helm.template(*LIKE_CONFIG_DEFAULT, *WITH_MONITORING, namespace=ns)
    for obj in objs:
        assert obj["metadata"].get("namespace") == (None if obj["kind"] in CLUSTER_SCOPED else ns)
        # The dashboard's namespace variable has a default value only; pick it in Grafana.
        if obj["kind"] != "ConfigMap":
            assert NAMESPACE not in json.dumps(obj), obj["kind"]
    bindings = [o for o in objs if o["kind"] in ("ClusterRoleBinding", "RoleBinding")]
    assert len(bindings) == 3  # the manager's two, and the metrics reviews'
    # The membership policy holds the release's manager ServiceAccount to its one status use.
    membership = json.dumps(one(objs, "ValidatingAdmissionPolicy", "deviceshare-group-membership"))
    assert f"system:serviceaccount:{ns}:deviceshare-manager" in membership
    for binding in bindings:
        assert binding["subjects"][0]["namespace"] == ns
    svc = f"deviceshare-webhook-service.{ns}.svc"
    assert one(objs, "Certificate")["spec"]["dnsNames"] == [svc, f"{svc}.cluster.local"]
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        config = one(objs, kind)
        assert config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"].startswith(
            f"{ns}/"
        )
        assert config["webhooks"][0]["clientConfig"]["service"]["namespace"] == ns
    secret = one(helm.template("--set=certificates.source=helm", namespace=ns), "Secret")
    check_serving_pair(secret["data"], ns)


# --- install, upgrade, uninstall for real -------------------------------------------------


@pytest.fixture
def own_control_plane() -> Iterator[ControlPlane]:
    """A control plane of this test's alone, with no CRDs: the chart brings its own."""
    with ControlPlane() as cp:
        yield cp


def stored(kubeconfig: Path, manifest: str) -> list[str]:
    """kind/name of each object of the manifest that the API server has."""
    docs = [d for d in yaml.safe_load_all(manifest) if d]
    out = kubectl(
        kubeconfig,
        "get",
        "--ignore-not-found",
        "-o",
        "name",
        "-f",
        "-",
        stdin=yaml.safe_dump_all(docs),
    )
    return sorted(out.split())


def names_in(manifest: str) -> list[tuple[str, str]]:
    return sorted((d["kind"], d["metadata"]["name"]) for d in yaml.safe_load_all(manifest) if d)


def get(kubeconfig: Path, *args: str) -> Obj:
    return dict(yaml.safe_load(kubectl(kubeconfig, "get", *args, "-o", "yaml")))


def test_install_upgrade_uninstall_with_generated_certificates(
    helm: Helm, own_control_plane: ControlPlane
) -> None:
    cp, kc = own_control_plane, own_control_plane.kubeconfig_path
    release = ["--kubeconfig", str(kc), "--namespace", NAMESPACE]
    # The namespace enforces Pod Security "restricted" (README): the manager meets it.
    r = cp.http.post(
        "/api/v1/namespaces",
        json={
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "name": NAMESPACE,
                "labels": {
                    "pod-security.kubernetes.io/enforce": "restricted",
                    "pod-security.kubernetes.io/warn": "restricted",
                },
            },
        },
    )
    assert r.status_code == 201, r.text
    assert cp.http.get("/apis/cert-manager.io/v1").status_code == 404  # auto picks helm

    # No --wait: the manager never becomes Ready here (no kubelet).
    out = helm.run("install", RELEASE, str(CHART), *release)
    assert "PodSecurity" not in out.stderr, out.stderr
    manifest = helm.run("get", "manifest", RELEASE, *release).stdout
    made = names_in(manifest)
    assert ("Secret", "webhook-server-cert") in made
    assert not [k for k, _ in made if k in ("Certificate", "Issuer")]
    assert len(stored(kc, manifest)) == len(made)
    secret = get(kc, "-n", NAMESPACE, "secret", "webhook-server-cert")
    check_serving_pair(secret["data"], NAMESPACE)
    hook = get(kc, "mutatingwebhookconfiguration", "deviceshare-mutating-webhook-configuration")
    assert hook["webhooks"][0]["clientConfig"]["caBundle"] == secret["data"]["ca.crt"]
    crd = get(kc, "crd", CRD)
    assert any(
        c["type"] == "Established" and c["status"] == "True" for c in crd["status"]["conditions"]
    )
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"

    helm.run(
        "upgrade",
        RELEASE,
        str(CHART),
        *release,
        "--set=replicaCount=2",
        "--set=logLevel=debug",
        "--set=delivery.mode=cdi",
        "--set-string=deviceEnv.example\\.com/npu=NPU_VISIBLE_DEVICES",
    )
    deploy = get(kc, "-n", NAMESPACE, "deploy", "deviceshare-manager")
    assert deploy["spec"]["replicas"] == 2
    s = settings_of(deploy["spec"]["template"]["spec"]["containers"][0])
    assert (s.log_level, s.delivery) == ("debug", "cdi")
    assert s.env_table()["example.com/npu"] == "NPU_VISIBLE_DEVICES"
    # lookup kept the CA and the pair: the caBundle callers trust did not change.
    assert get(kc, "-n", NAMESPACE, "secret", "webhook-server-cert")["data"] == secret["data"]
    hook = get(kc, "mutatingwebhookconfiguration", "deviceshare-mutating-webhook-configuration")
    assert hook["webhooks"][0]["clientConfig"]["caBundle"] == secret["data"]["ca.crt"]
    history = json.loads(helm.run("history", RELEASE, *release, "-o", "json").stdout)
    assert [h["revision"] for h in history] == [1, 2] and history[-1]["status"] == "deployed"

    out = helm.run("uninstall", RELEASE, *release)
    assert CRD in out.stdout  # "These resources were kept due to the resource policy"
    assert stored(kc, manifest) == [f"customresourcedefinition.apiextensions.k8s.io/{CRD}"]
    # The kept CRD still serves groups (and would keep every group that existed).
    group = {
        "apiVersion": "deviceshare.io/v1alpha1",
        "kind": "SharedDeviceGroup",
        "metadata": {"name": "kept"},
        "spec": {"resources": {"nvidia.com/gpu": 1}},
    }
    r = cp.http.post("/apis/deviceshare.io/v1alpha1/shareddevicegroups", json=group)
    assert r.status_code == 201, r.text

    # Installing again adopts the kept CRD (it carries this release's ownership metadata).
    helm.run("install", RELEASE, str(CHART), *release)
    assert cp.http.get("/apis/deviceshare.io/v1alpha1/shareddevicegroups/kept").status_code == 200
    helm.run("uninstall", RELEASE, *release)


def test_install_upgrade_uninstall_with_cert_manager(
    helm: Helm, own_control_plane: ControlPlane
) -> None:
    cp, kc = own_control_plane, own_control_plane.kubeconfig_path
    release = ["--kubeconfig", str(kc), "--namespace", NAMESPACE]
    thirdparty.install(cp, thirdparty.CERT_MANAGER)
    thirdparty.install(cp, thirdparty.MONITORING)

    helm.run(
        "install",
        RELEASE,
        str(CHART),
        *release,
        "--create-namespace",
        "--set=crds.keep=false",
        "--set=metrics.serviceMonitor.enabled=true",
        "--set=grafana.dashboard.enabled=true",
    )
    manifest = helm.run("get", "manifest", RELEASE, *release).stdout
    made = names_in(manifest)
    assert {
        ("Certificate", "deviceshare-serving-cert"),
        ("Issuer", "deviceshare-selfsigned-issuer"),
        ("ServiceMonitor", "deviceshare-manager-metrics-monitor"),
        ("ConfigMap", "deviceshare-grafana-dashboard"),
    } <= set(made)
    assert ("Secret", "webhook-server-cert") not in made  # cert-manager writes it
    assert len(stored(kc, manifest)) == len(made)
    for kind, name in (
        ("mutatingwebhookconfiguration", "deviceshare-mutating-webhook-configuration"),
        ("validatingwebhookconfiguration", "deviceshare-validating-webhook-configuration"),
    ):
        config = get(kc, kind, name)
        assert config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == (
            f"{NAMESPACE}/deviceshare-serving-cert"
        )
    assert "helm.sh/resource-policy" not in (
        get(kc, "crd", CRD)["metadata"].get("annotations") or {}
    )

    helm.run(
        "upgrade",
        RELEASE,
        str(CHART),
        *release,
        "--reuse-values",
        "--set=schedulerName=gpu-share-scheduler",
        "--set=podDisruptionBudget.enabled=true",
        "--set=replicaCount=2",
    )
    hook = get(kc, "mutatingwebhookconfiguration", "deviceshare-mutating-webhook-configuration")
    assert "== 'gpu-share-scheduler'" in hook["webhooks"][0]["matchConditions"][0]["expression"]
    deploy = get(kc, "-n", NAMESPACE, "deploy", "deviceshare-manager")
    assert settings_of(deploy["spec"]["template"]["spec"]["containers"][0]).scheduler_name == (
        "gpu-share-scheduler"
    )
    assert get(kc, "-n", NAMESPACE, "pdb", "deviceshare-manager")["spec"]["minAvailable"] == 1
    manifest = helm.run("get", "manifest", RELEASE, *release).stdout
    assert ("PodDisruptionBudget", "deviceshare-manager") in names_in(manifest)

    helm.run("uninstall", RELEASE, *release)
    assert stored(kc, manifest) == []  # crds.keep=false: the CRD went too


def test_metrics_are_https_with_token_review_unless_turned_off(helm: Helm) -> None:
    secure = settings_of(container(helm.template()))
    assert secure.metrics_secure is True
    monitor = one(helm.template("--set=metrics.serviceMonitor.enabled=true"), "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["scheme"] == "https"
    plain = helm.template("--set=metrics.secure=false", "--set=metrics.serviceMonitor.enabled=true")
    assert settings_of(container(plain)).metrics_secure is False
    assert one(plain, "ServiceMonitor")["spec"]["endpoints"][0]["scheme"] == "http"


# --- helm test ------------------------------------------------------------------------------

DOCTOR_TEST = "deviceshare-doctor-test"


def test_helm_test_runs_doctor_with_the_doctor_roles(
    helm: Helm, cluster: ControlPlane, capsys: pytest.CaptureFixture[str]
) -> None:
    """`helm test` runs `sdg doctor` in the manager's image as a ServiceAccount bound to
    config/rbac's doctor roles as their comment says; as that account doctor reaches the
    same verdicts as the admin, none of them a refused read."""
    from cli import main as cli

    objs = helm.template(tests=True)
    hooks = [o for o in objs if (o["metadata"].get("annotations") or {}).get("helm.sh/hook")]
    assert {o["metadata"]["annotations"]["helm.sh/hook"] for o in hooks} == {"test"}
    # Only the hooks are added (by kind and name: generated certificates differ per run).
    assert by_key(helm.template()).keys() == by_key([o for o in objs if o not in hooks]).keys()
    pod = one(hooks, "Pod", DOCTOR_TEST)
    (c,) = pod["spec"]["containers"]
    manager = container(objs)
    assert c["image"] == manager["image"] and c["imagePullPolicy"] == manager["imagePullPolicy"]
    assert c["command"] == ["sdg", "doctor", "--claims-namespace", NAMESPACE]
    assert c["securityContext"] == manager["securityContext"]
    assert pod["spec"]["restartPolicy"] == "Never"
    assert pod["spec"]["serviceAccountName"] == one(hooks, "ServiceAccount")["metadata"]["name"]
    bindings = {
        (b["kind"], b["roleRef"]["name"], b["metadata"].get("namespace"))
        for b in hooks
        if b["kind"] in ("ClusterRoleBinding", "RoleBinding")
    }
    assert bindings == {
        ("ClusterRoleBinding", "deviceshare-doctor", None),
        ("RoleBinding", "deviceshare-doctor-probe", NAMESPACE),
        ("RoleBinding", "deviceshare-doctor-records", NAMESPACE),
    }
    roles = {o["metadata"]["name"] for o in objs if o["kind"] == "ClusterRole"}
    assert {role for _, role, _ in bindings} <= roles
    # Valid for the API server (unknown fields fail); nothing stored.
    dry_run(cluster.kubeconfig_path, hooks, "sdg-helm-test-hooks")

    # As that ServiceAccount (a client certificate with its user name and groups).
    for role in yaml.safe_load_all((ROOT / "config" / "rbac" / "doctor_role.yaml").read_text()):
        cluster.apply(role)
    stored_hooks = [o for o in hooks if o["kind"] != "Pod"]
    for obj in stored_hooks:
        cluster.apply(obj)
    try:
        account = f"system:serviceaccount:{NAMESPACE}:{DOCTOR_TEST}"
        kubeconfig = cluster.user_kubeconfig(
            account, ["system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}"]
        )
        args = ["doctor", "--claims-namespace", NAMESPACE, "-n", NAMESPACE, "-o", "json"]
        cli.main(["--kubeconfig", str(kubeconfig), *args])
        as_account = json.loads(capsys.readouterr().out)
        cli.main(["--kubeconfig", str(cluster.kubeconfig_path), *args])
        as_admin = json.loads(capsys.readouterr().out)
    finally:
        for obj in stored_hooks:
            meta = obj["metadata"]
            cluster.delete(obj["apiVersion"], obj["kind"], meta["name"], meta.get("namespace"))
    assert len(as_account) > 10, as_account
    refused = [c for c in as_account if "forbidden" in c["detail"].lower()]
    assert not refused, refused
    assert [(c["name"], c["status"]) for c in as_account] == [
        (c["name"], c["status"]) for c in as_admin
    ]

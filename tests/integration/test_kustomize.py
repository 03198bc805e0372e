"""The kustomize builds in config/ as the real API server accepts them.

Every overlay (``default``, ``overlays/dev``, ``overlays/production``,
``overlays/prometheus``, ``overlays/network-policy``) is built with the pinned kubectl and
applied to the local kube-apiserver with server-side apply and ``--dry-run=server``: every
object goes through decoding, schema validation (an unknown field fails server-side apply),
defaulting and admission, but nothing is stored. So the overlays, which share object names,
never see each other, and the session's other tests never meet webhook configurations
pointing at a Service that does not exist.

Each overlay is applied to a server with exactly the third-party CRDs it needs: always
cert-manager's; the Prometheus Operator's ServiceMonitor only for the overlays that add
monitoring. So ``config/default`` is proven to install where only cert-manager is.

What is stored: the ``deviceshare-system`` Namespace (plain, so namespaced objects can be
dry-run into it; left in place, since without a namespace controller a deleted namespace
would stay Terminating and block others) and test stand-ins of those third-party CRDs
(``hack/testdata/``), which add kinds no other test uses.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from controllers.settings import parse
from sdgruntime.envtest.controlplane import ControlPlane
from tests.integration import thirdparty

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
KUBECTL = Path(sys.executable).parent / "kubectl"
OVERLAYS = [
    "default",
    "overlays/dev",
    "overlays/production",
    "overlays/prometheus",
    "overlays/network-policy",
]
# The overlays with a ServiceMonitor and the Grafana dashboard (config/prometheus).
MONITORED = {"overlays/production", "overlays/prometheus"}
# The overlays with config/network-policy, and the labels of the namespace whose pods may
# scrape /metrics there.
ISOLATED = {
    "overlays/network-policy": {"metrics": "enabled"},
    "overlays/production": {"kubernetes.io/metadata.name": "monitoring"},
}
NAMESPACE = "deviceshare-system"
CERT_DIR = "/tmp/k8s-webhook-server/serving-certs"

Obj = dict[str, Any]


def kustomize(overlay: str) -> list[Obj]:
    out = subprocess.run(
        [str(KUBECTL), "kustomize", str(ROOT / "config" / overlay)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, f"kubectl kustomize config/{overlay}:\n{out.stderr}"
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def dry_run(kubeconfig: str, docs: list[Obj]) -> subprocess.CompletedProcess[str]:
    """``kubectl apply --server-side --dry-run=server -o json`` of ``docs``."""
    with tempfile.TemporaryDirectory() as cache:
        return subprocess.run(
            [
                str(KUBECTL),
                "apply",
                "--server-side",
                "--dry-run=server",
                # The e2e tests may have stored the same admission policies under another field
                # manager; the API server's defaults in their atomic matchConstraints differ from
                # the manifest and would count as a conflict. Nothing is stored here anyway.
                "--force-conflicts",
                "--field-manager=sdg-kustomize-test",
                "--kubeconfig",
                kubeconfig,
                # Fresh discovery: the tests add and remove CRDs within one session.
                f"--cache-dir={cache}",
                "-o",
                "json",
                "-f",
                "-",
            ],
            input=yaml.safe_dump_all(docs),
            capture_output=True,
            text=True,
            check=False,
        )


def dry_run_apply(kubeconfig: str, docs: list[Obj]) -> list[Obj]:
    """``kubectl apply --server-side --dry-run=server``; returns what the server made of it."""
    out = dry_run(kubeconfig, docs)
    assert out.returncode == 0, f"server-side dry-run apply failed:\n{out.stderr}"
    result = json.loads(out.stdout)
    return result["items"] if result.get("kind") == "List" else [result]


def one(objs: list[Obj], kind: str, name: str | None = None) -> Obj:
    found = [
        o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)
    ]
    assert len(found) == 1, f"expected one {kind} {name or ''}, got {len(found)}"
    return found[0]


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def kinds_served(cp: ControlPlane, built: list[Obj]) -> None:
    """The server gets the ServiceMonitor CRD exactly when the build has one."""
    if any(o["kind"] == "ServiceMonitor" for o in built):
        thirdparty.install(cp, thirdparty.MONITORING)
    else:
        thirdparty.remove(cp, thirdparty.MONITORING)


@pytest.fixture(scope="module")
def cluster(control_plane: ControlPlane) -> ControlPlane:
    """The control plane with cert-manager's CRD stand-ins and the namespace."""
    thirdparty.install(control_plane, thirdparty.CERT_MANAGER)
    r = control_plane.http.post(
        "/api/v1/namespaces",
        json={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
    )
    assert r.status_code in (201, 409), r.text
    return control_plane


@pytest.fixture(scope="module", params=OVERLAYS)
def applied(
    request: pytest.FixtureRequest, cluster: ControlPlane
) -> Iterator[tuple[str, list[Obj], list[Obj]]]:
    """(overlay, built objects, the server's dry-run answer for each)."""
    built = kustomize(request.param)
    kinds_served(cluster, built)
    yield request.param, built, dry_run_apply(str(cluster.kubeconfig_path), built)


def test_every_object_is_accepted_and_nothing_is_stored(
    applied: tuple[str, list[Obj], list[Obj]], cluster: ControlPlane
) -> None:
    overlay, built, answered = applied
    assert [(o["kind"], o["metadata"]["name"]) for o in answered] == [
        (o["kind"], o["metadata"]["name"]) for o in built
    ]
    kinds = sorted({o["kind"] for o in built})
    expected = {
        "ClusterRole",
        "ClusterRoleBinding",
        "CustomResourceDefinition",
        "Deployment",
        "Issuer",
        "Certificate",
        "MutatingWebhookConfiguration",
        "Namespace",
        "PriorityClass",
        "Role",
        "RoleBinding",
        "Service",
        "ServiceAccount",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "ValidatingWebhookConfiguration",
    }
    if overlay == "overlays/production":
        expected.add("PodDisruptionBudget")
    if overlay in MONITORED:
        expected |= {"ServiceMonitor", "ConfigMap"}  # the ConfigMap is the Grafana dashboard
    if overlay in ISOLATED:
        expected.add("NetworkPolicy")
    assert set(kinds) == expected
    cluster_scoped = {
        "ClusterRole",
        "ClusterRoleBinding",
        "CustomResourceDefinition",
        "MutatingWebhookConfiguration",
        "PriorityClass",
        "Namespace",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "ValidatingWebhookConfiguration",
    }
    for obj in built:  # kustomize must not give cluster-scoped objects a namespace
        assert "namespace" not in obj["metadata"] or obj["kind"] not in cluster_scoped, obj
    for obj in answered:
        ns = obj["metadata"].get("namespace")
        assert ns == (None if obj["kind"] in cluster_scoped else NAMESPACE), obj["kind"]
    # Dry run: the Deployment and the webhook configurations were never stored.
    assert (
        cluster.http.get(f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/deviceshare-manager")
    ).status_code == 404
    assert (
        cluster.http.get(
            "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/"
            "deviceshare-validating-webhook-configuration"
        )
    ).status_code == 404


def test_manager_deployment(applied: tuple[str, list[Obj], list[Obj]]) -> None:
    overlay, _, answered = applied
    deploy = one(answered, "Deployment", "deviceshare-manager")
    pod = deploy["spec"]["template"]
    spec = pod["spec"]
    assert len(spec["containers"]) == 1
    (c,) = spec["containers"]

    # Runs the console script the wheel installs, with leader election.
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert c["command"] == ["sdg-manager"] and "sdg-manager" in scripts
    assert "--leader-elect" in c["args"]
    assert f"--webhook-cert-dir={CERT_DIR}" in c["args"]
    assert c["image"].startswith("ghcr.io/deviceshare/sdg-manager:")

    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"webhook": 9443, "metrics": 8080, "health": 8081}
    assert "--webhook-port=9443" in c["args"]
    assert "--metrics-bind-address=:8080" in c["args"]
    assert "--health-probe-bind-address=:8081" in c["args"]
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        get = c[probe]["httpGet"]
        assert get["path"] == path
        assert ports.get(get["port"], get["port"]) == 8081

    # Pod Security "restricted".
    sc = c["securityContext"]
    assert sc["runAsNonRoot"] is True
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert sc["seccompProfile"]["type"] == "RuntimeDefault"
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"

    for section in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(c["resources"][section])

    env = {e["name"]: e for e in c["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"

    # The manager's own flag parser accepts the args and env exactly as the pod gets them.
    settings = parse(
        c["args"],
        environ={"POD_NAMESPACE": NAMESPACE}
        | {k: e["value"] for k, e in env.items() if "value" in e},
    )
    assert settings.leader_elect is True
    assert settings.namespace == NAMESPACE
    assert (settings.webhook_port, settings.webhook_cert_dir) == (9443, CERT_DIR)
    assert settings.log_format == ("text" if overlay == "overlays/dev" else "json")
    assert settings.log_level == ("debug" if overlay == "overlays/dev" else "info")

    # The webhook serving pair cert-manager writes is mounted where the manager reads it.
    cert = one(answered, "Certificate")
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes[mounts[CERT_DIR]]["secret"]["secretName"] == cert["spec"]["secretName"]
    assert cert["spec"]["secretName"] == "webhook-server-cert"

    # Its ServiceAccount is the one the RBAC bindings grant.
    sa = one(answered, "ServiceAccount")
    assert spec["serviceAccountName"] == sa["metadata"]["name"] == "deviceshare-manager"
    for kind in ("ClusterRoleBinding", "RoleBinding"):
        bindings = [o for o in answered if o["kind"] == kind]  # the manager's, metrics auth
        assert bindings, kind
        for binding in bindings:
            assert {
                "kind": "ServiceAccount",
                "name": "deviceshare-manager",
                "namespace": NAMESPACE,
            } in binding["subjects"], binding["metadata"]["name"]

    if overlay == "overlays/dev":
        assert deploy["spec"]["replicas"] == 1
        assert "--log-level=debug" in c["args"]
        assert env["SDG_LOG_FORMAT"]["value"] == "text"
    elif overlay == "overlays/production":
        assert deploy["spec"]["replicas"] == 2
        terms = spec["affinity"]["podAntiAffinity"][
            "preferredDuringSchedulingIgnoredDuringExecution"
        ]
        assert any(
            t["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
            and matches(
                t["podAffinityTerm"]["labelSelector"]["matchLabels"], pod["metadata"]["labels"]
            )
            for t in terms
        )
        pdb = one(answered, "PodDisruptionBudget")
        assert pdb["spec"]["minAvailable"] == 1
        assert matches(pdb["spec"]["selector"]["matchLabels"], pod["metadata"]["labels"])
    else:
        assert deploy["spec"]["replicas"] == 1


def test_services_and_monitor_reach_the_manager(applied: tuple[str, list[Obj], list[Obj]]) -> None:
    overlay, _, answered = applied
    deploy = one(answered, "Deployment", "deviceshare-manager")
    labels = deploy["spec"]["template"]["metadata"]["labels"]
    port_names = {p["name"] for p in deploy["spec"]["template"]["spec"]["containers"][0]["ports"]}

    webhook = one(answered, "Service", "deviceshare-webhook-service")
    assert matches(webhook["spec"]["selector"], labels)
    assert [(p["port"], p["targetPort"]) for p in webhook["spec"]["ports"]] == [(443, "webhook")]

    metrics = one(answered, "Service", "deviceshare-manager-metrics-service")
    assert matches(metrics["spec"]["selector"], labels)
    (mport,) = metrics["spec"]["ports"]
    assert mport["targetPort"] in port_names

    if overlay not in MONITORED:  # nothing that needs the Prometheus Operator
        assert not [o for o in answered if o["kind"] in ("ServiceMonitor", "ConfigMap")]
        return
    monitor = one(answered, "ServiceMonitor")
    assert matches(monitor["spec"]["selector"]["matchLabels"], metrics["metadata"]["labels"])
    assert not matches(monitor["spec"]["selector"]["matchLabels"], webhook["metadata"]["labels"])
    assert [(e["port"], e["path"]) for e in monitor["spec"]["endpoints"]] == [
        (mport["name"], "/metrics")
    ]

    dashboard = one(answered, "ConfigMap", "deviceshare-grafana-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["sdg-dashboard.json"])["uid"] == "shared-device-group"


def test_default_installs_where_only_cert_manager_is(cluster: ControlPlane) -> None:
    """config/default needs no Prometheus Operator; config/overlays/prometheus does, and
    renders the ServiceMonitor. The refused overlay is the control: this server really
    lacks the kind."""
    kc = str(cluster.kubeconfig_path)
    thirdparty.remove(cluster, thirdparty.MONITORING)
    assert cluster.http.get(thirdparty.MONITORING_API).status_code == 404

    built = kustomize("default")
    assert [o["metadata"]["name"] for o in dry_run_apply(kc, built)] == [
        o["metadata"]["name"] for o in built
    ]

    monitored = kustomize("overlays/prometheus")
    refused = dry_run(kc, monitored)
    assert refused.returncode != 0
    assert 'no matches for kind "ServiceMonitor"' in refused.stderr, refused.stderr

    thirdparty.install(cluster, thirdparty.MONITORING)
    monitor = one(dry_run_apply(kc, monitored), "ServiceMonitor")
    assert monitor["metadata"]["namespace"] == NAMESPACE
    # Only the monitoring objects are added to config/default.
    added = {(o["kind"], o["metadata"]["name"]) for o in monitored} - {
        (o["kind"], o["metadata"]["name"]) for o in built
    }
    assert added == {
        ("ServiceMonitor", "deviceshare-manager-metrics-monitor"),
        ("ConfigMap", "deviceshare-grafana-dashboard"),
    }


def ingress_allowed(
    policies: list[Obj], pod: dict[str, str], port: int, ns: dict[str, str]
) -> bool:
    """NetworkPolicy semantics for what our policies use: may a pod in a namespace labelled
    ``ns`` reach ``port`` (TCP) of a pod labelled ``pod``? Refuses any other construct, so
    a change to the policies cannot be judged by rules this does not know."""
    selecting = [p for p in policies if matches(p["spec"]["podSelector"]["matchLabels"], pod)]
    if not selecting:
        return True  # not isolated
    for policy in selecting:
        for rule in policy["spec"].get("ingress", []):
            ports = rule.get("ports")
            if ports is not None and not any(
                p["port"] == port and p.get("protocol", "TCP") == "TCP" for p in ports
            ):
                continue
            sources = rule.get("from")
            if sources is None:
                return True
            for peer in sources:
                assert set(peer) == {"namespaceSelector"}, peer
                assert set(peer["namespaceSelector"]) == {"matchLabels"}, peer
                if matches(peer["namespaceSelector"]["matchLabels"], ns):
                    return True
    return False


def test_network_policy_overlay_admits_only_metrics_scrapers_and_webhook_calls(
    applied: tuple[str, list[Obj], list[Obj]],
) -> None:
    overlay, _, answered = applied
    policies = [o for o in answered if o["kind"] == "NetworkPolicy"]
    if overlay not in ISOLATED:
        assert not policies  # optional: only these overlays isolate the manager
        return
    deploy = one(answered, "Deployment", "deviceshare-manager")
    pod = deploy["spec"]["template"]["metadata"]["labels"]
    ports = {
        p["name"]: p["containerPort"]
        for p in deploy["spec"]["template"]["spec"]["containers"][0]["ports"]
    }
    assert {p["metadata"]["name"] for p in policies} == {
        "deviceshare-allow-metrics-traffic",
        "deviceshare-allow-webhook-traffic",
    }
    for policy in policies:
        assert policy["metadata"]["namespace"] == NAMESPACE
        assert matches(policy["spec"]["podSelector"]["matchLabels"], pod)
        # Ingress only: the manager keeps reaching the API server.
        assert policy["spec"]["policyTypes"] == ["Ingress"]

    scraper, other = ISOLATED[overlay], {"kubernetes.io/metadata.name": "team-a"}
    assert ingress_allowed(policies, pod, ports["metrics"], scraper)
    assert not ingress_allowed(policies, pod, ports["metrics"], other)
    if overlay == "overlays/production":  # the monitoring namespace only, not any labelled one
        assert not ingress_allowed(policies, pod, ports["metrics"], {"metrics": "enabled"})
    # The API server calls the webhooks from outside any namespace: allowed from anywhere.
    assert ports["webhook"] == 9443
    assert ingress_allowed(policies, pod, ports["webhook"], other)
    assert ingress_allowed(policies, pod, ports["webhook"], {})
    # Nothing else is opened (the kubelet's probes come from the node, always allowed).
    assert not ingress_allowed(policies, pod, ports["health"], scraper)
    # The control: another pod in the namespace is not isolated by these policies.
    assert ingress_allowed(policies, {"app": "other"}, ports["health"], other)


def test_user_roles_aggregate_into_view_and_edit(
    applied: tuple[str, list[Obj], list[Obj]],
) -> None:
    """Every install carries kubebuilder's viewer and editor roles for SharedDeviceGroups,
    labelled so that the API server's aggregation adds them to view, edit and admin
    (tests/integration/test_user_roles.py proves their rules against the API server)."""
    _, _, answered = applied
    viewer = one(answered, "ClusterRole", "shareddevicegroup-viewer-role")
    editor = one(answered, "ClusterRole", "shareddevicegroup-editor-role")
    aggregate = "rbac.authorization.k8s.io/aggregate-to-"
    assert {k for k, v in viewer["metadata"]["labels"].items() if k.startswith(aggregate)} == {
        f"{aggregate}view"
    }
    assert viewer["metadata"]["labels"][f"{aggregate}view"] == "true"
    assert {k for k, v in editor["metadata"]["labels"].items() if v == "true"} >= {
        f"{aggregate}edit",
        f"{aggregate}admin",
    }
    assert f"{aggregate}view" not in editor["metadata"]["labels"]


def test_webhooks_get_a_certificate_and_ca_from_cert_manager(
    applied: tuple[str, list[Obj], list[Obj]],
) -> None:
    _, _, answered = applied
    cert = one(answered, "Certificate")
    issuer = one(answered, "Issuer")
    service = one(answered, "Service", "deviceshare-webhook-service")
    svc = f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc"
    assert svc == "deviceshare-webhook-service.deviceshare-system.svc"
    assert cert["spec"]["dnsNames"] == [svc, f"{svc}.cluster.local"]
    assert cert["spec"]["issuerRef"] == {"kind": "Issuer", "name": issuer["metadata"]["name"]}
    assert "selfSigned" in issuer["spec"]

    ref = f"{cert['metadata']['namespace']}/{cert['metadata']['name']}"
    paths = {
        "MutatingWebhookConfiguration": {
            "mpod.deviceshare.io": "/mutate-v1-pod",
            "msdg.deviceshare.io": "/mutate-deviceshare-io-v1alpha1-shareddevicegroup",
        },
        "ValidatingWebhookConfiguration": {
            "vsdg.deviceshare.io": "/validate-deviceshare-io-v1alpha1-shareddevicegroup",
            "vbinding.deviceshare.io": "/validate-v1-binding",
        },
    }
    for kind, hooks in paths.items():
        config = one(answered, kind)
        assert config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == ref
        assert {hook["name"] for hook in config["webhooks"]} == set(hooks)
        for hook in config["webhooks"]:
            assert hook["clientConfig"]["service"] == {
                "name": service["metadata"]["name"],
                "namespace": service["metadata"]["namespace"],
                "path": hooks[hook["name"]],
                "port": 443,
            }


def test_admission_policies_deny_and_fail_closed(
    applied: tuple[str, list[Obj], list[Obj]],
) -> None:
    """config/policy is part of every install, bound to deny (not just warn or audit)."""
    _, _, answered = applied
    policies = {
        o["metadata"]["name"]: o for o in answered if o["kind"] == "ValidatingAdmissionPolicy"
    }
    assert set(policies) == {
        "deviceshare-group-membership",
        "deviceshare-ephemeral-container-devices",
        "deviceshare-group-pods",
    }
    bindings = [o for o in answered if o["kind"] == "ValidatingAdmissionPolicyBinding"]
    assert sorted(b["spec"]["policyName"] for b in bindings) == sorted(policies)
    for b in bindings:
        assert b["spec"]["validationActions"] == ["Deny"]
        assert "paramRef" not in b["spec"]
    for policy in policies.values():
        assert policy["spec"]["failurePolicy"] == "Fail"
        assert policy["spec"]["matchConditions"]
        for rule in policy["spec"]["validations"]:
            assert rule["reason"] == "Forbidden" and rule["messageExpression"] and rule["message"]


def test_namespace_enforces_restricted_pod_security(
    applied: tuple[str, list[Obj], list[Obj]],
) -> None:
    _, _, answered = applied
    labels = one(answered, "Namespace", NAMESPACE)["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_manager_pod_is_admitted_under_restricted_pod_security(
    overlay: str, cluster: ControlPlane, namespace: str
) -> None:
    """The API server's PodSecurity admission admits the manager's pod in a namespace that
    enforces "restricted", and (the control) rejects the same pod without its security
    context, so the admission really judged it."""
    r = cluster.http.patch(
        f"/api/v1/namespaces/{namespace}",
        json={"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert r.status_code == 200, r.text
    deploy = one(kustomize(overlay), "Deployment", "deviceshare-manager")
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "manager", "labels": deploy["spec"]["template"]["metadata"]["labels"]},
        "spec": deploy["spec"]["template"]["spec"],
    }
    url = f"/api/v1/namespaces/{namespace}/pods"
    r = cluster.http.post(url, params={"dryRun": "All"}, json=pod)
    assert r.status_code == 201, r.text
    assert not r.headers.get("warning"), r.headers.get("warning")

    pod["spec"] = {**pod["spec"], "securityContext": {}}
    pod["spec"]["containers"] = [
        {k: v for k, v in c.items() if k != "securityContext"} for c in pod["spec"]["containers"]
    ]
    r = cluster.http.post(url, params={"dryRun": "All"}, json=pod)
    assert r.status_code == 403 and "PodSecurity" in r.text, r.text


def test_the_binding_webhook_skips_the_managers_own_identity(
    applied: tuple[str, list[Obj], list[Obj]],
) -> None:
    """Its matchConditions name the ServiceAccount the manager runs as (a stale name would
    send every one of SDG's binds through the webhook) and kube-scheduler."""
    _, _, answered = applied
    deployment = one(answered, "Deployment", "deviceshare-manager")
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    namespace = deployment["metadata"]["namespace"]
    config = one(answered, "ValidatingWebhookConfiguration")
    (hook,) = [h for h in config["webhooks"] if h["name"] == "vbinding.deviceshare.io"]
    (condition,) = hook["matchConditions"]
    assert f"'system:serviceaccount:{namespace}:{account}'" in condition["expression"]
    assert "'system:kube-scheduler'" in condition["expression"]
    assert hook["failurePolicy"] == "Ignore"
    assert hook["rules"][0]["resources"] == ["pods/binding", "bindings"]

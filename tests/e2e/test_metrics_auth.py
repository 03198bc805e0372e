"""Secure metrics, judged by the real API server: the manager (under config/rbac, as
deployed with ``--metrics-secure``) serves ``/metrics`` over HTTPS only to bearer tokens the
API server authenticates (TokenReview) and authorizes for ``get /metrics``
(SubjectAccessReview), i.e. to ServiceAccounts bound to ``deviceshare-metrics-reader``.

The tokens are real service-account tokens from the TokenRequest API. Each rule of
``metrics_auth_role.yaml`` is shown to be needed here (tests/e2e/test_rbac.py proves
role.yaml's rules with the scheduling flow, which does not use these).
"""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from sdgruntime.envtest import ControlPlane
from sdgruntime.envtest.controlplane import load_manifests
from tests.e2e.harness import (
    MANAGER_NS,
    ROOT,
    SA_GROUPS,
    SA_USER,
    install_rbac,
    run_sdg,
    wait_rbac,
)

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

READER_ROLE = "deviceshare-metrics-reader"
AUTH_ROLE_FILE = ROOT / "config" / "rbac" / "metrics_auth_role.yaml"
RBAC = "/apis/rbac.authorization.k8s.io/v1"


def can_get_metrics(user: str) -> dict[str, Any]:
    return {"user": user, "nonResourceAttributes": {"path": "/metrics", "verb": "get"}}


def manager_can(group: str, resource: str) -> dict[str, Any]:
    return {
        "user": SA_USER,
        "groups": SA_GROUPS,
        "resourceAttributes": {"group": group, "resource": resource, "verb": "create"},
    }


@pytest.fixture
def tokens(cluster: ControlPlane, namespace: str) -> Iterator[dict[str, str]]:
    """``reader``: a ServiceAccount bound to deviceshare-metrics-reader; ``stranger``: one
    that is not."""
    out = {w: cluster.service_account_token(namespace, w, 600) for w in ("reader", "stranger")}
    binding = f"metrics-reader-{namespace}"
    cluster.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": binding},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": READER_ROLE,
            },
            "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}],
        }
    )
    wait_rbac(cluster, can_get_metrics(f"system:serviceaccount:{namespace}:reader"), True)
    try:
        yield out
    finally:
        cluster.delete("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", binding)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_scrapes_need_a_token_the_api_server_lets_get_metrics(
    cluster: ControlPlane, namespace: str, tokens: dict[str, str]
) -> None:
    async with run_sdg(cluster, webhooks=False, metrics_secure=True) as sdg:
        port = sdg.manager.metrics_port
        url = f"https://127.0.0.1:{port}/metrics"
        # The pair is self-signed at start, for this host: a scraper that trusts it
        # verifies the server (config/prometheus skips verification instead).
        pem = await anyio.to_thread.run_sync(ssl.get_server_certificate, ("127.0.0.1", port))
        trusting = ssl.create_default_context(cadata=pem)
        async with httpx.AsyncClient(verify=trusting, timeout=10) as http:
            r = await http.get(url)
            assert (r.status_code, r.text) == (401, "Unauthorized\n")
            r = await http.get(url, headers=bearer("not-a-token"))
            assert (r.status_code, r.text) == (401, "Unauthorized\n")
            r = await http.get(url, headers={"Authorization": f"Basic {tokens['reader']}"})
            assert r.status_code == 401

            r = await http.get(url, headers=bearer(tokens["stranger"]))
            assert r.status_code == 403, r.text
            stranger = f"system:serviceaccount:{namespace}:stranger"
            assert r.text == f"Authorization denied for user {stranger}\n"

            for _ in range(2):  # the second answer comes from the cached reviews
                r = await http.get(url, headers=bearer(tokens["reader"]))
                assert r.status_code == 200, r.text
                assert r.headers["content-type"].startswith("text/plain; version=")
                assert "controller_runtime_reconcile_total" in r.text
                assert "rest_client_requests_total" in r.text
        # HTTPS only: a plain HTTP request gets no answer.
        async with httpx.AsyncClient(timeout=5) as plain:
            with pytest.raises(httpx.TransportError):
                await plain.get(
                    f"http://127.0.0.1:{port}/metrics", headers=bearer(tokens["reader"])
                )


async def test_serving_certificate_from_a_cert_dir(
    cluster: ControlPlane, tokens: dict[str, str], tmp_path: Path
) -> None:
    cluster.ca.serving(["127.0.0.1"]).write(tmp_path, "tls.crt", "tls.key")
    verify = ssl.create_default_context(cadata=cluster.ca.cert_pem.decode())
    async with (
        run_sdg(
            cluster, webhooks=False, metrics_secure=True, metrics_cert_dir=str(tmp_path)
        ) as sdg,
        httpx.AsyncClient(verify=verify, timeout=10) as http,
    ):
        r = await http.get(
            f"https://127.0.0.1:{sdg.manager.metrics_port}/metrics",
            headers=bearer(tokens["reader"]),
        )
        assert r.status_code == 200, r.text


def _auth_rules() -> list[dict[str, Any]]:
    (role,) = load_manifests([AUTH_ROLE_FILE])
    return list(role["rules"])


@pytest.mark.parametrize("dropped", _auth_rules(), ids=lambda r: r["resources"][0])
async def test_every_metrics_auth_rule_is_needed(
    cluster: ControlPlane, tokens: dict[str, str], dropped: dict[str, Any]
) -> None:
    """Without either review right the manager cannot tell who scrapes: 500, never 200."""
    check = manager_can(dropped["apiGroups"][0], dropped["resources"][0])
    install_rbac(cluster, drop_rule=lambda r: r == dropped)
    try:
        wait_rbac(cluster, check, False)
        async with (
            run_sdg(cluster, webhooks=False, metrics_secure=True) as sdg,
            httpx.AsyncClient(verify=False, timeout=10) as http,
        ):
            r = await http.get(
                f"https://127.0.0.1:{sdg.manager.metrics_port}/metrics",
                headers=bearer(tokens["reader"]),
            )
            assert r.status_code == 500, (dropped, r.status_code, r.text)
    finally:
        install_rbac(cluster)
        wait_rbac(cluster, check, True)


def test_metrics_auth_role_is_bound_to_the_manager() -> None:
    docs = load_manifests([ROOT / "config" / "rbac"])
    (binding,) = [
        d
        for d in docs
        if d["kind"] == "ClusterRoleBinding"
        and d["roleRef"]["name"] == "deviceshare-metrics-auth-role"
    ]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "deviceshare-manager", "namespace": MANAGER_NS}
    ]
    (reader,) = [d for d in docs if d["metadata"]["name"] == READER_ROLE]
    assert reader["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]

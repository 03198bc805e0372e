"""The local control plane is a real Kubernetes API server: version, validation, watch, RBAC."""

from __future__ import annotations

import json
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import anyio
import httpx
import pytest
import yaml

from sdgruntime import errors
from sdgruntime.client import Client
from sdgruntime.envtest import ControlPlane, ensure_binaries
from sdgruntime.envtest.controlplane import free_port, pid_alive
from sdgruntime.kinds import CONFIGMAPS
from sdgruntime.webhook import AdmissionRequest, AdmissionResponse, WebhookServer, denied

pytestmark = pytest.mark.integration

WIDGET_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.envtest.example.com"},
    "spec": {
        "group": "envtest.example.com",
        "scope": "Namespaced",
        "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "required": ["size"],
                                "properties": {"size": {"type": "integer", "minimum": 1}},
                            }
                        },
                    }
                },
            }
        ],
    },
}


def _client_for(kubeconfig: Path) -> httpx.Client:
    cfg = yaml.safe_load(kubeconfig.read_text())
    import base64
    import tempfile

    tmp = Path(tempfile.mkdtemp())
    user = cfg["users"][0]["user"]
    (tmp / "c.crt").write_bytes(base64.b64decode(user["client-certificate-data"]))
    (tmp / "c.key").write_bytes(base64.b64decode(user["client-key-data"]))
    (tmp / "ca.crt").write_bytes(
        base64.b64decode(cfg["clusters"][0]["cluster"]["certificate-authority-data"])
    )
    ctx = ssl.create_default_context(cafile=str(tmp / "ca.crt"))
    ctx.load_cert_chain(str(tmp / "c.crt"), str(tmp / "c.key"))
    return httpx.Client(base_url=cfg["clusters"][0]["cluster"]["server"], verify=ctx)


def test_version_and_readyz(control_plane: ControlPlane) -> None:
    version = control_plane.http.get("/version").json()
    source = Path(__file__).resolve().parents[3] / "hack" / "controlplane" / "go.mod"
    required = next(
        line.split()[1]
        for line in source.read_text().splitlines()
        if line.strip().startswith("k8s.io/kubernetes ")
    )
    assert version["gitVersion"] == required
    assert version["major"] == "1"
    r = control_plane.http.get("/readyz")
    assert r.status_code == 200 and r.text == "ok"


def test_admin_kubeconfig_is_system_masters(kubeconfig: str) -> None:
    with _client_for(Path(kubeconfig)) as http:
        review = http.post(
            "/apis/authentication.k8s.io/v1/selfsubjectreviews",
            json={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
        ).json()
    assert "system:masters" in review["status"]["userInfo"]["groups"]


def test_crd_schema_validation_is_the_servers(control_plane: ControlPlane, namespace: str) -> None:
    control_plane.install_crds([_write_tmp_crd(control_plane)])
    http = control_plane.http
    base = f"/apis/envtest.example.com/v1/namespaces/{namespace}/widgets"
    bad = {
        "apiVersion": "envtest.example.com/v1",
        "kind": "Widget",
        "metadata": {"name": "bad"},
        "spec": {"size": 0},
    }
    r = http.post(base, json=bad)
    assert r.status_code == 422
    assert (
        "spec.size: Invalid value: 0: spec.size in body should be greater than or equal to 1"
        in (r.json()["message"])
    )
    good = {**bad, "metadata": {"name": "good"}, "spec": {"size": 3}}
    assert http.post(base, json=good).status_code == 201
    assert http.get(f"{base}/good").json()["spec"] == {"size": 3}


def _write_tmp_crd(cp: ControlPlane) -> Path:
    path = cp.work_dir / "widget-crd.yaml"
    path.write_text(yaml.safe_dump(WIDGET_CRD))
    return path


def test_watch_sees_real_writes(control_plane: ControlPlane, namespace: str) -> None:
    http = control_plane.http
    base = f"/api/v1/namespaces/{namespace}/configmaps"
    rv = http.get(base).json()["metadata"]["resourceVersion"]
    seen: list[tuple[str, str]] = []
    done = threading.Event()

    def watch() -> None:
        params = {"watch": "1", "resourceVersion": rv, "timeoutSeconds": "20"}
        with http.stream("GET", base, params=params, timeout=30) as r:
            for line in r.iter_lines():
                if not line:
                    continue
                ev = json.loads(line)
                seen.append((ev["type"], ev["object"]["metadata"]["name"]))
                if ev["type"] == "DELETED":
                    done.set()
                    return

    t = threading.Thread(target=watch)
    t.start()
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "w"}, "data": {"a": "1"}}
    assert http.post(base, json=cm).status_code == 201
    assert (
        http.patch(
            f"{base}/w",
            json={"data": {"a": "2"}},
            headers={"Content-Type": "application/merge-patch+json"},
        ).status_code
        == 200
    )
    assert http.delete(f"{base}/w").status_code == 200
    assert done.wait(25)
    t.join()
    assert seen == [("ADDED", "w"), ("MODIFIED", "w"), ("DELETED", "w")]


def test_rbac_forbids_a_user_without_rights(control_plane: ControlPlane, namespace: str) -> None:
    with _client_for(control_plane.user_kubeconfig("nobody")) as http:
        r = http.get(f"/api/v1/namespaces/{namespace}/pods")
    assert r.status_code == 403
    assert 'User "nobody" cannot list resource "pods"' in r.json()["message"]


def test_stop_leaves_no_process_and_restart_reuses_build() -> None:
    binaries = ensure_binaries()
    mtimes = {p.name: p.stat().st_mtime for p in binaries.iterdir() if not p.name.startswith(".")}
    cp = ControlPlane()
    cp.start()
    pids = cp.pids
    assert set(pids) == {"etcd", "kube-apiserver"}
    assert all(pid_alive(p) for p in pids.values())
    cp.stop()
    deadline = time.monotonic() + 5
    while any(pid_alive(p) for p in pids.values()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(pid_alive(p) for p in pids.values())
    assert ensure_binaries() == binaries
    after = {p.name: p.stat().st_mtime for p in binaries.iterdir() if not p.name.startswith(".")}
    assert after == mtimes


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_cli_serves_until_interrupted(tmp_path: Path, signum: int) -> None:
    out = tmp_path / "kubeconfig"
    proc = subprocess.Popen(
        [sys.executable, "-m", "sdgruntime.envtest", "--kubeconfig-out", str(out)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("control plane ready: kube-apiserver v1.")
        assert str(out) in line
        server = yaml.safe_load(out.read_text())["clusters"][0]["cluster"]["server"]
        with _client_for(out) as http:
            assert http.get("/readyz").status_code == 200
    finally:
        proc.send_signal(signum)
        rest, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert "control plane stopped" in rest
    # Nothing listens any more: the API server (and etcd behind it) are gone.
    port = int(server.rsplit(":", 1)[1])
    with socket.socket() as s, pytest.raises(ConnectionRefusedError):
        s.connect(("127.0.0.1", port))


GUARD = {
    "apiVersion": "admissionregistration.k8s.io/v1",
    "kind": "ValidatingWebhookConfiguration",
    "metadata": {"name": "guard"},
    "webhooks": [
        {
            "name": "guard.example.com",
            "admissionReviewVersions": ["v1"],
            # As deployed: a URL elsewhere. Its path is what the local server serves.
            "clientConfig": {"url": "https://operator.example.com:8443/validate-guarded"},
            "rules": [
                {
                    "apiGroups": [""],
                    "apiVersions": ["v1"],
                    "operations": ["CREATE"],
                    "resources": ["configmaps"],
                }
            ],
            "objectSelector": {"matchLabels": {"guarded": "yes"}},
            "failurePolicy": "Fail",
            "sideEffects": "None",
        }
    ],
}


async def refuse_guarded(request: AdmissionRequest) -> AdmissionResponse:
    return denied(f"configmap {request.name} is guarded")


@pytest.mark.anyio
async def test_cli_installs_webhooks_that_call_a_server_running_outside_it(
    tmp_path: Path,
) -> None:
    """--webhook-port/--webhook-cert-dir/--install-webhooks: the CLI's API server calls a
    webhook server this process runs with the certificate the CLI wrote."""
    out, certs, hooks = tmp_path / "kubeconfig", tmp_path / "certs", tmp_path / "hooks.yaml"
    hooks.write_text(yaml.safe_dump(GUARD))
    port = free_port()
    command = [
        *(sys.executable, "-m", "sdgruntime.envtest", "--kubeconfig-out", str(out)),
        *("--webhook-port", str(port), "--webhook-cert-dir", str(certs)),
        *("--install-webhooks", str(hooks)),
    ]
    proc = await anyio.to_thread.run_sync(
        lambda: subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    )
    try:
        assert proc.stdout is not None
        lines = [await anyio.to_thread.run_sync(proc.stdout.readline) for _ in range(3)]
        assert lines[0] == f"webhook serving certificate: {certs}/tls.crt, tls.key\n"
        assert lines[1] == (
            "webhooks installed (ValidatingWebhookConfiguration guard): the API server "
            f"calls https://127.0.0.1:{port}\n"
        )
        assert lines[2].startswith("control plane ready: kube-apiserver v1.")
        server = WebhookServer("127.0.0.1", port, certs)
        server.register("/validate-guarded", refuse_guarded)
        async with anyio.create_task_group() as tg, Client.from_kubeconfig(out) as client:
            await tg.start(server.serve)
            cm = {"apiVersion": "v1", "kind": "ConfigMap"}
            guarded = {**cm, "metadata": {"name": "g", "labels": {"guarded": "yes"}}}
            with pytest.raises(errors.ApiError) as info:
                await client.create(CONFIGMAPS, guarded, "default")
            assert (
                'admission webhook "guard.example.com" denied the request: configmap g is guarded'
            ) in info.value.message
            plain = await client.create(CONFIGMAPS, {**cm, "metadata": {"name": "p"}}, "default")
            assert plain["metadata"]["name"] == "p"
            tg.cancel_scope.cancel()
    finally:
        proc.send_signal(signal.SIGTERM)
        rest, _ = await anyio.to_thread.run_sync(lambda: proc.communicate(timeout=30))
    assert proc.returncode == 0
    assert "control plane stopped" in rest


def test_cli_refuses_webhook_options_it_cannot_use(tmp_path: Path) -> None:
    for args, message in (
        (["--install-webhooks", str(tmp_path / "absent.yaml")], "no such file or folder"),
        (["--webhook-port", "0"], "is not a port"),
    ):
        run = subprocess.run(
            [sys.executable, "-m", "sdgruntime.envtest", *args],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert run.returncode == 2
        assert message in run.stderr


def test_kubebuilder_assets_are_used_and_nothing_is_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """KUBEBUILDER_ASSETS, controller-runtime's convention, names the binaries to run: the
    control plane starts from there, on a machine whose build cache is empty, and the build
    is never reached."""
    from sdgruntime.envtest import build

    cached = ensure_binaries()
    assets = tmp_path / "assets"
    assets.mkdir()
    for name in ("etcd", "kube-apiserver"):  # no kube-scheduler: ControlPlane needs neither
        (assets / name).symlink_to(cached / name)
    empty_cache = tmp_path / "cache"
    monkeypatch.setenv("KUBEBUILDER_ASSETS", str(assets))
    monkeypatch.setenv("XDG_CACHE_HOME", str(empty_cache))
    monkeypatch.delenv("SDG_CONTROLPLANE_BIN", raising=False)

    def no_build(*_: object) -> None:
        raise AssertionError("built although KUBEBUILDER_ASSETS is set")

    monkeypatch.setattr(build, "_build", no_build)
    with ControlPlane() as cp:
        assert cp.binaries == assets
        for name, pid in cp.pids.items():
            argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
            assert argv0 == str(assets / name)
        assert cp.http.get("/readyz").text == "ok"
    assert not empty_cache.exists()


def test_kubebuilder_assets_without_a_binary_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sdgruntime.envtest import BuildError

    (tmp_path / "etcd").symlink_to(ensure_binaries() / "etcd")
    monkeypatch.setenv("KUBEBUILDER_ASSETS", str(tmp_path))
    cp = ControlPlane()
    with pytest.raises(BuildError) as refused:
        cp.start()
    assert str(refused.value).startswith(f"KUBEBUILDER_ASSETS={tmp_path} lacks kube-apiserver")
    assert "unset KUBEBUILDER_ASSETS to build them" in str(refused.value)
    assert cp.pids == {}  # nothing was started

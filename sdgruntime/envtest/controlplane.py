"""A real local control plane (etcd + kube-apiserver) for tests and the demo, like envtest.

By default there is no kubelet and no controller-manager: nodes are API objects that tests
create, and admission plugins that depend on those controllers are disabled.
``components=("kube-scheduler", "kube-controller-manager")`` starts those beside it (the
controller-manager's node lifecycle controller taints nodes that no kubelet heartbeats:
use it with real nodes, ``sdgruntime.envtest.node``). The API server reaches kubelets with
a client certificate of its own CA, so ``kubectl logs`` and ``exec`` work on a real node.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import ctypes
import logging
import os
import random
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from sdgruntime.envtest.adminhttp import AdminHTTP, TransportError
from sdgruntime.envtest.build import BINARIES, ensure_binaries
from sdgruntime.envtest.certs import CertificateAuthority, KeyPair, service_account_keys

log = logging.getLogger(__name__)

ADMIN_USER = "envtest-admin"
#: What ``components`` may name, started in this order after the API server.
COMPONENTS = ("kube-controller-manager", "kube-scheduler")
_PR_SET_PDEATHSIG = 1


class ControlPlaneError(RuntimeError):
    """The control plane failed to start; the message carries the failing process's log."""


_LOWEST_PORT = 10000
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, for a process to bind soon. It is picked below
    the kernel's ephemeral range where that can be read: a port from the range (what
    binding port 0 gives) can be taken in between by any outgoing connection, and an API
    server calling webhooks opens hundreds (a manager then failed with EADDRINUSE)."""
    try:
        low = int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 0
    for _ in range(64 if low > _LOWEST_PORT + 1000 else 0):
        port = random.randrange(_LOWEST_PORT, low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue  # in use, or in TIME_WAIT
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:
    # A child that outlives a killed test runner would hold ports and etcd data:
    # ask the kernel to SIGTERM it when this process dies, however it dies.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def spawn_logged(
    argv: Sequence[str], log: Path, env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """``argv`` with stdout and stderr appended to ``log``, no stdin, ``env`` added to this
    process's; the kernel SIGTERMs it when this process dies, however it dies."""
    with open(log, "ab") as out:
        return subprocess.Popen(
            list(argv),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **env} if env else None,
            preexec_fn=_die_with_parent,
        )


def stop_process(proc: subprocess.Popen[Any], timeout: float = 15.0) -> None:
    """SIGTERM, up to ``timeout`` seconds to exit, then SIGKILL; reaped either way."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def log_tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of a log file ("" if there is none), for error messages."""
    if not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def load_manifests(paths: Iterable[str | Path]) -> list[dict[str, Any]]:
    """Every YAML document in the given files and folders (kustomization files excluded)."""
    docs: list[dict[str, Any]] = []
    for p in paths:
        path = Path(p)
        files = sorted(path.rglob("*.y*ml")) if path.is_dir() else [path]
        for f in files:
            if f.name.startswith("kustomization"):
                continue
            docs += [d for d in yaml.safe_load_all(f.read_text()) if d]
    return docs


class ControlPlane:
    """etcd + kube-apiserver on free loopback ports, with RBAC and an admin kubeconfig.

    Use as a context manager, or call ``start()`` and ``stop()``.
    """

    def __init__(
        self,
        *,
        crd_paths: Sequence[str | Path] = (),
        work_dir: str | Path | None = None,
        extra_apiserver_flags: Sequence[str] = (),
        start_timeout: float = 120.0,
        components: Sequence[str] = (),
        component_flags: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        unknown = sorted(set(components) - set(COMPONENTS))
        if unknown:
            raise ValueError(f"unknown components {unknown}; choose from {list(COMPONENTS)}")
        self.components = [c for c in COMPONENTS if c in components]
        self.component_flags = {k: list(v) for k, v in (component_flags or {}).items()}
        self.crd_paths = list(crd_paths)
        self._own_work_dir = work_dir is None
        self.work_dir = Path(work_dir or tempfile.mkdtemp(prefix="sdg-envtest-"))
        self.extra_apiserver_flags = list(extra_apiserver_flags)
        self.start_timeout = start_timeout
        self.ca = CertificateAuthority()
        self.webhook_serving = self.ca.serving(["127.0.0.1", "localhost"])
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self.host = ""
        self.etcd_url = ""
        self.binaries: Path | None = None
        self.kubeconfig_path = self.work_dir / "admin.kubeconfig"
        self._admin = self.ca.client(ADMIN_USER, ["system:masters"])
        self._http: AdminHTTP | None = None

    # --- lifecycle -------------------------------------------------------------------
    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        names = [*BINARIES, *(c for c in self.components if c not in BINARIES)]
        self.binaries = ensure_binaries(names)
        try:
            self._start_etcd()
            self._start_apiserver()
            self._write_kubeconfig(self.kubeconfig_path, self._admin)
            self._wait_ready()
            for component in self.components:
                self._start_component(component)
            if self.crd_paths:
                self.install_crds(self.crd_paths)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop the API server before etcd; kill whatever does not exit in time."""
        if self._http is not None:
            self._http.close()
            self._http = None
        for name in (*reversed(COMPONENTS), "kube-apiserver", "etcd"):
            proc = self._procs.pop(name, None)
            if proc is not None:
                stop_process(proc)
        if self._own_work_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)

    @property
    def pids(self) -> dict[str, int]:
        return {name: p.pid for name, p in self._procs.items()}

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        assert self.binaries is not None
        proc = spawn_logged([str(self.binaries / name), *args], self.work_dir / f"{name}.log")
        self._procs[name] = proc
        return proc

    def _log_tail(self, name: str, lines: int = 40) -> str:
        return log_tail(self.work_dir / f"{name}.log", lines)

    def _start_etcd(self) -> None:
        client, peer = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client}"
        self._spawn(
            "etcd",
            [
                f"--data-dir={self.work_dir / 'etcd'}",
                f"--listen-client-url={self.etcd_url}",
                f"--listen-peer-url=http://127.0.0.1:{peer}",
            ],
        )

    def _start_apiserver(self) -> None:
        certs = self.work_dir / "pki"
        ca_file, _ = KeyPair(self.ca.cert_pem, self.ca.key_pem).write(certs, "ca.crt", "ca.key")
        serving_cert, serving_key = self.ca.serving(["127.0.0.1", "localhost"]).write(
            certs, "apiserver.crt", "apiserver.key"
        )
        sa_pub, sa_key = service_account_keys().write(certs, "sa.pub", "sa.key")
        # kubectl logs/exec: the API server is a client of the kubelet, trusted by its CA.
        kubelet_cert, kubelet_key = self.ca.client(
            "kube-apiserver-kubelet-client", ["system:masters"]
        ).write(certs, "apiserver-kubelet-client.crt", "apiserver-kubelet-client.key")
        port = free_port()
        self.host = f"https://127.0.0.1:{port}"
        self._spawn(
            "kube-apiserver",
            [
                f"--etcd-servers={self.etcd_url}",
                f"--secure-port={port}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--cert-dir={certs}",
                f"--tls-cert-file={serving_cert}",
                f"--tls-private-key-file={serving_key}",
                f"--client-ca-file={ca_file}",
                "--authorization-mode=RBAC",
                f"--service-account-key-file={sa_pub}",
                f"--service-account-signing-key-file={sa_key}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                "--service-cluster-ip-range=10.0.0.0/24",
                # No controller-manager runs to untaint nodes or create SA tokens.
                "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition,Priority",
                "--endpoint-reconciler-type=none",
                "--allow-privileged=true",
                f"--kubelet-client-certificate={kubelet_cert}",
                f"--kubelet-client-key={kubelet_key}",
                "--kubelet-preferred-address-types=InternalIP,Hostname",
                *self.extra_apiserver_flags,
            ],
        )

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        last = ""
        while time.monotonic() < deadline:
            for name, proc in self._procs.items():
                if proc.poll() is not None:
                    raise ControlPlaneError(
                        f"{name} exited with {proc.returncode}:\n{self._log_tail(name)}"
                    )
            try:
                r = self.http.get("/readyz")
                # The default namespace comes from a post-start controller.
                if (
                    r.status_code == 200
                    and self.http.get("/api/v1/namespaces/default").status_code == 200
                ):
                    return
                last = r.text
            except TransportError as e:
                last = str(e)
            time.sleep(0.2)
        raise ControlPlaneError(
            f"kube-apiserver not ready within {self.start_timeout}s: {last}\n"
            f"{self._log_tail('kube-apiserver')}"
        )

    def _start_component(self, name: str) -> None:
        """kube-controller-manager or kube-scheduler as the admin, until its /healthz is ok."""
        port = free_port()
        common = [
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            "--authentication-skip-lookup",
            "--authorization-always-allow-paths=/healthz,/readyz,/livez",
        ]
        if name == "kube-scheduler":
            config = self.work_dir / "kube-scheduler.yaml"
            config.write_text(
                yaml.safe_dump(
                    {
                        "apiVersion": "kubescheduler.config.k8s.io/v1",
                        "kind": "KubeSchedulerConfiguration",
                        "clientConnection": {"kubeconfig": str(self.kubeconfig_path)},
                        "leaderElection": {"leaderElect": False},
                    }
                )
            )
            args = [f"--config={config}", *common]
        else:
            pki = self.work_dir / "pki"
            args = [
                f"--kubeconfig={self.kubeconfig_path}",
                "--leader-elect=false",
                "--use-service-account-credentials=false",
                f"--service-account-private-key-file={pki / 'sa.key'}",
                f"--root-ca-file={pki / 'ca.crt'}",
                *common,
            ]
        self._spawn(name, [*args, *self.component_flags.get(name, ())])
        deadline = time.monotonic() + self.start_timeout
        unverified = ssl.create_default_context()
        unverified.check_hostname = False
        unverified.verify_mode = ssl.CERT_NONE  # its serving certificate is self-signed
        http = AdminHTTP(f"https://127.0.0.1:{port}", unverified, timeout=5)
        while time.monotonic() < deadline:
            proc = self._procs[name]
            if proc.poll() is not None:
                raise ControlPlaneError(
                    f"{name} exited with {proc.returncode}:\n{self._log_tail(name)}"
                )
            with contextlib.suppress(*TransportError):
                if http.get("/healthz").status_code == 200:
                    return
            time.sleep(0.2)
        raise ControlPlaneError(f"{name} not healthy within {self.start_timeout}s")

    # --- access ----------------------------------------------------------------------
    @property
    def http(self) -> AdminHTTP:
        """A synchronous admin HTTP client for setup work (not for code under test)."""
        if self._http is None:
            pki = self.work_dir / "pki"
            cert, key = self._admin.write(pki, "admin.crt", "admin.key")
            ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
            ctx.load_cert_chain(str(cert), str(key))
            self._http = AdminHTTP(self.host, ctx, timeout=30)
        return self._http

    def _write_kubeconfig(self, path: Path, pair: KeyPair, user: str = ADMIN_USER) -> Path:
        credentials = {
            "client-certificate-data": base64.b64encode(pair.cert_pem).decode(),
            "client-key-data": base64.b64encode(pair.key_pem).decode(),
        }
        return self._kubeconfig_file(path, user, credentials)

    def _kubeconfig_file(self, path: Path, user: str, credentials: Mapping[str, str]) -> Path:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "envtest",
                    "cluster": {
                        "server": self.host,
                        "certificate-authority-data": base64.b64encode(self.ca.cert_pem).decode(),
                    },
                }
            ],
            "users": [
                {
                    "name": user,
                    "user": dict(credentials),
                }
            ],
            "contexts": [{"name": "envtest", "context": {"cluster": "envtest", "user": user}}],
            "current-context": "envtest",
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
        return path

    def user_kubeconfig(self, user: str, groups: Sequence[str] = ()) -> Path:
        """A kubeconfig for a client-certificate identity that has no rights until granted."""
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in user)
        path = self.work_dir / "users" / f"{safe}.kubeconfig"
        return self._write_kubeconfig(path, self.ca.client(user, list(groups)), user)

    def service_account_token(
        self, namespace: str, name: str, expiration_seconds: int = 3600
    ) -> str:
        """A token for ServiceAccount ``namespace/name`` from the TokenRequest API (what a
        projected token volume gives a pod); the ServiceAccount is created if missing, the
        namespace must exist."""
        r = self.http.post(
            f"/api/v1/namespaces/{namespace}/serviceaccounts",
            json={"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}},
        )
        if r.status_code not in (201, 409):
            raise ControlPlaneError(f"creating ServiceAccount {namespace}/{name}: {r.text}")
        r = self.http.post(
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
            json={
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {"expirationSeconds": expiration_seconds},
            },
        )
        if r.status_code != 201:
            raise ControlPlaneError(f"a token for ServiceAccount {namespace}/{name}: {r.text}")
        return str(r.json()["status"]["token"])

    def service_account_kubeconfig(
        self, namespace: str, name: str, expiration_seconds: int = 3600
    ) -> Path:
        """A kubeconfig with a token of ServiceAccount ``namespace/name``
        (``service_account_token``): how a pod of the cluster authenticates. The API server
        caches a token's verdict for 10 s; a client certificate (``user_kubeconfig``) is
        verified on every request, so the two cost it differently."""
        token = self.service_account_token(namespace, name, expiration_seconds)
        user = f"system:serviceaccount:{namespace}:{name}"
        path = self.work_dir / "users" / f"sa_{namespace}_{name}.kubeconfig"
        return self._kubeconfig_file(path, user, {"token": token})

    def bind_cluster_role(
        self, user: str, cluster_role: str, namespace: str | None = None
    ) -> dict[str, Any]:
        """Grant ``user`` the ClusterRole ``cluster_role``: in ``namespace`` with a
        RoleBinding, else cluster-wide with a ClusterRoleBinding (``<role>-<user>`` either
        way). Returns the binding as stored."""
        binding: dict[str, Any] = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding" if namespace else "ClusterRoleBinding",
            "metadata": {"name": f"{cluster_role}-{user}"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": cluster_role,
            },
            "subjects": [{"kind": "User", "name": user, "apiGroup": "rbac.authorization.k8s.io"}],
        }
        if namespace:
            binding["metadata"]["namespace"] = namespace
        return self.apply(binding)

    # --- installing things -----------------------------------------------------------
    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply one object as the admin (field manager ``envtest``)."""
        group_version = obj["apiVersion"]
        kind = obj["kind"]
        plural, namespaced = self._resource_for(group_version, kind)
        meta = obj["metadata"]
        prefix = f"/api/{group_version}" if "/" not in group_version else f"/apis/{group_version}"
        ns = meta.get("namespace") or ("default" if namespaced else None)
        path = prefix + (f"/namespaces/{ns}" if ns else "") + f"/{plural}/{meta['name']}"
        r = self.http.patch(
            path,
            params={"fieldManager": "envtest", "force": "true"},
            content=yaml.safe_dump(obj),
            headers={"Content-Type": "application/apply-patch+yaml"},
        )
        if r.status_code >= 300:
            raise ControlPlaneError(f"apply {kind} {meta['name']}: {r.status_code} {r.text}")
        return dict(r.json())

    def delete(
        self, group_version: str, kind: str, name: str, namespace: str | None = None
    ) -> None:
        plural, _ = self._resource_for(group_version, kind)
        prefix = f"/api/{group_version}" if "/" not in group_version else f"/apis/{group_version}"
        path = prefix + (f"/namespaces/{namespace}" if namespace else "") + f"/{plural}/{name}"
        r = self.http.delete(path)
        if r.status_code not in (200, 202, 404):
            raise ControlPlaneError(f"delete {kind} {name}: {r.status_code} {r.text}")

    def _resource_for(self, group_version: str, kind: str) -> tuple[str, bool]:
        prefix = f"/api/{group_version}" if "/" not in group_version else f"/apis/{group_version}"
        r = self.http.get(prefix)
        if r.status_code != 200:
            raise ControlPlaneError(f"API group {group_version} not served: {r.status_code}")
        for res in r.json()["resources"]:
            if res["kind"] == kind and "/" not in res["name"]:
                return res["name"], bool(res["namespaced"])
        raise ControlPlaneError(f"kind {kind} not served in {group_version}")

    def install_crds(self, paths: Iterable[str | Path], timeout: float = 30.0) -> list[str]:
        """Apply every CRD found in the paths and wait until each is Established."""
        crds = [d for d in load_manifests(paths) if d.get("kind") == "CustomResourceDefinition"]
        for crd in crds:
            self.apply(crd)
        names = [c["metadata"]["name"] for c in crds]
        deadline = time.monotonic() + timeout
        pending = set(names)
        while pending and time.monotonic() < deadline:
            for name in list(pending):
                r = self.http.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
                conds = (
                    (r.json().get("status") or {}).get("conditions") or [] if r.is_success else []
                )
                if any(c["type"] == "Established" and c["status"] == "True" for c in conds):
                    pending.discard(name)
            if pending:
                time.sleep(0.1)
        if pending:
            raise ControlPlaneError(f"CRDs not Established within {timeout}s: {sorted(pending)}")
        # Discovery caches in the API server catch up asynchronously; wait until served.
        for crd in crds:
            gv = f"{crd['spec']['group']}/{crd['spec']['versions'][0]['name']}"
            while time.monotonic() < deadline:
                if self.http.get(f"/apis/{gv}").status_code == 200:
                    break
                time.sleep(0.1)
        return names

    # --- webhooks --------------------------------------------------------------------
    def webhook_cert_dir(self, directory: str | Path | None = None) -> Path:
        """Write the webhook serving pair as tls.crt/tls.key (valid for 127.0.0.1)."""
        target = Path(directory) if directory else self.work_dir / "webhook-certs"
        self.webhook_serving.write(target, "tls.crt", "tls.key")
        return target

    def webhook_configurations(
        self,
        paths_or_objects: Iterable[str | Path | dict[str, Any]],
        port: int,
        namespace: str | None = None,
    ) -> list[dict[str, Any]]:
        """Webhook configurations rewritten to call ``https://127.0.0.1:<port><path>``.

        A service reference or a URL becomes a URL on loopback with this CA as caBundle,
        so the real API server calls a webhook server running in the test process over
        TLS. The path is kept: the service's ``path``, or the path of the ``url``.

        With ``namespace``, each configuration is named ``<name>-<namespace>`` and its
        webhooks get a ``namespaceSelector`` for that namespace alone (replacing theirs):
        tests sharing the control plane then never call each other's webhooks.
        """
        objs: list[dict[str, Any]] = []
        for item in paths_or_objects:
            objs += [item] if isinstance(item, dict) else load_manifests([item])
        out = []
        ca_bundle = base64.b64encode(self.ca.cert_pem).decode()
        for obj in objs:
            if obj.get("kind") not in (
                "MutatingWebhookConfiguration",
                "ValidatingWebhookConfiguration",
            ):
                continue
            obj = copy.deepcopy(obj)
            if namespace:
                obj["metadata"]["name"] = f"{obj['metadata']['name']}-{namespace}"
            for hook in obj.get("webhooks", []):
                if namespace:
                    only = {"kubernetes.io/metadata.name": namespace}
                    hook["namespaceSelector"] = {"matchLabels": only}
                cfg = hook.get("clientConfig") or {}
                if cfg.get("url"):
                    path = urlsplit(cfg["url"]).path or "/"
                else:
                    path = (cfg.get("service") or {}).get("path") or "/"
                hook["clientConfig"] = {
                    "url": f"https://127.0.0.1:{port}{path}",
                    "caBundle": ca_bundle,
                }
            out.append(obj)
        return out

    def install_webhooks(
        self,
        paths_or_objects: Iterable[str | Path | dict[str, Any]],
        port: int,
        namespace: str | None = None,
    ) -> list[dict[str, Any]]:
        """Apply the rewritten webhook configurations (:meth:`webhook_configurations`);
        returns what was applied."""
        objs = self.webhook_configurations(paths_or_objects, port, namespace)
        return [self.apply(o) for o in objs]

    @contextlib.contextmanager
    def webhooks(
        self,
        paths_or_objects: Iterable[str | Path | dict[str, Any]],
        port: int,
        namespace: str | None = None,
    ) -> Iterator[list[dict[str, Any]]]:
        """:meth:`install_webhooks` for the ``with`` block; deleted again when it ends."""
        installed = self.install_webhooks(paths_or_objects, port, namespace)
        try:
            yield installed
        finally:
            for obj in installed:
                self.delete(obj["apiVersion"], obj["kind"], obj["metadata"]["name"])


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); read its state.
    with contextlib.suppress(OSError):
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
        return state != "Z"
    return True

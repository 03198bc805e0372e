"""The manager image as ``make image`` builds it here (hack/image.py: podman, on a Debian
base made by mmdebstrap), run through testcontainers over podman's API socket.

It holds exactly the checkout's packages, runs its entrypoint as its numeric non-root user,
saves as the docker-archive that containerd imports, and the manager in it becomes ready
against the session's real kube-apiserver (host network, a kubeconfig of the manager's
ServiceAccount identity and RBAC, mounted read-only as a Secret would be): ``/readyz``
answers 200 and the manager holds its leader Lease.

Where the image cannot be built (not root, no podman or mmdebstrap) every test that needs
it skips with that reason. The first run on a machine makes the base (about 1.5 minutes)
and the image (about 1 minute; both need the network: a Debian mirror and the package
index); later runs reuse both and take seconds.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import tarfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from testcontainers.core.config import ConnectionMode, testcontainers_config
from testcontainers.core.container import DockerContainer

from controllers.settings import Settings
from hack.image import (
    BUILDER_ARG,
    BUILDER_STAGE,
    INSTALL_HINT,
    ImageError,
    build_image,
    cache_dir,
    cannot_build,
    image_info,
    podman_env,
    save_image,
)
from sdgruntime.envtest import ControlPlane
from sdgruntime.envtest.controlplane import free_port, stop_process
from tests.e2e.harness import MANAGER_NS, install_rbac, manager_kubeconfig

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
#: The image's user (the Dockerfile's USER), which the kubelet checks for runAsNonRoot.
UID = 65532
PACKAGES = ("sdgruntime", "api", "controllers", "webhooks")
# Run in the image by its venv's python: each installed module of the packages and its hash.
INSTALLED = (
    "import hashlib, json, pathlib, sysconfig\n"
    "site = pathlib.Path(sysconfig.get_paths()['purelib'])\n"
    f"packages = {PACKAGES!r}\n"
    "print(json.dumps({str(p.relative_to(site)): hashlib.sha256(p.read_bytes()).hexdigest()\n"
    "    for pkg in packages for p in sorted((site / pkg).rglob('*.py'))}))\n"
)


@dataclass(frozen=True)
class Built:
    tag: str
    #: The checkout's modules, by path, with their hash, unchanged while the image was built.
    sources: dict[str, str]
    #: Every module of the checkout before or after the build (others may edit meanwhile).
    seen: frozenset[str]


def checkout_sources() -> dict[str, str]:
    """The modules the wheels are built from: the packages' .py files, without what a local
    build or run leaves (build/, __pycache__/, *.egg-info/, which .dockerignore drops)."""
    found = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT)
            if rel.parts[1:2] == ("build",) or any(
                p == "__pycache__" or p.endswith(".egg-info") for p in rel.parts
            ):
                continue
            found[rel.as_posix()] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


@pytest.fixture(scope="module")
def built() -> Built:
    """The image, built (or found up to date) by hack/image.py; skips where it cannot be."""
    reason = cannot_build()
    if reason:
        pytest.skip(reason)
    before = checkout_sources()
    tag = build_image()
    after = checkout_sources()
    stable = {f: digest for f, digest in before.items() if after.get(f) == digest}
    return Built(tag, stable, frozenset(before) | frozenset(after))


@pytest.fixture(scope="module")
def podman_socket(built: Built, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """podman's Docker-compatible API on a private socket, for testcontainers (no Ryuk: the
    containers are removed here; connection mode docker_host: these VMs carry /.dockerenv,
    and testcontainers would take itself for a container)."""
    folder = tmp_path_factory.mktemp("podman")
    sock = folder / "podman.sock"
    url = f"unix://{sock}"
    with open(folder / "service.log", "wb") as log:
        service = subprocess.Popen(
            ["podman", "system", "service", "--time=0", url],
            env=podman_env(),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 30
        while not sock.exists():
            assert service.poll() is None, (folder / "service.log").read_text()
            assert time.monotonic() < deadline, "podman system service made no socket in 30s"
            time.sleep(0.1)
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("DOCKER_HOST", url)
            mp.setenv("TESTCONTAINERS_RYUK_DISABLED", "true")
            mp.setenv("TESTCONTAINERS_CONNECTION_MODE", "docker_host")
            # testcontainers read both when it was imported
            mp.setattr(testcontainers_config, "ryuk_disabled", True)
            mp.setattr(
                testcontainers_config, "connection_mode_override", ConnectionMode.docker_host
            )
            yield url
    finally:
        stop_process(service)


def run_to_exit(container: DockerContainer, timeout: float = 60) -> tuple[int, str, str]:
    """Start ``container``, wait for it to exit, remove it: (exit code, stdout, stderr)."""
    container.start()
    try:
        code = container.wait()
        out, err = container.get_logs()
    finally:
        container.stop()
    return code, out.decode(), err.decode()


def test_dockerfile_keys_the_wheel_install_on_the_builder() -> None:
    """hack/image.py passes the builder's image ID as BUILDER_ARG: the final stage must
    declare it before the step that mounts the builder, or podman 4.3 reuses that step's
    cached venv after the wheels changed (the next test would see old modules)."""
    final = (ROOT / "Dockerfile").read_text().rsplit("\nFROM ", 1)[1]
    declared = re.search(rf"^ARG {BUILDER_ARG}\b", final, re.M)
    mounted = re.search(rf"^RUN --mount=type=bind,from={BUILDER_STAGE},", final, re.M)
    assert declared and mounted and declared.start() < mounted.start(), final


def test_missing_tools_fail_clearly_and_make_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Without podman and mmdebstrap: one error naming both and the install command, before
    anything is made (no cache folder, no tar)."""
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with pytest.raises(ImageError) as error:
        build_image("localhost/sdg-manager:never")
    assert "podman and mmdebstrap are not installed" in str(error.value)
    assert INSTALL_HINT in str(error.value)
    with pytest.raises(ImageError, match="podman is not installed"):
        save_image("localhost/sdg-manager:never", tmp_path / "never.tar")
    assert not cache_dir().exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin"]


def test_image_holds_the_checkouts_modules(built: Built, podman_socket: str) -> None:
    """Each module of the four packages is in the image as it is in the checkout, and no
    other: a stale layer cache (old wheels under new sources) fails here."""
    container = DockerContainer(built.tag).with_kwargs(entrypoint=["python", "-c", INSTALLED])
    code, out, err = run_to_exit(container)
    assert code == 0, err
    installed: dict[str, str] = json.loads(out)
    stale = sorted(f for f, digest in built.sources.items() if installed.get(f) != digest)
    extra = sorted(set(installed) - built.seen)
    assert not stale and not extra, f"differ from the checkout: {stale}; not in it: {extra}"
    assert len(installed) >= len(built.sources) > 50


def test_image_runs_the_manager_as_its_non_root_user(built: Built, podman_socket: str) -> None:
    """The entrypoint is sdg-manager, run as UID 65532 (numeric, for runAsNonRoot); its
    --help lists every setting."""
    config = (image_info(built.tag) or {}).get("Config") or {}
    assert config.get("User") == f"{UID}:{UID}"
    assert config.get("Entrypoint") == ["sdg-manager"]
    code, out, err = run_to_exit(DockerContainer(built.tag).with_command(["--help"]))
    assert code == 0, out + err
    assert out.startswith("usage: sdg-manager"), out
    for name in Settings.model_fields:
        assert f"--{name.replace('_', '-')}" in out, name
    code, out, err = run_to_exit(DockerContainer(built.tag).with_kwargs(entrypoint=["id"]))
    assert code == 0, err
    assert out.split()[:2] == [f"uid={UID}({UID})", f"gid={UID}({UID})"], out


def test_manager_from_the_image_becomes_ready(
    built: Built, podman_socket: str, control_plane: ControlPlane, tmp_path: Path
) -> None:
    """The manager of the image, on the host network against the local API server, under
    the manager's ServiceAccount identity and config/rbac: /readyz answers 200 (cache synced,
    webhook server serving its certificate), it holds its leader Lease, and its process runs
    as UID 65532."""
    install_rbac(control_plane)
    # What a Secret volume gives the pod: files the container's user can read, read-only.
    mounted = tmp_path / "etc-sdg"
    (mounted / "certs").mkdir(parents=True)
    shutil.copy(manager_kubeconfig(control_plane), mounted / "kubeconfig")
    for name in ("tls.crt", "tls.key"):
        shutil.copy(control_plane.webhook_cert_dir() / name, mounted / "certs" / name)
    for path in (mounted, mounted / "certs", *mounted.rglob("*")):
        path.chmod(0o755 if path.is_dir() else 0o400)
        shutil.chown(path, UID, UID)
    probe, webhook = free_port(), free_port()
    lease = f"sdg-image-{uuid.uuid4().hex[:8]}"
    args = [
        "--kubeconfig=/etc/sdg/kubeconfig",
        f"--health-probe-bind-address=127.0.0.1:{probe}",
        "--metrics-bind-address=0",
        "--webhook-host=127.0.0.1",
        f"--webhook-port={webhook}",
        "--webhook-cert-dir=/etc/sdg/certs",
        f"--claims-namespace={MANAGER_NS}",
        "--leader-elect",
        f"--leader-election-namespace={MANAGER_NS}",
        f"--leader-election-id={lease}",
    ]
    container = (
        DockerContainer(built.tag)
        .with_command(args)
        .with_volume_mapping(str(mounted), "/etc/sdg", "ro")
        .with_kwargs(network_mode="host")
    )
    readyz = f"http://127.0.0.1:{probe}/readyz"
    lease_path = f"/apis/coordination.k8s.io/v1/namespaces/{MANAGER_NS}/leases/{lease}"
    container.start()
    try:

        def logs() -> str:
            out, err = container.get_logs()
            return (out + err).decode(errors="replace")

        deadline = time.monotonic() + 90
        status, holder = 0, ""
        while status != 200 or not holder:
            container.reload()
            assert container.status == "running", f"the manager exited:\n{logs()}"
            assert time.monotonic() < deadline, (
                f"not ready in 90s (/readyz {status}, lease holder {holder!r}):\n{logs()}"
            )
            time.sleep(0.5)
            try:
                status = httpx.get(readyz, timeout=2).status_code
            except httpx.TransportError:
                status = 0
            r = control_plane.http.get(lease_path)
            holder = r.json()["spec"].get("holderIdentity", "") if r.status_code == 200 else ""
        assert "manager: cache synced" in logs()
        # The manager's process as the host sees it (rootful podman maps no user IDs);
        # read here rather than by an exec, whose conmon would linger for minutes.
        pid = int(container.get_wrapped_container().attrs["State"]["Pid"])
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        assert "/opt/sdg/bin/sdg-manager --kubeconfig=" in cmdline, cmdline
        status_text = Path(f"/proc/{pid}/status").read_text()
        uids = re.search(r"^Uid:\s+(.*)$", status_text, re.M)
        assert uids and set(uids.group(1).split()) == {str(UID)}, status_text
    finally:
        container.stop()
        control_plane.http.delete(lease_path)
    # It was the container that answered: gone with it.
    with pytest.raises(httpx.TransportError):
        httpx.get(readyz, timeout=2)


def read_json(tar: tarfile.TarFile, name: str) -> Any:
    member = tar.extractfile(name)
    assert member is not None, f"{name} is not a file in the archive"
    return json.load(member)


def test_saved_image_is_a_docker_archive_of_the_tag(built: Built, tmp_path: Path) -> None:
    """save_image writes what `ctr -n k8s.io images import` reads: a docker-archive whose
    manifest names the tag, with the image's config (user, entrypoint) and every layer."""
    path = tmp_path / "sdg-manager.tar"
    try:
        assert save_image(built.tag, path) == path
        assert not list(tmp_path.glob(".*partial"))
        with tarfile.open(path) as tar:
            (manifest,) = read_json(tar, "manifest.json")
            assert manifest["RepoTags"] == [built.tag]
            config = read_json(tar, manifest["Config"])
            names = set(tar.getnames())
        assert config["config"]["User"] == f"{UID}:{UID}"
        assert config["config"]["Entrypoint"] == ["sdg-manager"]
        assert manifest["Layers"] and set(manifest["Layers"]) <= names
        assert len(manifest["Layers"]) == len(config["rootfs"]["diff_ids"])
    finally:
        path.unlink(missing_ok=True)

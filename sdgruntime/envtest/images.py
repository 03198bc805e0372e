"""Container images for a real node without a registry: ``pause`` and ``busybox``.

Both are made here, once per machine, as docker-archive tars that containerd imports
(``ctr -n k8s.io images import``) — there is no registry to pull from:

- ``pause``: Kubernetes' own ``build/pause/linux/pause.c`` from the ``k8s.io/kubernetes``
  module that ``hack/controlplane`` pins, compiled static with gcc, as its Makefile does;
- ``busybox``: Debian's ``busybox-static`` binary with a symlink per applet.

Pods use them with ``imagePullPolicy: Never``.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from sdgruntime.envtest.build import BuildError, build_once, cache_root, find_source_dir

#: The pause image the sandbox runs, tagged as containerd's config names it.
PAUSE_IMAGE = "registry.k8s.io/pause:3.10.2"
#: A busybox for test pods; ``imagePullPolicy: Never`` (the tag is local, nothing is pulled).
BUSYBOX_IMAGE = "localhost/envtest/busybox:1"
BUSYBOX_BINARY = Path("/bin/busybox")


@dataclass(frozen=True)
class Image:
    """An image tar and the reference it carries."""

    ref: str
    tar: Path


def _layer(files: dict[str, tuple[bytes, int]], links: dict[str, str]) -> bytes:
    """A layer tar: ``files`` path -> (content, mode), ``links`` path -> symlink target."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        dirs = sorted({str(Path(p).parent) for p in [*files, *links]} - {"."})
        for d in dirs:
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for path, (data, mode) in sorted(files.items()):
            info = tarfile.TarInfo(path)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
        for path, target in sorted(links.items()):
            info = tarfile.TarInfo(path)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    return buf.getvalue()


def write_docker_archive(path: Path, ref: str, layer: bytes, config: Mapping[str, object]) -> Path:
    """One-layer image ``ref`` as a docker-archive tar (``docker save``'s format)."""
    diff_id = hashlib.sha256(layer).hexdigest()
    image_config = {
        "architecture": "amd64",
        "os": "linux",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{diff_id}"]},
        "history": [{"created_by": "sdgruntime.envtest.images"}],
    }
    config_bytes = json.dumps(image_config, sort_keys=True).encode()
    config_name = f"{hashlib.sha256(config_bytes).hexdigest()}.json"
    manifest = [{"Config": config_name, "RepoTags": [ref], "Layers": [f"{diff_id}/layer.tar"]}]
    tmp = path.with_suffix(".tmp")
    with tarfile.open(tmp, "w") as tar:
        for name, data in (
            (f"{diff_id}/layer.tar", layer),
            (config_name, config_bytes),
            ("manifest.json", json.dumps(manifest).encode()),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    tmp.rename(path)
    return path


def _pause_source() -> Path:
    """pause.c of the k8s.io/kubernetes module pinned by hack/controlplane (downloaded once)."""
    source = find_source_dir()
    go = shutil.which("go")
    if go is None:
        raise BuildError("Go is required to fetch Kubernetes' pause.c (go mod download)")
    env = {**os.environ, "GOFLAGS": "-mod=mod"}
    env.setdefault("GOTOOLCHAIN", "local")
    proc = subprocess.run(
        [go, "mod", "download", "-json", "k8s.io/kubernetes"],
        cwd=source,
        env=env,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise BuildError(f"go mod download k8s.io/kubernetes failed:\n{proc.stderr[-2000:]}")
    pause_c = Path(json.loads(proc.stdout)["Dir"]) / "build" / "pause" / "linux" / "pause.c"
    if not pause_c.is_file():
        raise BuildError(f"{pause_c} is missing from the k8s.io/kubernetes module")
    return pause_c


def pause_image() -> Image:
    """The sandbox image, compiled from Kubernetes' pause.c (static, like its Makefile)."""
    pause_c = _pause_source()
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        raise BuildError("a C compiler is needed for the pause image: apt-get install -y gcc")
    digest = hashlib.sha256(pause_c.read_bytes()).hexdigest()[:12]
    out = cache_root() / "images" / f"pause-{digest}"
    tar = out / "pause.tar"

    def build(folder: Path) -> None:
        binary = folder / "pause"
        version = PAUSE_IMAGE.rsplit(":", 1)[1]
        cmd = [cc, "-Os", "-Wall", "-static", f"-DVERSION=v{version}", "-o", str(binary)]
        proc = subprocess.run([*cmd, str(pause_c)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise BuildError(
                f"compiling pause.c failed (a static libc is in Debian's libc6-dev):\n"
                f"{proc.stderr[-2000:]}"
            )
        layer = _layer({"pause": (binary.read_bytes(), 0o755)}, {})
        write_docker_archive(tar, PAUSE_IMAGE, layer, {"Entrypoint": ["/pause"], "User": "65535"})

    build_once(out, ["pause.tar"], build)
    return Image(PAUSE_IMAGE, tar)


def busybox_image() -> Image:
    """A busybox image from the machine's static busybox (Debian: busybox-static)."""
    if not BUSYBOX_BINARY.is_file():
        raise BuildError(
            f"{BUSYBOX_BINARY} is missing: apt-get install -y busybox-static "
            "(the test pods' image is made from it)"
        )
    data = BUSYBOX_BINARY.read_bytes()
    digest = hashlib.sha256(data).hexdigest()[:12]
    out = cache_root() / "images" / f"busybox-{digest}"
    tar = out / "busybox.tar"

    def build(folder: Path) -> None:
        proc = subprocess.run([str(BUSYBOX_BINARY), "--list"], capture_output=True, text=True)
        if proc.returncode != 0:
            raise BuildError(f"{BUSYBOX_BINARY} --list failed: {proc.stderr}")
        applets = [a for a in proc.stdout.split() if a and a != "busybox"]
        links = {f"bin/{a}": "busybox" for a in applets}
        layer = _layer({"bin/busybox": (data, 0o755)}, links)
        config = {"Cmd": ["sh"], "Env": ["PATH=/bin"]}
        write_docker_archive(tar, BUSYBOX_IMAGE, layer, config)

    build_once(out, ["busybox.tar"], build)
    return Image(BUSYBOX_IMAGE, tar)

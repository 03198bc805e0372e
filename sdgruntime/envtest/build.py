"""Build (once per machine) and locate the control-plane binaries from hack/controlplane.

The binaries are cached outside the repository, keyed by the Kubernetes version and a hash
of the Go module files, so a warm start costs nothing and a dependency bump rebuilds.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import re
import shutil
import subprocess
from pathlib import Path

log = logging.getLogger(__name__)

BINARIES = ("etcd", "kube-apiserver", "kube-scheduler")
_SOURCES = ("go.mod", "go.sum", "tools.go", "etcd/main.go")


class BuildError(RuntimeError):
    """The Go build of the control plane failed; the message carries the compiler output."""


def find_source_dir() -> Path:
    """The hack/controlplane module: $SDG_CONTROLPLANE_SRC, else next to this checkout."""
    env = os.environ.get("SDG_CONTROLPLANE_SRC")
    candidates = [Path(env)] if env else []
    here = Path(__file__).resolve()
    candidates += [p / "hack" / "controlplane" for p in here.parents]
    candidates += [p / "hack" / "controlplane" for p in [Path.cwd(), *Path.cwd().parents]]
    for c in candidates:
        if (c / "go.mod").is_file():
            return c
    raise BuildError(
        "cannot find hack/controlplane/go.mod; run from a checkout of the project or set "
        "SDG_CONTROLPLANE_SRC (or SDG_CONTROLPLANE_BIN to a folder with prebuilt binaries)"
    )


def kubernetes_version(source: Path) -> str:
    """The k8s.io/kubernetes version that go.mod requires, e.g. ``v1.37.2``."""
    match = re.search(r"^\s*k8s\.io/kubernetes\s+(v\S+)", (source / "go.mod").read_text(), re.M)
    if not match:
        raise BuildError(f"{source / 'go.mod'} does not require k8s.io/kubernetes")
    return match.group(1)


def cache_dir(source: Path) -> Path:
    digest = hashlib.sha256()
    for name in _SOURCES:
        digest.update((source / name).read_bytes())
    root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "sdg" / "controlplane"
    return root / f"{kubernetes_version(source)}-{digest.hexdigest()[:12]}"


def _ldflags(version: str) -> str:
    major, minor = version.lstrip("v").split(".")[:2]
    flags = ["-s", "-w"]
    # Both packages carry a version; without -X /version reports v0.0.0.
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {pkg}.gitVersion={version}",
            f"-X {pkg}.gitMajor={major}",
            f"-X {pkg}.gitMinor={minor}",
            f"-X {pkg}.gitTreeState=clean",
            f"-X {pkg}.buildDate=1970-01-01T00:00:00Z",
        ]
    return " ".join(flags)


def ensure_binaries() -> Path:
    """Return a folder holding etcd, kube-apiserver and kube-scheduler, building if needed."""
    prebuilt = os.environ.get("SDG_CONTROLPLANE_BIN")
    if prebuilt:
        folder = Path(prebuilt)
        missing = [b for b in BINARIES if not (folder / b).is_file()]
        if missing:
            raise BuildError(f"SDG_CONTROLPLANE_BIN={folder} lacks {', '.join(missing)}")
        return folder
    source = find_source_dir()
    out = cache_dir(source)
    if all((out / b).is_file() for b in BINARIES):
        return out
    out.mkdir(parents=True, exist_ok=True)
    # One build per machine at a time: parallel test sessions wait for the first.
    with open(out / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not all((out / b).is_file() for b in BINARIES):
            _build(source, out)
    return out


def _build(source: Path, out: Path) -> None:
    go = shutil.which("go")
    if go is None:
        raise BuildError("Go is not installed; the local control plane is built from source")
    version = kubernetes_version(source)
    env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-mod=mod -buildvcs=false"}
    env.setdefault("GOTOOLCHAIN", "local")
    targets = {
        "etcd": "./etcd",
        "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
        "kube-scheduler": "k8s.io/kubernetes/cmd/kube-scheduler",
    }
    for name, pkg in targets.items():
        if (out / name).is_file():
            continue
        log.warning("building %s %s (first run on this machine; takes minutes)", name, version)
        tmp = out / f".{name}.tmp"
        cmd = [go, "build", "-ldflags", _ldflags(version), "-o", str(tmp), pkg]
        proc = subprocess.run(cmd, cwd=source, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise BuildError(f"go build {pkg} failed:\n{proc.stderr[-4000:]}")
        tmp.rename(out / name)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    print(ensure_binaries())

"""Build (once per machine) and locate the control-plane binaries from hack/controlplane.

The binaries are cached outside the repository, keyed by the Kubernetes version and a hash
of the Go module files, so a warm start costs nothing and a dependency bump rebuilds.
``KUBEBUILDER_ASSETS`` (a folder with ``etcd`` and ``kube-apiserver``, as controller-runtime's
setup-envtest installs them) is used instead when set, and then nothing is built.

``python -m sdgruntime.envtest.build`` builds them (saying what and how long) and prints
the folder.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

log = logging.getLogger(__name__)

BINARIES = ("etcd", "kube-apiserver", "kube-scheduler")
#: What ControlPlane runs; all a KUBEBUILDER_ASSETS folder needs.
ENVTEST_BINARIES = ("etcd", "kube-apiserver")
# Rough minutes of a first build on 2 cores, told to the person waiting. Measured on 2
# cores with the modules already downloaded: etcd 28s, kube-apiserver 2m43s, kube-scheduler
# 30s (it reuses kube-apiserver's packages); a fresh machine downloads the modules first.
_FIRST_BUILD_MINUTES = {"etcd": 1, "kube-apiserver": 4, "kube-scheduler": 1}
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


def cache_root() -> Path:
    """~/.cache/sdg (or $XDG_CACHE_HOME/sdg): every tool built from a Go module under hack/."""
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "sdg"


def cache_dir(source: Path) -> Path:
    digest = hashlib.sha256()
    for name in _SOURCES:
        digest.update((source / name).read_bytes())
    return cache_root() / "controlplane" / f"{kubernetes_version(source)}-{digest.hexdigest()[:12]}"


def build_once(out: Path, binaries: Sequence[str], build: Callable[[Path], None]) -> Path:
    """``out`` once it holds every one of ``binaries``, calling ``build(out)`` if it does not.

    One build per machine at a time: parallel test sessions wait for the first, then find
    the binaries there. ``build`` should move each binary into place only when complete.
    """
    if all((out / b).is_file() for b in binaries):
        return out
    out.mkdir(parents=True, exist_ok=True)
    with open(out / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not all((out / b).is_file() for b in binaries):
            build(out)
    return out


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


def _prebuilt(variable: str, folder: Path, binaries: Sequence[str]) -> Path:
    missing = [b for b in binaries if not os.access(folder / b, os.X_OK) or (folder / b).is_dir()]
    if missing:
        raise BuildError(
            f"{variable}={folder} lacks {' and '.join(missing)} (an executable file each): "
            f"it must hold {' and '.join(binaries)}; unset {variable} to build them from "
            "hack/controlplane instead"
        )
    log.info("using %s from %s=%s; nothing is built", ", ".join(binaries), variable, folder)
    return folder


def ensure_binaries() -> Path:
    """A folder holding etcd and kube-apiserver (and, when built here, kube-scheduler):
    $KUBEBUILDER_ASSETS, else $SDG_CONTROLPLANE_BIN, else the cached build, building it
    once per machine if needed."""
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if assets:
        return _prebuilt("KUBEBUILDER_ASSETS", Path(assets), ENVTEST_BINARIES)
    prebuilt = os.environ.get("SDG_CONTROLPLANE_BIN")
    if prebuilt:
        folder = Path(prebuilt)
        missing = [b for b in BINARIES if not (folder / b).is_file()]
        if missing:
            raise BuildError(f"SDG_CONTROLPLANE_BIN={folder} lacks {', '.join(missing)}")
        return folder
    source = find_source_dir()
    return build_once(cache_dir(source), BINARIES, lambda out: _build(source, out))


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
    todo = [name for name in targets if not (out / name).is_file()]
    minutes = sum(_FIRST_BUILD_MINUTES[name] for name in todo)
    log.info(
        "building the local control plane %s (%s) from %s into %s: first run on this "
        "machine, about %d minutes on 2 cores; later runs start it in seconds",
        version,
        ", ".join(todo),
        source,
        out,
        minutes,
    )
    started = time.monotonic()
    for i, name in enumerate(todo, 1):
        log.info(
            "building %s %s (%d of %d; first run on this machine: about %d minute%s on 2 cores)…",
            name,
            version,
            i,
            len(todo),
            _FIRST_BUILD_MINUTES[name],
            "" if _FIRST_BUILD_MINUTES[name] == 1 else "s",
        )
        began = time.monotonic()
        tmp = out / f".{name}.tmp"
        cmd = [go, "build", "-ldflags", _ldflags(version), "-o", str(tmp), targets[name]]
        proc = subprocess.run(cmd, cwd=source, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise BuildError(f"go build {targets[name]} failed:\n{proc.stderr[-4000:]}")
        tmp.rename(out / name)
        log.info("… %s done in %s", name, _elapsed(time.monotonic() - began))
    log.info("control plane built in %s: %s", _elapsed(time.monotonic() - started), out)


def _elapsed(seconds: float) -> str:
    """``4m12s``, ``38s``."""
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def main() -> int:
    # INFO to stderr, without logger names: what is built and how long it took is for the
    # person waiting; stdout is only the folder, for scripts.
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        folder = ensure_binaries()
    except BuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())

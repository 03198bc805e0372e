"""Build (once per machine) and locate the helm CLI from the Go module in hack/helm.

Like the control plane (build.py): built from source with the local Go toolchain, cached
in ~/.cache/sdg/helm/<helm version>-<hash of go.mod and go.sum>/helm, one build at a time
per machine. ``python -m sdgruntime.envtest.helm`` builds it and prints its path.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from sdgruntime.envtest.build import BuildError, _elapsed, build_once, cache_root

log = logging.getLogger(__name__)

_SOURCES = ("go.mod", "go.sum")
_MODULE = re.compile(r"^\s*(helm\.sh/helm/v\d+)\s+(v\S+)", re.M)


def find_source_dir() -> Path:
    """The hack/helm module: $SDG_HELM_SRC, else next to this checkout or the working dir."""
    env = os.environ.get("SDG_HELM_SRC")
    candidates = [Path(env)] if env else []
    candidates += [p / "hack" / "helm" for p in Path(__file__).resolve().parents]
    candidates += [p / "hack" / "helm" for p in [Path.cwd(), *Path.cwd().parents]]
    for c in candidates:
        if (c / "go.mod").is_file():
            return c
    raise BuildError(
        "cannot find hack/helm/go.mod; run from a checkout of the project or set "
        "SDG_HELM_SRC (or SDG_HELM to a prebuilt helm binary)"
    )


def helm_module(source: Path) -> tuple[str, str]:
    """(module path, version) of helm that go.mod requires, e.g. ``helm.sh/helm/v4``."""
    match = _MODULE.search((source / "go.mod").read_text())
    if not match:
        raise BuildError(f"{source / 'go.mod'} does not require helm.sh/helm")
    return match.group(1), match.group(2)


def cache_dir(source: Path) -> Path:
    digest = hashlib.sha256()
    for name in _SOURCES:
        digest.update((source / name).read_bytes())
    _, version = helm_module(source)
    return cache_root() / "helm" / f"{version}-{digest.hexdigest()[:12]}"


def ensure_helm() -> Path:
    """The path of a helm binary: $SDG_HELM, else the cached build (building it if needed)."""
    prebuilt = os.environ.get("SDG_HELM")
    if prebuilt:
        if not Path(prebuilt).is_file():
            raise BuildError(f"SDG_HELM={prebuilt} is not a file")
        return Path(prebuilt)
    source = find_source_dir()
    return build_once(cache_dir(source), ["helm"], lambda out: _build(source, out)) / "helm"


def _build(source: Path, out: Path) -> None:
    go = shutil.which("go")
    if go is None:
        raise BuildError("Go is not installed; helm is built from source (hack/helm)")
    module, version = helm_module(source)
    env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-buildvcs=false"}
    env.setdefault("GOTOOLCHAIN", "local")
    # What helm's own Makefile stamps into a release build; without it `helm version`
    # reports only the minor version.
    ldflags = (
        f"-s -w -X {module}/internal/version.version={version}"
        f" -X {module}/internal/version.gitTreeState=clean"
    )
    pkg = f"{module}/cmd/helm"
    # Measured on 2 cores with an empty Go build cache and the modules already downloaded
    # (the control plane's k8s.io versions are the same): 1m37s, 2m37s under load.
    log.info(
        "building helm %s (%s) from %s into %s: first run on this machine, about 2-3 "
        "minutes on 2 cores…",
        version,
        pkg,
        source,
        out,
    )
    started = time.monotonic()
    tmp = out / ".helm.tmp"
    cmd = [go, "build", "-trimpath", "-ldflags", ldflags, "-o", str(tmp), pkg]
    proc = subprocess.run(cmd, cwd=source, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise BuildError(f"go build {pkg} failed:\n{proc.stderr[-4000:]}")
    tmp.rename(out / "helm")
    log.info("… helm %s built in %s: %s", version, _elapsed(time.monotonic() - started), out)


def main() -> int:
    # What is built and how long it took on stderr; stdout is only the path, for scripts.
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        helm = ensure_helm()
    except BuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(helm)
    return 0


if __name__ == "__main__":
    sys.exit(main())

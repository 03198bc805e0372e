"""Build (once per machine) and locate the Go binaries the local clusters run.

Each :class:`GoModule` is built into a cache folder outside any repository, keyed by its
version and a hash of its files, so a warm start costs nothing and a dependency bump
rebuilds: the packaged control plane (:func:`controlplane_module`,
:func:`ensure_binaries`) and, for a real node, containerd (:func:`containerd_module`,
:func:`ensure_node_binaries`). Prebuilt binaries are taken first from
``$KUBEBUILDER_ASSETS`` or ``$SDG_CONTROLPLANE_BIN`` (:data:`HOW_TO_GET_BINARIES`;
docs/testing.md, "The binaries"). ``python -m sdgruntime.envtest.build [--node]`` builds
and prints the folders.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

log = logging.getLogger(__name__)

BINARIES = ("etcd", "kube-apiserver", "kube-scheduler")
#: What ControlPlane runs; all a KUBEBUILDER_ASSETS folder needs.
ENVTEST_BINARIES = ("etcd", "kube-apiserver")
#: What a real node runs (ensure_node_binaries): the kubelet and containerd's three.
NODE_BINARIES = ("kubelet", "containerd", "containerd-shim-runc-v2", "ctr")
# Rough minutes of a first build on 2 cores, told to the person waiting. Measured on 2
# cores with the modules already downloaded: etcd 28s, kube-apiserver 2m43s, kube-scheduler
# 30s (it reuses kube-apiserver's packages); a fresh machine downloads the modules first.
# The node's two are built after the control plane and reuse most of its compiled packages:
# kube-controller-manager 1m50s, then the kubelet 1m01s; from a fresh Go build cache (the
# control plane 8m37s, on 2 cores shared with other work), the kubelet 49s, then
# kube-controller-manager 42s.
_CONTROLPLANE_MINUTES = {
    "etcd": 1,
    "kube-apiserver": 4,
    "kube-scheduler": 1,
    "kube-controller-manager": 2,
    "kubelet": 1,
}
# containerd 2m46s (3m38s from a fresh Go build cache), then the shim 2-3s and ctr 9s, which
# reuse most of its packages.
_CONTAINERD_MINUTES = {"containerd": 4, "containerd-shim-runc-v2": 1, "ctr": 1}
# What the headline calls a module's build ("building the local control plane v1.37.2 …").
_TITLES = {"controlplane": "the local control plane"}
_REQUIRE = re.compile(r"^\s*(?:require\s+)?([^\s()]+)\s+(v\S+)(?:\s*//.*)?$", re.M)
#: The control plane's Go module, shipped as package data.
PACKAGED_SOURCE = Path(__file__).resolve().parent / "go" / "controlplane"
#: Every way to get the control plane's binaries, for error messages (docs/testing.md).
HOW_TO_GET_BINARIES = (
    "install Go and run `python -m sdgruntime.envtest.build` "
    "once (it builds from the module shipped in sdgruntime into the cache, "
    "$XDG_CACHE_HOME/sdg or ~/.cache/sdg); or set KUBEBUILDER_ASSETS to a folder holding "
    "etcd and kube-apiserver (controller-runtime's setup-envtest installs one); or set "
    "SDG_CONTROLPLANE_BIN to a folder of prebuilt binaries; or set SDG_CONTROLPLANE_SRC "
    "to another copy of the Go module to build"
)


class BuildError(RuntimeError):
    """A Go build under hack/ failed or cannot start; the message says why (compiler output)."""


@dataclass(frozen=True)
class GoModule:
    """A Go module whose commands are built once per machine into a cache folder."""

    name: str  # cache folder name: "controlplane", "containerd", "gpusim"
    source: Path  # the folder holding go.mod
    targets: Mapping[str, str]  # binary name -> Go package path ("." for the module root)
    tags: Sequence[str] = ()
    cgo: bool = False
    # First-build estimate per binary on 2 cores, told to the person waiting (default 1).
    minutes: Mapping[str, int] = field(default_factory=dict)
    ldflags: str = "-s -w"
    # Never write into ``source`` (an installed package): go.mod and go.sum are copied
    # beside the build and passed with -modfile, so `go build -mod=mod` updates the copy.
    read_only: bool = False

    def version(self) -> str:
        """The version go.mod requires of the module providing the first target that is not
        in this module (``v1.37.2`` for k8s.io/kubernetes/cmd/kube-apiserver); ``dev`` when
        every target is this module's own code."""
        required = dict(_REQUIRE.findall((self.source / "go.mod").read_text()))
        for package in self.targets.values():
            if package.startswith("."):
                continue
            owners = [m for m in required if package == m or package.startswith(m + "/")]
            if owners:
                return required[max(owners, key=len)]
        return "dev"

    def sources(self) -> Iterator[Path]:
        """go.mod, go.sum (when there is one) and every .go file of the module, in a fixed
        order; skipped like `go build` skips them: folders named testdata or starting with
        ``.`` or ``_``, and nested modules."""
        for name in ("go.mod", "go.sum"):
            if (self.source / name).is_file():
                yield self.source / name
        found = []
        for folder, dirs, files in os.walk(self.source):
            dirs[:] = [
                d
                for d in dirs
                if not d.startswith((".", "_"))
                and d != "testdata"
                and not (Path(folder) / d / "go.mod").is_file()
            ]
            found += [Path(folder) / f for f in files if f.endswith(".go")]
        yield from sorted(found)

    def cache_dir(self) -> Path:
        """cache_root()/<name>/<version>-<first 12 hex of a sha256 of the module's files>."""
        digest = hashlib.sha256()
        for path in self.sources():
            digest.update(path.relative_to(self.source).as_posix().encode() + b"\0")
            digest.update(path.read_bytes())
        return cache_root() / self.name / f"{self.version()}-{digest.hexdigest()[:12]}"

    def ensure(self, names: Sequence[str] | None = None) -> Path:
        """The cache folder, once it holds each of ``names`` (default: every target),
        building the missing ones (one build per machine at a time)."""
        wanted = list(self.targets) if names is None else list(names)
        unknown = [n for n in wanted if n not in self.targets]
        if unknown:
            raise BuildError(
                f"{self.source} builds {', '.join(self.targets)}, not {', '.join(unknown)}"
            )
        return build_once(self.cache_dir(), wanted, lambda out: _build(self, out, wanted))


def _find_module(folder: str, variable: str, hint: str) -> Path:
    """hack/<folder>: $<variable>, else next to this checkout, else above the working dir."""
    env = os.environ.get(variable)
    candidates = [Path(env)] if env else []
    here = Path(__file__).resolve()
    candidates += [p / "hack" / folder for p in here.parents]
    candidates += [p / "hack" / folder for p in [Path.cwd(), *Path.cwd().parents]]
    for c in candidates:
        if (c / "go.mod").is_file():
            return c
    raise BuildError(
        f"cannot find hack/{folder}/go.mod; run from a checkout of the project or set "
        f"{variable} {hint}"
    )


def find_source_dir() -> Path:
    """The control plane's Go module: $SDG_CONTROLPLANE_SRC, else the packaged one."""
    env = os.environ.get("SDG_CONTROLPLANE_SRC")
    source = Path(env) if env else PACKAGED_SOURCE
    if not (source / "go.mod").is_file():
        where = f"SDG_CONTROLPLANE_SRC={env}" if env else f"sdgruntime's {source}"
        raise BuildError(f"{where} has no go.mod. To get the binaries, {HOW_TO_GET_BINARIES}")
    return source


def kubernetes_version(source: Path) -> str:
    """The k8s.io/kubernetes version that go.mod requires, e.g. ``v1.37.2``."""
    match = re.search(r"^\s*k8s\.io/kubernetes\s+(v\S+)", (source / "go.mod").read_text(), re.M)
    if not match:
        raise BuildError(f"{source / 'go.mod'} does not require k8s.io/kubernetes")
    return match.group(1)


def controlplane_module(source: Path | None = None) -> GoModule:
    """The control plane, kube-controller-manager and the kubelet, from ``source`` (by
    default :func:`find_source_dir`)."""
    source = source or find_source_dir()
    kubernetes = "k8s.io/kubernetes/cmd"
    return GoModule(
        name="controlplane",
        source=source,
        targets={
            "etcd": "./etcd",
            "kube-apiserver": f"{kubernetes}/kube-apiserver",
            "kube-scheduler": f"{kubernetes}/kube-scheduler",
            "kube-controller-manager": f"{kubernetes}/kube-controller-manager",
            "kubelet": f"{kubernetes}/kubelet",
        },
        minutes=_CONTROLPLANE_MINUTES,
        ldflags=_ldflags(kubernetes_version(source)),
        read_only=source.resolve() == PACKAGED_SOURCE,
    )


def containerd_module(source: Path | None = None) -> GoModule:
    """hack/containerd: containerd, containerd-shim-runc-v2 and ctr ($SDG_CONTAINERD_SRC
    for another copy of the module)."""
    source = source or _find_module("containerd", "SDG_CONTAINERD_SRC", "")
    package = "github.com/containerd/containerd/v2"
    module = GoModule(
        name="containerd",
        source=source,
        targets={
            "containerd": f"{package}/cmd/containerd",
            "containerd-shim-runc-v2": f"{package}/cmd/containerd-shim-runc-v2",
            "ctr": f"{package}/cmd/ctr",
        },
        # What containerd's own Makefile builds with (no man pages), less the btrfs
        # snapshotter, which needs the btrfs C headers.
        tags=("urfave_cli_no_docs", "no_btrfs"),
        minutes=_CONTAINERD_MINUTES,
    )
    # As containerd's Makefile stamps a release: else `containerd --version` says
    # 2.4.2+unknown. The revision (a git commit) is not in the module; it stays empty.
    version = f"-X {package}/version.Version={module.version()}"
    return replace(module, ldflags=f"{module.ldflags} {version}")


def cache_root() -> Path:
    """~/.cache/sdg (or $XDG_CACHE_HOME/sdg): every tool built from a Go module under hack/."""
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "sdg"


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
            "sdgruntime's Go module instead (`python -m sdgruntime.envtest.build`)"
        )
    log.info("using %s from %s=%s; nothing is built", ", ".join(binaries), variable, folder)
    return folder


def ensure_binaries(names: Sequence[str] = BINARIES) -> Path:
    """A folder holding ``names`` of the control plane module's binaries (by default the
    control plane: etcd and kube-apiserver and, when built here, kube-scheduler).

    $KUBEBUILDER_ASSETS when every name is one of :data:`BINARIES` (it must hold etcd and
    kube-apiserver, all an envtest folder has; it is not consulted for
    kube-controller-manager or the kubelet), else $SDG_CONTROLPLANE_BIN (it must hold each
    of ``names``), else the cached build, building the missing ones once per machine."""
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if assets and set(names) <= set(BINARIES):
        return _prebuilt("KUBEBUILDER_ASSETS", Path(assets), ENVTEST_BINARIES)
    prebuilt = os.environ.get("SDG_CONTROLPLANE_BIN")
    if prebuilt:
        folder = Path(prebuilt)
        missing = [b for b in names if not (folder / b).is_file()]
        if missing:
            raise BuildError(f"SDG_CONTROLPLANE_BIN={folder} lacks {', '.join(missing)}")
        return folder
    return controlplane_module().ensure(names)


def ensure_node_binaries() -> dict[str, Path]:
    """The path of each of :data:`NODE_BINARIES`: the kubelet as :func:`ensure_binaries`
    finds it, containerd's three from hack/containerd (built once per machine if needed)."""
    kubelet = ensure_binaries(["kubelet"]) / "kubelet"
    containerd = containerd_module().ensure()
    return {"kubelet": kubelet} | {
        name: containerd / name for name in NODE_BINARIES if name != "kubelet"
    }


def _build(module: GoModule, out: Path, names: Sequence[str]) -> None:
    """``go build`` each of ``names`` that ``out`` lacks, saying what and how long."""
    go = shutil.which("go")
    if go is None:
        needs = re.search(r"^go\s+(\S+)", (module.source / "go.mod").read_text(), re.M)
        hint = HOW_TO_GET_BINARIES if module.name == "controlplane" else "install Go"
        raise BuildError(
            f"Go is not on PATH: {', '.join(names)} are built from {module.source}, which "
            f"needs Go {needs.group(1) if needs else ''} or later. To get them, {hint}"
        )
    version = module.version()
    env = {
        **os.environ,
        "CGO_ENABLED": "1" if module.cgo else "0",
        "GOFLAGS": "-mod=mod -buildvcs=false",
    }
    env.setdefault("GOTOOLCHAIN", "local")
    flags = ["-tags", ",".join(module.tags)] if module.tags else []
    todo = [name for name in names if not (out / name).is_file()]
    minutes = {name: module.minutes.get(name, 1) for name in todo}
    log.info(
        "building %s %s (%s) from %s into %s: first run on this machine, about %s on "
        "2 cores; later runs start it in seconds",
        _TITLES.get(module.name, module.name),
        version,
        ", ".join(todo),
        module.source,
        out,
        _minutes(sum(minutes.values())),
    )
    started = time.monotonic()
    with tempfile.TemporaryDirectory(dir=out, prefix=".mod-") as scratch:
        if module.read_only:
            for name in ("go.mod", "go.sum"):
                if (module.source / name).is_file():
                    shutil.copyfile(module.source / name, Path(scratch) / name)
            flags += ["-modfile", str(Path(scratch) / "go.mod")]
        for i, name in enumerate(todo, 1):
            log.info(
                "building %s %s (%d of %d; first run on this machine: about %s on 2 cores)…",
                name,
                version,
                i,
                len(todo),
                _minutes(minutes[name]),
            )
            began = time.monotonic()
            tmp = out / f".{name}.tmp"
            package = module.targets[name]
            cmd = [go, "build", *flags, "-ldflags", module.ldflags, "-o", str(tmp), package]
            proc = subprocess.run(cmd, cwd=module.source, env=env, capture_output=True, text=True)
            if proc.returncode != 0:
                raise BuildError(f"go build {package} failed:\n{proc.stderr[-4000:]}")
            tmp.rename(out / name)
            log.info("… %s done in %s", name, _elapsed(time.monotonic() - began))
    log.info("%s built in %s: %s", ", ".join(todo), _elapsed(time.monotonic() - started), out)


def _minutes(n: int) -> str:
    """``1 minute``, ``6 minutes``."""
    return f"{n} minute" if n == 1 else f"{n} minutes"


def _elapsed(seconds: float) -> str:
    """``4m12s``, ``38s``."""
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sdgruntime.envtest.build",
        description="Build the local control plane once per machine and print its folder.",
    )
    parser.add_argument(
        "--node",
        action="store_true",
        help="also build what a real node needs: kube-controller-manager, the kubelet and "
        "containerd (its runc shim, ctr); print each folder",
    )
    args = parser.parse_args(argv)
    # INFO to stderr, without logger names: what is built and how long it took is for the
    # person waiting; stdout is only the folders, for scripts.
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        folders = [ensure_binaries()]
        if args.node:
            # The controller-manager too: a control plane with real nodes runs it.
            folders.append(ensure_binaries(["kube-controller-manager", "kubelet"]))
            folders += [path.parent for path in ensure_node_binaries().values()]
    except BuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for folder in dict.fromkeys(folders):
        print(folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``python -m sdgruntime.envtest.build`` as a newcomer meets it: it says what it builds and
how long that took, uses KUBEBUILDER_ASSETS when set, and runs without warnings; and the
GoModule builder under it: only the missing binaries, a cache folder per version and
module content, the node binaries only on demand.

A fake ``go`` on PATH stands in for the compiler (the real build takes minutes; the
integration tests start the control plane from the real one), so these run in a second.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from sdgruntime.envtest import build
from sdgruntime.envtest.build import BuildError, GoModule

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "hack" / "controlplane"
CONTAINERD = ROOT / "hack" / "containerd"


def required(go_mod: Path, module: str) -> str:
    """The version go.mod requires of ``module`` (in a require block or on one line)."""
    lines = (line.strip().removeprefix("require ") for line in go_mod.read_text().splitlines())
    return next(line.split()[1] for line in lines if line.startswith(f"{module} "))


VERSION = required(SOURCE / "go.mod", "k8s.io/kubernetes")
CONTAINERD_VERSION = required(CONTAINERD / "go.mod", "github.com/containerd/containerd/v2")

# Writes the -o file like `go build` would, and records every call (with its CGO_ENABLED).
FAKE_GO = """#!/bin/sh
echo "CGO_ENABLED=$CGO_ENABLED $*" >> "$FAKE_GO_LOG"
while [ $# -gt 0 ]; do
  if [ "$1" = "-o" ]; then printf '#!/bin/sh\\n' > "$2"; chmod +x "$2"; fi
  shift
done
"""


def executable(path: Path, text: str = "#!/bin/sh\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """A machine without a build cache or KUBEBUILDER_ASSETS, and a fake go on PATH."""
    src = tmp_path / "src"
    for name in ("go.mod", "go.sum", "tools.go", "etcd/main.go"):
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(SOURCE / name, src / name)
    containerd = tmp_path / "containerd"
    for name in ("go.mod", "go.sum", "tools.go"):
        containerd.mkdir(exist_ok=True)
        shutil.copyfile(CONTAINERD / name, containerd / name)
    executable(tmp_path / "bin" / "go", FAKE_GO)
    out = {
        k: v
        for k, v in os.environ.items()
        if k not in ("KUBEBUILDER_ASSETS", "SDG_CONTROLPLANE_BIN", "PYTHONWARNINGS")
    }
    return out | {
        "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "SDG_CONTROLPLANE_SRC": str(src),
        "SDG_CONTAINERD_SRC": str(containerd),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "FAKE_GO_LOG": str(tmp_path / "go.log"),
    }


@pytest.fixture
def machine(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The same machine for calls in this process."""
    for name in ("KUBEBUILDER_ASSETS", "SDG_CONTROLPLANE_BIN"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


def go_calls(env: dict[str, str]) -> list[str]:
    log = Path(env["FAKE_GO_LOG"])
    return log.read_text().splitlines() if log.exists() else []


def built(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))


def build_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    # -W error: any warning (runpy's "found in sys.modules" among them) fails the run.
    return subprocess.run(
        [sys.executable, "-W", "error", "-m", "sdgruntime.envtest.build", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_first_build_says_what_it_builds_and_how_long(env: dict[str, str]) -> None:
    run = build_cli(env)
    assert run.returncode == 0, run.stderr
    folder = Path(run.stdout.strip())
    assert folder.parent == Path(env["XDG_CACHE_HOME"]) / "sdg" / "controlplane"
    assert sorted(p.name for p in folder.iterdir() if not p.name.startswith(".")) == [
        "etcd",
        "kube-apiserver",
        "kube-scheduler",
    ]
    lines = run.stderr.splitlines()
    assert lines[0].startswith(f"building the local control plane {VERSION} (etcd, ")
    assert "first run on this machine, about 6 minutes on 2 cores" in lines[0]
    assert (
        f"building kube-apiserver {VERSION} (2 of 3; first run on this machine: "
        "about 4 minutes on 2 cores)…"
    ) in lines
    assert "… kube-apiserver done in 0s" in lines
    assert lines[-1] == f"etcd, kube-apiserver, kube-scheduler built in 0s: {folder}"
    # INFO for the person waiting, not a warning or a logger name.
    assert not [line for line in lines if "WARNING" in line or "sdgruntime" in line]
    calls = Path(env["FAKE_GO_LOG"]).read_text().splitlines()
    assert [c.split()[-1] for c in calls] == [
        "./etcd",
        "k8s.io/kubernetes/cmd/kube-apiserver",
        "k8s.io/kubernetes/cmd/kube-scheduler",
    ]

    # The second run finds the cache: nothing is built and nothing is said.
    again = build_cli(env)
    assert again.returncode == 0 and again.stdout == run.stdout
    assert again.stderr == ""
    assert len(Path(env["FAKE_GO_LOG"]).read_text().splitlines()) == 3


def test_kubebuilder_assets_are_used_and_nothing_is_built(
    env: dict[str, str], tmp_path: Path
) -> None:
    assets = tmp_path / "assets"
    for name in ("etcd", "kube-apiserver", "kubectl"):  # what setup-envtest installs
        executable(assets / name)
    run = build_cli(env | {"KUBEBUILDER_ASSETS": str(assets)})
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == str(assets)
    assert f"from KUBEBUILDER_ASSETS={assets}; nothing is built" in run.stderr
    assert not Path(env["FAKE_GO_LOG"]).exists()
    assert not Path(env["XDG_CACHE_HOME"]).exists()


def test_kubebuilder_assets_without_kube_apiserver_is_a_clear_error(
    env: dict[str, str], tmp_path: Path
) -> None:
    assets = tmp_path / "assets"
    executable(assets / "etcd")
    (assets / "kube-apiserver").write_text("")  # present but not executable
    run = build_cli(env | {"KUBEBUILDER_ASSETS": str(assets)})
    assert run.returncode == 1
    assert run.stderr.startswith(f"error: KUBEBUILDER_ASSETS={assets} lacks kube-apiserver ")
    assert "it must hold etcd and kube-apiserver" in run.stderr
    assert "Traceback" not in run.stderr
    assert not Path(env["FAKE_GO_LOG"]).exists()


def go_module(root: Path, name: str = "gpusim", **options: object) -> GoModule:
    """A module of our own (like hack/node/gpusim): a command at the root and one below."""
    executable(root / "go.mod", "module example.com/gpusim\n\ngo 1.26.0\n")
    (root / "main.go").write_text("package main\n\nfunc main() {}\n")
    (root / "cmd" / "probe").mkdir(parents=True)
    (root / "cmd" / "probe" / "main.go").write_text("package main\n\nfunc main() {}\n")
    targets = {"gpusim": ".", "gpusim-probe": "./cmd/probe"}
    return GoModule(name, root, targets, **options)  # type: ignore[arg-type]


def test_a_module_builds_only_the_missing_binaries_asked_for(
    machine: dict[str, str], tmp_path: Path
) -> None:
    module = go_module(tmp_path / "gpusim", minutes={"gpusim": 2})
    folder = module.ensure(["gpusim"])
    assert folder.parent == Path(machine["XDG_CACHE_HOME"]) / "sdg" / "gpusim"
    assert folder.name.startswith("dev-")  # no required module provides the commands
    assert built(folder) == ["gpusim"]
    assert [c.split()[-1] for c in go_calls(machine)] == ["."]

    assert module.ensure() == folder
    assert built(folder) == ["gpusim", "gpusim-probe"]
    assert [c.split()[-1] for c in go_calls(machine)] == [".", "./cmd/probe"]

    (folder / "gpusim-probe").unlink()
    module.ensure(["gpusim", "gpusim-probe"])
    assert [c.split()[-1] for c in go_calls(machine)] == [".", "./cmd/probe", "./cmd/probe"]
    module.ensure()
    assert len(go_calls(machine)) == 3


def test_a_module_refuses_a_binary_it_does_not_build(
    machine: dict[str, str], tmp_path: Path
) -> None:
    module = go_module(tmp_path / "gpusim")
    with pytest.raises(BuildError, match="builds gpusim, gpusim-probe, not kubectl"):
        module.ensure(["gpusim", "kubectl"])
    assert go_calls(machine) == []


def test_the_cache_folder_changes_with_any_go_file_and_go_sum(
    machine: dict[str, str], tmp_path: Path
) -> None:
    module = go_module(tmp_path / "gpusim")
    first = module.ensure()
    assert module.cache_dir() == first
    (module.source / "README.md").write_text("not Go\n")
    (module.source / "testdata").mkdir()
    (module.source / "testdata" / "x.go").write_text("package x\n")  # go build skips it
    assert module.cache_dir() == first

    keys = {first}
    for path, text in [
        ("main.go", "package main\n\nfunc main() { println() }\n"),
        ("cmd/probe/main.go", "package main\n\nfunc main() { println() }\n"),
        ("cmd/probe/more.go", "package main\n"),
        ("go.sum", "example.org/x v1.0.0 h1:x=\n"),
    ]:
        (module.source / path).write_text(text)
        keys.add(module.cache_dir())
    assert len(keys) == 5

    # A changed module is built again, into its own folder.
    second = module.ensure()
    assert second != first and built(second) == ["gpusim", "gpusim-probe"]
    assert len(go_calls(machine)) == 4


def test_tags_cgo_and_ldflags_reach_go_build(machine: dict[str, str], tmp_path: Path) -> None:
    plain = go_module(tmp_path / "plain")
    plain.ensure(["gpusim"])
    tagged = go_module(
        tmp_path / "tagged",
        "tagged",
        tags=("urfave_cli_no_docs", "no_btrfs"),
        cgo=True,
        ldflags="-X a.b=c",
    )
    tagged.ensure(["gpusim"])
    assert go_calls(machine) == [
        f"CGO_ENABLED=0 build -ldflags -s -w -o {plain.cache_dir() / '.gpusim.tmp'} .",
        "CGO_ENABLED=1 build -tags urfave_cli_no_docs,no_btrfs -ldflags -X a.b=c "
        f"-o {tagged.cache_dir() / '.gpusim.tmp'} .",
    ]


def test_containerd_is_stamped_with_its_module_version(
    machine: dict[str, str], tmp_path: Path
) -> None:
    stamp = "-X github.com/containerd/containerd/v2/version.Version="
    module = build.containerd_module()
    assert module.source == Path(machine["SDG_CONTAINERD_SRC"])
    assert CONTAINERD_VERSION == "v2.4.2"
    assert module.version() == CONTAINERD_VERSION
    assert module.ldflags == f"-s -w {stamp}{CONTAINERD_VERSION}"
    assert module.cache_dir().name.startswith(f"{CONTAINERD_VERSION}-")

    # A version bump in go.mod is what gets stamped, into a folder of its own.
    go_mod = module.source / "go.mod"
    go_mod.write_text(go_mod.read_text().replace(CONTAINERD_VERSION, "v2.9.1"))
    bumped = build.containerd_module()
    assert bumped.ldflags == f"-s -w {stamp}v2.9.1"
    assert bumped.cache_dir().name.startswith("v2.9.1-")


def test_node_binaries_are_built_on_demand_only(machine: dict[str, str]) -> None:
    controlplane = build.ensure_binaries()
    assert built(controlplane) == ["etcd", "kube-apiserver", "kube-scheduler"]
    assert len(go_calls(machine)) == 3

    paths = build.ensure_node_binaries()
    assert list(paths) == ["kubelet", "containerd", "containerd-shim-runc-v2", "ctr"]
    assert paths["kubelet"] == controlplane / "kubelet"
    containerd = paths["containerd"].parent
    assert containerd.parent == Path(machine["XDG_CACHE_HOME"]) / "sdg" / "containerd"
    assert all(p.is_file() and p.parent == containerd for n, p in paths.items() if n != "kubelet")
    calls = go_calls(machine)[3:]
    assert [c.split()[-1] for c in calls] == [
        "k8s.io/kubernetes/cmd/kubelet",
        "github.com/containerd/containerd/v2/cmd/containerd",
        "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2",
        "github.com/containerd/containerd/v2/cmd/ctr",
    ]
    assert f"-X k8s.io/component-base/version.gitVersion={VERSION} " in calls[0]
    assert all(" -tags urfave_cli_no_docs,no_btrfs " in c for c in calls[1:])
    stamp = f"-X github.com/containerd/containerd/v2/version.Version={CONTAINERD_VERSION} "
    assert all(stamp in c for c in calls[1:])

    # Nothing more for the control plane, and a second node finds everything built.
    assert build.ensure_binaries() == controlplane
    assert build.ensure_node_binaries() == paths
    assert len(go_calls(machine)) == 7
    assert "kube-controller-manager" not in built(controlplane)


def test_node_flag_also_builds_the_node_and_prints_each_folder(env: dict[str, str]) -> None:
    run = build_cli(env, "--node")
    assert run.returncode == 0, run.stderr
    controlplane, containerd = (Path(line) for line in run.stdout.splitlines())
    assert built(controlplane) == [
        "etcd",
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kubelet",
    ]
    assert built(containerd) == ["containerd", "containerd-shim-runc-v2", "ctr"]
    lines = run.stderr.splitlines()
    assert lines[0].startswith(f"building the local control plane {VERSION} (etcd, ")
    assert any(
        line.startswith(f"building containerd {CONTAINERD_VERSION} (containerd, ") for line in lines
    )
    assert len(go_calls(env)) == 8

    again = build_cli(env, "--node")
    assert (again.returncode, again.stdout, again.stderr) == (0, run.stdout, "")
    plain = build_cli(env)
    assert (plain.returncode, plain.stdout, plain.stderr) == (0, f"{controlplane}\n", "")
    assert len(go_calls(env)) == 8


def test_kubebuilder_assets_are_for_the_envtest_binaries_only(
    machine: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assets = tmp_path / "assets"
    for name in ("etcd", "kube-apiserver"):
        executable(assets / name)
    monkeypatch.setenv("KUBEBUILDER_ASSETS", str(assets))
    assert build.ensure_binaries() == assets
    assert build.ensure_binaries(list(build.BINARIES)) == assets  # as ControlPlane asks
    assert go_calls(machine) == []

    folder = build.ensure_binaries(["kube-controller-manager"])
    assert folder.parent == Path(machine["XDG_CACHE_HOME"]) / "sdg" / "controlplane"
    assert built(folder) == ["kube-controller-manager"]
    assert [c.split()[-1] for c in go_calls(machine)] == [
        "k8s.io/kubernetes/cmd/kube-controller-manager"
    ]


def test_a_prebuilt_folder_must_hold_each_binary_asked_for(
    machine: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prebuilt = tmp_path / "prebuilt"
    for name in build.BINARIES:
        executable(prebuilt / name)
    monkeypatch.setenv("SDG_CONTROLPLANE_BIN", str(prebuilt))
    assert build.ensure_binaries() == prebuilt
    with pytest.raises(BuildError, match=f"SDG_CONTROLPLANE_BIN={prebuilt} lacks kubelet$"):
        build.ensure_node_binaries()
    executable(prebuilt / "kubelet")
    assert build.ensure_node_binaries()["kubelet"] == prebuilt / "kubelet"
    assert [c.split()[-1] for c in go_calls(machine)] == [
        "github.com/containerd/containerd/v2/cmd/containerd",
        "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2",
        "github.com/containerd/containerd/v2/cmd/ctr",
    ]

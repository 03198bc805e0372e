"""``python -m sdgruntime.envtest.build`` as a newcomer meets it: it says what it builds and
how long that took, uses KUBEBUILDER_ASSETS when set, and runs without warnings.

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

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "hack" / "controlplane"
VERSION = next(
    line.split()[1]
    for line in (SOURCE / "go.mod").read_text().splitlines()
    if line.strip().startswith("k8s.io/kubernetes ")
)

# Writes the -o file like `go build` would, and records every call.
FAKE_GO = """#!/bin/sh
echo "$*" >> "$FAKE_GO_LOG"
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
    executable(tmp_path / "bin" / "go", FAKE_GO)
    out = {
        k: v
        for k, v in os.environ.items()
        if k not in ("KUBEBUILDER_ASSETS", "SDG_CONTROLPLANE_BIN", "PYTHONWARNINGS")
    }
    return out | {
        "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "SDG_CONTROLPLANE_SRC": str(src),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "FAKE_GO_LOG": str(tmp_path / "go.log"),
    }


def build_cli(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    # -W error: any warning (runpy's "found in sys.modules" among them) fails the run.
    return subprocess.run(
        [sys.executable, "-W", "error", "-m", "sdgruntime.envtest.build"],
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
    assert lines[-1] == f"control plane built in 0s: {folder}"
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

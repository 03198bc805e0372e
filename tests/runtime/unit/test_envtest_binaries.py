"""Where envtest gets its binaries in any project: the control plane's Go module ships
inside sdgruntime, is built from there without writing into the installed package, and
every error says every way to get the binaries (KUBEBUILDER_ASSETS, SDG_CONTROLPLANE_BIN,
SDG_CONTROLPLANE_SRC, ``python -m sdgruntime.envtest.build``).

A fake ``go`` on PATH stands in for the compiler, as in SDG's tests/unit/test_envtest_build.py.
"""

from __future__ import annotations

import hashlib
import stat
from pathlib import Path

import pytest

from sdgruntime.envtest import build
from sdgruntime.envtest.build import PACKAGED_SOURCE, BuildError

FAKE_GO = """#!/bin/sh
echo "$*" >> "$FAKE_GO_LOG"
while [ $# -gt 0 ]; do
  if [ "$1" = "-o" ]; then printf '#!/bin/sh\\n' > "$2"; chmod +x "$2"; fi
  if [ "$1" = "-modfile" ]; then echo "example.org/x v1.0.0 h1:x=" >> "${2%.mod}.sum"; fi
  shift
done
"""
WAYS = (
    "python -m sdgruntime.envtest.build",
    "KUBEBUILDER_ASSETS",
    "SDG_CONTROLPLANE_BIN",
    "SDG_CONTROLPLANE_SRC",
)


@pytest.fixture
def machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No binaries anywhere: an empty cache, and none of the variables set."""
    for name in ("KUBEBUILDER_ASSETS", "SDG_CONTROLPLANE_BIN", "SDG_CONTROLPLANE_SRC"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path


def fake_go(machine: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    go = machine / "bin" / "go"
    go.parent.mkdir()
    go.write_text(FAKE_GO)
    go.chmod(go.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", str(go.parent))
    monkeypatch.setenv("FAKE_GO_LOG", str(machine / "go.log"))
    return machine / "go.log"


def package_digest() -> str:
    digest = hashlib.sha256()
    for path in sorted(PACKAGED_SOURCE.rglob("*")):
        if path.is_file():
            digest.update(str(path.relative_to(PACKAGED_SOURCE)).encode() + path.read_bytes())
    return digest.hexdigest()


def test_the_control_plane_module_ships_in_the_package(machine: Path) -> None:
    assert Path(build.__file__).parent / "go" / "controlplane" == PACKAGED_SOURCE
    module = build.controlplane_module()
    assert module.source == PACKAGED_SOURCE and module.read_only
    assert module.version().startswith("v1.")  # the k8s.io/kubernetes it pins
    assert module.cache_dir().parent == machine / "cache" / "sdg" / "controlplane"


def test_it_is_built_without_writing_into_the_package(
    machine: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = fake_go(machine, monkeypatch)
    before = package_digest()
    folder = build.ensure_binaries()
    assert sorted(p.name for p in folder.iterdir() if not p.name.startswith(".")) == list(
        sorted(build.BINARIES)
    )
    lines = calls.read_text().splitlines()
    assert len(lines) == 3
    for line in lines:  # go.mod and go.sum are a copy beside the build, which go may update
        modfile = Path(line.split("-modfile ")[1].split()[0])
        assert modfile.name == "go.mod" and not modfile.is_relative_to(PACKAGED_SOURCE)
    assert package_digest() == before
    assert build.ensure_binaries() == folder  # found in the cache: nothing more is built
    assert len(calls.read_text().splitlines()) == 3


def test_without_go_the_error_names_every_way_to_get_the_binaries(
    machine: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(machine))  # no go here
    with pytest.raises(BuildError) as info:
        build.ensure_binaries()
    message = str(info.value)
    assert message.startswith("Go is not on PATH: etcd, kube-apiserver, kube-scheduler are ")
    assert f"built from {PACKAGED_SOURCE}, which needs Go 1." in message
    assert all(way in message for way in WAYS), message


def test_a_wrong_source_folder_is_named_with_every_way(
    machine: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SDG_CONTROLPLANE_SRC", str(machine))
    with pytest.raises(BuildError) as info:
        build.ensure_binaries()
    message = str(info.value)
    assert message.startswith(f"SDG_CONTROLPLANE_SRC={machine} has no go.mod. ")
    assert all(way in message for way in WAYS), message


def test_another_copy_of_the_module_is_built_in_place(
    machine: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """$SDG_CONTROLPLANE_SRC is a checkout of one's own: go may update its go.sum there."""
    copy = machine / "src"
    for path in PACKAGED_SOURCE.rglob("*"):
        if path.is_file():
            (copy / path.relative_to(PACKAGED_SOURCE)).parent.mkdir(parents=True, exist_ok=True)
            (copy / path.relative_to(PACKAGED_SOURCE)).write_bytes(path.read_bytes())
    monkeypatch.setenv("SDG_CONTROLPLANE_SRC", str(copy))
    calls = fake_go(machine, monkeypatch)
    module = build.controlplane_module()
    assert module.source == copy and not module.read_only
    assert module.cache_dir() == build.controlplane_module(PACKAGED_SOURCE).cache_dir()
    build.ensure_binaries(["etcd"])
    assert "-modfile" not in calls.read_text()

"""sdgruntime as its own distribution, from the outside: its wheel is built from the
sdgruntime/ folder alone (copied elsewhere, so nothing else of the repository can leak in;
``pip wheel`` with build isolation, as any user would), holds exactly the package, and,
installed into a fresh venv with only its own dependencies (from the package index), it
imports whole, without api, controllers or webhooks anywhere, its own unit tests
(tests/runtime/unit) pass there, and, run from a folder outside the repository, envtest
finds its binaries (built from the Go module the wheel ships) and starts a control plane.

Needs the package index (the build backend, the dependencies), like test_dockerfile.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

import sdgruntime

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "sdgruntime"
PROJECT = tomllib.loads((PACKAGE / "pyproject.toml").read_text())["project"]
IGNORED = shutil.ignore_patterns("build", "*.egg-info", "__pycache__", "*.pyc")


def run(*cmd: str | Path, cwd: Path, timeout: float = 600) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    proc = subprocess.run(
        [str(c) for c in cmd],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert proc.returncode == 0, f"{cmd}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("dist")
    src = base / "src" / "sdgruntime"
    shutil.copytree(PACKAGE, src, ignore=IGNORED)
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", base / "out", src, cwd=base)
    (built,) = (base / "out").glob("*.whl")
    return built


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> Path:
    """A new venv with the wheel, its test extra (pytest, pytest-timeout) and its dev extra
    (hypothesis, which sdgruntime's own unit tests import)."""
    where = tmp_path_factory.mktemp("venv") / "venv"
    venv.create(where, with_pip=True)
    python = where / "bin" / "python"
    spec = f"sdgruntime[test,dev] @ {wheel.as_uri()}"
    run(python, "-m", "pip", "install", "-q", spec, cwd=where)
    return python


def test_the_wheel_is_named_by_sdgruntimes_version(wheel: Path) -> None:
    assert wheel.name == f"sdgruntime-{sdgruntime.__version__}-py3-none-any.whl"


def test_the_wheel_holds_the_package_and_its_metadata_only(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {
        f"sdgruntime/{p.relative_to(PACKAGE).as_posix()}"
        for p in PACKAGE.rglob("*")
        if p.is_file()
        and (p.suffix in (".py", ".go") or p.name in ("py.typed", "go.mod", "go.sum"))
        and not {"build", "__pycache__"} & set(p.relative_to(PACKAGE).parts)
        and not any(part.endswith(".egg-info") for part in p.relative_to(PACKAGE).parts)
    }
    dist_info = {
        n for n in names if n.startswith(f"sdgruntime-{sdgruntime.__version__}.dist-info/")
    }
    # every module and envtest's Go module, and no pyproject.toml or README.md
    assert names - dist_info == expected
    assert "sdgruntime/envtest/go/controlplane/go.mod" in names


def test_the_wheel_declares_the_projects_requirements(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        (meta,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        lines = zf.read(meta).decode().splitlines()
    requires = {
        str(Requirement(line.split(":", 1)[1]))
        for line in lines
        if line.startswith("Requires-Dist:")
    }
    expected = {str(Requirement(r)) for r in PROJECT["dependencies"]}
    for extra, reqs in PROJECT["optional-dependencies"].items():
        for r in reqs:  # the extra joins a requirement's own marker with "and"
            requirement, _, marker = r.partition(";")
            marker = f"{marker.strip()} and " if marker else ""
            expected.add(str(Requirement(f'{requirement}; {marker}extra == "{extra}"')))
    assert requires == expected
    assert "Name: sdgruntime" in lines and f"Version: {sdgruntime.__version__}" in lines
    assert "License-Expression: Apache-2.0" in lines


IMPORT_ALL = """
import importlib, importlib.metadata, importlib.util, pkgutil, sys
import sdgruntime
for module in pkgutil.walk_packages(sdgruntime.__path__, "sdgruntime."):
    importlib.import_module(module.name)
for name in sdgruntime.__all__:
    getattr(sdgruntime, name)  # every lazy top-level export resolves
print(sdgruntime.__version__, importlib.metadata.version("sdgruntime"))
SDG = ("api", "controllers", "webhooks")
print(sorted(n for n in SDG if importlib.util.find_spec(n)))
print(sorted({n.split(".")[0] for n in sys.modules} & set(SDG)))
print(sdgruntime.__file__)
"""


def test_the_installed_wheel_imports_whole_without_sdg(fresh_venv: Path, tmp_path: Path) -> None:
    version, findable, loaded, where = run(fresh_venv, "-c", IMPORT_ALL, cwd=tmp_path).splitlines()
    assert version == f"{sdgruntime.__version__} {sdgruntime.__version__}"
    assert findable == "[]" and loaded == "[]"  # SDG's packages are not even installed
    assert Path(where).is_relative_to(fresh_venv.parents[1])  # the wheel's copy, not ours


def test_sdgruntimes_unit_tests_pass_without_sdg(fresh_venv: Path, tmp_path: Path) -> None:
    """tests/runtime/unit with the root conftest (the envtest plugin, anyio's backend), the
    helpers they share (tests/runtime/helpers.py) and this project's pytest settings, run
    by the fresh venv's pytest."""
    tests = tmp_path / "tests"
    shutil.copytree(ROOT / "tests" / "runtime" / "unit", tests / "runtime" / "unit", ignore=IGNORED)
    shared = ("tests/__init__.py", "tests/conftest.py", "tests/runtime/__init__.py")
    for name in (*shared, "tests/runtime/helpers.py"):
        shutil.copy2(ROOT / name, tmp_path / name)
    settings = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\n"
        f"addopts = {settings['addopts']} -p no:cacheprovider\n"
        f"timeout = {settings['timeout']}\n"
        "markers =\n"
        + "".join(f"    {m}\n" for m in settings["markers"])
        + "filterwarnings =\n"
        + "".join(f"    {w}\n" for w in settings["filterwarnings"])
    )
    out = run(fresh_venv, "-m", "pytest", "-q", "tests/runtime/unit", cwd=tmp_path)
    assert " passed" in out.splitlines()[-1] and "failed" not in out.splitlines()[-1], out


# A project of one's own: a folder outside this repository, the installed wheel only, no
# variable set. A go that fails stands first on PATH, so nothing is ever built here: the
# binaries must come from the cache that `make controlplane` (or any project's
# `python -m sdgruntime.envtest.build`) filled, found by the packaged module's key.
ENVTEST_ELSEWHERE = """
from sdgruntime.envtest import ControlPlane
from sdgruntime.envtest.build import PACKAGED_SOURCE, ensure_binaries
print(PACKAGED_SOURCE)
print(ensure_binaries())
with ControlPlane() as cp:
    print(cp.http.get("/version").json()["gitVersion"])
"""


@pytest.mark.integration
def test_envtest_finds_its_binaries_from_any_project(fresh_venv: Path, tmp_path: Path) -> None:
    from sdgruntime.envtest.build import BINARIES, PACKAGED_SOURCE, controlplane_module

    cached = controlplane_module(PACKAGED_SOURCE).cache_dir()
    if not all((cached / b).is_file() for b in BINARIES):
        pytest.skip(f"the control plane is not built yet ({cached}): make controlplane")
    project = tmp_path / "my-operator"
    (project / "bin").mkdir(parents=True)
    (project / "bin" / "go").write_text("#!/bin/sh\necho go was called >&2\nexit 99\n")
    (project / "bin" / "go").chmod(0o755)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("KUBEBUILDER_ASSETS", "SDG_", "PYTHONPATH", "VIRTUAL_ENV"))
    }
    env["PATH"] = f"{project / 'bin'}{os.pathsep}{env['PATH']}"
    proc = subprocess.run(
        [fresh_venv, "-c", ENVTEST_ELSEWHERE],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    source, binaries, version = proc.stdout.splitlines()
    assert Path(source).is_relative_to(fresh_venv.parents[1])  # the wheel's copy of the module
    assert Path(binaries) == cached
    assert version.startswith("v1.") and "go was called" not in proc.stderr


def test_a_bare_install_pulls_no_second_http_stack_nor_kubernetes(
    wheel: Path, tmp_path: Path
) -> None:
    """``pip install sdgruntime`` (no extras) resolves no second HTTP stack and not the
    kubernetes package: exec plugins and envtest's admin client need neither."""
    report = tmp_path / "report.json"
    run(
        sys.executable,
        "-m",
        "pip",
        "install",
        "--dry-run",
        "--ignore-installed",
        "-q",
        "--report",
        report,
        wheel,
        cwd=tmp_path,
    )
    names = {item["metadata"]["name"].lower() for item in json.loads(report.read_text())["install"]}
    assert "pydantic_core" in {n.replace("-", "_") for n in names}  # the whole resolution
    assert not names & {"aiohttp", "httpx", "httpcore", "kubernetes", "requests", "urllib3"}, names

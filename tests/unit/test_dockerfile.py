"""The manager image, checked without a Docker daemon.

Static checks read the Dockerfile and .dockerignore the way Docker does (instructions,
stages, allow-list matching). The wheel tests then rebuild what the builder stage builds:
the build context after .dockerignore, the builder's COPY instructions, its ``pip wheel``
of the two projects (sdgruntime, its own distribution in sdgruntime/, and
shared-device-group, which depends on it) — and check each wheel holds its own packages
and their ``py.typed`` markers, SDG's the console scripts and a requirement on sdgruntime
that the sdgruntime wheel satisfies, i.e. what ends up in the image. It needs the package
index for the build backend (setuptools), like the image build itself.
"""

from __future__ import annotations

import configparser
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
#: The packages of each wheel the image is built from, by wheel file name prefix.
WHEELS = {
    "sdgruntime": ("sdgruntime",),
    "shared_device_group": ("api", "controllers", "webhooks", "cli"),
}
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SCRIPTS: dict[str, str] = PYPROJECT["project"]["scripts"]


# --- a small Dockerfile reader -------------------------------------------------------------


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]


def parse_dockerfile(text: str) -> tuple[dict[str, str], list[Stage]]:
    """Global ARG defaults and the stages, with continuation lines joined."""
    logical: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):  # a comment inside a continued instruction
            continue
        if line.endswith("\\"):
            pending += line[:-1].strip() + " "
            continue
        logical.append(pending + line)
        pending = ""
    assert not pending, "Dockerfile ends inside a continued line"
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical:
        keyword, _, rest = line.partition(" ")
        keyword, rest = keyword.upper(), rest.strip()
        if keyword == "FROM":
            parts = rest.split()
            name = parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else None
            stages.append(Stage(parts[0], name))
        elif keyword == "ARG" and not stages:
            key, _, default = rest.partition("=")
            args[key] = default
        else:
            assert stages, f"{keyword} before the first FROM"
            stages[-1].instructions.append((keyword, rest))
    return args, stages


def resolve(text: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args[m.group(1) or m.group(2)], text)


ARGS, STAGES = parse_dockerfile((ROOT / "Dockerfile").read_text())
FINAL = STAGES[-1]
BUILDERS = {s.name: s for s in STAGES[:-1] if s.name}


# --- a small .dockerignore matcher (moby/patternmatcher semantics) -------------------------


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out += "(?:.*/)?"
            i += 3
        elif pattern.startswith("**", i):
            out += ".*"
            i += 2
        elif pattern[i] == "*":
            out += "[^/]*"
            i += 1
        elif pattern[i] == "?":
            out += "[^/]"
            i += 1
        elif pattern[i] == "[":
            end = pattern.index("]", i)
            out += pattern[i : end + 1]
            i = end + 1
        else:
            out += re.escape(pattern[i])
            i += 1
    return re.compile(out)


def read_dockerignore() -> list[tuple[re.Pattern[str], bool, str]]:
    rules = []
    for raw in (ROOT / ".dockerignore").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line[1:].strip() if negate else line
        pattern = pattern.strip("/")
        rules.append((_pattern_regex(pattern), negate, pattern))
    return rules


IGNORE = read_dockerignore()


def excluded(path: str) -> bool:
    """Whether Docker leaves ``path`` (relative, '/'-separated) out of the build context:
    the last rule matching the path or one of its parent directories decides."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    result = False
    for regex, negate, _ in IGNORE:
        if any(regex.fullmatch(p) for p in prefixes):
            result = not negate
    return result


def build_context(dest: Path) -> None:
    """Copy what ``docker build .`` would send as its context into ``dest``."""
    negations = [p for _, negate, p in IGNORE if negate]
    for top, dirs, files in os.walk(ROOT):
        directory = Path(top)
        rel_dir = directory.relative_to(ROOT).as_posix()
        rel_dir = "" if rel_dir == "." else rel_dir + "/"
        # Do not descend into excluded trees nothing is re-included from (.venv, .git).
        dirs[:] = [
            d
            for d in dirs
            if not excluded(rel_dir + d) or any(n.startswith(rel_dir + d + "/") for n in negations)
        ]
        for f in files:
            rel = rel_dir + f
            if not excluded(rel):
                target = dest / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(directory / f, target)


# --- static checks ---------------------------------------------------------------------------


def test_base_image_is_slim_python_311() -> None:
    for stage in STAGES:
        image = resolve(stage.base, ARGS)
        assert re.fullmatch(r"python:3\.11-slim(-\w+)?", image), image


def test_final_stage_runs_as_numeric_non_root_user() -> None:
    users = FINAL.all("USER")
    assert users, "the final stage sets no USER: it would run as root"
    uid, _, gid = users[-1].partition(":")
    # Numeric, so the kubelet can verify runAsNonRoot without reading /etc/passwd.
    assert uid.isdigit() and int(uid) != 0, users[-1]
    assert not gid or gid.isdigit(), users[-1]


def test_entrypoint_is_the_manager_console_script() -> None:
    (entrypoint,) = FINAL.all("ENTRYPOINT")
    assert json.loads(entrypoint) == ["sdg-manager"]  # exec form: signals reach the manager
    assert SCRIPTS["sdg-manager"] == "controllers.__main__:main"
    # The venv the wheel is installed into is on PATH, so the script resolves.
    (install,) = [r for r in FINAL.all("RUN") if "pip install" in r]
    venv = re.search(r"python -m venv (\S+)", install)
    assert venv, install
    path = re.search(r"PATH=(\S+)", " ".join(FINAL.all("ENV")))
    assert path and f"{venv.group(1)}/bin" in path.group(1).split(":")


def builder_wheel_sources() -> list[str]:
    """The project folders the builder's ``pip wheel`` builds, in order."""
    built = [r for s in BUILDERS.values() for r in s.all("RUN") if "pip wheel" in r]
    assert len(built) == 1, built
    match = re.search(r"pip wheel --wheel-dir \S+ ((?:[^\s&]+ ?)+)", built[0])
    assert match, built[0]
    return [source.strip("'\"") for source in match.group(1).split()]


def test_final_stage_installs_the_wheel_built_in_the_builder() -> None:
    built = [r for s in BUILDERS.values() for r in s.all("RUN") if "pip wheel" in r]
    assert built, "no builder stage runs pip wheel"
    # Both projects: the --no-index install below finds sdgruntime only among these wheels.
    assert builder_wheel_sources() == ["./sdgruntime", ".[otlp]"]
    (install,) = [r for r in FINAL.all("RUN") if "pip install" in r]
    mount = re.search(r"--mount=type=bind,from=(\w+),source=(\S+),target=(\S+)", install)
    assert mount and mount.group(1) in BUILDERS, install
    assert f"--wheel-dir {mount.group(2)}" in built[0]
    # Only the built wheels, no package index, and our own wheel by file.
    assert "--no-index" in install
    assert f"{mount.group(3)}/shared_device_group-*.whl" in install
    # No source tree or build tools reach the final stage.
    assert not FINAL.all("COPY") and not FINAL.all("ADD")


def test_dockerignore_sends_only_the_package_sources() -> None:
    for copy in BUILDERS["builder"].all("COPY"):
        *sources, _dest = copy.split()
        for src in sources:
            assert not excluded(src.strip("/")), f"{src} is COPY'd but .dockerignore drops it"
    for kept in (
        "pyproject.toml",
        "README.md",
        "api/v1alpha1.py",
        "sdgruntime/py.typed",
        "sdgruntime/pyproject.toml",
        "sdgruntime/README.md",
    ):
        assert not excluded(kept), kept
    for dropped in (
        ".venv/bin/python",
        ".git/HEAD",
        "tests/conftest.py",
        "hack/controlplane/go.mod",
        "config/crd/kustomization.yaml",
        "api/__pycache__/constants.cpython-311.pyc",
        "shared_device_group.egg-info/PKG-INFO",
        "sdgruntime/sdgruntime.egg-info/PKG-INFO",
        "sdgruntime/build/lib/sdgruntime/client.py",
    ):
        assert excluded(dropped), dropped


# --- the image content: the wheels ----------------------------------------------------------


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, zipfile.ZipFile]:
    """The wheels the builder stage builds, from exactly the files the builder copies,
    by name prefix (``sdgruntime``, ``shared_device_group``)."""
    base = tmp_path_factory.mktemp("image")
    context, src, out = base / "context", base / "src", base / "wheels"
    build_context(context)
    src.mkdir()
    for copy in BUILDERS["builder"].all("COPY"):
        *sources, dest = copy.split()
        for source in sources:
            origin = context / source.strip("/")
            assert origin.exists(), f"COPY {source}: not in the build context"
            if origin.is_dir():
                shutil.copytree(origin, src / dest.strip("/"), dirs_exist_ok=True)
            else:
                shutil.copy2(origin, src / dest / origin.name)
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out)]
    proc = subprocess.run(
        [*pip_wheel, *builder_wheel_sources()],
        cwd=src,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = {}
    for prefix in WHEELS:
        (path,) = out.glob(f"{prefix}-*.whl")
        found[prefix] = zipfile.ZipFile(path)
    assert len(list(out.glob("*.whl"))) == len(WHEELS)
    return found


def metadata(wheel: zipfile.ZipFile) -> str:
    (name,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    return wheel.read(name).decode()


@pytest.mark.parametrize("prefix", sorted(WHEELS))
def test_wheel_holds_its_typed_packages_and_nothing_else(
    wheels: dict[str, zipfile.ZipFile], prefix: str
) -> None:
    names = set(wheels[prefix].namelist())
    top = {n.split("/")[0] for n in names}
    dist_info = {t for t in top if t.endswith(".dist-info")}
    assert top - dist_info == set(WHEELS[prefix])
    for pkg in WHEELS[prefix]:
        assert f"{pkg}/__init__.py" in names, pkg
        assert f"{pkg}/py.typed" in names, f"{pkg} is not marked typed"
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]


def test_sdg_wheel_requires_the_sdgruntime_wheel_built_with_it(
    wheels: dict[str, zipfile.ZipFile],
) -> None:
    """The final stage installs SDG's wheel with --no-index: its requirement on sdgruntime
    must be met by the sdgruntime wheel of the same build."""
    requires = [
        Requirement(line.removeprefix("Requires-Dist:").strip())
        for line in metadata(wheels["shared_device_group"]).splitlines()
        if line.startswith("Requires-Dist:")
    ]
    (runtime,) = [r for r in requires if r.name == "sdgruntime" and not r.marker]
    version = re.search(r"^Version: (\S+)$", metadata(wheels["sdgruntime"]), re.M)
    assert version, "the sdgruntime wheel has no version"
    assert runtime.specifier.contains(version.group(1)), (runtime, version.group(1))


def test_wheel_declares_the_console_scripts(wheels: dict[str, zipfile.ZipFile]) -> None:
    wheel = wheels["shared_device_group"]
    (entry_points,) = [n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt")]
    parser = configparser.ConfigParser()
    parser.read_string(wheel.read(entry_points).decode())
    declared = {k: v.replace(" ", "") for k, v in parser["console_scripts"].items()}
    assert declared == SCRIPTS
    assert {"sdg-manager", "sdg", "kubectl-sdg"} <= set(declared)


def test_console_script_targets_are_in_the_wheel(wheels: dict[str, zipfile.ZipFile]) -> None:
    names = set(wheels["shared_device_group"].namelist())
    for script, target in SCRIPTS.items():
        module, _, func = target.partition(":")
        path = module.replace(".", "/") + ".py"
        assert path in names, f"console script {script} -> {target}, but {path} is not built"
        assert f"def {func}(" in wheels["shared_device_group"].read(path).decode(), (
            f"{path} defines no {func}()"
        )


def test_image_installs_the_otlp_extra(wheels: dict[str, zipfile.ZipFile]) -> None:
    """OTEL_TRACES_EXPORTER=otlp must work in the image: the builder builds the wheels of
    the otlp extra (the final install finds nothing else), the final stage installs SDG
    with it, the extra brings the exporter sdgruntime.tracing imports for http/protobuf,
    and the build fails if that module does not import."""
    exporter = "opentelemetry.exporter.otlp.proto.http.trace_exporter"
    assert f'"{exporter}"' in (ROOT / "sdgruntime" / "tracing.py").read_text()
    (install,) = [r for r in FINAL.all("RUN") if "pip install" in r]
    assert re.search(r"shared_device_group-\*\.whl\)?\[otlp\]", install), install
    assert f'python -c "import {exporter}"' in install

    def extra(wheel: zipfile.ZipFile, name: str) -> list[Requirement]:
        assert f"Provides-Extra: {name}" in metadata(wheel).splitlines()
        requires = [
            Requirement(line.removeprefix("Requires-Dist:").strip())
            for line in metadata(wheel).splitlines()
            if line.startswith("Requires-Dist:")
        ]
        return [
            r
            for r in requires
            if r.marker and "extra" in str(r.marker) and r.marker.evaluate({"extra": name})
        ]

    (runtime,) = extra(wheels["shared_device_group"], "otlp")
    assert (runtime.name, runtime.extras) == ("sdgruntime", {"otlp"})
    names = {r.name for r in extra(wheels["sdgruntime"], "otlp")}
    assert "opentelemetry-exporter-otlp-proto-http" in names

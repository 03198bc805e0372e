"""sdgruntime is a library of its own: nothing in it, and nothing in its tests, imports
Shared Device Group (api, controllers, webhooks); its distribution (sdgruntime/pyproject.toml)
declares exactly the third-party packages it imports, lists every subpackage, takes its
version from ``sdgruntime.__version__``, and ships envtest's Go module (the same files as
SDG's hack/controlplane).

Static (AST) checks, so a lazy import inside a function is caught as well as a top-level
one. test_distribution.py proves the same from the outside: the built wheel, alone in a
fresh venv.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import sysconfig
import tomllib
from collections.abc import Iterator
from pathlib import Path

from packaging.requirements import Requirement

import sdgruntime
from sdgruntime.envtest.build import PACKAGED_SOURCE, controlplane_module

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "sdgruntime"
ENVTEST = PACKAGE / "envtest"
HACK_CONTROLPLANE = ROOT / "hack" / "controlplane"
RUNTIME_TESTS = ROOT / "tests" / "runtime"
PROJECT = tomllib.loads((PACKAGE / "pyproject.toml").read_text())
SDG_PACKAGES = frozenset({"api", "controllers", "webhooks"})
#: Left in the package folder by a local build or an editable install; never shipped.
BUILD_LEFTOVERS = ("build", "sdgruntime.egg-info", "__pycache__")


def sources(folder: Path) -> Iterator[Path]:
    for path in sorted(folder.rglob("*.py")):
        if not any(part in BUILD_LEFTOVERS for part in path.relative_to(folder).parts):
            yield path


def imported_modules(path: Path) -> Iterator[tuple[int, str]]:
    """(line, absolute module) of every import in ``path``, also inside functions, and of
    ``import_module("...")`` / ``__import__("...")`` calls with a literal name."""
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:  # the name may be a module or an attribute of one
                yield node.lineno, f"{node.module}.{alias.name}"
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "id", getattr(node.func, "attr", None))
            in ("import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield node.lineno, node.args[0].value


def sdg_imports(folder: Path) -> list[str]:
    return [
        f"{path.relative_to(ROOT)}:{line}: {module}"
        for path in sources(folder)
        for line, module in imported_modules(path)
        if module.split(".")[0] in SDG_PACKAGES
    ]


def test_sdgruntime_imports_nothing_of_sdg() -> None:
    assert list(sources(PACKAGE)), "no sources found"
    assert sdg_imports(PACKAGE) == []


def test_runtime_tests_import_nothing_of_sdg() -> None:
    """tests/runtime, and tests/conftest.py that pytest loads for it."""
    assert sdg_imports(RUNTIME_TESTS) == []
    conftest = ROOT / "tests" / "conftest.py"
    found = [m for _, m in imported_modules(conftest) if m.split(".")[0] in SDG_PACKAGES]
    assert found == []
    # Nor helpers of SDG's test folders (tests.unit, tests.integration, tests.e2e).
    helpers = [
        f"{path.relative_to(ROOT)}: {module}"
        for path in sources(RUNTIME_TESTS)
        for _, module in imported_modules(path)
        if module.split(".")[0] == "tests" and not module.startswith("tests.runtime")
    ]
    assert helpers == []


def test_the_scan_sees_imports_inside_functions_and_import_module(tmp_path: Path) -> None:
    """The check above would catch the ways an SDG import could hide."""
    (tmp_path / "m.py").write_text(
        "from importlib import import_module\n"
        "def f():\n"
        "    from api.constants import GROUP\n"
        "    import controllers.app\n"
        "    return import_module('webhooks.podmutator')\n"
    )
    assert [m.split(": ")[1] for m in sdg_imports_in(tmp_path)] == [
        "api.constants.GROUP",
        "controllers.app",
        "webhooks.podmutator",
    ]


def sdg_imports_in(folder: Path) -> list[str]:
    return [
        f"{path.name}:{line}: {module}"
        for path in sources(folder)
        for line, module in sorted(imported_modules(path))
        if module.split(".")[0] in SDG_PACKAGES
    ]


# --- dependencies: exactly what sdgruntime imports ------------------------------------------


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def module_owners() -> dict[str, str]:
    """Importable module -> the installed distribution whose files provide it (only what
    is installed in the environment: not a stale ``*.egg-info`` in the working directory)."""
    owners: dict[str, str] = {}
    installed = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    for dist in importlib.metadata.distributions(path=installed):
        for file in dist.files or ():
            if file.suffix != ".py" or ".." in file.parts:
                continue
            parts = list(file.with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            if parts:
                owners.setdefault(".".join(parts), canonical(dist.metadata["Name"]))
    return owners


def owner_of(module: str, owners: dict[str, str]) -> str | None:
    parts = module.split(".")
    while parts:
        if (owner := owners.get(".".join(parts))) is not None:
            return owner
        parts.pop()
    return None


def third_party_imports(folders: list[Path], first_party: set[str]) -> dict[str, set[str]]:
    """Distribution -> the files importing it, for every import that is not stdlib or
    first party."""
    owners = module_owners()
    found: dict[str, set[str]] = {}
    unknown = []
    for folder in folders:
        for path in sources(folder):
            for line, module in imported_modules(path):
                top = module.split(".")[0]
                if top in sys.stdlib_module_names or top in first_party or top == "__future__":
                    continue
                owner = owner_of(module, owners)
                if owner is None:
                    unknown.append(f"{path.relative_to(ROOT)}:{line}: {module}")
                else:
                    found.setdefault(owner, set()).add(str(path.relative_to(ROOT)))
    # ``from pkg import name`` is looked up as pkg.name, then pkg (owner_of walks up). A
    # module nothing installed provides is a missing dependency.
    assert unknown == [], "imports no installed distribution provides"
    return found


def declared(requirements: list[str]) -> set[str]:
    return {canonical(Requirement(r).name) for r in requirements}


def test_dependencies_are_exactly_what_sdgruntime_imports() -> None:
    project = PROJECT["project"]
    imported = third_party_imports([PACKAGE], {"sdgruntime"})
    extras = {name: declared(reqs) for name, reqs in project["optional-dependencies"].items()}
    # The pytest plugin imports pytest: whoever loads it runs pytest. It is in the test extra.
    assert imported.pop("pytest") == {"sdgruntime/envtest/pytest_plugin.py"}
    assert "pytest" in extras["test"]
    # Only an auth-provider user loads the kubernetes package, from its extra.
    assert imported.pop("kubernetes") == {"sdgruntime/rest/config.py"}
    assert extras["auth-providers"] == {"kubernetes"}
    assert set(imported) == declared(project["dependencies"])


def test_the_test_extra_is_what_an_operators_tests_need() -> None:
    """An operator installing sdgruntime[test] gets pytest (the envtest plugin) and
    pytest-timeout, not sdgruntime's own tools: hypothesis (its property tests) and mypy
    are in `dev`, and nothing shipped imports them."""
    project = PROJECT["project"]
    extras = {name: declared(reqs) for name, reqs in project["optional-dependencies"].items()}
    assert extras["test"] == {"pytest", "pytest-timeout"}
    assert {"hypothesis", "mypy"} <= extras["dev"] and not extras["dev"] & extras["test"]
    shipped = set(third_party_imports([PACKAGE], {"sdgruntime"}))
    # dev may repeat an extra's package for the unit tests (kubernetes: auth-providers).
    assert not shipped & (extras["dev"] - extras["auth-providers"])
    # sdgruntime's unit tests (test_distribution.py runs them in a venv of [test,dev]) need
    # nothing more, and do need dev: they import hypothesis.
    unit = third_party_imports([RUNTIME_TESTS / "unit"], {"sdgruntime", "tests"})
    provided = declared(project["dependencies"]) | extras["test"] | extras["dev"]
    assert sorted(set(unit) - provided) == []
    assert "hypothesis" in unit


def test_every_subpackage_is_listed_and_typed() -> None:
    setuptools = PROJECT["tool"]["setuptools"]
    assert setuptools["package-dir"] == {"sdgruntime": "."}
    found = sorted(
        ".".join(("sdgruntime", *init.parent.relative_to(PACKAGE).parts))
        for init in sources(PACKAGE)
        if init.name == "__init__.py"
    )
    assert sorted(setuptools["packages"]) == found
    assert setuptools["include-package-data"] is False  # never pyproject.toml or README.md
    data = PROJECT["tool"]["setuptools"]["package-data"]
    assert data["sdgruntime"] == ["py.typed"]
    assert (PACKAGE / "py.typed").is_file()
    # and envtest's Go module, whole: every file GoModule.sources() hashes and builds
    assert set(data) == {"sdgruntime", "sdgruntime.envtest"}
    matched = {p for pattern in data["sdgruntime.envtest"] for p in ENVTEST.glob(pattern)}
    assert matched == set(controlplane_module(PACKAGED_SOURCE).sources())


def test_the_packaged_go_module_is_sdgs_hack_controlplane() -> None:
    """The same files, so both share one cache folder: a build for SDG's tests serves any
    project's envtest on the machine, and a bump of one without the other fails here."""
    ours, sdgs = controlplane_module(PACKAGED_SOURCE), controlplane_module(HACK_CONTROLPLANE)
    files = [p.relative_to(PACKAGED_SOURCE) for p in ours.sources()]
    assert files == [p.relative_to(HACK_CONTROLPLANE) for p in sdgs.sources()]
    changed = [
        str(f)
        for f in files
        if (PACKAGED_SOURCE / f).read_bytes() != (HACK_CONTROLPLANE / f).read_bytes()
    ]
    assert changed == [], "copy hack/controlplane to sdgruntime/envtest/go/controlplane"
    assert ours.cache_dir() == sdgs.cache_dir()


def test_the_version_is_sdgruntime_dunder_version() -> None:
    project = PROJECT["project"]
    assert project["name"] == "sdgruntime"
    assert "version" not in project and project["dynamic"] == ["version"]
    assert PROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "sdgruntime.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", sdgruntime.__version__)
    # What this environment installed (make install: pip install -e ./sdgruntime) says so.
    assert importlib.metadata.version("sdgruntime") == sdgruntime.__version__

"""Shared Device Group's distribution (pyproject.toml) builds on sdgruntime's: it ships only
api, controllers, webhooks and cli, depends on sdgruntime in a range its version is in, and
declares what its own packages import (not only what sdgruntime brings along).

The wheels themselves are checked in test_dockerfile.py; sdgruntime's side in
tests/runtime/test_packaging.py, whose helpers this reuses.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement

import sdgruntime
from tests.runtime.test_packaging import canonical, declared, third_party_imports

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
SETUPTOOLS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
PACKAGES = ("api", "controllers", "webhooks", "cli")


def test_sdg_ships_its_packages_and_not_sdgruntime() -> None:
    assert SETUPTOOLS["packages"]["find"]["include"] == [f"{p}*" for p in PACKAGES]


def test_sdg_depends_on_this_sdgruntime() -> None:
    (runtime,) = [Requirement(r) for r in PROJECT["dependencies"] if r.startswith("sdgruntime")]
    assert runtime.specifier.contains(sdgruntime.__version__), runtime
    # The otlp extra is sdgruntime's: tracing is set up there.
    assert PROJECT["optional-dependencies"]["otlp"] == ["sdgruntime[otlp]"]


def test_dependencies_are_what_sdg_imports() -> None:
    """Each third-party package api/controllers/webhooks import is declared here, even if
    sdgruntime depends on it too; nothing is declared that they do not import."""
    imported = third_party_imports([ROOT / p for p in PACKAGES], set(PACKAGES) | {"sdgruntime"})
    assert set(imported) | {"sdgruntime"} == declared(PROJECT["dependencies"])
    assert canonical("shared-device-group") not in imported

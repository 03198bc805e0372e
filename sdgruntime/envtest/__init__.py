"""A real local Kubernetes control plane (etcd + kube-apiserver) for tests and demos.

Like controller-runtime's envtest, but the binaries are built once per machine from the
Go module shipped in this package (there is nowhere to download them from); see
:mod:`sdgruntime.envtest.build` for where else they may come from.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sdgruntime.envtest.admission import admission_review
    from sdgruntime.envtest.build import BuildError, ensure_binaries
    from sdgruntime.envtest.certs import CertificateAuthority, KeyPair
    from sdgruntime.envtest.controlplane import (
        ControlPlane,
        ControlPlaneError,
        free_port,
        load_manifests,
    )
    from sdgruntime.envtest.eventually import eventually
    from sdgruntime.envtest.fakeclient import FakeClient
    from sdgruntime.envtest.fakerecorder import FakeRecorder, RecordedEvent

__all__ = [
    "BuildError",
    "CertificateAuthority",
    "ControlPlane",
    "ControlPlaneError",
    "FakeClient",
    "FakeRecorder",
    "KeyPair",
    "RecordedEvent",
    "admission_review",
    "ensure_binaries",
    "eventually",
    "free_port",
    "load_manifests",
]

# Imported on first use, not with the package: `python -m sdgruntime.envtest.build` imports
# this package before it runs build.py as __main__, and a build module imported here already
# would make runpy warn and run the module a second time.
_HOME = {
    "BuildError": "build",
    "ensure_binaries": "build",
    "CertificateAuthority": "certs",
    "KeyPair": "certs",
    "ControlPlane": "controlplane",
    "ControlPlaneError": "controlplane",
    "load_manifests": "controlplane",
    "free_port": "controlplane",
    "eventually": "eventually",
    "FakeClient": "fakeclient",
    "FakeRecorder": "fakerecorder",
    "RecordedEvent": "fakerecorder",
    "admission_review": "admission",
}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value

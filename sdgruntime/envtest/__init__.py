"""A real local Kubernetes control plane (etcd + kube-apiserver) for tests and demos.

Like controller-runtime's envtest, but the binaries are built here from the Kubernetes
Go modules in ``hack/controlplane`` (there is nowhere to download them from).
"""

from sdgruntime.envtest.build import BuildError, ensure_binaries
from sdgruntime.envtest.certs import CertificateAuthority, KeyPair
from sdgruntime.envtest.controlplane import ControlPlane, ControlPlaneError, load_manifests

__all__ = [
    "BuildError",
    "CertificateAuthority",
    "ControlPlane",
    "ControlPlaneError",
    "KeyPair",
    "ensure_binaries",
    "load_manifests",
]

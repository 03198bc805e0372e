"""``/metrics`` over HTTPS for authenticated, authorized scrapers only, as controller-runtime's
secure metrics serving (``filters.WithAuthenticationAndAuthorization``, kubebuilder's default).

Who may scrape is decided by the API server (:mod:`sdgruntime.authn`: a ``TokenReview``,
then a ``SubjectAccessReview`` for ``get /metrics``); reviews the caches cannot answer are
rate-limited (429 with ``Retry-After``). The serving certificate comes from ``cert_dir``
(re-read when it changes) or, without one, is a self-signed pair made at start, as
controller-runtime does: the token cannot be read on the wire, but a scraper can verify
the server only with a certificate it trusts.
"""

from __future__ import annotations

import datetime
import ipaddress
import socket
import ssl
import tempfile
from collections.abc import Callable
from pathlib import Path

from prometheus_client import CollectorRegistry

from sdgruntime import metrics
from sdgruntime.authn import APIServerAuth
from sdgruntime.probes import MetricsServer
from sdgruntime.webhook.certs import CertWatcher, server_context

__all__ = ["SecureMetricsServer", "self_signed_pair"]

SELF_SIGNED_DAYS = 365


def self_signed_pair(
    hosts: list[str] | None = None, days: int = SELF_SIGNED_DAYS
) -> tuple[bytes, bytes]:
    """A PEM certificate and key (ECDSA P-256) for ``hosts`` (names and IPs; default:
    this host's name, ``localhost``, ``127.0.0.1`` and ``::1``), signed by itself."""
    from cryptography import x509  # only here: a manager with a cert_dir never needs it
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    if hosts is None:
        hosts = [socket.gethostname(), "localhost", "127.0.0.1", "::1"]
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for host in dict.fromkeys(hosts):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))  # clock skew
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def _self_signed_context() -> ssl.SSLContext:
    """A server context with a fresh self-signed pair; the files exist only while loading
    (``ssl`` reads pairs from files), so the key stays in memory only."""
    cert_pem, key_pem = self_signed_pair()
    with tempfile.TemporaryDirectory(prefix="sdg-metrics-cert-") as tmp:
        cert_file, key_file = Path(tmp) / "tls.crt", Path(tmp) / "tls.key"
        key_file.touch(mode=0o600)
        key_file.write_bytes(key_pem)
        cert_file.write_bytes(cert_pem)
        return server_context(cert_file, key_file)


class SecureMetricsServer(MetricsServer):
    """``/metrics`` over HTTPS on ``addr`` behind ``auth``, until cancelled (module doc).

    ``cert_dir=None`` serves a self-signed certificate made here; a ``cert_dir`` that has
    no loadable ``tls.crt``/``tls.key`` fails here, so the manager does not start
    without the certificate it was told to use.
    """

    def __init__(
        self,
        addr: str,
        auth: APIServerAuth,
        *,
        cert_dir: str | Path | None = None,
        registry: CollectorRegistry = metrics.REGISTRY,
    ) -> None:
        provider: Callable[[], ssl.SSLContext]
        if cert_dir is None:
            context = _self_signed_context()
            provider = lambda: context  # noqa: E731
        else:
            provider = CertWatcher(
                Path(cert_dir) / "tls.crt",
                Path(cert_dir) / "tls.key",
                hint="ManagerOptions(metrics_cert_dir=...) names a folder with tls.crt and "
                "tls.key; leave it None for a self-signed certificate made at start",
            )
        self.auth = auth
        super().__init__(
            addr,
            registry,
            ssl_context_provider=provider,
            protect=auth.protect,
            # Reviews go to the API server: a scrape must not hang on a slow one.
            handler_timeout=30.0,
        )

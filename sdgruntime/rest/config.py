"""Where the API server is and who we are to it: kubeconfig, in-cluster, credentials.

Connection and auth settings come from the ``kubernetes`` package's config loaders
(kubeconfig, in-cluster), so every auth flavour they support (tokens, client certificates,
exec plugins, token files) works here. After loading, that package is only touched through
the configuration's ``refresh_api_key_hook``, which :class:`Credentials` runs when due.
"""

from __future__ import annotations

import os
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import anyio
import anyio.to_thread
import kubernetes.client
import kubernetes.config

__all__ = [
    "ConnectionSettings",
    "Credentials",
    "authorization",
    "auto_configuration",
    "incluster_configuration",
    "kubeconfig_configuration",
]


@dataclass(slots=True)
class ConnectionSettings:
    """What the client needs from a ``kubernetes.client.Configuration``, read once."""

    host: str  # "https://127.0.0.1:6443", no trailing slash
    ca_file: str | None
    cert_file: str | None
    key_file: str | None
    verify: bool
    check_hostname: bool
    tls_server_name: str | None
    refresh_hook: Callable[[Any], None] | None

    @classmethod
    def from_configuration(cls, cfg: kubernetes.client.Configuration) -> ConnectionSettings:
        return cls(
            host=str(cfg.host).rstrip("/"),
            ca_file=cfg.ssl_ca_cert or None,
            cert_file=cfg.cert_file or None,
            key_file=cfg.key_file or None,
            verify=bool(cfg.verify_ssl),
            check_hostname=cfg.assert_hostname is not False,
            tls_server_name=getattr(cfg, "tls_server_name", None) or None,
            refresh_hook=cfg.refresh_api_key_hook,
        )

    @property
    def host_port(self) -> str:
        """``host:port`` (default port filled in), the ``host`` label of the REST metrics."""
        u = urlsplit(self.host)
        port = u.port or (443 if u.scheme == "https" else 80)
        return f"{u.hostname}:{port}"

    def ssl_context(self) -> ssl.SSLContext:
        """The TLS context for every connection: CA, client cert, verification."""
        ctx = ssl.create_default_context(cafile=self.ca_file if self.verify else None)
        if not self.verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        elif not self.check_hostname:
            ctx.check_hostname = False
        if self.cert_file:
            ctx.load_cert_chain(self.cert_file, self.key_file)
        return ctx


def authorization(cfg: kubernetes.client.Configuration) -> str | None:
    """The Authorization header value the configuration carries now (no refresh)."""
    for key in ("BearerToken", "authorization"):
        token = cfg.api_key.get(key)
        if token:
            prefix = cfg.api_key_prefix.get(key)
            return f"{prefix} {token}" if prefix else str(token)
    return None


# --- loaders ---------------------------------------------------------------------------


def kubeconfig_configuration(
    path: str | os.PathLike[str] | None = None, context: str | None = None
) -> kubernetes.client.Configuration:
    """A kubeconfig file's configuration (default: $KUBECONFIG, else ~/.kube/config)."""
    if path is None:
        path = os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
    cfg = kubernetes.client.Configuration()
    kubernetes.config.load_kube_config(
        config_file=os.fspath(path), context=context, client_configuration=cfg
    )
    return cfg


def incluster_configuration() -> kubernetes.client.Configuration:
    """The pod's ServiceAccount (token file, CA, the kubernetes Service's address)."""
    cfg = kubernetes.client.Configuration()
    kubernetes.config.load_incluster_config(client_configuration=cfg)
    return cfg


def auto_configuration(kubeconfig: str | None = None) -> kubernetes.client.Configuration:
    """controller-runtime's order: explicit path, $KUBECONFIG, in-cluster, ~/.kube/config."""
    # $KUBECONFIG is read now (the kubernetes package reads it once, at import time);
    # a ':'-separated list is merged by its loader.
    kubeconfig = kubeconfig or os.environ.get("KUBECONFIG")
    if kubeconfig:
        return kubeconfig_configuration(kubeconfig)
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return incluster_configuration()
    return kubeconfig_configuration(None)


# --- credentials -----------------------------------------------------------------------


class Credentials:
    """The Authorization header in ``headers`` and the client certificate in ``ssl_context``,
    kept current through the configuration's refresh hook (exec plugins, token files).

    ``headers`` is edited in place, so a transport holding that dict sends the new token
    from the next request on; a new client certificate is loaded into the shared TLS
    context, which new connections use.
    """

    def __init__(
        self,
        configuration: kubernetes.client.Configuration,
        settings: ConnectionSettings,
        ssl_context: ssl.SSLContext,
        headers: dict[str, str],
        *,
        refresh_interval: float = 1.0,
    ) -> None:
        self.configuration = configuration
        self.hook = settings.refresh_hook
        self.headers = headers
        self._ssl = ssl_context
        self._loaded_cert = (settings.cert_file, settings.key_file)
        self._interval = refresh_interval
        self._next_refresh = 0.0
        self._lock = anyio.Lock()
        self._set_header()

    def _set_header(self) -> None:
        auth = authorization(self.configuration)
        if auth:
            self.headers["Authorization"] = auth
        else:
            self.headers.pop("Authorization", None)

    async def refresh(self, *, force: bool = False) -> None:
        """Run the refresh hook if it is due (or ``force``, after a 401).

        The hook may run a subprocess or read a file, so it runs in a worker thread, and at
        most once per ``refresh_interval``; the hook itself only reloads when expired.
        """
        hook = self.hook
        if hook is None or (not force and time.monotonic() < self._next_refresh):
            return
        async with self._lock:
            if not force and time.monotonic() < self._next_refresh:
                return
            await anyio.to_thread.run_sync(hook, self.configuration)
            self._next_refresh = time.monotonic() + self._interval
            self._set_header()
            cfg = self.configuration
            cert = (cfg.cert_file or None, cfg.key_file or None)
            if cert != self._loaded_cert and cert[0]:
                # an exec plugin handed out a new client certificate: new connections use it
                self._ssl.load_cert_chain(cert[0], cert[1])
                self._loaded_cert = cert

"""Where the API server is and who we are to it: kubeconfig, in-cluster, credentials.

Kubeconfig files (exec credential plugins included) and the in-cluster ServiceAccount are
read by :mod:`sdgruntime.rest.kubeconfig` into a :class:`RestConfig`. Only a user with an
``auth-provider`` is loaded by the ``kubernetes`` package (the ``auth-providers`` extra,
imported only then), into a ``kubernetes.client.Configuration``, whose
``refresh_api_key_hook`` :class:`Credentials` runs when due. A
:class:`~sdgruntime.client.Client` takes either.
"""

from __future__ import annotations

import os
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias
from urllib.parse import urlsplit

import anyio
import anyio.to_thread

from sdgruntime.rest.kubeconfig import (
    KubeconfigError,
    NeedsKubernetesPackage,
    RestConfig,
    default_kubeconfig_path,
    incluster_rest_config,
    kubeconfig_rest_config,
)

if TYPE_CHECKING:
    import kubernetes.client

__all__ = [
    "ClientConfiguration",
    "ConnectionSettings",
    "Credentials",
    "KubeconfigError",
    "RestConfig",
    "authorization",
    "auto_configuration",
    "incluster_configuration",
    "kubeconfig_configuration",
]

#: What a client is built from: our own :class:`RestConfig`, or a
#: ``kubernetes.client.Configuration`` (auth-providers, or one made by hand).
ClientConfiguration: TypeAlias = "RestConfig | kubernetes.client.Configuration"


@dataclass(slots=True)
class ConnectionSettings:
    """What the client needs from its configuration, read once."""

    host: str  # "https://127.0.0.1:6443", no trailing slash
    ca_file: str | None
    cert_file: str | None
    key_file: str | None
    verify: bool
    check_hostname: bool
    tls_server_name: str | None
    refresh_hook: Callable[[Any], None] | None

    @classmethod
    def from_configuration(cls, cfg: ClientConfiguration) -> ConnectionSettings:
        if isinstance(cfg, RestConfig):
            return cls(
                host=cfg.host.rstrip("/"),
                ca_file=cfg.ca_file,
                cert_file=cfg.cert_file,
                key_file=cfg.key_file,
                verify=cfg.verify,
                check_hostname=True,
                tls_server_name=cfg.tls_server_name,
                # called as hook(cfg), like the kubernetes package's hook
                refresh_hook=(
                    RestConfig.reload_token
                    if cfg.token_file
                    else RestConfig.run_exec
                    if cfg.exec_plugin
                    else None
                ),
            )
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


def authorization(cfg: ClientConfiguration) -> str | None:
    """The Authorization header value the configuration carries now (no refresh)."""
    if isinstance(cfg, RestConfig):
        return cfg.authorization()
    for key in ("BearerToken", "authorization"):
        token = cfg.api_key.get(key)
        if token:
            prefix = cfg.api_key_prefix.get(key)
            return f"{prefix} {token}" if prefix else str(token)
    return None


# --- loaders ---------------------------------------------------------------------------


def kubeconfig_configuration(
    path: str | os.PathLike[str] | None = None, context: str | None = None
) -> ClientConfiguration:
    """A kubeconfig's configuration (default: $KUBECONFIG, else ~/.kube/config; a
    ``:``-separated list is merged): a :class:`RestConfig`, or for a user with an
    ``auth-provider`` the ``kubernetes`` package's ``Configuration``."""
    spec = os.fspath(path) if path is not None else default_kubeconfig_path()
    try:
        return kubeconfig_rest_config(spec, context)
    except NeedsKubernetesPackage:
        return _kubernetes_kubeconfig(spec, context)


def _kubernetes_kubeconfig(spec: str, context: str | None) -> kubernetes.client.Configuration:
    """The ``kubernetes`` package's loader, imported only for the users that need it."""
    try:
        import kubernetes.client  # about 32 MiB with its dependencies: only when needed
        import kubernetes.config
    except ImportError as err:
        raise KubeconfigError(
            f"kubeconfig {spec}: the user has an auth-provider, which needs the kubernetes "
            "package: pip install 'sdgruntime[auth-providers]' (or use an exec plugin or a "
            "token: client-go itself dropped the built-in auth-providers)"
        ) from err

    cfg = kubernetes.client.Configuration()
    kubernetes.config.load_kube_config(config_file=spec, context=context, client_configuration=cfg)
    return cfg


def incluster_configuration() -> RestConfig:
    """The pod's ServiceAccount (token file re-read every minute, CA, the kubernetes
    Service's address from $KUBERNETES_SERVICE_HOST/PORT, namespace)."""
    return incluster_rest_config()


def auto_configuration(kubeconfig: str | None = None) -> ClientConfiguration:
    """controller-runtime's order: explicit path, $KUBECONFIG, in-cluster, ~/.kube/config."""
    kubeconfig = kubeconfig or os.environ.get("KUBECONFIG")
    if kubeconfig:
        return kubeconfig_configuration(kubeconfig)
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return incluster_configuration()
    return kubeconfig_configuration(None)


# --- credentials -----------------------------------------------------------------------


class Credentials:
    """The Authorization header in ``headers`` and the client certificate in ``ssl_context``,
    kept current: a :class:`RestConfig`'s token file is re-read when due; a
    ``kubernetes.client.Configuration``'s refresh hook (exec plugins) is run.

    ``headers`` is edited in place, so a transport holding that dict sends the new token
    from the next request on; a new client certificate is loaded into the shared TLS
    context, which new connections use.
    """

    def __init__(
        self,
        configuration: ClientConfiguration,
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
        cfg = self.configuration
        if isinstance(cfg, RestConfig):
            if cfg.exec_plugin is not None:
                await self._rerun_exec(cfg, force)
            else:
                await self._reload_token(cfg, force)
            return
        hook = self.hook
        if hook is None or (not force and time.monotonic() < self._next_refresh):
            return
        async with self._lock:
            if not force and time.monotonic() < self._next_refresh:
                return
            await anyio.to_thread.run_sync(hook, cfg)
            self._next_refresh = time.monotonic() + self._interval
            self._set_header()
            self._load_cert(cfg.cert_file or None, cfg.key_file or None)

    def _load_cert(self, cert_file: str | None, key_file: str | None) -> None:
        """An exec plugin handed out a new client certificate: new connections use it."""
        if (cert_file, key_file) != self._loaded_cert and cert_file:
            self._ssl.load_cert_chain(cert_file, key_file)
            self._loaded_cert = (cert_file, key_file)

    async def _rerun_exec(self, cfg: RestConfig, force: bool) -> None:
        """Run the exec plugin when its credential expired, or after a 401 (``force``);
        an expired credential is renewed at most once per ``refresh_interval``."""
        now = time.monotonic()
        if not force and not (cfg.exec_due(now) and now >= self._next_refresh):
            return
        async with self._lock:
            now = time.monotonic()
            if not force and not (cfg.exec_due(now) and now >= self._next_refresh):
                return
            await anyio.to_thread.run_sync(cfg.run_exec)
            self._next_refresh = time.monotonic() + self._interval
            self._set_header()
            self._load_cert(cfg.cert_file, cfg.key_file)

    async def _reload_token(self, cfg: RestConfig, force: bool) -> None:
        """Re-read a token file when due (every ``token_period``) or forced (a 401, at most
        once per ``refresh_interval``); no thread hop when not due."""
        if not cfg.token_file:
            return
        now = time.monotonic()
        if not (cfg.token_due(now) or (force and now >= self._next_refresh)):
            return
        async with self._lock:
            now = time.monotonic()
            if not (cfg.token_due(now) or (force and now >= self._next_refresh)):
                return
            await anyio.to_thread.run_sync(cfg.reload_token)
            self._next_refresh = time.monotonic() + self._interval
            self._set_header()

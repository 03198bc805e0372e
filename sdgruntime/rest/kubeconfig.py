"""Kubeconfig files and the pod's ServiceAccount, read here instead of by the ``kubernetes``
package, into a :class:`RestConfig` (client-go's ``rest.Config``, in small).

What is read follows the ``kubernetes`` loader and client-go: ``$KUBECONFIG`` lists
(first file naming an entry wins, the last ``current-context`` wins), contexts, TLS
settings, tokens, token files (re-read every minute), client certificates, basic auth and
``exec`` plugins (run by :mod:`sdgruntime.rest.execplugin`); ``*-data`` wins over a file,
relative paths resolve against the file they came from. :func:`needs_kubernetes_package`
says when a user has an ``auth-provider``, the one case left to that package.
"""

from __future__ import annotations

import atexit
import base64
import binascii
import contextlib
import logging
import os
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from sdgruntime.rest.execplugin import ExecPlugin, ExecPluginError

__all__ = [
    "SERVICE_ACCOUNT_DIR",
    "Entry",
    "Kubeconfig",
    "KubeconfigError",
    "NeedsKubernetesPackage",
    "RestConfig",
    "default_kubeconfig_path",
    "incluster_rest_config",
    "kubeconfig_rest_config",
    "needs_kubernetes_package",
    "read_kubeconfig",
    "select_context",
]

log = logging.getLogger(__name__)

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
#: How long a token read from a file is used before the file is read again (client-go:
#: one minute for ``tokenFile`` and the in-cluster token; the kubelet rotates the
#: projected token well before it expires).
TOKEN_FILE_PERIOD = 60.0
#: An exec credential is renewed this long before its expirationTimestamp.
EXEC_EXPIRY_SKEW = 10.0


class KubeconfigError(ValueError):
    """A kubeconfig (or the in-cluster environment) that cannot give a configuration."""


class NeedsKubernetesPackage(KubeconfigError):
    """The context's user has an ``exec`` plugin or an ``auth-provider``: load it with the
    ``kubernetes`` package (:mod:`sdgruntime.rest.config` does)."""


# --- the configuration -----------------------------------------------------------------


@dataclass(slots=True)
class RestConfig:
    """Where the API server is and who we are to it: what :class:`~sdgruntime.client.Client`
    needs, and nothing of the ``kubernetes`` package.

    A ``token_file`` is read again when :meth:`token_due` (every ``token_period`` seconds)
    or on demand (after a 401), so rotated ServiceAccount tokens are picked up.
    """

    host: str  # "https://127.0.0.1:6443"
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    verify: bool = True
    tls_server_name: str | None = None
    token: str | None = field(default=None, repr=False)
    token_file: str | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    namespace: str | None = None  # the context's, or the pod's; None: not set
    token_period: float = TOKEN_FILE_PERIOD
    exec_plugin: ExecPlugin | None = None  # the user's exec credential plugin
    _token_read_at: float | None = field(default=None, repr=False)
    _exec_expires: float | None = field(default=None, repr=False)
    _exec_ran: bool = field(default=False, repr=False)

    def authorization(self) -> str | None:
        """The Authorization header value now (no file read)."""
        if self.token:
            return f"Bearer {self.token}"
        if self.username is not None and self.password is not None:
            pair = f"{self.username}:{self.password}".encode()
            return f"Basic {base64.b64encode(pair).decode()}"
        return None

    def token_due(self, now: float | None = None) -> bool:
        """Whether ``token_file`` should be read again."""
        if not self.token_file:
            return False
        if self._token_read_at is None:
            return True
        return (time.monotonic() if now is None else now) - self._token_read_at >= (
            self.token_period
        )

    def exec_due(self, now: float | None = None) -> bool:
        """Whether the exec plugin should run again: never run, or its credential expired
        (``EXEC_EXPIRY_SKEW`` early, so a request does not race the expiry)."""
        if self.exec_plugin is None:
            return False
        if not self._exec_ran:
            return True
        now = time.monotonic() if now is None else now
        return self._exec_expires is not None and now >= self._exec_expires - EXEC_EXPIRY_SKEW

    def run_exec(self) -> None:
        """Run the exec plugin now (blocking) and take its token or client certificate.
        Raises :class:`KubeconfigError` with the plugin's error."""
        if self.exec_plugin is None:
            return
        try:
            cred = self.exec_plugin.run()
        except ExecPluginError as err:
            raise KubeconfigError(str(err)) from err
        self.token = cred.token
        if cred.cert_pem is not None and cred.key_pem is not None:
            self.cert_file, self.key_file = _temp_file(cred.cert_pem), _temp_file(cred.key_pem)
        self._exec_expires = cred.expires
        self._exec_ran = True

    def reload_token(self) -> None:
        """Read ``token_file`` now (blocking). A file that cannot be read or is empty keeps
        the token in use (logged), as client-go's cached file token source does; without
        one yet, it raises :class:`KubeconfigError`."""
        if not self.token_file:
            return
        try:
            token = Path(self.token_file).read_text().strip()
            if not token:
                raise KubeconfigError(f"token file {self.token_file} is empty")
        except (OSError, UnicodeDecodeError, KubeconfigError) as err:
            if self.token is None:
                raise KubeconfigError(f"cannot read token file {self.token_file}: {err}") from err
            log.warning(
                "cannot re-read token file %s (keeping the token in use): %s",
                self.token_file,
                err,
            )
            self._token_read_at = time.monotonic()  # retry after a period, not per request
            return
        self.token = token
        self._token_read_at = time.monotonic()


# --- kubeconfig files ------------------------------------------------------------------


def default_kubeconfig_path() -> str:
    """``$KUBECONFIG`` (maybe a ``:``-separated list), else ``~/.kube/config``."""
    return os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")


@dataclass(slots=True)
class Entry:
    """A named cluster/user/context and the directory its relative paths resolve against."""

    body: Mapping[str, Any]
    base: Path


@dataclass(slots=True)
class Kubeconfig:
    """The merged files: named entries, and the current context."""

    sources: list[str]
    clusters: dict[str, Entry]
    users: dict[str, Entry]
    contexts: dict[str, Entry]
    current_context: str | None


def read_kubeconfig(path: str | os.PathLike[str] | None = None) -> Kubeconfig:
    """Read and merge the kubeconfig file(s) at ``path`` (a ``:``-separated list; default:
    :func:`default_kubeconfig_path`)."""
    spec = os.fspath(path) if path is not None else default_kubeconfig_path()
    merged = Kubeconfig([], {}, {}, {}, None)
    for part in spec.split(os.pathsep):
        if not part:
            continue
        file = Path(os.path.expanduser(part))
        if not file.exists():
            continue
        try:
            doc = yaml.safe_load(file.read_text())
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
            raise KubeconfigError(f"cannot read kubeconfig {file}: {err}") from err
        if doc is None:
            raise KubeconfigError(f"kubeconfig {file} is empty")
        if not isinstance(doc, dict):
            raise KubeconfigError(f"kubeconfig {file} is not a mapping")
        merged.sources.append(str(file))
        base = file.resolve().parent
        for key, into, inner in (
            ("clusters", merged.clusters, "cluster"),
            ("users", merged.users, "user"),
            ("contexts", merged.contexts, "context"),
        ):
            items = doc.get(key) or []
            if not isinstance(items, list):
                raise KubeconfigError(f"kubeconfig {file}: {key} is not a list")
            for item in items:
                if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                    raise KubeconfigError(f"kubeconfig {file}: an entry of {key} has no name")
                body = item.get(inner) or {}
                if not isinstance(body, dict):
                    raise KubeconfigError(
                        f"kubeconfig {file}: {key}[{item['name']}].{inner} is not a mapping"
                    )
                into.setdefault(item["name"], Entry(body, base))
        if doc.get("current-context"):
            merged.current_context = str(doc["current-context"])
    if not merged.sources:
        raise KubeconfigError(f"no kubeconfig file found at {spec}")
    return merged


def select_context(
    cfg: Kubeconfig, context: str | None = None
) -> tuple[str, Entry, Entry | None, Entry]:
    """(context name, context, user or None, cluster) for ``context`` or the current one."""
    where = ":".join(cfg.sources)
    name = context or cfg.current_context
    if not name:
        raise KubeconfigError(f"kubeconfig {where} has no current-context; name a context")
    ctx = cfg.contexts.get(name)
    if ctx is None:
        known = ", ".join(sorted(cfg.contexts)) or "none"
        raise KubeconfigError(f"kubeconfig {where}: no context {name!r} (contexts: {known})")
    cluster_name = ctx.body.get("cluster")
    if not cluster_name:
        raise KubeconfigError(f"kubeconfig {where}: context {name!r} names no cluster")
    cluster = cfg.clusters.get(str(cluster_name))
    if cluster is None:
        raise KubeconfigError(
            f"kubeconfig {where}: context {name!r} names cluster {cluster_name!r}, "
            "which is not defined"
        )
    user: Entry | None = None
    user_name = ctx.body.get("user")
    if user_name:
        user = cfg.users.get(str(user_name))
        if user is None:
            raise KubeconfigError(
                f"kubeconfig {where}: context {name!r} names user {user_name!r}, "
                "which is not defined"
            )
    return name, ctx, user, cluster


def needs_kubernetes_package(user: Mapping[str, Any] | None) -> bool:
    """Whether the user authenticates in a way only the ``kubernetes`` package handles
    (an ``auth-provider``: client-go's deprecated gcp/azure/oidc plugins)."""
    return user is not None and "auth-provider" in user


def kubeconfig_rest_config(
    path: str | os.PathLike[str] | None = None, context: str | None = None
) -> RestConfig:
    """The :class:`RestConfig` of a kubeconfig's context (default: the current one).

    Raises :class:`KubeconfigError` for what cannot be used, and its subclass
    :class:`NeedsKubernetesPackage` for a user with an ``exec`` plugin or ``auth-provider``.
    """
    cfg = read_kubeconfig(path)
    name, ctx, user, cluster = select_context(cfg, context)
    return _rest_config(name, ctx, user, cluster)


def _rest_config(name: str, ctx: Entry, user: Entry | None, cluster: Entry) -> RestConfig:
    if user is not None and needs_kubernetes_package(user.body):
        raise NeedsKubernetesPackage(f"context {name!r}: its user has an auth-provider")
    server = cluster.body.get("server")
    if not server or not isinstance(server, str):
        raise KubeconfigError(f"context {name!r}: its cluster has no server")
    out = RestConfig(host=server.rstrip("/"))
    namespace = ctx.body.get("namespace")
    out.namespace = str(namespace) if namespace else None
    out.verify = not bool(cluster.body.get("insecure-skip-tls-verify", False))
    if cluster.body.get("tls-server-name"):
        out.tls_server_name = str(cluster.body["tls-server-name"])
    if server.startswith("https"):
        out.ca_file = _file_or_data(cluster, "certificate-authority")
        if user is not None:
            out.cert_file = _file_or_data(user, "client-certificate")
            out.key_file = _file_or_data(user, "client-key")
    if user is not None:
        body = user.body
        if "exec" in body:
            try:
                out.exec_plugin = ExecPlugin.parse(
                    body["exec"], user.base, _cluster_info(out, cluster, server)
                )
            except ExecPluginError as err:
                raise KubeconfigError(f"context {name!r}: {err}") from err
            out.run_exec()
        elif body.get("token"):
            out.token = str(body["token"]).strip()
        elif body.get("tokenFile"):
            out.token_file = str(user.base / str(body["tokenFile"]))
            out.reload_token()
        elif "username" in body and "password" in body:
            out.username, out.password = str(body["username"]), str(body["password"])
    return out


def _cluster_info(out: RestConfig, cluster: Entry, server: str) -> dict[str, Any]:
    """The cluster as an exec plugin is told it (``provideClusterInfo``)."""
    info: dict[str, Any] = {"server": server}
    if out.ca_file:
        with contextlib.suppress(OSError):
            info["certificate-authority-data"] = base64.b64encode(
                Path(out.ca_file).read_bytes()
            ).decode()
    if not out.verify:
        info["insecure-skip-tls-verify"] = True
    if out.tls_server_name:
        info["tls-server-name"] = out.tls_server_name
    extensions = cluster.body.get("extensions") or []
    for ext in extensions if isinstance(extensions, list) else ():
        if isinstance(ext, Mapping) and ext.get("name") == "client.authentication.k8s.io/exec":
            info["config"] = ext.get("extension")
    return info


def _file_or_data(entry: Entry, key: str) -> str | None:
    """The file holding ``key``: ``key-data`` (base64) written to a private temporary file,
    else ``key`` resolved against the entry's kubeconfig directory; None when neither."""
    data = entry.body.get(f"{key}-data")
    if data:
        try:
            content = base64.b64decode(str(data), validate=False)
        except (binascii.Error, ValueError) as err:
            raise KubeconfigError(f"{key}-data is not base64: {err}") from err
        return _temp_file(content)
    name = entry.body.get(key)
    if not name:
        return None
    file = os.path.normpath(entry.base / str(name))
    if not os.path.isfile(file):
        raise KubeconfigError(f"{key} {file} does not exist")
    return file


_temp_files: dict[bytes, str] = {}


def _temp_file(content: bytes) -> str:
    """A 0600 file with ``content`` (one per distinct content), removed at exit."""
    name = _temp_files.get(content)
    if name is not None and os.path.isfile(name):
        return name
    if not _temp_files:
        atexit.register(_remove_temp_files)
    fd, name = tempfile.mkstemp(prefix="sdgruntime-kubeconfig-")
    with os.fdopen(fd, "wb") as f:
        f.write(content)
    _temp_files[content] = name
    return name


def _remove_temp_files() -> None:
    for name in _temp_files.values():
        with contextlib.suppress(OSError):
            os.remove(name)
    _temp_files.clear()


# --- in-cluster ------------------------------------------------------------------------


def incluster_rest_config(
    environ: Mapping[str, str] | None = None, directory: str | os.PathLike[str] | None = None
) -> RestConfig:
    """The pod's ServiceAccount: ``https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT``,
    its token (re-read every minute: the kubelet rotates it) and CA, and its namespace."""
    env = os.environ if environ is None else environ
    sa = Path(directory) if directory is not None else SERVICE_ACCOUNT_DIR
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    if host is None or port is None:
        raise KubeconfigError(
            "not in a cluster: KUBERNETES_SERVICE_HOST/KUBERNETES_SERVICE_PORT are not set"
        )
    if not host or not port:
        raise KubeconfigError("KUBERNETES_SERVICE_HOST/KUBERNETES_SERVICE_PORT are set but empty")
    if ":" in host or "%" in host:  # an IPv6 address (net.JoinHostPort)
        host = f"[{host}]"
    token_file, ca_file = sa / "token", sa / "ca.crt"
    if not token_file.is_file():
        raise KubeconfigError(f"ServiceAccount token file {token_file} does not exist")
    if not ca_file.is_file():
        raise KubeconfigError(f"ServiceAccount CA file {ca_file} does not exist")
    if not ca_file.read_bytes().strip():
        raise KubeconfigError(f"ServiceAccount CA file {ca_file} is empty")
    namespace: str | None = None
    with contextlib.suppress(OSError, UnicodeDecodeError):
        namespace = (sa / "namespace").read_text().strip() or None
    out = RestConfig(
        host=f"https://{host}:{port}",
        ca_file=str(ca_file),
        token_file=str(token_file),
        namespace=namespace,
    )
    out.reload_token()
    return out

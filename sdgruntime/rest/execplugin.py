"""Kubeconfig ``exec`` credential plugins: run the command, read its ExecCredential.

The client side of client-go's exec protocol (``client.authentication.k8s.io`` v1 and
v1beta1): the plugin gets ``KUBERNETES_EXEC_INFO`` (the request: never interactive here,
the cluster when ``provideClusterInfo``), prints an ExecCredential whose ``status`` holds a
bearer ``token`` or a client certificate and key, and optionally an
``expirationTimestamp``, until which the credential is used. A plugin is run without a
terminal, so ``interactiveMode: Always`` is refused with what to do instead.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

__all__ = ["EXEC_TIMEOUT", "ExecCredential", "ExecPlugin", "ExecPluginError"]

API_VERSIONS = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")
#: How long a plugin may run (client-go sets none; a hung plugin would stall every request
#: waiting for credentials, so it is stopped and the error says so).
EXEC_TIMEOUT = 60.0
#: The most a plugin may print: a credential is a few KiB.
MAX_OUTPUT = 1 << 20


class ExecPluginError(ValueError):
    """A plugin that is misconfigured, failed, or printed no usable credential."""


@dataclass(frozen=True, slots=True)
class ExecCredential:
    """What one run of a plugin gave: a token, or a PEM client certificate and key;
    ``expires`` is a ``time.monotonic()`` deadline, None when the plugin set none."""

    token: str | None
    cert_pem: bytes | None
    key_pem: bytes | None
    expires: float | None


@dataclass(frozen=True, slots=True)
class ExecPlugin:
    """A user's ``exec`` stanza, validated when the kubeconfig is read."""

    command: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    api_version: str = API_VERSIONS[0]
    install_hint: str = ""
    interactive_mode: str = "IfAvailable"
    cluster: Mapping[str, Any] | None = field(default=None, repr=False)  # provideClusterInfo

    @classmethod
    def parse(
        cls, body: Mapping[str, Any], base: Path, cluster: Mapping[str, Any] | None
    ) -> ExecPlugin:
        """``body`` is the user's ``exec``; ``base`` the kubeconfig's directory (a relative
        command with a ``/`` is resolved against it, as client-go does); ``cluster`` the
        cluster info sent when ``provideClusterInfo`` is true."""
        if not isinstance(body, Mapping):
            raise ExecPluginError("exec is not a mapping")
        command = body.get("command")
        if not command or not isinstance(command, str):
            raise ExecPluginError("exec has no command")
        api_version = body.get("apiVersion")
        if api_version not in API_VERSIONS:
            raise ExecPluginError(
                f"exec apiVersion {api_version!r} is not supported; use one of "
                + ", ".join(API_VERSIONS)
            )
        mode = body.get("interactiveMode") or (
            "IfAvailable" if api_version.endswith("v1beta1") else None
        )
        if mode not in ("Never", "IfAvailable", "Always"):
            raise ExecPluginError(
                f"exec interactiveMode {mode!r}: set Never, IfAvailable or Always "
                "(required for client.authentication.k8s.io/v1)"
            )
        if mode == "Always":
            raise ExecPluginError(
                f"exec plugin {command} needs a terminal (interactiveMode: Always), and a "
                "controller runs it without one: log in with it first and use a token, or "
                "set interactiveMode to IfAvailable if the plugin can do without"
            )
        if "/" in command and not os.path.isabs(command):
            command = str(base / command)
        args = body.get("args") or []
        env = body.get("env") or []
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise ExecPluginError("exec args is not a list of strings")
        if not isinstance(env, list) or not all(
            isinstance(e, Mapping) and isinstance(e.get("name"), str) for e in env
        ):
            raise ExecPluginError("exec env is not a list of {name, value}")
        return cls(
            command=command,
            args=tuple(args),
            env=tuple((e["name"], str(e.get("value") or "")) for e in env),
            api_version=api_version,
            install_hint=str(body.get("installHint") or ""),
            interactive_mode=mode,
            cluster=cluster if body.get("provideClusterInfo") else None,
        )

    def request(self) -> str:
        """The ExecCredential request put in ``KUBERNETES_EXEC_INFO``."""
        spec: dict[str, Any] = {"interactive": False}
        if self.cluster is not None:
            spec["cluster"] = dict(self.cluster)
        return json.dumps({"apiVersion": self.api_version, "kind": "ExecCredential", "spec": spec})

    def run(self, timeout: float = EXEC_TIMEOUT) -> ExecCredential:
        """Run the plugin (blocking) and return its credential, or raise
        :class:`ExecPluginError` saying what went wrong."""
        env = {**os.environ, **dict(self.env), "KUBERNETES_EXEC_INFO": self.request()}
        try:
            done = subprocess.run(
                [self.command, *self.args],
                env=env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=timeout,
                check=False,
            )
        except FileNotFoundError as err:
            hint = f"; {self.install_hint}" if self.install_hint else ""
            raise ExecPluginError(f"exec plugin {self.command} not found{hint}") from err
        except subprocess.TimeoutExpired as err:
            raise ExecPluginError(
                f"exec plugin {self.command} did not finish within {timeout:.0f} s"
            ) from err
        except OSError as err:
            raise ExecPluginError(f"exec plugin {self.command} cannot run: {err}") from err
        if done.returncode != 0:
            said = done.stderr[:2000].decode(errors="replace").strip()
            raise ExecPluginError(
                f"exec plugin {self.command} exited {done.returncode}"
                + (f": {said}" if said else "")
            )
        return self._read(done.stdout)

    def _read(self, out: bytes) -> ExecCredential:
        where = f"exec plugin {self.command}"
        if len(out) > MAX_OUTPUT:
            raise ExecPluginError(f"{where} printed more than {MAX_OUTPUT} bytes")
        try:
            doc = json.loads(out)
        except ValueError as err:
            raise ExecPluginError(f"{where} printed no JSON ExecCredential: {err}") from err
        if not isinstance(doc, dict) or doc.get("kind") != "ExecCredential":
            raise ExecPluginError(f"{where} printed no ExecCredential (kind)")
        if doc.get("apiVersion") != self.api_version:
            raise ExecPluginError(
                f"{where} answered apiVersion {doc.get('apiVersion')!r} to a request of "
                f"{self.api_version}"
            )
        status = doc.get("status")
        if not isinstance(status, dict):
            raise ExecPluginError(f"{where} printed an ExecCredential without status")
        token = status.get("token") or None
        cert, key = status.get("clientCertificateData"), status.get("clientKeyData")
        if bool(cert) != bool(key):
            raise ExecPluginError(
                f"{where} gave clientCertificateData without clientKeyData or the reverse"
            )
        if not token and not cert:
            raise ExecPluginError(f"{where} gave neither a token nor a client certificate")
        return ExecCredential(
            token=str(token) if token else None,
            cert_pem=str(cert).encode() if cert else None,
            key_pem=str(key).encode() if key else None,
            expires=_deadline(status.get("expirationTimestamp"), where),
        )


def _deadline(stamp: Any, where: str) -> float | None:
    """An RFC 3339 ``expirationTimestamp`` as a ``time.monotonic()`` deadline."""
    if not stamp:
        return None
    try:
        at = datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))
    except ValueError as err:
        raise ExecPluginError(f"{where}: expirationTimestamp {stamp!r} is not RFC 3339") from err
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return time.monotonic() + (at - datetime.now(UTC)).total_seconds()

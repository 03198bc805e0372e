"""Serving certificates that follow their files, for TLS servers that must not restart.

``CertWatcher`` compares the files' content (the kubelet swaps a mounted Secret through a
symlink, so paths and modification times say nothing), at most every ``min_interval``
seconds and only when a new connection asks, so an idle server does no file I/O. A new
pair reaches new handshakes through ``sni_callback`` on the context the listener holds;
open connections keep theirs, and a pair that does not load leaves the previous one in
use. Details: docs/webhooks.md, "Certificates".
"""

from __future__ import annotations

import base64
import hashlib
import logging
import ssl
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)


def server_context(cert_file: str | Path, key_file: str | Path) -> ssl.SSLContext:
    """A server context for TLS >= 1.2 with the given pair.

    ALPN offers only ``http/1.1``: the servers do not speak HTTP/2, and Go clients (the
    API server included) would try h2 if it were offered. No session tickets are issued
    (see below).
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["http/1.1"])
    # No session tickets: client-go keeps no TLS session cache, so the API server never
    # resumes, and OpenSSL's two TLS 1.3 tickets per handshake were 16% of its server CPU.
    context.num_tickets = 0
    context.options |= ssl.OP_NO_TICKET
    context.load_cert_chain(str(cert_file), str(key_file))
    return context


def _describe(err: BaseException | None) -> str:
    """``No such file or directory: /certs/tls.key``, or the TLS library's reason."""
    if isinstance(err, OSError) and err.strerror:
        return f"{err.strerror}: {err.filename}" if err.filename else err.strerror
    return str(err) if err is not None else "the files changed while being read"


class CertWatcher:
    """Provides the current ``ssl.SSLContext`` for ``cert_file``/``key_file``.

    Call it (``watcher()``) to get the context, re-reading the files if ``min_interval``
    has passed since the last look. The first load happens in the constructor unless
    ``load=False``; ``current()`` raises until a pair has loaded. ``hint`` ends the error
    of a first load that fails: where the owner of the watcher sets the folder.
    """

    def __init__(
        self,
        cert_file: str | Path,
        key_file: str | Path,
        *,
        min_interval: float = 2.0,
        load: bool = True,
        context_factory: Callable[[Path, Path], ssl.SSLContext] = server_context,
        clock: Callable[[], float] = time.monotonic,
        hint: str = "",
    ) -> None:
        self.cert_file = Path(cert_file)
        self.key_file = Path(key_file)
        self.min_interval = min_interval
        self._factory = context_factory
        self._clock = clock
        self._context: ssl.SSLContext | None = None
        self._loaded_digest: bytes | None = None
        self._failed_digest: bytes | None = None
        self._checked_at: float | None = None
        self._last_error: BaseException | None = None  # why the last load failed
        self._newest: ssl.SSLContext | None = None  # the pair loaded last, after the first
        if load:
            self.refresh()
            if self._context is None:
                raise RuntimeError(
                    f"cannot load serving certificate {self.cert_file} / {self.key_file}: "
                    f"{_describe(self._last_error)}" + (f"; {hint}" if hint else "")
                )

    def __call__(self) -> ssl.SSLContext:
        now = self._clock()
        if self._checked_at is None or now - self._checked_at >= self.min_interval:
            self.refresh()
        return self.current()

    def current(self) -> ssl.SSLContext:
        """The context in use, without looking at the files."""
        if self._context is None:
            raise RuntimeError(f"no serving certificate loaded from {self.cert_file}")
        return self._context

    @property
    def loaded(self) -> bool:
        return self._context is not None

    def refresh(self) -> bool:
        """Re-reads the files now; returns whether a new pair was loaded."""
        self._checked_at = self._clock()
        try:
            cert, key = self.cert_file.read_bytes(), self.key_file.read_bytes()
        except OSError as exc:
            self._last_error = exc
            if self._failed_digest != b"unreadable":
                self._failed_digest = b"unreadable"
                log.error("cannot read serving certificate files: %s", exc)
            return False
        digest = hashlib.sha256(len(cert).to_bytes(8, "big") + cert + key).digest()
        if digest == self._loaded_digest:
            return False
        try:
            self._load(cert, key)
        except (OSError, ssl.SSLError, ValueError) as exc:
            self._last_error = exc
            if self._failed_digest != digest:
                self._failed_digest = digest
                log.error(
                    "cannot load serving certificate %s / %s (%s); keeping the %s",
                    self.cert_file,
                    self.key_file,
                    exc,
                    "previous one" if self._context is not None else "server without one",
                )
            return False
        self._loaded_digest = digest
        self._failed_digest = None
        log.info(
            "loaded serving certificate %s (SHA-256 fingerprint %s)",
            self.cert_file,
            fingerprint(cert),
        )
        return True

    def _load(self, cert: bytes, key: bytes) -> None:
        """Loads exactly the bytes read (files may change meanwhile) into a fresh context,
        so a bad pair fails there and leaves the live one as it was.

        Loading into the live context instead would keep the old certificate offered to
        clients that prefer its key type (OpenSSL keeps one per key type in a context)."""
        with tempfile.TemporaryDirectory(prefix="sdg-serving-cert-") as folder:
            cert_file, key_file = Path(folder) / "tls.crt", Path(folder) / "tls.key"
            key_file.touch(mode=0o600)
            key_file.write_bytes(key)
            cert_file.write_bytes(cert)
            fresh = self._factory(cert_file, key_file)
        if self._context is None:
            self._context = fresh
            return
        self._newest = fresh
        self._context.sni_callback = self._switch

    def _switch(self, connection: ssl.SSLObject, name: str | None, _: ssl.SSLContext) -> None:
        """``sni_callback``: the handshake goes on with the newest pair's context."""
        if self._newest is not None:
            connection.context = self._newest


def fingerprint(pem: bytes) -> str:
    """SHA-256 of the first certificate in ``pem`` (DER), as ``openssl x509 -fingerprint
    -sha256`` prints it; ``?`` if there is none."""
    begin, end = b"-----BEGIN CERTIFICATE-----", b"-----END CERTIFICATE-----"
    start = pem.find(begin)
    stop = pem.find(end, start + 1)
    if start < 0 or stop < 0:
        return "?"
    try:
        der = base64.b64decode(b"".join(pem[start + len(begin) : stop].split()), validate=True)
    except ValueError:
        return "?"
    return hashlib.sha256(der).digest().hex(":").upper() if der else "?"

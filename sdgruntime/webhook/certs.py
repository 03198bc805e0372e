"""Serving certificates that follow their files, for TLS servers that must not restart.

A mounted Secret is updated by the kubelet through an atomic symlink swap
(``..data -> ..2024_...``): the paths stay the same and modification times are not a
reliable signal, so ``CertWatcher`` compares the files' *content* (a SHA-256 of both)
at most every ``min_interval`` seconds, lazily, when a new connection asks for the
context. No background task is needed and an idle server does no file I/O.

A new pair that does not load (half-written files, a key that does not match the
certificate, garbage) is logged once per distinct content and the previous context
stays in use; the files are examined again on the next check, so the pair is picked up
as soon as it is complete.

The expiry (``not_after``, for the log) is read from the certificate's DER by
:func:`not_after` rather than by ``cryptography``, whose import costs a manager that only
serves certificates about 14 MiB of RSS.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import hashlib
import logging
import re
import ssl
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)


def server_context(
    cert_file: str | Path, key_file: str | Path, *, http2: bool = False
) -> ssl.SSLContext:
    """A server context for TLS >= 1.2 with the given pair.

    ALPN offers ``h2`` then ``http/1.1`` with ``http2`` (for an ``HTTPServer(http2=True)``:
    Go clients, the API server included, then pick h2), else only ``http/1.1``, since Go
    clients would try h2 on a server that does not speak it. No session tickets are issued
    (see below).
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["h2", "http/1.1"] if http2 else ["http/1.1"])
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
        self.not_after: float | None = None  # POSIX time the current certificate expires
        self._last_error: BaseException | None = None  # why the last load failed
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
            digest = self._digest()
        except OSError as exc:
            self._last_error = exc
            if self._failed_digest != b"unreadable":
                self._failed_digest = b"unreadable"
                log.error("cannot read serving certificate files: %s", exc)
            return False
        if digest == self._loaded_digest:
            return False
        try:
            context = self._factory(self.cert_file, self.key_file)
            # The files may have changed between reading and loading: only trust a load
            # whose content is the content we hashed, or the next check would miss it.
            if self._digest() != digest:
                return False
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
        self._context = context
        self._loaded_digest = digest
        self._failed_digest = None
        self.not_after = self._expiry()
        log.info(
            "loaded serving certificate %s (expires %s)",
            self.cert_file,
            time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.not_after))
            if self.not_after is not None
            else "unknown",
        )
        return True

    def _digest(self) -> bytes:
        sha = hashlib.sha256()
        for path in (self.cert_file, self.key_file):
            data = path.read_bytes()
            sha.update(len(data).to_bytes(8, "big"))
            sha.update(data)
        return sha.digest()

    def _expiry(self) -> float | None:
        try:
            return not_after(self.cert_file.read_bytes())
        except (OSError, ValueError):
            return None


_PEM_CERT = re.compile(rb"-----BEGIN CERTIFICATE-----([^-]*)-----END CERTIFICATE-----")


def not_after(pem: bytes) -> float:
    """POSIX time the first certificate in ``pem`` expires (``tbsCertificate.validity.
    notAfter``, RFC 5280 4.1); ValueError if there is none or it is malformed."""
    match = _PEM_CERT.search(pem)
    if match is None:
        raise ValueError("no PEM certificate")
    try:
        der = base64.b64decode(match.group(1))
    except binascii.Error as err:
        raise ValueError(f"PEM certificate is not base64: {err}") from err
    try:
        _, cert, _ = _der(der, 0, 0x30)  # Certificate ::= SEQUENCE
        _, pos, _ = _der(der, cert, 0x30)  # tbsCertificate ::= SEQUENCE
        if der[pos] == 0xA0:  # [0] EXPLICIT version, absent for v1
            pos = _der(der, pos, 0xA0)[2]
        for tag in (0x02, 0x30, 0x30):  # serialNumber, signature, issuer
            pos = _der(der, pos, tag)[2]
        _, validity, _ = _der(der, pos, 0x30)
        pos = _der(der, validity, None)[2]  # notBefore
        tag, start, end = _der(der, pos, None)  # notAfter
    except IndexError:
        raise ValueError("truncated certificate") from None
    text = der[start:end].decode("ascii", "replace")
    if tag == 0x17:  # UTCTime YYMMDDHHMMSSZ: 50..99 are 19xx
        text = ("19" if int(text[:2]) >= 50 else "20") + text
    elif tag != 0x18:  # GeneralizedTime YYYYMMDDHHMMSSZ
        raise ValueError(f"notAfter has tag {tag:#x}, not a time")
    when = datetime.datetime.strptime(text, "%Y%m%d%H%M%SZ").replace(tzinfo=datetime.UTC)
    return when.timestamp()


def _der(der: bytes, pos: int, expect: int | None) -> tuple[int, int, int]:
    """(tag, content start, content end) of the DER element at ``pos``."""
    tag, length = der[pos], der[pos + 1]
    pos += 2
    if length & 0x80:
        count = length & 0x7F
        if not 0 < count <= 4:
            raise ValueError("unsupported DER length")
        length = int.from_bytes(der[pos : pos + count], "big")
        pos += count
    if expect is not None and tag != expect:
        raise ValueError(f"DER tag {tag:#x}, expected {expect:#x}")
    if pos + length > len(der):
        raise ValueError("truncated certificate")
    return tag, pos, pos + length

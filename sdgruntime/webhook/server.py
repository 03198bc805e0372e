"""The admission webhook server: HTTPS, AdmissionReview v1, metrics, certificate rotation.

As controller-runtime's ``webhook.Server``: :class:`WebhookServer` serves each registered
path as one :class:`~sdgruntime.webhook.Webhook` over :mod:`sdgruntime.httpserver`, with
the pair in ``cert_dir`` followed by a ``CertWatcher``. A reviewed request is HTTP 200
with the verdict in the AdmissionReview; one that cannot be reviewed gets an HTTP error
with the reason, never a traceback. A handler gets at most 90 % of the API server's
``?timeout=`` (or ``request_timeout``), so a slow one is a denial that says so. Codes and
metrics: docs/webhooks.md, "Failures and HTTP errors".
"""

from __future__ import annotations

import functools
import json
import logging
import re
import ssl
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.abc

from sdgruntime import metrics
from sdgruntime.httpserver import Handler, HTTPServer, Request, Response, Router
from sdgruntime.webhook.admission import (
    AdmissionHandler,
    Mutator,
    ObjectUnreadable,
    ReviewError,
    Validator,
    Webhook,
)
from sdgruntime.webhook.certs import CertWatcher

log = logging.getLogger(__name__)

DEFAULT_CERT_DIR = Path("/tmp/k8s-webhook-server/serving-certs")  # controller-runtime's
# An AdmissionReview carries the object and, on UPDATE, the old object; objects are at
# most ~1.5 MiB in etcd and 3 MiB in an API request, so 7 MiB (controller-runtime's
# limit) fits any real review with JSON overhead and still bounds memory.
DEFAULT_MAX_BODY_BYTES = 7 * 1024 * 1024
# The API server keeps a pool of keep-alive connections per webhook host (client-go's
# MaxIdleConnsPerHost is 25) and opens more only for concurrent requests; a cluster
# has one to a few API servers, so real use stays well below 100. An open connection
# costs a few tens of KiB (TLS + parser state), so 256 idle ones are a few MiB, and a
# flood cannot use up the process's file descriptors (1024 by default).
DEFAULT_MAX_CONNECTIONS = 256
# The API server is the one client: one connection per review in flight (HTTP/1.1), so a
# burst of concurrent pod creates needs as many; half the total per address keeps any
# other address (a pod of the cluster) from holding every slot.
DEFAULT_MAX_CONNECTIONS_PER_CLIENT = 128
DEFAULT_PRESSURE_IDLE_TIMEOUT = 5.0
# Body bytes held at once across connections: four reviews of the largest allowed size,
# thousands of real ones (a Pod review is 5-50 KiB). Without it, 256 connections x 7 MiB
# could buffer 1.75 GiB in a manager limited to 512 MiB.
DEFAULT_MAX_BUFFERED_BYTES = 4 * DEFAULT_MAX_BODY_BYTES
_APISERVER_DEADLINE_SHARE = 0.9
_GO_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_GO_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


class WebhookServer:
    """Serves admission webhooks over TLS until cancelled.

    ``ssl_context_provider`` replaces the certificate files (tests, or a context from
    elsewhere); otherwise the pair in ``cert_dir`` is loaded when ``serve`` starts
    (failing fast if it cannot be) and followed afterwards.
    """

    def __init__(
        self,
        host: str | None = "0.0.0.0",
        port: int = 9443,
        cert_dir: str | Path = DEFAULT_CERT_DIR,
        cert_name: str = "tls.crt",
        key_name: str = "tls.key",
        *,
        request_timeout: float = 10.0,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        max_connections_per_client: int | None = DEFAULT_MAX_CONNECTIONS_PER_CLIENT,
        pressure_idle_timeout: float = DEFAULT_PRESSURE_IDLE_TIMEOUT,
        max_buffered_bytes: int | None = None,
        cert_check_interval: float = 2.0,
        ssl_context_provider: Callable[[], ssl.SSLContext] | None = None,
    ) -> None:
        self.host = host
        self.cert_file = Path(cert_dir) / cert_name
        self.key_file = Path(cert_dir) / key_name
        self.request_timeout = request_timeout
        self.cert_check_interval = cert_check_interval
        self._ssl_context_provider = ssl_context_provider
        self._router = Router()
        self._webhooks: dict[str, Webhook] = {}
        self._http = HTTPServer(
            host,
            port,
            self._router,
            max_body_bytes=max_body_bytes,
            max_connections=max_connections,
            max_connections_per_client=max_connections_per_client,
            pressure_idle_timeout=pressure_idle_timeout,
            max_buffered_bytes=(
                max(DEFAULT_MAX_BUFFERED_BYTES, max_body_bytes)
                if max_buffered_bytes is None
                else max_buffered_bytes
            ),
            # Reading a review and sending the verdict must fit in the API server's
            # deadline too; the handler itself is bounded by the Webhook.
            request_timeout=request_timeout,
            name="webhook",
        )

    def register(
        self,
        path: str,
        handler: Mutator | Validator | AdmissionHandler,
        *,
        timeout: float | None = None,
    ) -> Webhook:
        """Serves ``handler`` on ``path`` (also after the server started)."""
        webhook = Webhook(handler, name=path, timeout=timeout or self.request_timeout)
        self._router.add(path, self._route(path, webhook))
        self._webhooks[path] = webhook
        log.info("registered %s webhook on %s", webhook.kind, path)
        return webhook

    @property
    def webhooks(self) -> dict[str, Webhook]:
        return dict(self._webhooks)

    @property
    def port(self) -> int:
        """The bound port (once serving)."""
        return self._http.port

    @property
    def http(self) -> HTTPServer:
        """The HTTP server underneath (its connection counts, for tests and probes)."""
        return self._http

    def ready(self) -> bool:
        """Whether the server is listening: a readyz check for the manager."""
        return self._http.listening

    async def serve(
        self, *, task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        provider = self._ssl_context_provider
        if provider is None:
            provider = CertWatcher(
                self.cert_file,
                self.key_file,
                min_interval=self.cert_check_interval,
                hint=(
                    f"the webhook server reads {self.cert_file.name} and {self.key_file.name} "
                    "from ManagerOptions(webhook_cert_dir=...) (WebhookServer(cert_dir=...)), "
                    f"{DEFAULT_CERT_DIR} by default: mount a kubernetes.io/tls Secret there "
                    "(e.g. cert-manager's), or in tests write a pair with "
                    "control_plane.webhook_cert_dir(folder)"
                ),
            )
        self._http.ssl_context_provider = provider
        await self._http.serve(task_status=task_status)

    def _route(self, path: str, webhook: Webhook) -> Handler:
        latency = metrics.WEBHOOK_LATENCY.labels(webhook=path)
        in_flight = metrics.WEBHOOK_IN_FLIGHT.labels(webhook=path)
        by_code: dict[int, Any] = {}  # the request counter per status (a few codes)

        async def handle(request: Request) -> Response:
            start = time.perf_counter()
            in_flight.inc()
            status = 500  # if _handle raised, the HTTP server answers 500
            try:
                response = await self._handle(webhook, request)
                status = response.status
                return response
            finally:
                in_flight.dec()
                latency.observe(time.perf_counter() - start)
                counter = by_code.get(status)
                if counter is None:
                    counter = by_code[status] = metrics.WEBHOOK_REQUESTS.labels(
                        webhook=path, code=str(status)
                    )
                counter.inc()

        return handle

    async def _handle(self, webhook: Webhook, request: Request) -> Response:
        if request.method != "POST":
            return _status_response(405, "MethodNotAllowed", "only POST is allowed", allow="POST")
        content_type = request.headers.get("content-type", "")
        if content_type.split(";", 1)[0].strip().lower() != "application/json":
            return _status_response(
                415,
                "UnsupportedMediaType",
                f"content type {content_type!r}, expected application/json",
            )
        deadline = _go_duration(request.query_value("timeout"))
        try:
            review = await webhook.review(
                request.body,
                max_seconds=deadline * _APISERVER_DEADLINE_SHARE if deadline else None,
            )
        except ReviewError as exc:
            if not isinstance(exc, ObjectUnreadable):  # that one was logged with its source
                log.info(
                    "webhook %s: bad request from %s: %s",
                    webhook.name,
                    request.client,
                    exc.message,
                )
            return _status_response(exc.status, "BadRequest", exc.message)
        return Response.json(review)


def _status_response(code: int, reason: str, message: str, **headers: str) -> Response:
    """A ``metav1.Status`` body, as the API server's own errors look."""
    status = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    return Response(
        code,
        {"content-type": "application/json", **headers},
        json.dumps(status, separators=(",", ":")).encode(),
    )


@functools.lru_cache(maxsize=32)  # the API server sends one value per webhook: parse it once
def _go_duration(text: str | None) -> float | None:
    """Seconds in a Go duration such as ``10s`` or ``1m30s``; ``None`` if absent/invalid."""
    if not text:
        return None
    total, pos = 0.0, 0
    for match in _GO_DURATION.finditer(text):
        if match.start() != pos:
            return None
        total += float(match.group(1)) * _GO_UNITS[match.group(2)]
        pos = match.end()
    return total if pos == len(text) and total > 0 else None

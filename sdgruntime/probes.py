"""Plain-HTTP servers for the kubelet's probes (``/healthz``, ``/readyz``) and Prometheus
(``/metrics``), answering as controller-runtime (and the API server) do.

A check is a callable (sync or async) that returns ``False`` or raises to fail; anything
else passes. A failing check's reason is logged, not served, since probe ports are often
reachable from the whole cluster. Probes and metrics are separate servers (usually on
different ports); ``metrics_handler()`` serves both on one. The answers, ``?verbose``,
``?exclude=`` and ``/readyz/<name>``: docs/contracts.md, "The manager".
"""

from __future__ import annotations

import inspect
import logging
import ssl
from collections.abc import Awaitable, Callable, Mapping

import anyio
import anyio.abc
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from sdgruntime import metrics
from sdgruntime.httpserver import Handler, HTTPServer, Request, Response, Router

log = logging.getLogger(__name__)

Check = Callable[[], bool | Awaitable[bool | None] | None]


def parse_addr(addr: str) -> tuple[str | None, int]:
    """Go-style listen address: ``":8080"`` (all interfaces), ``"127.0.0.1:0"``,
    ``"[::1]:8443"``."""
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"listen address must be host:port or :port, got {addr!r}")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    return (host or None), int(port)


class _CheckSet:
    """The named checks of one endpoint (``healthz`` or ``readyz``)."""

    def __init__(self, endpoint: str, checks: Mapping[str, Check] | None, timeout: float) -> None:
        self.endpoint = endpoint
        self.timeout = timeout
        self.checks: dict[str, Check] = {}
        self._failing: set[str] = set()
        for name, check in (checks or {}).items():
            self.add(name, check)

    def add(self, name: str, check: Check) -> None:
        if not name or "/" in name:
            raise ValueError(f"invalid check name {name!r}")
        if name in self.checks:
            raise ValueError(f"{self.endpoint} check {name!r} is already registered")
        self.checks[name] = check

    async def run_one(self, name: str) -> str | None:
        """``None`` if the check passes, else why not."""
        try:
            result = self.checks[name]()
            if inspect.isawaitable(result):
                with anyio.fail_after(self.timeout):
                    result = await result
        except TimeoutError:
            reason: str | None = f"timed out after {self.timeout}s"
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}"
        else:
            reason = "returned false" if result is not None and not result else None
        if reason is None:
            if name in self._failing:
                self._failing.discard(name)
                log.info("%s check %r passes again", self.endpoint, name)
        elif name not in self._failing:
            self._failing.add(name)
            log.warning("%s check %r failed: %s", self.endpoint, name, reason)
        else:
            log.debug("%s check %r still failing: %s", self.endpoint, name, reason)
        return reason

    async def handle(self, request: Request) -> Response:
        if request.method not in ("GET", "HEAD"):
            return Response.text("method not allowed\n", 405, {"allow": "GET, HEAD"})
        excluded = set(request.query.get("exclude", []))
        unknown = excluded - self.checks.keys()
        lines, failed = [], False
        for name in self.checks:
            if name in excluded:
                lines.append(f"[+]{name} excluded: ok")
                continue
            reason = await self.run_one(name)
            failed |= reason is not None
            lines.append(f"[-]{name} failed: reason withheld" if reason else f"[+]{name} ok")
        lines.extend(
            f"warn: some {self.endpoint} checks cannot be excluded: no matches for {name!r}"
            for name in sorted(unknown)
        )
        if failed:
            return Response.text("\n".join([*lines, f"{self.endpoint} check failed"]) + "\n", 500)
        if "verbose" in request.query:
            return Response.text("\n".join([*lines, f"{self.endpoint} check passed"]) + "\n")
        return Response.text("ok")

    def single(self, name: str) -> Handler:
        async def handle(request: Request) -> Response:
            if request.method not in ("GET", "HEAD"):
                return Response.text("method not allowed\n", 405, {"allow": "GET, HEAD"})
            reason = await self.run_one(name)
            if reason is not None:
                return Response.text(f"internal server error: {name} check failed\n", 500)
            return Response.text("ok")

        return handle


class ProbeServer:
    """``/healthz`` and ``/readyz`` (and ``/healthz/<name>``, ``/readyz/<name>``) over
    plain HTTP on ``addr``, until cancelled."""

    def __init__(
        self,
        addr: str = ":8081",
        healthz_checks: Mapping[str, Check] | None = None,
        readyz_checks: Mapping[str, Check] | None = None,
        *,
        check_timeout: float = 5.0,
    ) -> None:
        self.router = Router()
        self._sets = {
            "healthz": _CheckSet("healthz", None, check_timeout),
            "readyz": _CheckSet("readyz", None, check_timeout),
        }
        for endpoint, checks in (("healthz", healthz_checks), ("readyz", readyz_checks)):
            self.router.add(f"/{endpoint}", self._sets[endpoint].handle)
            for name, check in (checks or {}).items():
                self._add(endpoint, name, check)
        host, port = parse_addr(addr)
        # Probes are tiny GETs: small limits, and a stuck check must not hold the kubelet.
        self._http = HTTPServer(
            host,
            port,
            self.router,
            max_body_bytes=64 * 1024,
            request_timeout=10.0,
            handler_timeout=check_timeout * 4,
            name="probe",
        )

    def add_healthz_check(self, name: str, check: Check) -> None:
        self._add("healthz", name, check)

    def add_readyz_check(self, name: str, check: Check) -> None:
        self._add("readyz", name, check)

    def _add(self, endpoint: str, name: str, check: Check) -> None:
        checks = self._sets[endpoint]
        checks.add(name, check)
        self.router.add(f"/{endpoint}/{name}", checks.single(name))

    @property
    def port(self) -> int:
        return self._http.port

    def ready(self) -> bool:
        return self._http.listening

    async def serve(
        self, *, task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        await self._http.serve(task_status=task_status)


def metrics_handler(registry: CollectorRegistry = metrics.REGISTRY) -> Handler:
    """Prometheus text exposition of ``registry``."""

    async def handle(request: Request) -> Response:
        if request.method not in ("GET", "HEAD"):
            return Response.text("method not allowed\n", 405, {"allow": "GET, HEAD"})
        return Response(200, {"content-type": CONTENT_TYPE_LATEST}, generate_latest(registry))

    return handle


class MetricsServer:
    """``/metrics`` over plain HTTP on ``addr``, until cancelled.

    ``ssl_context_provider``, ``protect`` (a wrapper around the handler, e.g. token review)
    and ``handler_timeout`` are for ``SecureMetricsServer``, which is this server over
    HTTPS behind the API server's authentication.
    """

    def __init__(
        self,
        addr: str = ":8080",
        registry: CollectorRegistry = metrics.REGISTRY,
        *,
        ssl_context_provider: Callable[[], ssl.SSLContext] | None = None,
        protect: Callable[[Handler], Handler] | None = None,
        handler_timeout: float | None = None,
    ) -> None:
        host, port = parse_addr(addr)
        handler = metrics_handler(registry)
        self.router = Router({"/metrics": protect(handler) if protect else handler})
        self._http = HTTPServer(
            host,
            port,
            self.router,
            ssl_context_provider=ssl_context_provider,
            max_body_bytes=64 * 1024,
            request_timeout=10.0,
            handler_timeout=handler_timeout,
            name="metrics",
        )

    @property
    def port(self) -> int:
        return self._http.port

    def ready(self) -> bool:
        return self._http.listening

    async def serve(
        self, *, task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        await self._http.serve(task_status=task_status)

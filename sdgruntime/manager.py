"""The manager: one process's shared client and cache, its servers, its controllers and
leader election, started and stopped in order (as controller-runtime's manager).

Entry points: :class:`Manager` (``add_runnable``, ``add_healthz_check``/``add_readyz_check``,
:meth:`Manager.run_until_cancelled`, :meth:`Manager.run` with signal handling).
Webhooks, probes and metrics serve on every replica; reconcilers run only on the leader.
Invariant: the lease is renewed until leader work has stopped, so no other replica starts
while ours still writes; losing it cancels leader work at once and raises
:class:`LeaderElectionLost`. Start and stop order: docs/contracts.md, "The manager".
"""

from __future__ import annotations

import difflib
import logging
import os
import re
import signal
import socket
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
from opentelemetry import trace
from pydantic import BaseModel, ConfigDict, Field, model_validator

from sdgruntime.authn import (
    DEFAULT_MAX_CONCURRENT_REVIEWS,
    DEFAULT_REVIEW_BURST,
    DEFAULT_REVIEW_RATE,
    APIServerAuth,
)
from sdgruntime.builder import Builder
from sdgruntime.cache import Cache, KindOptions
from sdgruntime.client import Client
from sdgruntime.controller import Controller
from sdgruntime.events import EventRecorder
from sdgruntime.kinds import Kind
from sdgruntime.leaderelection import LeaderElectionLost, LeaderElector, check_durations
from sdgruntime.probes import Check, MetricsServer, ProbeServer, parse_addr
from sdgruntime.ratelimiter import BucketRateLimiter
from sdgruntime.securemetrics import SecureMetricsServer
from sdgruntime.webhook import WebhookServer
from sdgruntime.webhook.server import (
    DEFAULT_CERT_DIR,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_CONNECTIONS_PER_CLIENT,
    DEFAULT_PRESSURE_IDLE_TIMEOUT,
)
from sdgruntime.webhook.typed import WebhookBuilder

__all__ = ["LeaderElectionLost", "Manager", "ManagerOptions", "Runnable"]

log = logging.getLogger(__name__)

Runnable = Callable[[], Coroutine[Any, Any, Any]]
"""Long-running work the manager starts and cancels: ``async def fn() -> None``."""

_SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
_DNS_SUBDOMAIN = re.compile(
    r"(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
)


def _pod_namespace() -> str | None:
    """The namespace of the pod we run in (its service account's), if any."""
    try:
        return _SA_NAMESPACE.read_text().strip() or None
    except OSError:
        return None


def _unknown_fields(unknown: list[Any], fields: list[str]) -> str:
    parts = []
    for name in unknown:
        near = difflib.get_close_matches(str(name), fields, n=1)
        parts.append(f"{name!r}" + (f" (did you mean {near[0]!r}?)" if near else ""))
    return f"ManagerOptions has no field {', '.join(parts)}; its fields are: {', '.join(fields)}"


class ManagerOptions(BaseModel):
    """Settings of a :class:`Manager` (defaults as controller-runtime and kubebuilder's
    main.go). Bind addresses are Go-style (``":8080"``, ``"127.0.0.1:0"``); ``"0"``
    disables a server. Durations are seconds."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    kubeconfig: str | None = None
    metrics_bind_address: str = ":8080"
    # HTTPS, each scrape authenticated and authorized by the API server (TokenReview,
    # SubjectAccessReview on /metrics): sdgruntime.securemetrics. Off: plain HTTP.
    metrics_secure: bool = False
    # tls.crt/tls.key for metrics_secure (re-read on change); None: self-signed at start
    metrics_cert_dir: str | None = None
    # metrics_secure: scrapes the review caches cannot answer, per second (burst) and at
    # once; beyond them 429 (sdgruntime.authn). The reviews' own pool has the last many.
    metrics_auth_review_rate: float = Field(default=DEFAULT_REVIEW_RATE, gt=0)
    metrics_auth_review_burst: int = Field(default=DEFAULT_REVIEW_BURST, ge=1)
    metrics_auth_max_concurrent_reviews: int = Field(default=DEFAULT_MAX_CONCURRENT_REVIEWS, ge=1)
    health_probe_bind_address: str = ":8081"
    webhook_host: str | None = None  # all interfaces
    webhook_port: int = Field(default=9443, ge=0, le=65535)
    webhook_cert_dir: str = str(DEFAULT_CERT_DIR)
    # over it, a new connection gets 503 "too many connections" (WebhookServer)
    webhook_max_connections: int = Field(default=DEFAULT_MAX_CONNECTIONS, ge=1)
    # ... and over this many from one client address (None: no per-address limit)
    webhook_max_connections_per_client: int | None = Field(
        default=DEFAULT_MAX_CONNECTIONS_PER_CLIENT, ge=1
    )
    # idle connections are closed after it once 3/4 of webhook_max_connections are open
    webhook_pressure_idle_timeout: float = Field(default=DEFAULT_PRESSURE_IDLE_TIMEOUT, gt=0)
    # the pool of webhook_client (the webhooks' live reads), apart from the manager's
    webhook_client_max_connections: int = Field(default=8, ge=1)

    leader_election: bool = False
    leader_election_id: str = ""
    leader_election_namespace: str | None = None  # default: the pod's namespace
    leader_election_identity: str | None = None  # default: hostname_<uuid>
    leader_election_release_on_cancel: bool = False
    lease_duration: float = Field(default=15.0, gt=0)
    renew_deadline: float = Field(default=10.0, gt=0)
    retry_period: float = Field(default=2.0, gt=0)

    graceful_shutdown_timeout: float = Field(default=30.0, ge=0)
    # Events written per second by all of event_recorder()'s recorders, saved up to the
    # burst (the kubelet's --event-qps/--event-burst); math.inf: unpaced
    event_qps: float = Field(default=50.0, gt=0)
    event_burst: int = Field(default=100, ge=1)
    cache_sync_timeout: float = Field(default=120.0, gt=0)
    cache_by_kind: dict[Kind, KindOptions] = Field(default_factory=dict)
    # every controller of this manager may share its name with another (tests, replicas)
    skip_name_validation: bool = False

    @model_validator(mode="before")
    @classmethod
    def _known_fields(cls, data: Any) -> Any:
        """A typo names itself, the nearest field and every valid one (pydantic alone says
        "Extra inputs are not permitted")."""
        if isinstance(data, dict):
            unknown = [k for k in data if k not in cls.model_fields]
            if unknown:
                raise ValueError(_unknown_fields(unknown, sorted(cls.model_fields)))
        return data

    @model_validator(mode="after")
    def _check(self) -> ManagerOptions:
        """Everything that would otherwise fail only in ``run()``, with what to set."""
        for field in ("metrics_bind_address", "health_probe_bind_address"):
            address = getattr(self, field)
            if address != "0":
                try:
                    _, port = parse_addr(address)
                except ValueError as exc:
                    raise ValueError(f'{field}: {exc} (or "0" to disable the server)') from None
                if port > 65535:
                    raise ValueError(f"{field}: port {port} is over 65535")
        if self.metrics_cert_dir is not None and not self.metrics_secure:
            raise ValueError(
                "metrics_cert_dir is only used with metrics_secure=True: without it /metrics "
                "is served over plain HTTP"
            )
        if self.leader_election:
            self._check_election()
        return self

    def _check_election(self) -> None:
        if not self.leader_election_id:
            raise ValueError(
                "leader_election needs leader_election_id: the name of the Lease the replicas "
                'compete for, e.g. "my-operator-leader"'
            )
        if not _DNS_SUBDOMAIN.fullmatch(self.leader_election_id):
            raise ValueError(
                f"leader_election_id {self.leader_election_id!r} cannot name a Lease: use "
                "lower-case letters, digits, '-' and '.' (at most 253 characters)"
            )
        check_durations(self.lease_duration, self.renew_deadline, self.retry_period)
        if not self.leader_election_namespace and not _pod_namespace():
            raise ValueError(
                "leader_election needs leader_election_namespace outside a cluster (there "
                f"is no {_SA_NAMESPACE} to read the pod's namespace from): set "
                "ManagerOptions(leader_election_namespace=...) to where the Lease lives"
            )


class _Stage:
    """Tasks the manager starts in its root task group but stops itself, in order.

    The scope is shielded, so cancelling the manager does not reach the stage: only
    :meth:`cancel`/:meth:`stop` do. Errors still propagate to the root task group.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.scope = anyio.CancelScope(shield=True)
        self.spawned = False
        self._done: anyio.Event | None = None

    async def _run(
        self,
        body: Callable[..., Awaitable[Any]],
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        try:
            with self.scope:
                await body(task_status=task_status)
        finally:
            assert self._done is not None
            self._done.set()

    def spawn(self, tg: anyio.abc.TaskGroup, body: Callable[..., Awaitable[Any]]) -> None:
        if self.spawned or self.scope.cancel_called:
            return
        self.spawned, self._done = True, anyio.Event()
        tg.start_soon(self._run, body, name=f"manager {self.name}")

    async def start(self, tg: anyio.abc.TaskGroup, body: Callable[..., Awaitable[Any]]) -> None:
        """Run ``body`` and wait until it reports started (``task_status.started()``)."""
        self.spawned, self._done = True, anyio.Event()
        await tg.start(self._run, body, name=f"manager {self.name}")

    def cancel(self) -> None:
        self.scope.cancel()

    async def stop(self) -> None:
        self.scope.cancel()
        if self._done is not None:
            await self._done.wait()


async def _run_all(
    runnables: list[Runnable],
    *,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    async with anyio.create_task_group() as tg:
        for fn in runnables:
            tg.start_soon(fn, name=getattr(fn, "__qualname__", repr(fn)))
        task_status.started()


def _unwrap(group: BaseExceptionGroup[Any]) -> BaseException:
    """The single error inside (nested) task group errors, or the group itself."""
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


class Manager:
    """Owns the shared client and cache and runs everything added to it (module doc).

    ``client=None`` makes one from ``options.kubeconfig`` (explicit path, ``$KUBECONFIG``,
    in-cluster, ``~/.kube/config``) that the manager closes when it stops. ``cache`` and
    ``webhook_server`` replace the ones built from the options; ``tracer_provider``
    (default: the global one) is used by controllers built with :meth:`controller`.
    Add controllers, runnables, webhooks and checks before running.
    """

    def __init__(
        self,
        client: Client | None = None,
        *,
        options: ManagerOptions | None = None,
        cache: Cache | None = None,
        webhook_server: WebhookServer | None = None,
        tracer_provider: trace.TracerProvider | None = None,
    ) -> None:
        self.options = options or ManagerOptions()
        self._owns_client = client is None
        self.client = client if client is not None else Client.auto(self.options.kubeconfig)
        self.cache = cache or Cache(self.client, by_kind=self.options.cache_by_kind)
        self.tracer_provider = tracer_provider
        self._webhook_server = webhook_server
        self._controllers: list[Controller] = []
        self._runnables: list[tuple[Runnable, bool]] = []
        self._healthz: dict[str, Check] = {"ping": lambda: True}
        self._readyz: dict[str, Check] = {"cache-sync": lambda: self._cache_synced}
        self._recorders: dict[str, EventRecorder] = {}
        #: One bucket for every recorder: the manager's Event writes per second, in all.
        self._event_limiter: BucketRateLimiter[Any] = BucketRateLimiter(
            self.options.event_qps, self.options.event_burst
        )
        self._probe_server: ProbeServer | None = None
        self._metrics_server: MetricsServer | SecureMetricsServer | None = None
        self._elector: LeaderElector | None = None
        self._root: anyio.abc.TaskGroup | None = None
        self._leader: _Stage | None = None  # anyio objects are made inside the event loop
        self._cache_synced = False
        self._running = False
        self._elected: anyio.Event | None = None
        self._webhook_client: Client | None = None
        self._siblings: list[Client] = []  # clients with their own pools, closed at the end

    # --- building ---------------------------------------------------------------------------

    def controller(self, name: str | None = None) -> Builder:
        """Declare a controller: ``.for_(kind).owns(...).watches(...).complete(reconciler)``
        (see :mod:`sdgruntime.builder`)."""
        return Builder(self, name)

    def add_controller(self, controller: Controller) -> Controller:
        """Run ``controller`` (on the leader only unless ``need_leader_election=False``).

        A second controller of an existing name is refused, because the name is what tells
        their metrics, logs and spans apart; ``skip_name_validation=True`` (on either
        controller, or in the options) allows it.
        """
        self._check_not_running()
        skip = controller.skip_name_validation or self.options.skip_name_validation
        for other in self._controllers:
            if other is controller:
                raise ValueError(f"controller {controller.name!r} was already added")
            if other.name == controller.name and not (skip or other.skip_name_validation):
                raise ValueError(
                    f"a controller named {controller.name!r} was already added: give each "
                    "controller its own name (mgr.controller(name) or Controller(name, ...)); "
                    "the name labels its metrics, logs and spans. To share it deliberately, "
                    "pass skip_name_validation=True"
                )
        for kind in controller.kinds:
            self.cache.informer(kind)  # started and synced with the cache, before election
        self._controllers.append(controller)
        return controller

    @property
    def controllers(self) -> dict[str, Controller]:
        """The controllers by name (with shared names: the first added)."""
        by_name: dict[str, Controller] = {}
        for c in self._controllers:
            by_name.setdefault(c.name, c)
        return by_name

    def add_runnable(self, fn: Runnable, *, leader_only: bool = True) -> None:
        """Run ``fn()`` until the manager stops (cancellation); on the leader only unless
        ``leader_only=False``. It starts after the cache has synced."""
        self._check_not_running()
        self._runnables.append((fn, leader_only))

    @property
    def webhook_server(self) -> WebhookServer:
        """The admission webhook server, created on first use from the options (and only
        then started: a manager without webhooks opens no webhook port)."""
        if self._webhook_server is None:
            self._check_not_running()
            self._webhook_server = WebhookServer(
                self.options.webhook_host,
                self.options.webhook_port,
                self.options.webhook_cert_dir,
                max_connections=self.options.webhook_max_connections,
                max_connections_per_client=self.options.webhook_max_connections_per_client,
                pressure_idle_timeout=self.options.webhook_pressure_idle_timeout,
            )
        return self._webhook_server

    @property
    def webhook_client(self) -> Client:
        """The client for webhooks' live reads: the manager's identity on a pool of its
        own (``webhook_client_max_connections``), so reviews that miss the cache never
        make leader election or controllers wait for a connection. Closed with the
        manager."""
        if self._webhook_client is None:
            self._webhook_client = self._sibling(self.options.webhook_client_max_connections)
        return self._webhook_client

    def _sibling(self, limit: int) -> Client:
        """``client.with_pool(limit)``, closed when the manager stops; a client without
        that method (a fake in tests) is shared as it is."""
        with_pool = getattr(self.client, "with_pool", None)
        if with_pool is None:
            return self.client
        sibling: Client = with_pool(limit)
        self._siblings.append(sibling)
        return sibling

    def webhook_for(self, kind: Kind) -> WebhookBuilder:
        """Typed webhooks for ``kind`` on the webhook server:
        ``.with_validator(v).with_defaulter(d).complete()`` (see
        :mod:`sdgruntime.webhook.typed`)."""
        return WebhookBuilder(self.webhook_server, kind)

    def event_recorder(self, name: str) -> EventRecorder:
        """An EventRecorder whose Events name ``name`` as their source component.

        The manager runs its writers (for :meth:`EventRecorder.emit`) with the servers, so
        ask for recorders before running.
        """
        recorder = self._recorders.get(name)
        if recorder is None:
            self._check_not_running()
            recorder = self._recorders[name] = EventRecorder(
                self.client,
                name,
                host=socket.gethostname(),
                drain_timeout=self.options.graceful_shutdown_timeout,
                limiter=self._event_limiter,
            )
        return recorder

    def add_healthz_check(self, name: str, check: Check) -> None:
        """A liveness check (``/healthz``); ``ping`` is built in."""
        self._add_check(self._healthz, "healthz", name, check)

    def add_readyz_check(self, name: str, check: Check) -> None:
        """A readiness check (``/readyz``); ``cache-sync`` and ``webhook`` are built in."""
        self._add_check(self._readyz, "readyz", name, check)

    def _add_check(self, checks: dict[str, Check], endpoint: str, name: str, check: Check) -> None:
        if name in checks:
            raise ValueError(f"{endpoint} check {name!r} is already registered")
        checks[name] = check
        server = self._probe_server
        if server is not None:
            add = server.add_healthz_check if endpoint == "healthz" else server.add_readyz_check
            add(name, check)

    def _check_not_running(self) -> None:
        if self._running:
            raise RuntimeError("the manager is running: add everything before run()")

    # --- state --------------------------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        """Whether leader work runs here (always, once started, without election)."""
        leader = self._leader
        return leader is not None and leader.spawned and not leader.scope.cancel_called

    async def wait_for_leadership(self) -> None:
        """Return once this manager runs its leader work."""
        if self._elected is None:
            self._elected = anyio.Event()
        await self._elected.wait()

    @property
    def elector(self) -> LeaderElector | None:
        return self._elector

    @property
    def metrics_port(self) -> int:
        if self._metrics_server is None:
            raise RuntimeError("the metrics server is not running")
        return self._metrics_server.port

    @property
    def health_probe_port(self) -> int:
        if self._probe_server is None:
            raise RuntimeError("the probe server is not running")
        return self._probe_server.port

    # --- running ------------------------------------------------------------------------------

    async def run(self) -> None:
        """Run until SIGTERM or SIGINT, then shut down gracefully (the entry point of a
        process). A second signal during shutdown exits at once. Errors are raised as in
        :meth:`run_until_cancelled`: as themselves, not wrapped in an exception group."""
        try:
            async with anyio.create_task_group() as tg:
                stop = anyio.CancelScope()
                tg.start_soon(self._watch_signals, stop, name="manager signals")
                try:
                    with stop:
                        await self.run_until_cancelled()
                finally:
                    tg.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            exc = _unwrap(group)
            if exc is group:
                raise
            raise exc from None

    async def _watch_signals(self, stop: anyio.CancelScope) -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                if not stop.cancel_called:
                    log.info("received %s: shutting down", signal.Signals(signum).name)
                    stop.cancel()
                else:
                    log.warning("received %s again: exiting now", signal.Signals(signum).name)
                    os._exit(1)

    async def run_until_cancelled(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Start everything and run until cancelled; then stop in order (docs/contracts.md).

        ``task_status.started()`` fires once the servers listen and the cache has synced.
        Raises :class:`LeaderElectionLost` if the lease is lost, or the first error of a
        failing part (a webhook server without certificates, a cache that cannot sync).
        """
        if self._running:
            raise RuntimeError("a manager runs once")
        self._running = True
        if self._elected is None:
            self._elected = anyio.Event()
        elector = self._make_elector()
        self._leader = _Stage("leader work")
        servers, cache = _Stage("servers"), _Stage("cache")
        others, election = _Stage("runnables"), _Stage("leader election")
        try:
            async with anyio.create_task_group() as root:
                self._root = root
                try:
                    await servers.start(root, self._serve)
                    await cache.start(root, self.cache.run)
                    await self.cache.wait_for_sync(self.options.cache_sync_timeout)
                    self._cache_synced = True
                    log.info("manager: cache synced")
                    others.spawn(root, self._run_everywhere)
                    if elector is None:
                        self._start_leading()
                    else:
                        election.spawn(root, self._campaign)
                    task_status.started()
                    await anyio.sleep_forever()
                finally:
                    with anyio.CancelScope(shield=True):
                        await self._shutdown(others, election, cache, servers)
        except BaseExceptionGroup as group:
            exc = _unwrap(group)
            if exc is group:
                raise
            raise exc from None
        finally:
            self._root = None
            for sibling in self._siblings:
                await sibling.aclose()
            if self._owns_client:
                await self.client.aclose()

    def _make_elector(self) -> LeaderElector | None:
        opts = self.options
        if not opts.leader_election:
            return None
        namespace = opts.leader_election_namespace or _pod_namespace()
        if not namespace:  # the options checked it; the file may have gone since
            raise ValueError("leader_election_namespace is required when not running in a cluster")
        self._elector = LeaderElector(
            self.client,
            opts.leader_election_id,
            namespace,
            identity=opts.leader_election_identity,
            lease_duration=opts.lease_duration,
            renew_deadline=opts.renew_deadline,
            retry_period=opts.retry_period,
            release_on_cancel=opts.leader_election_release_on_cancel,
        )
        return self._elector

    async def _serve(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        opts = self.options
        async with anyio.create_task_group() as tg:
            # Event writers stop last, with the servers: events emitted while leader work
            # drains still get written.
            for name, recorder in self._recorders.items():
                await tg.start(recorder.run, name=f"event recorder {name}")
            if self._webhook_server is not None:
                webhook = self._webhook_server
                if "webhook" not in self._readyz:
                    self._readyz["webhook"] = webhook.ready
                await tg.start(webhook.serve, name="webhook server")
            if opts.health_probe_bind_address != "0":
                self._probe_server = ProbeServer(
                    opts.health_probe_bind_address,
                    healthz_checks=self._healthz,
                    readyz_checks=self._readyz,
                )
                await tg.start(self._probe_server.serve, name="probe server")
            if opts.metrics_bind_address != "0":
                if opts.metrics_secure:
                    reviews = opts.metrics_auth_max_concurrent_reviews
                    auth = APIServerAuth(
                        self._sibling(reviews),  # at most one review per request at a time
                        review_rate=opts.metrics_auth_review_rate,
                        review_burst=opts.metrics_auth_review_burst,
                        max_concurrent_reviews=reviews,
                    )
                    self._metrics_server = SecureMetricsServer(
                        opts.metrics_bind_address, auth, cert_dir=opts.metrics_cert_dir
                    )
                else:
                    self._metrics_server = MetricsServer(opts.metrics_bind_address)
                await tg.start(self._metrics_server.serve, name="metrics server")
            task_status.started()

    def _split(self, leader: bool) -> list[Runnable]:
        work: list[Runnable] = [
            c.run for c in self._controllers if c.need_leader_election == leader
        ]
        work += [fn for fn, leader_only in self._runnables if leader_only == leader]
        return work

    async def _run_everywhere(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        await _run_all(self._split(leader=False), task_status=task_status)

    async def _campaign(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        assert self._elector is not None
        task_status.started()
        await self._elector.run(self._start_leading, self._stop_leading)

    def _start_leading(self) -> None:
        """Start leader work (sync: called by the elector the moment it wins)."""
        if self._root is None or self._leader is None:
            return
        work = self._split(leader=True)
        log.info("manager: starting %d leader-only controllers/runnables", len(work))
        self._leader.spawn(self._root, lambda **kw: _run_all(work, **kw))
        if self._elected is not None:
            self._elected.set()

    def _stop_leading(self) -> None:
        """Cancel leader work at once (sync: called by the elector the moment it loses)."""
        for c in self._controllers:
            if c.need_leader_election:
                c.abort()
        if self._leader is not None:
            self._leader.cancel()

    async def _shutdown(
        self, others: _Stage, election: _Stage, cache: _Stage, servers: _Stage
    ) -> None:
        """Stop in order: leader work and runnables (graceful), the election (and lease
        release), then the cache and the servers with the Event recorders. One deadline
        bounds the graceful parts: the pod's termination grace period is one budget."""
        timeout = self.options.graceful_shutdown_timeout
        deadline = anyio.current_time() + timeout
        leader = self._leader
        assert leader is not None
        log.info("manager: stopping (graceful timeout %.0fs)", timeout)
        with anyio.move_on_at(deadline) as graceful:
            async with anyio.create_task_group() as tg:
                tg.start_soon(leader.stop)
                tg.start_soon(others.stop)
        if graceful.cancelled_caught:
            log.warning("manager: graceful shutdown timed out, cancelling remaining work")
            for c in self._controllers:
                c.abort()
            await leader.stop()
            await others.stop()
        await election.stop()
        await cache.stop()
        # the recorders drain (what leader work emitted last) in what is left of the deadline
        with anyio.move_on_at(deadline) as drained:
            await servers.stop()
        if drained.cancelled_caught:
            for recorder in self._recorders.values():
                recorder.abort()
            await servers.stop()
        log.info("manager: stopped")

"""Async Kubernetes API client: raw JSON over one bounded HTTP/1.1 pool, typed errors.

Connection and auth settings come from the ``kubernetes`` package's config loaders (kubeconfig,
in-cluster), so every auth flavour they support (tokens, client certs, exec plugins, token
files) works here; after construction that package is only touched through its
``refresh_api_key_hook``. Bodies are plain decoded JSON dicts, decoded once.

Retry policy (see :func:`should_retry`):

* Idempotent verbs (GET, PUT, PATCH, DELETE, HEAD) are retried on transient failures: no answer
  (:class:`~sdgruntime.errors.TransportError`), 429 and 5xx, with exponential backoff and
  jitter, honouring ``Retry-After``. PUT carries the object's resourceVersion as a
  precondition, so a replay of an already applied update fails with Conflict instead of
  overwriting; a replayed DELETE may answer NotFound. Merge, strategic and apply patches are
  idempotent. A JSON patch is not (a replayed ``add`` to ``/list/-`` appends twice), so
  ``patch(patch_type="json")`` is retried like a POST unless it contains a ``test`` op,
  which is then taken to guard it (test ``/metadata/resourceVersion`` to be sure).
* POST (create, bind, ...) is not idempotent: a replay after the server may have processed the
  first attempt could create twice or turn a success into AlreadyExists. It is retried only
  when the request provably never reached the server (:class:`RequestNotSent`: connect error,
  connect timeout, no free pooled connection) and on 429, which the server's flow control
  answers *before* a request is handled.
* 409 Conflict is never retried: it belongs to the caller's read-modify-write loop.
* Watches are never retried here; the informer owns reconnecting and resuming.
"""

from __future__ import annotations

import builtins
import json
import os
import ssl
import time
from collections.abc import AsyncGenerator, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Self
from urllib.parse import urlsplit

import anyio
import anyio.to_thread
import httpx
import kubernetes.client
import kubernetes.config
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential,
    wait_random,
)

from sdgruntime import errors
from sdgruntime.kinds import PODS, Kind
from sdgruntime.metrics import REST_CLIENT_LATENCY, REST_CLIENT_REQUESTS

__all__ = [
    "PATCH_CONTENT_TYPES",
    "Client",
    "ConnectionSettings",
    "LineSplitter",
    "PatchType",
    "RequestNotSent",
    "RetryPolicy",
    "api_error",
    "authorization",
    "parse_watch_line",
    "should_retry",
]

PatchType = Literal["merge", "json", "strategic", "apply"]

PATCH_CONTENT_TYPES: Mapping[str, str] = {
    "merge": "application/merge-patch+json",
    "json": "application/json-patch+json",
    "strategic": "application/strategic-merge-patch+json",
    "apply": "application/apply-patch+yaml",  # JSON is YAML: the body is sent as JSON
}

_JSON = "application/json"
_USER_AGENT = "sdgruntime/0.1 (python)"
_IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "PATCH", "DELETE", "OPTIONS"})


class RequestNotSent(errors.TransportError):
    """The request never reached the server (connect failed, no pooled connection free).

    Always safe to retry, even for POST.
    """


# --- retry policy ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How transient failures are retried. ``attempts=1`` disables retries.

    The wait before attempt n+1 is the server's ``Retry-After`` (capped) if it sent one, else
    ``initial_backoff * 2**(n-1)`` capped at ``max_backoff``, plus up to ``jitter`` seconds.
    """

    attempts: int = 5
    max_elapsed: float = 30.0  # no new attempt starts this long after the first failure
    initial_backoff: float = 0.1
    max_backoff: float = 5.0
    jitter: float = 0.2
    max_retry_after: float = 10.0

    def wait(self, state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        retry_after = getattr(exc, "retry_after", None)
        if retry_after is not None and retry_after >= 0:
            return min(float(retry_after), self.max_retry_after)
        backoff = wait_exponential(multiplier=self.initial_backoff, max=self.max_backoff)
        return (backoff + wait_random(0, self.jitter))(state)

    def retrying(self, method: str, *, idempotent: bool | None = None) -> AsyncRetrying:
        """A fresh tenacity loop for one request of ``method`` (see :func:`should_retry`)."""
        return AsyncRetrying(
            stop=stop_after_attempt(self.attempts) | stop_after_delay(self.max_elapsed),
            wait=self.wait,
            retry=retry_if_exception(lambda e: should_retry(method, e, idempotent=idempotent)),
            reraise=True,
            sleep=anyio.sleep,
        )


def should_retry(method: str, err: BaseException, *, idempotent: bool | None = None) -> bool:
    """Whether a failed attempt of ``method`` may be replayed (the policy in the module doc).

    ``idempotent`` overrides what the method implies (``False`` for an unguarded JSON
    patch: a PATCH, but not safe to replay).
    """
    if isinstance(err, RequestNotSent):
        return True
    if not isinstance(err, errors.ApiError) or isinstance(err, errors.Conflict):
        return False
    if idempotent is None:
        idempotent = method.upper() in _IDEMPOTENT
    if idempotent:
        return errors.is_retriable(err)
    # POST and friends: only when the server said it did not handle the request.
    return isinstance(err, errors.TooManyRequests)


def _has_test_op(patch: Any) -> bool:
    """Whether a JSON patch holds a ``test`` op, which makes a replay fail instead of
    applying twice (if it tests something the patch changes, e.g. the resourceVersion)."""
    return isinstance(patch, list) and any(
        isinstance(op, Mapping) and op.get("op") == "test" for op in patch
    )


# --- connection settings ---------------------------------------------------------------


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


def _retry_after(resp: httpx.Response, body: Any) -> float | None:
    value = resp.headers.get("retry-after")
    if value:
        try:
            return float(value)
        except ValueError:
            pass  # an HTTP date: the apiserver never sends one; fall back to backoff
    if isinstance(body, dict):
        seconds = (body.get("details") or {}).get("retryAfterSeconds")
        if isinstance(seconds, int | float):
            return float(seconds)
    return None


def _decode(content: bytes, content_type: str) -> Any:
    if not content:
        return None
    if "json" in content_type or content[:1] in (b"{", b"["):
        try:
            return json.loads(content)
        except ValueError:
            pass
    return content.decode("utf-8", "replace")


def api_error(resp: httpx.Response, content: bytes | None = None) -> errors.ApiError:
    """The typed error for a non-2xx answer, from its Status body and Retry-After."""
    raw = resp.content if content is None else content
    body = _decode(raw, resp.headers.get("content-type", ""))
    return errors.from_status(resp.status_code, body, _retry_after(resp, body))


def parse_watch_line(line: bytes) -> dict[str, Any]:
    """One watch event; an ERROR event is raised as its typed error (410 -> Gone)."""
    event = json.loads(line)
    if event.get("type") == "ERROR":
        status = event.get("object")
        if not isinstance(status, dict):
            status = {}
        raise errors.from_status(int(status.get("code") or 500), status)
    return event


class LineSplitter:
    """Split a byte stream into newline-terminated lines across arbitrary chunk borders."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        """The complete, non-blank lines this chunk finishes."""
        if b"\n" not in chunk:
            self._buf += chunk
            return []
        lines = (self._buf + chunk).split(b"\n")
        self._buf = lines.pop()
        return [line for line in lines if line.strip()]

    def rest(self) -> bytes:
        """What is left unterminated when the stream ends."""
        rest, self._buf = self._buf, b""
        return rest if rest.strip() else b""


def _transport_error(exc: httpx.TransportError, method: str, url: str) -> errors.TransportError:
    cls = (
        RequestNotSent
        if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout)
        else errors.TransportError
    )
    return cls(f"{method} {url}: {type(exc).__name__}: {exc}".rstrip(": "))


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


# --- the client ------------------------------------------------------------------------


class Client:
    """An async Kubernetes API client (docs/reference.md lists its methods).

    Two HTTP/1.1 pools share one TLS context: a bounded one for requests, and one for watches,
    because each watch holds a connection for its whole life and must not starve requests.
    """

    def __init__(
        self,
        configuration: kubernetes.client.Configuration,
        *,
        max_connections: int = 32,
        timeout: float = 30.0,
        connect_timeout: float = 10.0,
        retry: RetryPolicy | None = None,
        auth_refresh_interval: float = 1.0,
        user_agent: str = _USER_AGENT,
    ) -> None:
        self.configuration = configuration
        self.settings = ConnectionSettings.from_configuration(configuration)
        self.retry = retry or RetryPolicy()
        self.host = self.settings.host_port
        self._ssl = self.settings.ssl_context()
        self._loaded_cert = (self.settings.cert_file, self.settings.key_file)
        self._timeout = httpx.Timeout(timeout, connect=connect_timeout)
        self._connect_timeout = connect_timeout
        self._refresh_interval = auth_refresh_interval
        self._next_refresh = 0.0
        self._refresh_lock = anyio.Lock()
        self._headers: dict[str, str] = {"Accept": _JSON, "User-Agent": user_agent}
        self._set_auth_header()
        self._extensions: dict[str, Any] = {}
        if self.settings.tls_server_name:
            self._extensions["sni_hostname"] = self.settings.tls_server_name
        self._http = httpx.AsyncClient(
            base_url=self.settings.host,
            verify=self._ssl,
            http1=True,
            http2=False,
            timeout=self._timeout,
            limits=httpx.Limits(
                max_connections=max_connections, max_keepalive_connections=max_connections
            ),
            trust_env=False,
        )
        self._watch_http = httpx.AsyncClient(
            base_url=self.settings.host,
            verify=self._ssl,
            http1=True,
            http2=False,
            timeout=self._timeout,
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=16),
            trust_env=False,
        )
        self._counters: dict[tuple[str, str], Any] = {}
        self._latency: dict[str, Any] = {}

    # --- constructors --------------------------------------------------------------------

    @classmethod
    def from_kubeconfig(
        cls,
        path: str | os.PathLike[str] | None = None,
        context: str | None = None,
        max_connections: int = 32,
        **kwargs: Any,
    ) -> Self:
        """A client for a kubeconfig file (default: $KUBECONFIG, else ~/.kube/config)."""
        if path is None:
            path = os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
        cfg = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(
            config_file=os.fspath(path),
            context=context,
            client_configuration=cfg,
        )
        return cls(cfg, max_connections=max_connections, **kwargs)

    @classmethod
    def in_cluster(cls, max_connections: int = 32, **kwargs: Any) -> Self:
        """A client for the pod's service account."""
        cfg = kubernetes.client.Configuration()
        kubernetes.config.load_incluster_config(client_configuration=cfg)
        return cls(cfg, max_connections=max_connections, **kwargs)

    @classmethod
    def auto(cls, kubeconfig: str | None = None, **kwargs: Any) -> Self:
        """controller-runtime's order: explicit path, $KUBECONFIG, in-cluster, ~/.kube/config."""
        # $KUBECONFIG is read now (the kubernetes package reads it once, at import time);
        # a ':'-separated list is merged by its loader.
        kubeconfig = kubeconfig or os.environ.get("KUBECONFIG")
        if kubeconfig:
            return cls.from_kubeconfig(kubeconfig, **kwargs)
        if os.environ.get("KUBERNETES_SERVICE_HOST"):
            return cls.in_cluster(**kwargs)
        return cls.from_kubeconfig(None, **kwargs)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True):
            await self._http.aclose()
            await self._watch_http.aclose()

    # --- auth ----------------------------------------------------------------------------

    def _set_auth_header(self) -> None:
        auth = authorization(self.configuration)
        if auth:
            self._headers["Authorization"] = auth
        else:
            self._headers.pop("Authorization", None)

    async def refresh_auth(self, *, force: bool = False) -> None:
        """Run the config's refresh hook (exec plugins, token files) if it is due.

        The hook may run a subprocess or read a file, so it runs in a worker thread, and at
        most once per ``auth_refresh_interval``; the hook itself only reloads when expired.
        """
        hook = self.settings.refresh_hook
        if hook is None or (not force and time.monotonic() < self._next_refresh):
            return
        async with self._refresh_lock:
            if not force and time.monotonic() < self._next_refresh:
                return
            await anyio.to_thread.run_sync(hook, self.configuration)
            self._next_refresh = time.monotonic() + self._refresh_interval
            self._set_auth_header()
            cert = (self.configuration.cert_file or None, self.configuration.key_file or None)
            if cert != self._loaded_cert and cert[0]:
                # an exec plugin handed out a new client certificate: new connections use it
                self._ssl.load_cert_chain(cert[0], cert[1])
                self._loaded_cert = cert

    # --- transport -----------------------------------------------------------------------

    def _count(self, code: str, method: str, seconds: float) -> None:
        c = self._counters.get((code, method))
        if c is None:
            c = self._counters[(code, method)] = REST_CLIENT_REQUESTS.labels(
                code=code, method=method, host=self.host
            )
        c.inc()
        h = self._latency.get(method)
        if h is None:
            h = self._latency[method] = REST_CLIENT_LATENCY.labels(verb=method, host=self.host)
        h.observe(seconds)

    async def _once(
        self,
        method: str,
        path: str,
        params: Mapping[str, Any] | None,
        content: bytes | None,
        content_type: str | None,
    ) -> Any:
        """One attempt (plus one replay after a 401 if credentials could be refreshed)."""
        for refreshed in (False, True):
            if self.settings.refresh_hook is not None:
                await self.refresh_auth(force=refreshed)
            headers = self._headers
            if content_type is not None:
                headers = {**headers, "Content-Type": content_type}
            start = time.perf_counter()
            try:
                resp = await self._http.request(
                    method,
                    path,
                    params=params,
                    content=content,
                    headers=headers,
                    extensions=self._extensions,
                )
            except httpx.TransportError as exc:
                self._count("<error>", method, time.perf_counter() - start)
                raise _transport_error(exc, method, path) from exc
            self._count(str(resp.status_code), method, time.perf_counter() - start)
            if resp.status_code < 300:
                return _decode(resp.content, resp.headers.get("content-type", ""))
            if resp.status_code == 401 and not refreshed and self.settings.refresh_hook:
                continue  # expired credentials: refresh now and replay once
            raise api_error(resp)
        raise AssertionError("unreachable")

    async def _call(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        content: bytes | None = None,
        content_type: str | None = None,
        idempotent: bool | None = None,
    ) -> Any:
        """One request with the retry policy of its method (or of ``idempotent``)."""
        try:
            return await self._once(method, path, params, content, content_type)
        except errors.ApiError as exc:
            # Fast path: the tenacity loop (~25us) is only built once an attempt failed
            # retriably; it then starts by re-raising that failure as its attempt 1.
            if self.retry.attempts <= 1 or not should_retry(method, exc, idempotent=idempotent):
                raise
            first: errors.ApiError | None = exc
        async for attempt in self.retry.retrying(method, idempotent=idempotent):
            with attempt:
                if first is not None:
                    failed, first = first, None
                    raise failed
                return await self._once(method, path, params, content, content_type)
        raise AssertionError("unreachable")

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        json: Any = None,
        content_type: str | None = None,
    ) -> Any:
        """Any API call: decoded JSON (or text) back, typed errors, the method's retry policy."""
        content = None if json is None else _dumps(json)
        if content is not None and content_type is None:
            content_type = _JSON
        return await self._call(
            method.upper(), path, params=params, content=content, content_type=content_type
        )

    # --- typed verbs ---------------------------------------------------------------------

    @staticmethod
    def _namespace(kind: Kind, namespace: str | None, obj: Mapping[str, Any] | None = None) -> str:
        if not kind.namespaced:
            return ""
        ns = namespace or (obj or {}).get("metadata", {}).get("namespace")
        if not ns:
            raise ValueError(f"{kind.name} is namespaced: a namespace is required")
        return ns

    async def get(self, kind: Kind, name: str, namespace: str | None = None) -> dict[str, Any]:
        return await self._call("GET", kind.path(self._namespace(kind, namespace), name))

    async def list(
        self,
        kind: Kind,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int | None = None,
        continue_: str | None = None,
        resource_version: str | None = None,
    ) -> dict[str, Any]:
        """One raw List page; ``namespace=None`` on a namespaced kind lists all namespaces."""
        params: dict[str, Any] = {}
        if label_selector:
            params["labelSelector"] = label_selector
        if field_selector:
            params["fieldSelector"] = field_selector
        if limit:
            params["limit"] = limit
        if continue_:
            params["continue"] = continue_
        if resource_version is not None:
            params["resourceVersion"] = resource_version
        return await self._call("GET", kind.path(namespace), params=params or None)

    async def list_all(
        self,
        kind: Kind,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        page_size: int = 500,
    ) -> tuple[builtins.list[dict[str, Any]], str]:
        """Every item, paged; and the list's resourceVersion (to start a watch from).

        Items get ``apiVersion``/``kind`` filled in (the server omits them in lists), so they
        look like objects from GET or watch. An expired continue token (410) restarts the
        list from scratch once.
        """
        for restart in (False, True):
            items: list[dict[str, Any]] = []
            token: str | None = None
            try:
                while True:
                    page = await self.list(
                        kind,
                        namespace,
                        label_selector=label_selector,
                        field_selector=field_selector,
                        limit=page_size,
                        continue_=token,
                    )
                    items.extend(page.get("items") or ())
                    meta = page.get("metadata") or {}
                    token = meta.get("continue")
                    if not token:
                        break
            except errors.Gone:
                if restart or token is None:
                    raise
                continue
            for item in items:
                if "kind" not in item:
                    item["apiVersion"] = kind.api_version
                    item["kind"] = kind.kind
            return items, str(meta.get("resourceVersion", ""))
        raise AssertionError("unreachable")

    async def watch(
        self,
        kind: Kind,
        namespace: str | None = None,
        *,
        resource_version: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        timeout_seconds: int | None = None,
        allow_bookmarks: bool = True,
        read_timeout: float | None = None,
    ) -> AsyncGenerator[dict[str, Any]]:
        """Yield watch events ``{"type", "object"}`` until the server ends the stream.

        An ERROR event is raised as its typed error (410 -> :class:`errors.Gone`). Without a
        ``read_timeout`` a stream with ``timeout_seconds`` gets that plus 30 s, so a silently
        dead connection surfaces as TransportError instead of hanging. Not retried.
        """
        params: dict[str, Any] = {"watch": "1"}
        if allow_bookmarks:
            params["allowWatchBookmarks"] = "true"
        if resource_version is not None:
            params["resourceVersion"] = resource_version
        if label_selector:
            params["labelSelector"] = label_selector
        if field_selector:
            params["fieldSelector"] = field_selector
        if timeout_seconds is not None:
            params["timeoutSeconds"] = int(timeout_seconds)
            if read_timeout is None:
                read_timeout = timeout_seconds + 30.0
        c = self._connect_timeout
        timeout = httpx.Timeout(connect=c, read=read_timeout, write=c, pool=c)
        path = kind.path(namespace)
        if self.settings.refresh_hook is not None:
            await self.refresh_auth()
        start = time.perf_counter()
        counted = False
        try:
            async with self._watch_http.stream(
                "GET",
                path,
                params=params,
                headers=self._headers,
                timeout=timeout,
                extensions=self._extensions,
            ) as resp:
                self._count(str(resp.status_code), "GET", time.perf_counter() - start)
                counted = True
                if resp.status_code >= 300:
                    raise api_error(resp, await resp.aread())
                lines = LineSplitter()
                async for chunk in resp.aiter_bytes():
                    for line in lines.feed(chunk):
                        yield parse_watch_line(line)
                if rest := lines.rest():
                    yield parse_watch_line(rest)
        except httpx.TransportError as exc:
            if not counted:
                self._count("<error>", "GET", time.perf_counter() - start)
            raise _transport_error(exc, "WATCH", path) from exc

    async def create(
        self,
        kind: Kind,
        obj: Mapping[str, Any],
        namespace: str | None = None,
        *,
        dry_run: bool = False,
        field_manager: str | None = None,
    ) -> dict[str, Any]:
        ns = self._namespace(kind, namespace, obj)
        params: dict[str, Any] = {}
        if dry_run:
            params["dryRun"] = "All"
        if field_manager:
            params["fieldManager"] = field_manager
        return await self._call(
            "POST", kind.path(ns), params=params or None, content=_dumps(obj), content_type=_JSON
        )

    async def update(
        self, kind: Kind, obj: Mapping[str, Any], *, subresource: str | None = None
    ) -> dict[str, Any]:
        """PUT the object; its ``metadata.resourceVersion`` (if set) is the precondition."""
        meta = obj.get("metadata") or {}
        ns = self._namespace(kind, None, obj)
        return await self._call(
            "PUT",
            kind.path(ns, meta["name"], subresource),
            content=_dumps(obj),
            content_type=_JSON,
        )

    async def update_status(self, kind: Kind, obj: Mapping[str, Any]) -> dict[str, Any]:
        return await self.update(kind, obj, subresource="status")

    async def patch(
        self,
        kind: Kind,
        name: str,
        body: Any,
        namespace: str | None = None,
        *,
        patch_type: PatchType = "merge",
        subresource: str | None = None,
        field_manager: str | None = None,
        force: bool = False,
    ) -> dict[str, Any]:
        """PATCH with the given patch type; ``apply`` is server-side apply (needs a manager).

        A ``json`` patch without a ``test`` op is not replayed after a 5xx or a lost
        answer (it may have been applied), only when it was never sent or got a 429.
        """
        try:
            content_type = PATCH_CONTENT_TYPES[patch_type]
        except KeyError:
            raise ValueError(f"unknown patch type {patch_type!r}") from None
        params: dict[str, Any] = {}
        if patch_type == "apply":
            if not field_manager:
                raise ValueError("server-side apply needs a field_manager")
            if isinstance(body, Mapping) and ("apiVersion" not in body or "kind" not in body):
                body = {"apiVersion": kind.api_version, "kind": kind.kind, **body}
            if force:
                params["force"] = "true"
        if field_manager:
            params["fieldManager"] = field_manager
        ns = self._namespace(kind, namespace)
        return await self._call(
            "PATCH",
            kind.path(ns, name, subresource),
            params=params or None,
            content=_dumps(body),
            content_type=content_type,
            idempotent=None if patch_type != "json" else _has_test_op(body),
        )

    async def delete(
        self,
        kind: Kind,
        name: str,
        namespace: str | None = None,
        *,
        resource_version: str | None = None,
        uid: str | None = None,
        propagation_policy: str | None = None,
        grace_period_seconds: int | None = None,
        dry_run: bool = False,
    ) -> dict[str, Any]:
        """DELETE; returns the object (still there with a finalizer) or a Status."""
        opts: dict[str, Any] = {}
        preconditions = {}
        if resource_version:
            preconditions["resourceVersion"] = resource_version
        if uid:
            preconditions["uid"] = uid
        if preconditions:
            opts["preconditions"] = preconditions
        if propagation_policy:
            opts["propagationPolicy"] = propagation_policy
        if grace_period_seconds is not None:
            opts["gracePeriodSeconds"] = grace_period_seconds
        if dry_run:
            opts["dryRun"] = ["All"]
        content = None
        if opts:
            content = _dumps({"apiVersion": "v1", "kind": "DeleteOptions", **opts})
        ns = self._namespace(kind, namespace)
        return await self._call(
            "DELETE",
            kind.path(ns, name),
            content=content,
            content_type=_JSON if content else None,
        )

    async def bind(
        self, namespace: str, pod_name: str, node_name: str, *, pod_uid: str | None = None
    ) -> None:
        """Bind a pod to a node (what a scheduler does); ``pod_uid`` guards a recreated pod."""
        meta: dict[str, Any] = {"name": pod_name, "namespace": namespace}
        if pod_uid:
            meta["uid"] = pod_uid
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": meta,
            "target": {"apiVersion": "v1", "kind": "Node", "name": node_name},
        }
        await self._call(
            "POST",
            PODS.path(namespace, pod_name, "binding"),
            content=_dumps(binding),
            content_type=_JSON,
        )

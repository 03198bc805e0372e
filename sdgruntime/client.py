"""Async Kubernetes API client: the typed verbs, raw JSON in and out, typed errors.

Bodies are plain decoded JSON dicts, decoded once. The layers under the verbs are in
:mod:`sdgruntime.rest`: ``config`` and ``kubeconfig`` (loading and credentials; exec
plugins run by ``execplugin``, the ``kubernetes`` package only for auth-providers),
``transport`` (one pool for requests, ``http1``, and one for watches), ``retry`` (which
failures are replayed: :func:`should_retry`) and ``watch``. Invariant: 409 Conflict and
watches are never retried here. The retry policy: docs/contracts.md, "Retries".
"""

from __future__ import annotations

import builtins
import copy
import os
from collections.abc import AsyncGenerator, Callable, Mapping
from contextlib import aclosing
from typing import Any, Literal, Self

from sdgruntime import errors
from sdgruntime.kinds import PODS, Kind
from sdgruntime.rest.config import (
    ClientConfiguration,
    ConnectionSettings,
    Credentials,
    RestConfig,
    authorization,
    auto_configuration,
    incluster_configuration,
    kubeconfig_configuration,
)
from sdgruntime.rest.retry import RequestNotSent, RetryPolicy, has_test_op, should_retry
from sdgruntime.rest.transport import Transport, api_error, decode, dumps
from sdgruntime.rest.watch import (
    INITIAL_EVENTS_END,
    LineSplitter,
    parse_watch_line,
    watch_events,
    watch_params,
)

__all__ = [
    "PATCH_CONTENT_TYPES",
    "Client",
    "ClientConfiguration",
    "ConnectionSettings",
    "LineSplitter",
    "PatchType",
    "RequestNotSent",
    "RestConfig",
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
#: The Accept of a request whose caller reads only the answer's metadata.
METADATA_ONLY = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
_USER_AGENT = "sdgruntime/0.1 (python)"


class Client:
    """An async Kubernetes API client (docs/reference.md lists its methods).

    Two HTTP/1.1 pools share one TLS context: a bounded one (``max_connections``) for
    requests, and one for watches, because each watch holds a connection for its whole
    life and must not starve requests. Runs on anyio's asyncio backend (the default).

    ``configuration`` is a :class:`RestConfig` (what the constructors below read) or a
    ``kubernetes.client.Configuration``.
    """

    def __init__(
        self,
        configuration: ClientConfiguration,
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
        self._headers: dict[str, str] = {"Accept": _JSON, "User-Agent": user_agent}
        self._credentials = Credentials(
            configuration,
            self.settings,
            self._ssl,
            self._headers,
            refresh_interval=auth_refresh_interval,
        )
        self._refreshes = self.settings.refresh_hook is not None
        self._timeouts = (timeout, connect_timeout)
        self._transport = self._new_transport(max_connections)
        # one headers dict per (content type, accept), rebuilt when the credentials change
        self._typed_headers: dict[tuple[str | None, str | None], dict[str, str]] = {}
        self._typed_auth: str | None = self._headers.get("Authorization")

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
        cfg = kubeconfig_configuration(path, context)
        return cls(cfg, max_connections=max_connections, **kwargs)

    @classmethod
    def in_cluster(cls, max_connections: int = 32, **kwargs: Any) -> Self:
        """A client for the pod's service account."""
        return cls(incluster_configuration(), max_connections=max_connections, **kwargs)

    @classmethod
    def auto(cls, kubeconfig: str | None = None, **kwargs: Any) -> Self:
        """controller-runtime's order: explicit path, $KUBECONFIG, in-cluster, ~/.kube/config."""
        return cls(auto_configuration(kubeconfig), **kwargs)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def with_pool(self, limit: int) -> Self:
        """A sibling client: the same server, credentials (refreshed for both), TLS
        context and retry policy, but its own pools, ``limit`` request connections.

        For callers that must not queue behind each other on one bounded pool: a
        manager gives its webhooks and its metrics' TokenReviews their own, so floods
        on those never delay leader election or controllers. Close it with
        :meth:`aclose` (closing this client does not close it).
        """
        if limit < 1:
            raise ValueError(f"a pool needs at least 1 connection, got {limit}")
        sibling = copy.copy(self)  # shares configuration, settings, credentials, headers
        sibling._transport = self._new_transport(limit)
        sibling._typed_headers = {}  # its own cache of the (shared) headers
        return sibling

    def _new_transport(self, max_connections: int) -> Transport:
        """Pools of their own for this client's server, TLS context and timeouts."""
        timeout, connect_timeout = self._timeouts
        return Transport(
            self.settings,
            self._ssl,
            max_connections=max_connections,
            timeout=timeout,
            connect_timeout=connect_timeout,
        )

    @property
    def pool_limit(self) -> int:
        """How many request connections this client opens at most."""
        return self._transport.max_connections

    async def aclose(self) -> None:
        await self._transport.aclose()

    # --- auth ----------------------------------------------------------------------------

    async def refresh_auth(self, *, force: bool = False) -> None:
        """Refresh the credentials (exec plugins, token files) if it is due.

        The hook may run a subprocess or read a file, so it runs in a worker thread, and at
        most once per ``auth_refresh_interval``; the hook itself only reloads when expired.
        A new token is sent from the next request on; a new client certificate is used by
        new connections.
        """
        await self._credentials.refresh(force=force)

    def _headers_for(self, content_type: str | None, accept: str | None) -> dict[str, str]:
        if content_type is None and accept is None:
            return self._headers
        auth = self._headers.get("Authorization")
        if auth != self._typed_auth:
            self._typed_headers.clear()
            self._typed_auth = auth
        headers = self._typed_headers.get((content_type, accept))
        if headers is None:
            headers = dict(self._headers)
            if content_type is not None:
                headers["Content-Type"] = content_type
            if accept is not None:
                headers["Accept"] = accept
            self._typed_headers[(content_type, accept)] = headers
        return headers

    # --- one request, with its retry policy ------------------------------------------------

    async def _once(
        self,
        method: str,
        path: str,
        params: Mapping[str, Any] | None,
        content: bytes | None,
        content_type: str | None,
        accept: str | None = None,
    ) -> Any:
        """One attempt (plus one replay after a 401 if credentials could be refreshed)."""
        for refreshed in (False, True):
            if self._refreshes:
                await self.refresh_auth(force=refreshed)
            resp = await self._transport.request(
                method,
                path,
                params=params,
                content=content,
                headers=self._headers_for(content_type, accept),
            )
            if resp.status_code < 300:
                return decode(resp.content, resp.headers.get("content-type", ""))
            if resp.status_code == 401 and not refreshed and self._refreshes:
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
        accept: str | None = None,
    ) -> Any:
        """One request with the retry policy of its method (or of ``idempotent``)."""
        try:
            return await self._once(method, path, params, content, content_type, accept)
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
                return await self._once(method, path, params, content, content_type, accept)
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
        content = None if json is None else dumps(json)
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
        return str(ns)

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
        transform: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    ) -> tuple[builtins.list[dict[str, Any]], str]:
        """Every item, paged; and the list's resourceVersion (to start a watch from).

        Items get ``apiVersion``/``kind`` filled in (the server omits them in lists), so they
        look like objects from GET or watch. ``transform`` is applied to each item as its
        page arrives, so a cache that keeps a slim copy never holds the whole list in full
        (the peak memory of a cold start). An expired continue token (410) restarts the
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
                    for item in page.get("items") or ():
                        if "kind" not in item:
                            item["apiVersion"] = kind.api_version
                            item["kind"] = kind.kind
                        items.append(transform(item) if transform is not None else item)
                    meta = page.get("metadata") or {}
                    token = meta.get("continue")
                    if not token:
                        break
            except errors.Gone:
                if restart or token is None:
                    raise
                continue
            return items, str(meta.get("resourceVersion", ""))
        raise AssertionError("unreachable")

    async def list_streamed(
        self,
        kind: Kind,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        transform: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
        timeout_seconds: int = 600,
        read_timeout: float | None = None,
    ) -> tuple[builtins.list[dict[str, Any]], str]:
        """What :meth:`list_all` returns, read as a streamed list (a watch with
        ``sendInitialEvents``, Kubernetes 1.27+): one object decoded and
        transformed at a time, so the peak memory is one object, not a page of 500.

        Raises :class:`errors.BadRequest`/:class:`errors.Invalid` where the server refuses
        the request (older servers refuse ``resourceVersionMatch`` on a watch), and
        :class:`errors.TransportError` if the stream ends before its last initial event.
        """
        params = watch_params(
            label_selector=label_selector,
            field_selector=field_selector,
            timeout_seconds=timeout_seconds,
            send_initial_events=True,
        )
        if self._refreshes:
            await self.refresh_auth()
        items: builtins.list[dict[str, Any]] = []
        events = watch_events(
            self._transport, kind.path(namespace), params, self._headers, read_timeout=read_timeout
        )
        async with aclosing(events) as stream:
            async for event in stream:
                obj = event.get("object") or {}
                meta = obj.get("metadata") or {}
                if event.get("type") == "BOOKMARK":
                    if (meta.get("annotations") or {}).get(INITIAL_EVENTS_END) == "true":
                        return items, str(meta.get("resourceVersion", ""))
                    continue
                if event.get("type") != "ADDED":
                    # Only ADDED events come before the end; anything else is no list.
                    raise errors.TransportError(
                        f"streamed list of {kind.name}: unexpected {event.get('type')} event"
                    )
                if "kind" not in obj:
                    obj["apiVersion"] = kind.api_version
                    obj["kind"] = kind.kind
                items.append(transform(obj) if transform is not None else obj)
        raise errors.TransportError(f"streamed list of {kind.name} ended before its last event")

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
        params = watch_params(
            resource_version=resource_version,
            label_selector=label_selector,
            field_selector=field_selector,
            timeout_seconds=timeout_seconds,
            allow_bookmarks=allow_bookmarks,
        )
        if self._refreshes:
            await self.refresh_auth()
        events = watch_events(
            self._transport,
            kind.path(namespace),
            params,
            self._headers,
            read_timeout=read_timeout,
        )
        async with aclosing(events) as stream:
            async for event in stream:
                yield event

    async def create(
        self,
        kind: Kind,
        obj: Mapping[str, Any],
        namespace: str | None = None,
        *,
        dry_run: bool = False,
        field_manager: str | None = None,
        metadata_only: bool = False,
    ) -> dict[str, Any]:
        """POST a new object; ``metadata_only`` as for :meth:`patch`."""
        ns = self._namespace(kind, namespace, obj)
        params: dict[str, Any] = {}
        if dry_run:
            params["dryRun"] = "All"
        if field_manager:
            params["fieldManager"] = field_manager
        return await self._call(
            "POST",
            kind.path(ns),
            params=params or None,
            content=dumps(obj),
            content_type=_JSON,
            accept=METADATA_ONLY if metadata_only else None,
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
            content=dumps(obj),
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
        metadata_only: bool = False,
    ) -> dict[str, Any]:
        """PATCH with the given patch type; ``apply`` is server-side apply (needs a manager).

        ``metadata_only``: the answer is the object's metadata alone (a
        ``PartialObjectMetadata``), for a caller that reads no more than its
        resourceVersion: less for the API server to encode and for us to decode.

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
            content=dumps(body),
            content_type=content_type,
            idempotent=None if patch_type != "json" else has_test_op(body),
            accept=METADATA_ONLY if metadata_only else None,
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
            content = dumps({"apiVersion": "v1", "kind": "DeleteOptions", **opts})
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
            content=dumps(binding),
            content_type=_JSON,
        )

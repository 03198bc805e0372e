"""Authentication and authorization of HTTP requests by the API server, as
controller-runtime's ``filters.WithAuthenticationAndAuthorization`` does for kubebuilder's
secure metrics.

A request must carry ``Authorization: Bearer <token>``. The token is checked with a
``TokenReview`` (who is this?), then the user with a ``SubjectAccessReview`` for the
non-resource URL (may they ``get /metrics``?), so access is granted with ordinary RBAC::

    rules:
      - nonResourceURLs: ["/metrics"]
        verbs: ["get"]

Answers (as controller-runtime's): no or no valid token: 401 ``Unauthorized``; a user
without the rule: 403 ``Authorization denied for user <name>``; the API server not
answering the review: 500, logged with what the manager's RBAC needs.

Both results are cached for ``ttl`` seconds (10 by default), denials too, in bounded
LRU maps keyed by a SHA-256 of the token (the token itself is never kept): Prometheus
scrapes every 15-60 s per replica, so scrapes cost the API server at most two reviews per
``ttl`` and token, however often they come (a bad token: one).
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from sdgruntime import errors
from sdgruntime.client import Client
from sdgruntime.httpserver import Handler, Request, Response
from sdgruntime.kinds import Kind

__all__ = [
    "SUBJECTACCESSREVIEWS",
    "TOKENREVIEWS",
    "APIServerAuth",
    "TTLCache",
    "UserInfo",
    "bearer_token",
]

log = logging.getLogger(__name__)

TOKENREVIEWS = Kind("authentication.k8s.io", "v1", "TokenReview", "tokenreviews", False)
SUBJECTACCESSREVIEWS = Kind(
    "authorization.k8s.io", "v1", "SubjectAccessReview", "subjectaccessreviews", False
)
DEFAULT_TTL = 10.0
DEFAULT_MAX_ENTRIES = 1024

K = TypeVar("K")
V = TypeVar("V")


class TTLCache(Generic[K, V]):
    """At most ``max_entries`` values, each for ``ttl`` seconds; the least recently used
    goes first when full, so memory stays bounded whatever clients send."""

    def __init__(
        self, ttl: float, max_entries: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be at least 1, got {max_entries}")
        self.ttl = ttl
        self.max_entries = max_entries
        self._clock = clock
        self._items: OrderedDict[K, tuple[float, V]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: K) -> tuple[bool, V | None]:
        """``(True, value)`` while fresh, else ``(False, None)``."""
        item = self._items.get(key)
        if item is None:
            return False, None
        expires, value = item
        if self._clock() >= expires:
            del self._items[key]
            return False, None
        self._items.move_to_end(key)
        return True, value

    def put(self, key: K, value: V) -> None:
        if self.ttl <= 0:
            return
        self._items[key] = (self._clock() + self.ttl, value)
        self._items.move_to_end(key)
        while len(self._items) > self.max_entries:
            self._items.popitem(last=False)


@dataclass(frozen=True, slots=True)
class UserInfo:
    """Who a TokenReview says the token belongs to."""

    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: tuple[tuple[str, tuple[str, ...]], ...] = field(default=())

    @classmethod
    def from_review(cls, user: Mapping[str, Any]) -> UserInfo:
        extra = user.get("extra") or {}
        return cls(
            username=str(user.get("username") or ""),
            uid=str(user.get("uid") or ""),
            groups=tuple(str(g) for g in user.get("groups") or ()),
            extra=tuple(sorted((str(k), tuple(str(x) for x in v or ())) for k, v in extra.items())),
        )


def _needs(exc: errors.ApiError, kind: Kind) -> str:
    """What to grant, when the API server refused the review itself."""
    if isinstance(exc, errors.Forbidden):
        return f" (the manager needs create on {kind.name}: config/rbac/metrics_auth_role.yaml)"
    return ""


def bearer_token(request: Request) -> str | None:
    """The token of ``Authorization: Bearer <token>`` (scheme case-insensitive), else
    ``None``, as client-go's bearer token authenticator reads it."""
    parts = request.headers.get("authorization", "").split(" ")
    if len(parts) < 2 or parts[0].lower() != "bearer" or not parts[1]:
        return None
    return parts[1]


class APIServerAuth:
    """Reviews requests with the API server through ``client`` (the manager's identity,
    which needs ``create`` on ``tokenreviews`` and ``subjectaccessreviews``).

    ``audiences`` are the TokenReview audiences (empty: the API server's own, which
    service-account tokens from the TokenRequest API and projected volumes carry).
    """

    def __init__(
        self,
        client: Client,
        *,
        ttl: float = DEFAULT_TTL,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        audiences: Sequence[str] = (),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.audiences = list(audiences)
        self._users: TTLCache[bytes, UserInfo | None] = TTLCache(ttl, max_entries, clock)
        self._decisions: TTLCache[tuple[UserInfo, str, str], tuple[bool, str]] = TTLCache(
            ttl, max_entries, clock
        )

    async def authenticate(self, token: str) -> UserInfo | None:
        """The token's user, or ``None`` if the API server does not accept it.

        Raises ``errors.ApiError`` (``TransportError`` included) when the review fails."""
        key = hashlib.sha256(token.encode()).digest()
        hit, user = self._users.get(key)
        if hit:
            return user
        spec: dict[str, Any] = {"token": token}
        if self.audiences:
            spec["audiences"] = self.audiences
        review = await self.client.create(
            TOKENREVIEWS,
            {"apiVersion": TOKENREVIEWS.api_version, "kind": "TokenReview", "spec": spec},
        )
        status = review.get("status") or {}
        user = None
        if status.get("authenticated") and (status.get("user") or {}).get("username"):
            user = UserInfo.from_review(status["user"])
        else:
            log.debug("token not authenticated: %s", status.get("error") or "no reason given")
        self._users.put(key, user)
        return user

    async def authorize(self, user: UserInfo, verb: str, path: str) -> tuple[bool, str]:
        """Whether ``user`` may ``verb`` the non-resource URL ``path``, and the API
        server's reason. Raises as :meth:`authenticate` when the review fails."""
        key = (user, verb, path)
        hit, decision = self._decisions.get(key)
        if hit and decision is not None:
            return decision
        spec: dict[str, Any] = {
            "user": user.username,
            "groups": list(user.groups),
            "nonResourceAttributes": {"path": path, "verb": verb},
        }
        if user.uid:
            spec["uid"] = user.uid
        if user.extra:
            spec["extra"] = {k: list(v) for k, v in user.extra}
        review = await self.client.create(
            SUBJECTACCESSREVIEWS,
            {
                "apiVersion": SUBJECTACCESSREVIEWS.api_version,
                "kind": "SubjectAccessReview",
                "spec": spec,
            },
        )
        status = review.get("status") or {}
        decision = (
            bool(status.get("allowed")) and not status.get("denied"),
            str(status.get("reason") or status.get("evaluationError") or ""),
        )
        self._decisions.put(key, decision)
        return decision

    def protect(self, handler: Handler) -> Handler:
        """``handler`` behind authentication and authorization (module doc)."""

        async def guarded(request: Request) -> Response:
            token = bearer_token(request)
            if token is None:
                return Response.text("Unauthorized\n", 401)
            try:
                user = await self.authenticate(token)
            except errors.ApiError as exc:
                log.error("TokenReview failed: %s%s", exc, _needs(exc, TOKENREVIEWS))
                return Response.text("Authentication failed\n", 500)
            if user is None:
                return Response.text("Unauthorized\n", 401)
            try:
                allowed, reason = await self.authorize(user, request.method.lower(), request.path)
            except errors.ApiError as exc:
                log.error(
                    "SubjectAccessReview failed: %s%s", exc, _needs(exc, SUBJECTACCESSREVIEWS)
                )
                return Response.text(f"Authorization for user {user.username} failed\n", 500)
            if not allowed:
                log.debug("denied %s %s to %s: %s", request.method, request.path, user, reason)
                return Response.text(f"Authorization denied for user {user.username}\n", 403)
            return await handler(request)

        return guarded

"""Authentication and authorization of HTTP requests by the API server, as
controller-runtime's ``filters.WithAuthenticationAndAuthorization`` does for secure metrics.

A bearer token is checked with a ``TokenReview``, then the user with a
``SubjectAccessReview`` for the non-resource URL, so access is ordinary RBAC
(``nonResourceURLs: ["/metrics"]``, ``verbs: ["get"]``). Answers: 401, 403, 500 if the API
server does not answer. Results (denials too) are cached for ``ttl`` seconds, keyed by a
SHA-256 of the token (never the token). Reviews the caches cannot answer are bounded by
:class:`ReviewLimiter` (429 with ``Retry-After`` beyond), so a flood of made-up tokens
costs the API server little; cached tokens are answered at once.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from sdgruntime import errors
from sdgruntime.client import Client
from sdgruntime.httpserver import Handler, Request, Response
from sdgruntime.kinds import Kind
from sdgruntime.lru import LRU

__all__ = [
    "SUBJECTACCESSREVIEWS",
    "TOKENREVIEWS",
    "APIServerAuth",
    "ReviewLimiter",
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
# A scraper costs at most two reviews per ttl: 20/s serves hundreds of scrapers, and a
# flood adds at most that to the API server's load.
DEFAULT_REVIEW_RATE = 20.0
DEFAULT_REVIEW_BURST = 40
DEFAULT_MAX_CONCURRENT_REVIEWS = 8
_REFUSAL_LOG_INTERVAL = 10.0

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
        self._items: LRU[K, tuple[float, V]] = LRU(max_entries)

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: K) -> tuple[bool, V | None]:
        """``(True, value)`` while fresh, else ``(False, None)``."""
        item = self._items.get(key)
        if item is None:
            return False, None
        expires, value = item
        if self._clock() >= expires:
            self._items.pop(key)
            return False, None
        return True, value

    def put(self, key: K, value: V) -> None:
        if self.ttl <= 0:
            return
        self._items.put(key, (self._clock() + self.ttl, value))


class ReviewLimiter:
    """A token bucket (``rate`` per second, up to ``burst`` saved) and a cap on reviews in
    progress, for requests that need the API server. Never waits: :meth:`acquire` says
    at once whether the caller may go on (then :meth:`release` when done) or how long to
    wait before retrying."""

    def __init__(
        self,
        rate: float = DEFAULT_REVIEW_RATE,
        burst: int = DEFAULT_REVIEW_BURST,
        max_concurrent: int = DEFAULT_MAX_CONCURRENT_REVIEWS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if rate <= 0:
            raise ValueError(f"review rate must be over 0 per second, got {rate}")
        if burst < 1:
            raise ValueError(f"review burst must be at least 1, got {burst}")
        if max_concurrent < 1:
            raise ValueError(f"concurrent reviews must be at least 1, got {max_concurrent}")
        self.rate = rate
        self.burst = burst
        self.max_concurrent = max_concurrent
        self._clock = clock
        self._tokens = float(burst)
        self._updated = clock()
        self.in_progress = 0

    def acquire(self) -> tuple[float, str] | None:
        """``None``: go on (and call :meth:`release` after). Else the seconds to wait
        and which limit was hit, for a 429."""
        if self.in_progress >= self.max_concurrent:
            return 1.0, f"{self.max_concurrent} reviews in progress"
        now = self._clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._updated) * self.rate)
        self._updated = now
        if self._tokens < 1.0 - 1e-9:  # float sums of rate x time: not a token short
            return (1.0 - self._tokens) / self.rate, (
                f"over {self.rate:g} reviews per second (burst {self.burst})"
            )
        self._tokens -= 1.0
        self.in_progress += 1
        return None

    def release(self) -> None:
        """A review that :meth:`acquire` let go on is done."""
        self.in_progress = max(0, self.in_progress - 1)


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
    ``review_rate``, ``review_burst`` and ``max_concurrent_reviews`` bound the requests
    the caches cannot answer (module doc).
    """

    def __init__(
        self,
        client: Client,
        *,
        ttl: float = DEFAULT_TTL,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        audiences: Sequence[str] = (),
        review_rate: float = DEFAULT_REVIEW_RATE,
        review_burst: int = DEFAULT_REVIEW_BURST,
        max_concurrent_reviews: int = DEFAULT_MAX_CONCURRENT_REVIEWS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.audiences = list(audiences)
        self.limiter = ReviewLimiter(review_rate, review_burst, max_concurrent_reviews, clock)
        self._refused = 0  # requests refused since the last warning
        self._refusal_logged = float("-inf")
        self._clock = clock
        self._users: TTLCache[bytes, UserInfo | None] = TTLCache(ttl, max_entries, clock)
        self._decisions: TTLCache[tuple[UserInfo, str, str], tuple[bool, str]] = TTLCache(
            ttl, max_entries, clock
        )

    def cached(self, token: str, verb: str, path: str) -> bool:
        """Whether both answers for ``token`` are cached, so no review is needed."""
        hit, user = self._users.get(_token_key(token))
        if not hit:
            return False
        return user is None or self._decisions.get((user, verb, path))[0]

    async def authenticate(self, token: str) -> UserInfo | None:
        """The token's user, or ``None`` if the API server does not accept it.

        Raises ``errors.ApiError`` (``TransportError`` included) when the review fails."""
        key = _token_key(token)
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
            if self.cached(token, request.method.lower(), request.path):
                refusal = await self._review(request, token)
            else:
                limited = self.limiter.acquire()
                if limited is not None:
                    return self._too_many(*limited)
                try:
                    refusal = await self._review(request, token)
                finally:
                    self.limiter.release()  # the reviews are done: the handler runs free
            return refusal if refusal is not None else await handler(request)

        return guarded

    async def _review(self, request: Request, token: str) -> Response | None:
        """The answer refusing ``request``, or ``None`` if its token's user may go on."""
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
            log.error("SubjectAccessReview failed: %s%s", exc, _needs(exc, SUBJECTACCESSREVIEWS))
            return Response.text(f"Authorization for user {user.username} failed\n", 500)
        if not allowed:
            log.debug("denied %s %s to %s: %s", request.method, request.path, user, reason)
            return Response.text(f"Authorization denied for user {user.username}\n", 403)
        return None

    def _too_many(self, wait: float, limit: str) -> Response:
        """429 for a request whose review would go over the limits."""
        seconds = max(1, math.ceil(wait))
        self._refused += 1
        now = self._clock()
        if now - self._refusal_logged >= _REFUSAL_LOG_INTERVAL:
            log.warning(
                "refused %d request(s) needing a TokenReview/SubjectAccessReview: %s",
                self._refused,
                limit,
            )
            self._refused, self._refusal_logged = 0, now
        return Response.text(
            f"Too many requests to authenticate: {limit}; a token already reviewed is "
            f"answered at once. Retry after {seconds}s\n",
            429,
            {"retry-after": str(seconds)},
        )


def _token_key(token: str) -> bytes:
    """What the caches keep of a token: its SHA-256, never the token."""
    return hashlib.sha256(token.encode()).digest()

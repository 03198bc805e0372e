"""Secure metrics without an API server: the TokenReview/SubjectAccessReview filter
(answers, what it asks, its bounded cache), the self-signed serving pair, the HTTPS
server on a real socket, and the manager options. tests/e2e/test_metrics_auth.py proves
the same against the real API server."""

from __future__ import annotations

import ipaddress
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import load_pem_private_key
from pydantic import ValidationError

from sdgruntime import errors
from sdgruntime.authn import (
    SUBJECTACCESSREVIEWS,
    TOKENREVIEWS,
    APIServerAuth,
    TTLCache,
    UserInfo,
    bearer_token,
)
from sdgruntime.httpserver import Request, Response
from sdgruntime.kinds import Kind
from sdgruntime.manager import ManagerOptions
from sdgruntime.securemetrics import SecureMetricsServer, self_signed_pair

pytestmark = pytest.mark.anyio

READER = {
    "username": "system:serviceaccount:monitoring:prometheus",
    "uid": "u-1",
    "groups": ["system:serviceaccounts", "system:authenticated"],
    "extra": {"authentication.kubernetes.io/pod-name": ["prometheus-0"]},
}


class FakeAPIServer:
    """Answers reviews as the API server would: ``tokens`` maps a token to its user;
    ``allowed`` holds the usernames that may get /metrics. Counts what it was asked."""

    def __init__(self) -> None:
        self.tokens: dict[str, dict[str, Any]] = {"good": READER, "other": {"username": "bob"}}
        self.allowed = {READER["username"]}
        self.calls: list[tuple[Kind, dict[str, Any]]] = []
        self.fail: errors.ApiError | None = None

    async def create(self, kind: Kind, obj: dict[str, Any]) -> dict[str, Any]:
        self.calls.append((kind, obj))
        if self.fail is not None:
            raise self.fail
        spec = obj["spec"]
        if kind == TOKENREVIEWS:
            user = self.tokens.get(spec["token"])
            if user is None:
                return {**obj, "status": {"authenticated": False, "error": "invalid token"}}
            return {**obj, "status": {"authenticated": True, "user": user}}
        assert kind == SUBJECTACCESSREVIEWS
        ok = spec["user"] in self.allowed and spec["nonResourceAttributes"] == {
            "path": "/metrics",
            "verb": "get",
        }
        return {**obj, "status": {"allowed": ok, "reason": "RBAC" if ok else ""}}

    def count(self, kind: Kind) -> int:
        return sum(1 for k, _ in self.calls if k == kind)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def ok(_: Request) -> Response:
    return Response.text("metrics\n")


def get(token: str | None = None, *, scheme: str = "Bearer", method: str = "GET") -> Request:
    headers = {} if token is None else {"authorization": f"{scheme} {token}"}
    return Request(method=method, path="/metrics", headers=headers)


def auth_for(api: FakeAPIServer, **kwargs: Any) -> APIServerAuth:
    return APIServerAuth(api, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("header", "token"),
    [
        ("Bearer abc", "abc"),
        ("bearer abc", "abc"),
        ("Bearer abc extra", "abc"),
        ("Bearer ", None),
        ("Bearer", None),
        ("Basic abc", None),
        ("", None),
    ],
)
def test_bearer_token(header: str, token: str | None) -> None:
    request = Request(method="GET", path="/", headers={"authorization": header} if header else {})
    assert bearer_token(request) == token


async def test_answers_401_403_200_as_controller_runtime() -> None:
    api = FakeAPIServer()
    guarded = auth_for(api).protect(ok)
    for request in (get(), get("good", scheme="Basic"), get("unknown")):
        r = await guarded(request)
        assert (r.status, r.body) == (401, b"Unauthorized\n")
    r = await guarded(get("other"))
    assert (r.status, r.body) == (403, b"Authorization denied for user bob\n")
    r = await guarded(get("good"))
    assert (r.status, r.body) == (200, b"metrics\n")
    # HEAD asks for verb "head", as the API server's request info would: not granted here.
    assert (await guarded(get("good", method="HEAD"))).status == 403


async def test_reviews_ask_for_the_user_and_the_non_resource_url() -> None:
    api = FakeAPIServer()
    assert (await auth_for(api, audiences=["sdg"]).protect(ok)(get("good"))).status == 200
    (_, token_review), (_, access_review) = api.calls
    assert token_review["apiVersion"] == "authentication.k8s.io/v1"
    assert token_review["spec"] == {"token": "good", "audiences": ["sdg"]}
    assert access_review["apiVersion"] == "authorization.k8s.io/v1"
    assert access_review["spec"] == {
        "user": READER["username"],
        "uid": "u-1",
        "groups": READER["groups"],
        "extra": READER["extra"],
        "nonResourceAttributes": {"path": "/metrics", "verb": "get"},
    }


async def test_results_are_cached_for_the_ttl_then_asked_again() -> None:
    api, clock = FakeAPIServer(), Clock()
    guarded = auth_for(api, ttl=10, clock=clock).protect(ok)
    for _ in range(5):
        assert (await guarded(get("good"))).status == 200
        assert (await guarded(get("other"))).status == 403
        assert (await guarded(get("unknown"))).status == 401
    assert api.count(TOKENREVIEWS) == 3  # one per token, denials included
    assert api.count(SUBJECTACCESSREVIEWS) == 2  # one per authenticated user
    # Revoked in RBAC: still allowed from the cache until the TTL passes, then denied.
    api.allowed.clear()
    clock.now += 9.9
    assert (await guarded(get("good"))).status == 200
    clock.now += 0.1
    assert (await guarded(get("good"))).status == 403
    assert api.count(TOKENREVIEWS) == 4


async def test_the_cache_keeps_no_raw_token() -> None:
    auth = auth_for(FakeAPIServer())
    await auth.protect(ok)(get("good"))
    assert "good" not in repr(auth._users._items)


def test_ttl_cache_is_bounded_lru() -> None:
    clock = Clock()
    cache: TTLCache[str, int] = TTLCache(ttl=10, max_entries=2, clock=clock)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == (True, 1)  # a is now the most recently used
    cache.put("c", 3)
    assert len(cache) == 2
    assert cache.get("b") == (False, None)
    assert cache.get("a") == (True, 1) and cache.get("c") == (True, 3)
    clock.now += 10
    assert cache.get("a") == (False, None) and len(cache) == 1
    with pytest.raises(ValueError, match="max_entries"):
        TTLCache(ttl=1, max_entries=0)


async def test_a_flood_of_distinct_tokens_stays_within_the_bound() -> None:
    api = FakeAPIServer()
    auth = auth_for(api, max_entries=16)
    for i in range(100):
        await auth.protect(ok)(get(f"bad-{i}"))
    assert len(auth._users) == 16


@pytest.mark.parametrize("which", ["TokenReview", "SubjectAccessReview"])
async def test_a_failing_review_is_500_and_not_cached(which: str) -> None:
    api = FakeAPIServer()
    auth = auth_for(api)
    guarded = auth.protect(ok)
    if which == "SubjectAccessReview":
        await auth.authenticate("good")  # cached: only the access review fails
    api.fail = errors.Forbidden(f"cannot create {which}", reason="Forbidden")
    r = await guarded(get("good"))
    assert r.status == 500
    message = (
        b"Authentication failed\n"
        if which == "TokenReview"
        else (f"Authorization for user {READER['username']} failed\n".encode())
    )
    assert r.body == message
    api.fail = None
    assert (await guarded(get("good"))).status == 200


def test_user_info_from_review_is_hashable_and_ordered() -> None:
    a = UserInfo.from_review({**READER, "extra": {"b": ["2"], "a": ["1"]}})
    b = UserInfo.from_review({**READER, "extra": {"a": ["1"], "b": ["2"]}})
    assert a == b and hash(a) == hash(b)


# --- the serving pair and the HTTPS server -------------------------------------------------


def test_self_signed_pair_is_a_server_certificate_for_its_hosts() -> None:
    cert_pem, key_pem = self_signed_pair(["metrics.example", "127.0.0.1"])
    cert = x509.load_pem_x509_certificate(cert_pem)
    key = load_pem_private_key(key_pem, None)
    assert cert.public_key() == key.public_key()
    assert cert.issuer == cert.subject
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["metrics.example"]
    assert sans.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert x509.oid.ExtendedKeyUsageOID.SERVER_AUTH in usage
    days = (cert.not_valid_after_utc - cert.not_valid_before_utc).days
    assert 365 <= days <= 366


@asynccontextmanager
async def serving(server: SecureMetricsServer) -> AsyncIterator[int]:
    async with anyio.create_task_group() as tg:
        port = await tg.start(server.serve)
        yield port
        tg.cancel_scope.cancel()


async def test_secure_server_serves_https_behind_the_filter() -> None:
    server = SecureMetricsServer("127.0.0.1:0", auth_for(FakeAPIServer()))
    async with serving(server) as port:
        pem = await anyio.to_thread.run_sync(ssl.get_server_certificate, ("127.0.0.1", port))
        verify = ssl.create_default_context(cadata=pem)  # valid for 127.0.0.1
        async with httpx.AsyncClient(verify=verify, timeout=10) as http:
            url = f"https://127.0.0.1:{port}/metrics"
            assert (await http.get(url)).status_code == 401
            r = await http.get(url, headers={"Authorization": "Bearer good"})
            assert r.status_code == 200
            assert "rest_client_requests_total" in r.text
            assert (await http.get(f"https://127.0.0.1:{port}/other")).status_code == 404
        async with httpx.AsyncClient(timeout=5) as plain:
            with pytest.raises(httpx.TransportError):
                await plain.get(f"http://127.0.0.1:{port}/metrics")


def test_a_cert_dir_without_a_pair_fails_at_construction(tmp_path: Any) -> None:
    with pytest.raises(RuntimeError, match="cannot load serving certificate"):
        SecureMetricsServer("127.0.0.1:0", auth_for(FakeAPIServer()), cert_dir=tmp_path)


def test_manager_options() -> None:
    options = ManagerOptions()
    assert (options.metrics_secure, options.metrics_cert_dir) == (False, None)
    with pytest.raises(ValidationError, match="metrics_cert_dir is only used with metrics_secure"):
        ManagerOptions(metrics_cert_dir="/certs")
    assert ManagerOptions(metrics_secure=True, metrics_cert_dir="/certs").metrics_cert_dir

"""Client configuration, request shaping, error decoding and retry decisions, without a server.

The two tests at the end use a bare TCP socket as a *faulty network peer* (refuses, hangs up,
stalls); they check the client's reaction to transport faults that a healthy API server cannot
be made to produce, not any API behaviour.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import ssl
import sys
from contextlib import aclosing
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import httpx
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from tenacity import RetryCallState

from sdgruntime import errors
from sdgruntime.client import (
    PATCH_CONTENT_TYPES,
    Client,
    LineSplitter,
    RequestNotSent,
    RetryPolicy,
    api_error,
    parse_watch_line,
    should_retry,
)
from sdgruntime.kinds import CONFIGMAPS, NODES
from sdgruntime.metrics import REST_CLIENT_REQUESTS

# --- fixtures: TLS material and kubeconfigs --------------------------------------------


def _self_signed(cn: str, *, ca: bool) -> tuple[bytes, bytes]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=1))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


@pytest.fixture(scope="module")
def ca_pem() -> bytes:
    return _self_signed("unit-test-ca", ca=True)[0]


@pytest.fixture(scope="module")
def client_pair() -> tuple[bytes, bytes]:
    return _self_signed("unit-test-user", ca=False)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _kubeconfig(
    tmp_path: Path,
    users: dict[str, dict[str, Any]],
    *,
    server: str = "https://127.0.0.1:6443",
    cluster: dict[str, Any] | None = None,
) -> Path:
    cluster = cluster or {}
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server, **cluster}}],
        "users": [{"name": name, "user": user} for name, user in users.items()],
        "contexts": [{"name": name, "context": {"cluster": "c", "user": name}} for name in users],
        "current-context": next(iter(users)),
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(doc))
    return path


# --- configuration derivation ----------------------------------------------------------


@pytest.mark.anyio
async def test_token_user_gets_bearer_header_and_verifying_tls(tmp_path: Path, ca_pem: bytes):
    path = _kubeconfig(
        tmp_path,
        {"tok": {"token": "s3cr3t"}},
        cluster={"certificate-authority-data": _b64(ca_pem)},
    )
    async with Client.from_kubeconfig(path, context="tok") as client:
        assert client.settings.host == "https://127.0.0.1:6443"
        assert client.host == "127.0.0.1:6443"
        assert client._headers["Authorization"] == "Bearer s3cr3t"
        assert client.settings.cert_file is None
        ctx = client.settings.ssl_context()
        assert ctx.verify_mode == ssl.CERT_REQUIRED
        assert ctx.check_hostname
        subjects = [dict(x[0] for x in c["subject"]) for c in ctx.get_ca_certs()]
        assert {"commonName": "unit-test-ca"} in subjects


@pytest.mark.anyio
async def test_client_cert_user_uses_the_certificate_and_no_token(
    tmp_path: Path, ca_pem: bytes, client_pair: tuple[bytes, bytes]
):
    cert_pem, key_pem = client_pair
    path = _kubeconfig(
        tmp_path,
        {
            "certuser": {
                "client-certificate-data": _b64(cert_pem),
                "client-key-data": _b64(key_pem),
            },
            "tok": {"token": "x"},
        },
        cluster={"certificate-authority-data": _b64(ca_pem)},
    )
    async with Client.from_kubeconfig(path, context="certuser") as client:
        assert "Authorization" not in client._headers
        assert client.settings.cert_file and client.settings.key_file
        cert = await anyio.Path(client.settings.cert_file).read_bytes()
        key = await anyio.Path(client.settings.key_file).read_bytes()
        assert cert.strip() == cert_pem.strip()
        assert key.strip() == key_pem.strip()
        # loading the pair into a context proves cert and key belong together
        client.settings.ssl_context()


@pytest.mark.anyio
async def test_insecure_skip_tls_verify_disables_verification(tmp_path: Path):
    path = _kubeconfig(
        tmp_path,
        {"tok": {"token": "t"}},
        server="https://example.invalid",
        cluster={"insecure-skip-tls-verify": True},
    )
    async with Client.from_kubeconfig(path) as client:
        ctx = client.settings.ssl_context()
        assert ctx.verify_mode == ssl.CERT_NONE
        assert not ctx.check_hostname
        assert client.host == "example.invalid:443"


@pytest.mark.anyio
async def test_exec_credentials_are_refreshed_through_the_hook(tmp_path: Path):
    """An exec plugin's expired token is replaced via the config's refresh hook."""
    counter = tmp_path / "n"
    counter.write_text("0")
    script = tmp_path / "plugin.py"
    script.write_text(
        "import json, pathlib, sys\n"
        f"p = pathlib.Path({str(counter)!r})\n"
        "n = int(p.read_text()) + 1\n"
        "p.write_text(str(n))\n"
        "print(json.dumps({'apiVersion': 'client.authentication.k8s.io/v1beta1',\n"
        "  'kind': 'ExecCredential', 'status': {'token': f'tok-{n}',\n"
        "  'expirationTimestamp': '2000-01-01T00:00:00Z'}}))\n"
    )
    exec_cfg = {
        "apiVersion": "client.authentication.k8s.io/v1beta1",
        "command": sys.executable,
        "args": [str(script)],
    }
    path = _kubeconfig(tmp_path, {"ex": {"exec": exec_cfg}}, cluster={})
    async with Client.from_kubeconfig(path, auth_refresh_interval=3600) as client:
        assert client._headers["Authorization"] == "Bearer tok-1"
        assert client.settings.refresh_hook is not None
        await client.refresh_auth()  # due: never refreshed yet
        assert client._headers["Authorization"] == "Bearer tok-2"
        await client.refresh_auth()  # not due again for an hour
        assert client._headers["Authorization"] == "Bearer tok-2"
        await client.refresh_auth(force=True)  # what a 401 answer triggers
        assert client._headers["Authorization"] == "Bearer tok-3"


@pytest.mark.anyio
async def test_auto_prefers_explicit_path_then_kubeconfig_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    env_dir, arg_dir = tmp_path / "env", tmp_path / "arg"
    env_dir.mkdir()
    arg_dir.mkdir()
    from_env = _kubeconfig(env_dir, {"u": {"token": "t"}}, server="https://10.0.0.1:6443")
    from_arg = _kubeconfig(arg_dir, {"u": {"token": "t"}}, server="https://10.0.0.2:6443")
    monkeypatch.setenv("KUBECONFIG", str(from_env))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.9.9.9")  # a kubeconfig still wins
    async with Client.auto() as client:
        assert client.host == "10.0.0.1:6443"
    async with Client.auto(str(from_arg)) as client:
        assert client.host == "10.0.0.2:6443"


# --- request shaping -------------------------------------------------------------------


def test_patch_content_types():
    assert PATCH_CONTENT_TYPES == {
        "merge": "application/merge-patch+json",
        "json": "application/json-patch+json",
        "strategic": "application/strategic-merge-patch+json",
        "apply": "application/apply-patch+yaml",
    }


@pytest.mark.anyio
async def test_patch_and_namespace_argument_errors(tmp_path: Path):
    path = _kubeconfig(tmp_path, {"tok": {"token": "t"}})
    async with Client.from_kubeconfig(path) as client:
        with pytest.raises(ValueError, match="field_manager"):
            await client.patch(CONFIGMAPS, "x", {}, "ns", patch_type="apply")
        with pytest.raises(ValueError, match="unknown patch type"):
            await client.patch(CONFIGMAPS, "x", {}, "ns", patch_type="yaml")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="namespaced"):
            await client.get(CONFIGMAPS, "x")
        with pytest.raises(ValueError, match="namespaced"):
            await client.create(CONFIGMAPS, {"metadata": {"name": "x"}})


# --- error decoding --------------------------------------------------------------------


def _status(code: int, reason: str, message: str, **extra: Any) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "code": code,
        "reason": reason,
        "message": message,
        **extra,
    }


@pytest.mark.parametrize(
    ("code", "reason", "cls"),
    [
        (404, "NotFound", errors.NotFound),
        (409, "AlreadyExists", errors.AlreadyExists),
        (409, "Conflict", errors.Conflict),
        (403, "Forbidden", errors.Forbidden),
        (410, "Expired", errors.Gone),
        (422, "Invalid", errors.Invalid),
        (429, "TooManyRequests", errors.TooManyRequests),
        (500, "InternalError", errors.ServerError),
        (503, "ServiceUnavailable", errors.ServerError),
    ],
)
def test_status_bodies_decode_to_typed_errors(code: int, reason: str, cls: type):
    resp = httpx.Response(code, json=_status(code, reason, f"the {reason} message"))
    err = api_error(resp)
    assert type(err) is cls
    assert err.code == code
    assert err.reason == reason
    assert err.message == f"the {reason} message"
    assert err.status["kind"] == "Status"


def test_retry_after_from_header_or_status_details():
    header = httpx.Response(429, headers={"Retry-After": "3"}, json=_status(429, "TooMany", "m"))
    assert api_error(header).retry_after == 3.0
    details = httpx.Response(
        503, json=_status(503, "ServiceUnavailable", "m", details={"retryAfterSeconds": 2})
    )
    assert api_error(details).retry_after == 2.0
    assert api_error(httpx.Response(500, json=_status(500, "x", "m"))).retry_after is None


def test_non_json_error_body_keeps_its_text():
    err = api_error(httpx.Response(502, text="bad gateway", headers={"content-type": "text/plain"}))
    assert isinstance(err, errors.ServerError)
    assert err.message == "bad gateway"


def test_watch_error_events_raise_typed_errors():
    gone = json.dumps({"type": "ERROR", "object": _status(410, "Expired", "too old")}).encode()
    with pytest.raises(errors.Gone, match="too old"):
        parse_watch_line(gone)
    event = {"type": "ADDED", "object": {"kind": "ConfigMap", "metadata": {"name": "a"}}}
    assert parse_watch_line(json.dumps(event).encode()) == event


def test_line_splitter_handles_partial_and_merged_chunks():
    events = [json.dumps({"type": "ADDED", "object": {"n": i}}).encode() for i in range(3)]
    stream = b"\n".join(events) + b"\n"
    # every split point: a line cut anywhere, two lines in one chunk
    for cut in range(1, len(stream)):
        s = LineSplitter()
        got = s.feed(stream[:cut]) + s.feed(stream[cut:])
        assert got == events and s.rest() == b""
    # byte by byte, and an unterminated last line at end of stream
    s = LineSplitter()
    got = [line for b in stream[:-1] for line in s.feed(bytes([b]))]
    assert got == events[:2] and s.rest() == events[2]


# --- retry decisions -------------------------------------------------------------------


def _err(cls: type[errors.ApiError], code: int = 0) -> errors.ApiError:
    return cls("x", code=code or None)


TRANSIENT = [
    _err(errors.TransportError),
    _err(errors.TooManyRequests),
    _err(errors.ServerError, 500),
    _err(errors.ServerError, 503),
]
PERMANENT = [
    _err(errors.Conflict),
    _err(errors.AlreadyExists),
    _err(errors.NotFound),
    _err(errors.Invalid),
    _err(errors.Forbidden),
    _err(errors.Unauthorized),
    _err(errors.BadRequest),
    _err(errors.Gone),
    ValueError("not an API error"),
]


@pytest.mark.parametrize("method", ["GET", "PUT", "PATCH", "DELETE"])
def test_idempotent_methods_retry_transient_failures_only(method: str):
    for err in [*TRANSIENT, RequestNotSent("x")]:
        assert should_retry(method, err), err
    for err in PERMANENT:
        assert not should_retry(method, err), err


def test_post_retries_only_what_the_server_did_not_handle():
    assert should_retry("POST", RequestNotSent("connect refused"))
    assert should_retry("POST", _err(errors.TooManyRequests))
    assert not should_retry("POST", _err(errors.TransportError))  # maybe processed
    assert not should_retry("POST", _err(errors.ServerError, 500))
    assert not should_retry("POST", _err(errors.ServerError, 504))
    for err in PERMANENT:
        assert not should_retry("POST", err), err


def _wait_after(policy: RetryPolicy, attempt: int, exc: BaseException) -> float:
    state = RetryCallState(policy.retrying("GET"), fn=None, args=(), kwargs={})
    state.attempt_number = attempt
    state.set_exception((type(exc), exc, None))
    return policy.wait(state)


def test_backoff_is_exponential_bounded_and_honours_retry_after():
    policy = RetryPolicy(initial_backoff=0.1, max_backoff=1.0, jitter=0.0, max_retry_after=5)
    waits = [_wait_after(policy, n, _err(errors.ServerError, 500)) for n in range(1, 7)]
    assert waits == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0])
    throttled = errors.TooManyRequests("slow down", retry_after=2.0)
    assert _wait_after(policy, 1, throttled) == 2.0
    assert _wait_after(policy, 1, errors.TooManyRequests("x", retry_after=60)) == 5.0
    jittery = RetryPolicy(initial_backoff=0.1, max_backoff=1.0, jitter=0.5)
    for _ in range(50):
        assert 0.1 <= _wait_after(jittery, 1, _err(errors.TransportError)) <= 0.6


# --- transport faults (a bare socket as the faulty peer) -------------------------------


def _count(method: str, code: str, host: str) -> float:
    v = REST_CLIENT_REQUESTS.labels(code=code, method=method, host=host)
    return v._value.get()


FAST = RetryPolicy(attempts=3, initial_backoff=0.001, max_backoff=0.001, jitter=0.0)


@pytest.mark.anyio
async def test_connect_refused_is_retried_then_raised_for_every_method(tmp_path: Path):
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    await listener.aclose()  # nothing listens there now: connections are refused
    path = _kubeconfig(tmp_path, {"tok": {"token": "t"}}, server=f"http://127.0.0.1:{port}")
    async with Client.from_kubeconfig(path, retry=FAST) as client:
        host = client.host
        for method, call in (
            ("GET", client.get(NODES, "n")),
            ("POST", client.create(NODES, {"metadata": {"name": "n"}})),
        ):
            before = _count(method, "<error>", host)
            with pytest.raises(RequestNotSent):
                await call
            assert _count(method, "<error>", host) - before == 3


@pytest.mark.anyio
async def test_hangup_after_request_retries_get_but_not_post(tmp_path: Path):
    """A connection dropped after the request was sent: POST may have been processed."""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    requests: list[bytes] = []

    async def hang_up(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            requests.append(await stream.receive())

    path = _kubeconfig(tmp_path, {"tok": {"token": "t"}}, server=f"http://127.0.0.1:{port}")
    async with anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, hang_up)
        async with Client.from_kubeconfig(path, retry=FAST) as client:
            with pytest.raises(errors.TransportError) as get_err:
                await client.get(NODES, "n")
            gets = len(requests)
            with pytest.raises(errors.TransportError) as post_err:
                await client.create(NODES, {"metadata": {"name": "n"}})
            posts = len(requests) - gets
        tg.cancel_scope.cancel()
    assert not isinstance(get_err.value, RequestNotSent)
    assert not isinstance(post_err.value, RequestNotSent)
    assert gets == 3
    assert posts == 1


@pytest.mark.anyio
async def test_json_patch_is_replayed_only_when_a_test_op_guards_it(tmp_path: Path):
    """A replayed ``add`` to ``/list/-`` after a lost answer could append twice."""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    requests: list[bytes] = []

    async def hang_up(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            requests.append(await stream.receive())

    append = [{"op": "add", "path": "/metadata/finalizers/-", "value": "x"}]
    guarded = [{"op": "test", "path": "/metadata/resourceVersion", "value": "7"}, *append]
    merge = {"metadata": {"labels": {"a": "b"}}}
    path = _kubeconfig(tmp_path, {"tok": {"token": "t"}}, server=f"http://127.0.0.1:{port}")
    sent: dict[str, int] = {}
    async with anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, hang_up)
        async with Client.from_kubeconfig(path, retry=FAST) as client:
            for label, body, patch_type in (
                ("unguarded json", append, "json"),
                ("guarded json", guarded, "json"),
                ("merge", merge, "merge"),
            ):
                before = len(requests)
                with pytest.raises(errors.TransportError):
                    await client.patch(NODES, "n", body, patch_type=patch_type)  # type: ignore[arg-type]
                sent[label] = len(requests) - before
        tg.cancel_scope.cancel()
    assert sent == {"unguarded json": 1, "guarded json": 3, "merge": 3}
    assert not should_retry("PATCH", _err(errors.ServerError, 500), idempotent=False)
    assert should_retry("PATCH", _err(errors.TooManyRequests), idempotent=False)


@pytest.mark.anyio
async def test_stalled_watch_stream_raises_transport_error(tmp_path: Path):
    """A watch whose peer goes silent ends with TransportError after read_timeout."""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    event = json.dumps({"type": "ADDED", "object": {"metadata": {"name": "a"}}}).encode()

    async def stall(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            await stream.receive()
            await stream.send(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n"
                + f"{len(event) + 1:x}\r\n".encode()
                + event
                + b"\n\r\n"
            )
            await anyio.sleep_forever()

    path = _kubeconfig(tmp_path, {"tok": {"token": "t"}}, server=f"http://127.0.0.1:{port}")
    got: list[dict[str, Any]] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, stall)
        async with Client.from_kubeconfig(path) as client:
            with pytest.raises(errors.TransportError, match="ReadTimeout"):
                async with aclosing(client.watch(NODES, read_timeout=0.3)) as events:
                    async for ev in events:
                        got.append(ev)
        tg.cancel_scope.cancel()
    assert [e["object"]["metadata"]["name"] for e in got] == ["a"]

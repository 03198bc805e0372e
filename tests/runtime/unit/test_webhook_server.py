"""The admission webhook server over real TLS on 127.0.0.1, the JSON-patch diff, the
certificate watcher and the webhook metrics."""

from __future__ import annotations

import base64
import json
import logging
import os
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import httpx
import pytest
from anyio.streams.tls import TLSAttribute
from hypothesis import given, settings
from hypothesis import strategies as st

from sdgruntime import metrics
from sdgruntime.envtest import FakeClient
from sdgruntime.envtest.certs import CertificateAuthority
from sdgruntime.probes import MetricsServer
from sdgruntime.webhook import (
    AdmissionRequest,
    AdmissionResponse,
    CertWatcher,
    Denied,
    Webhook,
    WebhookServer,
    allowed,
    denied,
    patch_ops,
    patched,
)
from sdgruntime.webhook.admission import ReviewError, parse_review
from sdgruntime.webhook.certs import fingerprint
from sdgruntime.webhook.jsonpatch import diff, escape, json_equal
from tests.runtime.helpers import as_client
from tests.runtime.helpers import both_event_loops as anyio_backend  # noqa: F401

# --- certificates -------------------------------------------------------------------


class CA(CertificateAuthority):
    """A throwaway CA (envtest's) with the helpers these tests use."""

    def issue(self, ip: str = "127.0.0.1") -> tuple[bytes, bytes]:
        """A serving (cert PEM, key PEM) pair for ``ip``."""
        pair = self.serving([ip])
        return pair.cert_pem, pair.key_pem

    def client_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cadata=self.cert_pem.decode())
        context.set_alpn_protocols(["h2", "http/1.1"])  # as Go clients offer
        return context


class SecretVolume:
    """A directory laid out as the kubelet mounts a Secret: files are symlinks through
    ``..data``, and an update swaps ``..data`` atomically (same paths, new content)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.generation = 0

    def write(self, files: dict[str, bytes]) -> None:
        self.generation += 1
        version = self.root / f"..v{self.generation}"
        version.mkdir()
        for name, data in files.items():
            (version / name).write_bytes(data)
        tmp = self.root / "..data_tmp"
        tmp.symlink_to(version.name)
        os.replace(tmp, self.root / "..data")
        for name in files:
            link = self.root / name
            if not link.is_symlink():
                link.symlink_to(f"..data/{name}")


@pytest.fixture
def ca() -> CA:
    return CA("test-ca-1")


@pytest.fixture
def cert_dir(tmp_path: Path, ca: CA) -> SecretVolume:
    volume = SecretVolume(tmp_path)
    crt, key = ca.issue()
    volume.write({"tls.crt": crt, "tls.key": key})
    return volume


# --- a server under test ------------------------------------------------------------


def pod(**labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "ns", "labels": dict(labels)},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }


def review(obj: Any = None, *, uid: str = "uid-1", operation: str = "CREATE") -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "name": "p",
            "namespace": "ns",
            "operation": operation,
            "userInfo": {"username": "alice"},
            "object": pod() if obj is None else obj,
            "oldObject": None,
            "dryRun": False,
        },
    }


class InjectEnv:
    """A Mutator: adds an env var to every container and a label with a ``/`` and ``~``."""

    async def mutate(self, request: AdmissionRequest) -> AdmissionResponse:
        obj = request.copy_object()
        obj["metadata"]["labels"]["example.com/dev~ice"] = "gpu"
        for container in obj["spec"]["containers"]:
            container.setdefault("env", []).append({"name": "VISIBLE_DEVICES", "value": "0,1"})
        return patched(request.object, obj, warnings=["injected devices"])


class NoDelete:
    """A Validator: denies deletion, allows the rest."""

    async def validate(self, request: AdmissionRequest) -> AdmissionResponse:
        if request.operation == "DELETE":
            return denied("group has active pods: ns/a, ns/b", reason="Forbidden")
        return allowed(warnings=["looks fine"])


class PatchingValidator:
    async def validate(self, request: AdmissionRequest) -> AdmissionResponse:
        return patch_ops([{"op": "add", "path": "/metadata/x", "value": 1}])


async def raises(request: AdmissionRequest) -> AdmissionResponse:
    raise RuntimeError("database on fire")


async def denies_deep_inside(request: AdmissionRequest) -> AdmissionResponse:
    raise Denied("group g does not exist", code=404, reason="NotFound")


async def times_out_itself(request: AdmissionRequest) -> AdmissionResponse:
    raise TimeoutError("the database did not answer")


async def hangs(request: AdmissionRequest) -> AdmissionResponse:
    await anyio.sleep_forever()
    raise AssertionError


class Serving:
    def __init__(self, server: WebhookServer, ca: CA) -> None:
        self.server = server
        self.url = f"https://127.0.0.1:{server.port}"
        self.ca = ca

    def client(self, ca: CA | None = None) -> httpx.AsyncClient:
        """A new client (new connections) trusting ``ca``."""
        return httpx.AsyncClient(
            base_url=self.url, verify=(ca or self.ca).client_context(), timeout=10
        )

    async def post(self, path: str, body: Any, **kwargs: Any) -> httpx.Response:
        async with self.client() as client:
            return await client.post(path, json=body, **kwargs)


@asynccontextmanager
async def running(server: WebhookServer, ca: CA) -> AsyncIterator[Serving]:
    async with anyio.create_task_group() as tg:
        await tg.start(server.serve)
        yield Serving(server, ca)
        tg.cancel_scope.cancel()


def make_server(volume: SecretVolume, **kwargs: Any) -> WebhookServer:
    server = WebhookServer("127.0.0.1", 0, cert_dir=volume.root, cert_check_interval=0, **kwargs)
    server.register("/mutate", InjectEnv())
    server.register("/validate", NoDelete())
    server.register("/patching-validator", PatchingValidator())
    server.register("/raises", raises)
    server.register("/denies", denies_deep_inside)
    server.register("/hangs", hangs, timeout=0.2)
    server.register("/times-out-itself", times_out_itself)
    return server


def decode_patch(response: dict[str, Any]) -> list[dict[str, Any]]:
    assert response["patchType"] == "JSONPatch"
    return json.loads(base64.b64decode(response["patch"]))


# --- an independent RFC 6902 applier (the oracle for the diff) -------------------------


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def apply_patch(ops: list[dict[str, Any]], doc: Any) -> Any:
    doc = json.loads(json.dumps(doc))
    for op in ops:
        path = op["path"]
        if path == "":
            assert op["op"] in ("replace", "add")
            doc = op["value"]
            continue
        *parents, last = [_unescape(t) for t in path.split("/")[1:]]
        target = doc
        for token in parents:
            target = target[int(token)] if isinstance(target, list) else target[token]
        if isinstance(target, list):
            index = len(target) if last == "-" else int(last)
            if op["op"] == "add":
                assert 0 <= index <= len(target)
                target.insert(index, op["value"])
            elif op["op"] == "remove":
                del target[index]
            elif op["op"] == "replace":
                target[index] = op["value"]
            else:
                raise AssertionError(op)
        else:
            if op["op"] == "add":
                target[last] = op["value"]
            elif op["op"] == "remove":
                del target[last]
            elif op["op"] == "replace":
                assert last in target
                target[last] = op["value"]
            else:
                raise AssertionError(op)
    return doc


_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53), max_value=2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=5)
)
_keys = st.text(alphabet="ab~/0", max_size=3)
json_values = st.recursive(
    _scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(_keys, children, max_size=4),
    max_leaves=20,
)


@settings(max_examples=500, deadline=None)
@given(json_values, json_values)
def test_applying_the_diff_yields_the_target(a: Any, b: Any) -> None:
    ops = diff(a, b)
    assert json_equal(apply_patch(ops, a), b)
    # the patch is plain JSON and does not alias the target
    assert json.loads(json.dumps(ops)) == ops


@settings(max_examples=200, deadline=None)
@given(json_values)
def test_no_change_no_patch(a: Any) -> None:
    assert diff(a, json.loads(json.dumps(a))) == []


def test_diff_is_small_and_exact_where_it_matters() -> None:
    assert escape("a/b~c") == "a~1b~0c"
    assert diff({"a": 1}, {"a": True}) == [{"op": "replace", "path": "/a", "value": True}]
    assert diff({"a": 1}, {"a": 1.0}) == [{"op": "replace", "path": "/a", "value": 1.0}]
    # appending to a list is one add, not a rewrite of the list
    assert diff({"l": [1, 2]}, {"l": [1, 2, 3]}) == [{"op": "add", "path": "/l/2", "value": 3}]
    # inserting at the front replaces the list rather than shifting every element
    assert diff({"l": [1, 2]}, {"l": [0, 1, 2]}) == [
        {"op": "replace", "path": "/l", "value": [0, 1, 2]}
    ]
    with pytest.raises(ValueError, match="copy_object"):
        obj = pod()
        patched(obj, obj)


# --- the server ------------------------------------------------------------------------


@pytest.mark.anyio
async def test_mutation_is_returned_as_a_base64_json_patch(cert_dir: SecretVolume, ca: CA) -> None:
    original = pod(app="x")
    async with running(make_server(cert_dir), ca) as srv:
        r = await srv.post("/mutate", review(original, uid="abc"))
    assert r.status_code == 200
    body = r.json()
    assert (body["apiVersion"], body["kind"]) == ("admission.k8s.io/v1", "AdmissionReview")
    response = body["response"]
    assert response["uid"] == "abc"
    assert response["allowed"] is True
    assert response["warnings"] == ["injected devices"]
    ops = decode_patch(response)
    assert {"op": "add", "path": "/metadata/labels/example.com~1dev~0ice", "value": "gpu"} in ops
    mutated = apply_patch(ops, original)
    assert mutated["metadata"]["labels"] == {"app": "x", "example.com/dev~ice": "gpu"}
    assert mutated["spec"]["containers"][0]["env"] == [{"name": "VISIBLE_DEVICES", "value": "0,1"}]


def test_one_response_answers_many_reviews_each_with_its_own_uid_and_the_patch() -> None:
    """A handler may keep a response and return it again (a remembered decision): each
    review carries its own uid and the patch, which follows a patch list set anew."""
    ops = [{"op": "add", "path": "/metadata/labels/a", "value": "ü"}]
    response = patch_ops(ops, warnings=["w"])
    first, second = response.to_review("u1"), response.to_review("u2")
    assert (first["response"]["uid"], second["response"]["uid"]) == ("u1", "u2")
    assert decode_patch(first["response"]) == decode_patch(second["response"]) == ops
    assert first["response"]["patch"] == response.encoded_patch()
    response.patch = [{"op": "remove", "path": "/metadata/labels/a"}]
    assert decode_patch(response.to_review("u3")["response"]) == response.patch
    assert patch_ops([]).encoded_patch() == ""
    assert "patch" not in allowed().to_review("u")["response"]


@pytest.mark.anyio
async def test_validator_allows_and_denies_with_message(cert_dir: SecretVolume, ca: CA) -> None:
    async with running(make_server(cert_dir), ca) as srv:
        ok = (await srv.post("/validate", review(operation="CREATE"))).json()["response"]
        no = (await srv.post("/validate", review(operation="DELETE"))).json()["response"]
        deep = (await srv.post("/denies", review())).json()["response"]
    assert ok["allowed"] is True and ok["warnings"] == ["looks fine"]
    assert "patch" not in ok
    assert no["allowed"] is False
    assert no["status"] == {
        "code": 403,
        "message": "group has active pods: ns/a, ns/b",
        "reason": "Forbidden",
    }
    assert deep["allowed"] is False
    assert deep["status"] == {
        "code": 404,
        "message": "group g does not exist",
        "reason": "NotFound",
    }


@pytest.mark.anyio
async def test_failing_handlers_deny_with_500_and_timeouts_say_so(
    cert_dir: SecretVolume, ca: CA
) -> None:
    async with running(make_server(cert_dir), ca) as srv:
        crash = (await srv.post("/raises", review())).json()["response"]
        own_timeout = (await srv.post("/times-out-itself", review())).json()["response"]
        bad_validator = (await srv.post("/patching-validator", review())).json()["response"]
        slow = (await srv.post("/hangs", review())).json()["response"]
        # the API server's announced deadline (?timeout=) shortens ours (10 s by default)
        srv.server.register("/hangs-long", hangs)
        announced = (await srv.post("/hangs-long?timeout=300ms", review())).json()["response"]
        assert (await srv.post("/mutate", review())).json()["response"]["allowed"] is True
    assert crash["allowed"] is False
    assert crash["status"]["code"] == 500
    assert crash["status"]["message"] == "internal error: RuntimeError: database on fire"
    # a TimeoutError of the handler's own is its failure, not the webhook's deadline
    assert own_timeout["status"]["code"] == 500
    assert own_timeout["status"]["message"] == (
        "internal error: TimeoutError: the database did not answer"
    )
    assert bad_validator["allowed"] is False and bad_validator["status"]["code"] == 500
    assert "may not return a patch" in bad_validator["status"]["message"]
    for timed_out in (slow, announced):
        assert timed_out["allowed"] is False
        assert timed_out["status"]["code"] == 504
        assert "timed out" in timed_out["status"]["message"]


@pytest.mark.anyio
async def test_handlers_that_wait_are_answered_or_stopped_like_any_other() -> None:
    """A handler that decides at once runs with no timer; one that waits gets the deadline
    for the rest: it answers, fails by its own timeout (500), overruns (504), or is
    cancelled with its request (it sees the cancellation where it waits)."""
    body = json.dumps(review()).encode()
    seen: list[str] = []

    async def waits_then_answers(request: AdmissionRequest) -> AdmissionResponse:
        for _ in range(3):
            await anyio.lowlevel.checkpoint()
        await anyio.sleep(0.01)
        return allowed(f"decided on {request.name} after waiting")

    async def waits_then_times_out_itself(request: AdmissionRequest) -> AdmissionResponse:
        await anyio.lowlevel.checkpoint()
        raise TimeoutError("the database did not answer")

    async def waits_forever(request: AdmissionRequest) -> AdmissionResponse:
        try:
            await anyio.sleep_forever()  # its first wait
        except BaseException as exc:
            seen.append(type(exc).__name__)
            raise
        raise AssertionError

    waited = (await Webhook(waits_then_answers).review(body))["response"]
    assert waited["allowed"] is True
    assert waited["status"]["message"] == "decided on p after waiting"
    own = (await Webhook(waits_then_times_out_itself).review(body))["response"]
    assert own["status"]["code"] == 500
    assert own["status"]["message"] == "internal error: TimeoutError: the database did not answer"
    overran = (await Webhook(waits_forever, timeout=0.05).review(body))["response"]
    assert overran["status"]["code"] == 504
    assert seen == ["CancelledError"]  # the deadline's cancellation reached the handler
    async with anyio.create_task_group() as tg:
        tg.start_soon(Webhook(waits_forever).review, body)
        await anyio.sleep(0.05)
        tg.cancel_scope.cancel()  # the client went away
    assert seen == ["CancelledError", "CancelledError"]


@pytest.mark.anyio
async def test_requests_that_are_not_reviews_get_clean_http_errors(
    cert_dir: SecretVolume, ca: CA
) -> None:
    server = make_server(cert_dir, max_body_bytes=64 * 1024)
    wrong_kind = review() | {"kind": "Pod"}
    old_version = review() | {"apiVersion": "admission.k8s.io/v1beta1"}
    no_uid = review()
    del no_uid["request"]["uid"]
    no_request = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}
    async with running(server, ca) as srv, srv.client() as client:
        for body in (wrong_kind, old_version, no_uid, no_request, [1, 2], "text"):
            r = await client.post("/validate", json=body)
            assert r.status_code == 400, body
            assert r.json()["kind"] == "Status" and r.json()["code"] == 400
        as_json = {"content-type": "application/json"}
        for raw in (b"{not json", b"", b"\xff\xfe"):
            r = await client.post("/validate", content=raw, headers=as_json)
            assert r.status_code == 400, raw
        as_text = {"content-type": "text/plain"}
        assert (await client.post("/validate", content=b"{}", headers=as_text)).status_code == 415
        r = await client.get("/validate")
        assert r.status_code == 405 and r.headers["allow"] == "POST"
        huge = review(pod(big="x" * 100_000))
        assert (await client.post("/validate", json=huge)).status_code == 413
        assert (await client.post("/nowhere", json=review())).status_code == 404
        # and it still serves real reviews, on the same client
        r = await client.post("/validate", json=review())
        assert r.status_code == 200 and r.json()["response"]["allowed"] is True


@pytest.mark.anyio
async def test_h2_is_never_negotiated_and_http11_is_served(cert_dir: SecretVolume, ca: CA) -> None:
    """Go clients (the API server) offer h2 first; the server picks HTTP/1.1 (HTTP/2 is
    off, as in kubebuilder's scaffold since the Rapid Reset CVEs)."""
    async with running(make_server(cert_dir), ca) as srv:
        stream = await anyio.connect_tcp(
            "127.0.0.1",
            srv.server.port,
            ssl_context=ca.client_context(),
            tls_standard_compatible=False,  # HTTP needs no close_notify
        )
        async with stream:
            assert stream.extra(TLSAttribute.alpn_protocol) == "http/1.1"
        # offers h2 in ALPN, as Go clients do (httpx would fail on an h2 answer)
        async with httpx.AsyncClient(verify=ca.client_context()) as client:
            r = await client.post(f"{srv.url}/validate", json=review(pod()))
            assert r.http_version == "HTTP/1.1"
            assert r.json()["response"]["allowed"] is True


@pytest.mark.anyio
async def test_no_session_ticket_is_issued(cert_dir: SecretVolume, ca: CA) -> None:
    """The API server (client-go) never resumes a TLS session, so a ticket is wasted work."""
    async with running(make_server(cert_dir), ca) as srv:
        stream = await anyio.connect_tcp(
            "127.0.0.1",
            srv.server.port,
            ssl_context=ca.client_context(),
            tls_standard_compatible=False,
        )
        async with stream:
            await stream.send(b"GET /validate HTTP/1.1\r\nHost: x\r\n\r\n")
            await stream.receive()  # the answer, sent after any ticket (TLS 1.3)
            ssl_object = stream.extra(TLSAttribute.ssl_object)
            assert ssl_object.version() == "TLSv1.3"
            assert ssl_object.session is not None and not ssl_object.session.has_ticket


@pytest.mark.anyio
async def test_a_rotated_certificate_is_used_for_new_connections(
    cert_dir: SecretVolume, ca: CA
) -> None:
    ca2 = CA("test-ca-2")
    async with running(make_server(cert_dir), ca) as srv:
        async with srv.client(ca) as old_client:
            assert (await old_client.post("/validate", json=review())).status_code == 200

            crt, key = ca2.issue()
            cert_dir.write({"tls.crt": crt, "tls.key": key})

            # the kept-alive connection goes on with the certificate it negotiated
            assert (await old_client.post("/validate", json=review())).status_code == 200
        async with srv.client(ca2) as new_client:
            assert (await new_client.post("/validate", json=review())).status_code == 200
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            async with srv.client(ca) as stale_client:
                await stale_client.post("/validate", json=review())

        # a broken pair (key of another certificate) is refused; the last good one stays
        crt3, _ = CA("test-ca-3").issue()
        cert_dir.write({"tls.crt": crt3, "tls.key": key})
        async with srv.client(ca2) as client:
            assert (await client.post("/validate", json=review())).status_code == 200


def served_certificate(server: ssl.SSLContext, client: ssl.SSLContext | None = None) -> bytes:
    """The certificate (DER) a handshake with ``server`` presents; ``b""`` if it fails.
    ``client`` verifies nothing by default."""
    if client is None:
        client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        client.check_hostname, client.verify_mode = False, ssl.CERT_NONE
    to_server, to_client = ssl.MemoryBIO(), ssl.MemoryBIO()
    ours = client.wrap_bio(to_client, to_server)
    theirs = server.wrap_bio(to_server, to_client, server_side=True)
    done = {ours: False, theirs: False}
    for _ in range(10):
        for side in (ours, theirs):
            try:
                side.do_handshake()
                done[side] = True
            except ssl.SSLWantReadError:
                pass
            except ssl.SSLError:
                return b""
        if all(done.values()):
            return ours.getpeercert(binary_form=True) or b""
    raise AssertionError("the handshake did not finish")


def der(pem: bytes) -> bytes:
    return ssl.PEM_cert_to_DER_cert(pem.decode())


def test_cert_watcher_reloads_on_content_change_only(cert_dir: SecretVolume, ca: CA) -> None:
    watcher = CertWatcher(cert_dir.root / "tls.crt", cert_dir.root / "tls.key", min_interval=0)
    live = watcher()
    first = served_certificate(live)
    assert first == der((cert_dir.root / "tls.crt").read_bytes())
    assert not watcher.refresh()  # same content: nothing re-loaded
    crt, key = CA("other").issue()

    (cert_dir.root / "..data" / "tls.crt").write_bytes(crt)  # half an update...
    assert watcher() is live and not watcher.refresh()  # ...does not load (key mismatch)
    assert served_certificate(live) == first  # and the old pair is still served
    (cert_dir.root / "..data" / "tls.key").write_bytes(key)
    assert watcher() is live  # the listener keeps its context; handshakes get the new pair
    assert served_certificate(live) == der(crt)

    lazy = CertWatcher(cert_dir.root / "tls.crt", cert_dir.root / "tls.key", min_interval=3600)
    context = lazy()
    new_crt, new_key = ca.issue()
    cert_dir.write({"tls.crt": new_crt, "tls.key": new_key})
    assert lazy() is context and served_certificate(context) == der(crt)  # not looked at yet
    assert lazy.refresh() and served_certificate(lazy()) == der(new_crt)

    with pytest.raises(RuntimeError):
        CertWatcher(cert_dir.root / "missing.crt", cert_dir.root / "tls.key")


def test_a_loaded_certificate_is_logged_by_its_fingerprint(
    cert_dir: SecretVolume, ca: CA, caplog: pytest.LogCaptureFixture
) -> None:
    """The log names the certificate as ``openssl x509 -fingerprint -sha256`` does, the
    first of a chain; text that holds no certificate gets ``?``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes

    crt, key = ca.issue()
    chain = crt + CA("another").issue()[0]
    cert_dir.write({"tls.crt": chain, "tls.key": key})
    expected = x509.load_pem_x509_certificate(crt).fingerprint(hashes.SHA256()).hex(":")
    with caplog.at_level(logging.INFO, logger="sdgruntime.webhook.certs"):
        CertWatcher(cert_dir.root / "tls.crt", cert_dir.root / "tls.key")
    assert f"SHA-256 fingerprint {expected.upper()}" in caplog.text
    assert fingerprint(b"no certificate here") == "?"
    assert fingerprint(b"-----BEGIN CERTIFICATE-----\n!!\n-----END CERTIFICATE-----") == "?"


def test_a_new_key_type_replaces_the_old_certificate_for_every_client(
    cert_dir: SecretVolume, ca: CA
) -> None:
    """OpenSSL keeps one certificate per key type in a context: after an ECDSA -> RSA
    rotation, a client that takes only ECDSA must not be served the old certificate."""
    watcher = CertWatcher(cert_dir.root / "tls.crt", cert_dir.root / "tls.key", min_interval=0)
    live = watcher()
    rsa_crt, rsa_key = rsa_pair()
    cert_dir.write({"tls.crt": rsa_crt, "tls.key": rsa_key})
    assert watcher() is live
    assert served_certificate(live) == der(rsa_crt)
    ecdsa_only = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ecdsa_only.check_hostname, ecdsa_only.verify_mode = False, ssl.CERT_NONE
    ecdsa_only.maximum_version = ssl.TLSVersion.TLSv1_2  # ciphers name the key type
    ecdsa_only.set_ciphers("ECDHE-ECDSA-AES128-GCM-SHA256")
    assert served_certificate(live, ecdsa_only) in (b"", der(rsa_crt))
    crt, key = ca.issue()  # and back to ECDSA
    cert_dir.write({"tls.crt": crt, "tls.key": key})
    assert served_certificate(watcher(), ecdsa_only) == der(crt)


def rsa_pair() -> tuple[bytes, bytes]:
    """A self-signed RSA serving pair for 127.0.0.1."""
    import datetime as dt
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "rsa")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


@pytest.mark.anyio
async def test_serve_fails_fast_without_a_certificate(tmp_path: Path) -> None:
    server = WebhookServer("127.0.0.1", 0, cert_dir=tmp_path)
    assert not server.ready()
    with pytest.raises(RuntimeError, match="serving certificate"):
        await server.serve()


@pytest.mark.anyio
async def test_ready_and_metrics_report_the_webhooks(cert_dir: SecretVolume, ca: CA) -> None:
    def sample(name: str, **labels: str) -> float:
        return metrics.REGISTRY.get_sample_value(name, labels) or 0.0

    server = make_server(cert_dir)
    assert not server.ready()
    ok_before = sample("controller_runtime_webhook_requests_total", webhook="/mutate", code="200")
    bad_before = sample("controller_runtime_webhook_requests_total", webhook="/mutate", code="405")
    seen_before = sample("controller_runtime_webhook_latency_seconds_count", webhook="/mutate")
    async with running(server, ca) as srv, running_metrics() as metrics_url:
        assert server.ready()
        await srv.post("/mutate", review())
        await srv.post("/mutate", review())
        async with srv.client() as client:
            await client.get("/mutate")
        async with httpx.AsyncClient() as client:
            text = (await client.get(metrics_url)).text
    assert not server.ready()
    assert sample("controller_runtime_webhook_requests_total", webhook="/mutate", code="200") == (
        ok_before + 2
    )
    assert sample("controller_runtime_webhook_requests_total", webhook="/mutate", code="405") == (
        bad_before + 1
    )
    assert sample("controller_runtime_webhook_latency_seconds_count", webhook="/mutate") == (
        seen_before + 3
    )
    assert sample("controller_runtime_webhook_requests_in_flight", webhook="/mutate") == 0
    exposed = [line for line in text.splitlines() if 'webhook="/mutate"' in line]
    for name in (
        "controller_runtime_webhook_requests_total{",
        "controller_runtime_webhook_latency_seconds_bucket{",
        "controller_runtime_webhook_requests_in_flight{",
    ):
        assert any(line.startswith(name) for line in exposed), name


@asynccontextmanager
async def running_metrics() -> AsyncIterator[str]:
    async with anyio.create_task_group() as tg:
        port = await tg.start(MetricsServer("127.0.0.1:0").serve)
        yield f"http://127.0.0.1:{port}/metrics"
        tg.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("10s", 10.0),
        ("1m30s", 90.0),
        ("250ms", 0.25),
        ("1.5s", 1.5),
        ("", None),
        ("10", None),
        ("s", None),
        ("0s", None),
    ],
)
def test_api_server_timeout_parameter_is_read_as_a_go_duration(
    text: str, seconds: float | None
) -> None:
    from sdgruntime.webhook.server import _go_duration

    assert _go_duration(text) == seconds


def _with(path: str, value: Any) -> bytes:
    """A valid review with ``request.<path>`` (dotted) set to ``value``."""
    body = review()
    *parents, last = path.split(".")
    target = body["request"]
    for key in parents:
        target = target.setdefault(key, {})
    target[last] = value
    return json.dumps(body).encode()


def _without(key: str) -> bytes:
    body = review()
    del body["request"][key]
    return json.dumps(body).encode()


_DEEP = "[" * 100_000  # truncated, even: json gives up long before the end
_PREFIX = '{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":'


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"", "empty"),
        (b"\xff\xfe{}", "not JSON"),
        (json.dumps(review()).encode("utf-16"), "not JSON"),
        (b'{"a": "\xed\xa0\x80"}', "not JSON"),  # an encoded surrogate is not UTF-8
        (json.dumps(review())[:-7].encode(), "not JSON"),
        (b'{"a": NaN}', "not JSON"),
        (b'{"a": 1e999}', "out of range"),
        (b"1" * 5000, "not JSON"),  # beyond Python's int digits limit
        ((_PREFIX + _DEEP).encode(), "nests deeper than 100 levels"),
        ((_PREFIX + "[" * 600 + "]" * 600 + "}").encode(), "nests deeper than 100 levels"),
        (_with("object", {"a": json.loads("[" * 98 + "]" * 98)}), "nests deeper"),
        (b"[]", "JSON array, not an object"),
        (b'"review"', "JSON string, not an object"),
        (b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}', "has no request"),
        (b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":[]}', "array"),
        (json.dumps(review() | {"apiVersion": ["v1"]}).encode(), "apiVersion=a JSON array"),
        (_without("uid"), "request.uid must be a non-empty string"),
        (_with("uid", ""), "request.uid must be a non-empty string"),
        (_with("uid", 42), "request.uid must be a non-empty string, got 42"),
        (_without("kind"), "request.kind must be an object"),
        (_with("kind", "Pod"), 'request.kind must be an object of group/version/kind, got "Pod"'),
        (_with("kind.kind", ["Pod"]), "request.kind.kind must be a string, got a JSON array"),
        (_with("kind.version", 0), "request.kind.version must be a string, got 0"),
        (_with("resource", ["pods"]), "request.resource must be an object"),
        (_with("resource", 7), "request.resource must be an object"),
        (_with("resource.resource", {}), "request.resource.resource must be a string"),
        (_with("requestKind", "Pod"), "request.requestKind must be an object"),
        (_with("requestResource.group", 1), "request.requestResource.group must be a string"),
        (_without("operation"), "request.operation must be one of CREATE, UPDATE"),
        (_with("operation", "create"), 'got "create"'),
        (_with("operation", "X" * 1000), "..."),  # the reason stays short
        (_with("operation", ["CREATE"]), "request.operation must be one of"),
        (_with("name", 7), "request.name must be a string"),
        (_with("namespace", False), "request.namespace must be a string"),
        (_with("subResource", []), "request.subResource must be a string"),
        (_with("object", "pod"), "request.object must be an object or null"),
        (_with("object", []), "request.object must be an object or null"),
        (_with("oldObject", 0), "request.oldObject must be an object or null"),
        (_with("options", "x"), "request.options must be an object or null"),
        (_with("dryRun", "true"), "request.dryRun must be a bool"),
        (_with("dryRun", 0), "request.dryRun must be a bool, got 0"),
        (_with("userInfo", "alice"), "request.userInfo must be an object"),
        (_with("userInfo.username", ["alice"]), "request.userInfo.username must be a string"),
        (_with("userInfo.uid", 5), "request.userInfo.uid must be a string"),
        (_with("userInfo.groups", "admins"), "request.userInfo.groups must be a list of strings"),
        (_with("userInfo.groups", [1]), "request.userInfo.groups must be a list of strings"),
        (_with("userInfo.extra", []), "request.userInfo.extra must be an object"),
        (_with("userInfo.extra", {"k": "v"}), 'request.userInfo.extra["k"] must be a list'),
    ],
)
def test_an_unreadable_review_is_refused_with_its_reason(body: bytes, reason: str) -> None:
    with pytest.raises(ReviewError) as info:
        parse_review(body)
    assert info.value.status == 400
    assert reason in info.value.message
    assert len(info.value.message) < 200


def test_brackets_in_strings_do_not_make_a_review_too_deep() -> None:
    """The depth bound counts the body's '{' and '[' before it walks the object: brackets
    inside strings may pass the limit, yet only the real nesting refuses a review."""
    shallow = {"a": json.loads("[" * 90 + "]" * 90), "note": "[{" * 500}
    request = parse_review(_with("object", shallow))
    assert request.object == shallow


def test_reviews_as_go_encodes_them_are_readable() -> None:
    """``null`` and absent optional fields (Go's zero values), unknown fields and the
    deepest allowed object pass; ``kind``/``resource`` come out as their three strings."""
    body = review(pod())
    request = body["request"]
    for key in ("name", "namespace", "subResource", "oldObject", "options", "dryRun"):
        request[key] = None
    request["userInfo"] = {"username": "u", "groups": None, "extra": {"scopes": None}}
    request["kind"] = {"kind": "Pod", "version": None, "future": 1}
    request["requestKind"] = None
    request["someFutureField"] = {"x": [1]}
    request["object"]["deep"] = json.loads("[" * 96 + "]" * 96)  # review depth 100
    parsed = parse_review(json.dumps(body).encode())
    assert parsed.kind == {"group": "", "version": "", "kind": "Pod"}
    assert parsed.resource == {"group": "", "version": "v1", "resource": "pods"}
    assert (parsed.name, parsed.namespace, parsed.dry_run, parsed.old_object) == (
        "",
        "",
        False,
        None,
    )
    assert parsed.raw["someFutureField"] == {"x": [1]}
    del request["userInfo"]
    del request["object"]  # a DELETE carries oldObject only
    request["operation"] = "DELETE"
    assert parse_review(json.dumps(body).encode()).object is None


class ReadsLabels:
    """A mutator that trusts the object's shape, as real ones do."""

    async def mutate(self, request: AdmissionRequest) -> AdmissionResponse:
        obj = request.copy_object()
        team = obj["metadata"]["labels"].get("team")
        for container in obj["spec"]["containers"]:
            container.setdefault("env", []).append({"name": "TEAM", "value": team})
        return patched(request.object, obj)


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("obj", "error"),
    [
        ({"metadata": {"labels": ["team"]}, "spec": {}}, "AttributeError"),
        ({"metadata": {"labels": {}}, "spec": {"containers": "c"}}, "AttributeError"),
        ({"metadata": {"labels": {}}, "spec": {"containers": [1]}}, "AttributeError"),
        ({"metadata": {"labels": {}}}, "KeyError: 'spec'"),
        ({"metadata": [], "spec": {}}, "TypeError"),
    ],
)
async def test_a_handler_that_cannot_read_the_object_answers_400_with_why(
    cert_dir: SecretVolume, ca: CA, caplog: pytest.LogCaptureFixture, obj: Any, error: str
) -> None:
    server = make_server(cert_dir)
    server.register("/reads-labels", ReadsLabels())
    async with running(server, ca) as srv:
        caplog.clear()
        r = await srv.post("/reads-labels", review(obj))
        assert r.status_code == 400
        status = r.json()
        assert status["kind"] == "Status" and status["code"] == 400
        assert status["message"].startswith(f"the object could not be read: {error}")
        warnings = [rec for rec in caplog.records if rec.levelname == "WARNING"]
        assert len(warnings) == 1 and not any(rec.exc_info for rec in caplog.records)
        line = warnings[0].getMessage()
        assert "/reads-labels" in line and "in mutate" in line and "uid=uid-1" in line
        good = pod(team="a")
        assert (await srv.post("/reads-labels", review(good))).json()["response"]["allowed"]


@pytest.mark.anyio
async def test_strings_that_cannot_be_utf8_still_get_a_valid_answer(
    cert_dir: SecretVolume, ca: CA
) -> None:
    """A lone surrogate is a valid JSON escape (json.dumps writes one for these strings):
    echoing it in the uid or a patch must not break the answer."""
    server = make_server(cert_dir)
    server.register("/reads-labels", ReadsLabels())
    body = json.dumps(review(pod(team="\ud83d"), uid="u\udc00")).encode()
    async with running(server, ca) as srv, srv.client() as client:
        as_json = {"content-type": "application/json"}
        r = await client.post("/reads-labels", content=body, headers=as_json)
    assert r.status_code == 200
    response = json.loads(r.content)["response"]
    assert response["uid"] == "u\udc00" and response["allowed"] is True
    env = {
        "op": "add",
        "path": "/spec/containers/0/env",
        "value": [{"name": "TEAM", "value": "\ud83d"}],
    }
    assert decode_patch(response) == [env]


@pytest.mark.anyio
async def test_connections_over_the_limit_get_503_over_tls(cert_dir: SecretVolume, ca: CA) -> None:
    async with running(make_server(cert_dir, max_connections=2), ca) as srv:
        async with srv.client() as first, srv.client() as second:
            for client in (first, second):  # two kept-alive connections
                assert (await client.post("/validate", json=review())).status_code == 200
            async with srv.client() as third:
                r = await third.post("/validate", json=review())
                assert r.status_code == 503
                assert r.text == "too many connections (limit 2)\n"
                assert r.headers["retry-after"] == "1"
            for client in (first, second):
                assert (await client.post("/validate", json=review())).status_code == 200
        with anyio.fail_after(5):  # both closed: room again
            while srv.server._http.connections:  # noqa: ASYNC110 - polls a counter
                await anyio.sleep(0.01)
        assert (await srv.post("/validate", review())).status_code == 200


@pytest.mark.anyio
async def test_a_client_that_never_completes_the_handshake_is_dropped(
    cert_dir: SecretVolume, ca: CA
) -> None:
    async with running(make_server(cert_dir, request_timeout=0.3), ca) as srv:
        with anyio.fail_after(5):
            async with await anyio.connect_tcp("127.0.0.1", srv.server.port) as stream:
                await stream.send(b"\x16\x03\x01")  # the start of a ClientHello, no more
                with pytest.raises((anyio.EndOfStream, anyio.BrokenResourceError)):
                    await stream.receive()
        assert srv.server._http.connections == 0
        assert (await srv.post("/validate", review())).status_code == 200


@pytest.mark.anyio
async def test_the_manager_option_sets_the_connection_limit(cert_dir: SecretVolume, ca: CA) -> None:
    from pydantic import ValidationError

    from sdgruntime.manager import Manager, ManagerOptions

    with pytest.raises(ValidationError):
        ManagerOptions(webhook_max_connections=0)
    options = ManagerOptions(
        webhook_host="127.0.0.1",
        webhook_port=0,
        webhook_cert_dir=str(cert_dir.root),
        webhook_max_connections=1,
    )
    server = Manager(client=as_client(FakeClient()), options=options).webhook_server
    server.register("/validate", NoDelete())
    async with running(server, ca) as srv, srv.client() as first:
        assert (await first.post("/validate", json=review())).status_code == 200
        async with srv.client() as second:
            r = await second.post("/validate", json=review())
        assert r.status_code == 503 and r.text == "too many connections (limit 1)\n"

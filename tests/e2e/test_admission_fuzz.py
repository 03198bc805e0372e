"""Thousands of generated malformed AdmissionReviews sent to SDG's real webhook port over
TLS: every one is answered 4xx with a reason (never a 500), a malformed *object* inside a
well-formed review gets 400 or a verdict, and the server goes on serving.

What counts as malformed is written here from the Go types of ``admission.k8s.io/v1``
(``null`` is a Go zero value, so it is only wrong where a value is required), not from
the implementation. Hypothesis runs in a worker thread with a blocking client, so the
manager keeps serving on the event loop meanwhile.
"""

from __future__ import annotations

import json
import ssl
import time
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api.constants import SDG_KIND
from controllers.app import GROUP_DEFAULTER_PATH, GROUP_WEBHOOK_PATH, POD_WEBHOOK_PATH
from sdgruntime.client import Client
from sdgruntime.envtest import ControlPlane
from sdgruntime.kinds import PODS
from tests.e2e.harness import GPU, add_node, env_of, group, pod, run_sdg, wait_bound

pytestmark = [pytest.mark.integration, pytest.mark.anyio, pytest.mark.timeout(240)]

PATHS = (POD_WEBHOOK_PATH, GROUP_WEBHOOK_PATH, GROUP_DEFAULTER_PATH)
GROUP = "fuzz"
OPERATIONS = ("CREATE", "UPDATE", "DELETE", "CONNECT")
FUZZ_SECONDS = 50.0  # all strategies together; examples past it are skipped
MAX_BODY = 7 * 1024 * 1024  # the webhook server's default body cap

Doc = dict[str, Any]
Path = tuple[str | int, ...]


# --- well-formed reviews, as the API server sends them -----------------------------------


def pod_obj() -> Doc:
    obj = pod("fuzzed", GROUP)
    obj["metadata"]["namespace"] = "ns"
    obj["metadata"]["labels"] = {"app": "a"}
    obj["spec"]["containers"][0]["env"] = [{"name": "A", "value": "1"}]
    obj["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1"}}
    obj["spec"]["initContainers"] = [{"name": "init", "image": "busybox"}]
    obj["spec"]["nodeSelector"] = {"zone": "a"}
    return obj


def group_obj(bound: bool = False) -> Doc:
    obj = group(GROUP, {GPU: 1}, nodeSelector={"zone": "a"})
    if bound:
        obj["status"] = {"phase": "Bound", "nodeName": "n1", "conditions": [{"type": "x"}]}
    return obj


def review(kind: str, obj: Doc | None, old: Doc | None = None, operation: str = "CREATE") -> Doc:
    if kind == "Pod":
        gvk = {"group": "", "version": "v1", "kind": "Pod"}
        gvr = {"group": "", "version": "v1", "resource": "pods"}
    else:
        gvk = {"group": SDG_KIND.group, "version": SDG_KIND.version, "kind": SDG_KIND.kind}
        gvr = {"group": SDG_KIND.group, "version": SDG_KIND.version, "resource": SDG_KIND.plural}
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "0b7f6c0e-fuzz",
            "kind": gvk,
            "resource": gvr,
            "requestKind": gvk,
            "requestResource": gvr,
            "name": "fuzzed",
            "namespace": "ns" if kind == "Pod" else "",
            "operation": operation,
            "userInfo": {
                "username": "alice",
                "uid": "u-1",
                "groups": ["system:authenticated"],
                "extra": {"scopes": ["a"]},
            },
            "object": obj,
            "oldObject": old,
            "dryRun": False,
            "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"},
        },
    }


def base_reviews() -> list[Doc]:
    return [
        review("Pod", pod_obj()),
        review(SDG_KIND.kind, group_obj()),
        review(SDG_KIND.kind, group_obj(), group_obj(bound=True), "UPDATE"),
        review(SDG_KIND.kind, None, group_obj(bound=True), "DELETE"),
    ]


# --- what the envelope allows (admission.k8s.io/v1) --------------------------------------


def _str_or_null(v: Any) -> bool:
    return v is None or isinstance(v, str)


def _strings_or_null(v: Any) -> bool:
    return v is None or (isinstance(v, list) and all(isinstance(x, str) for x in v))


def _object_or_null(v: Any) -> bool:
    return v is None or isinstance(v, dict)


ENVELOPE: dict[Path, Callable[[Any], bool]] = {
    ("apiVersion",): lambda v: v == "admission.k8s.io/v1",
    ("kind",): lambda v: v == "AdmissionReview",
    ("request",): lambda v: isinstance(v, dict),
    ("request", "uid"): lambda v: isinstance(v, str) and v != "",
    ("request", "kind"): lambda v: isinstance(v, dict),
    ("request", "resource"): lambda v: isinstance(v, dict),
    ("request", "requestKind"): _object_or_null,
    ("request", "requestResource"): _object_or_null,
    ("request", "operation"): lambda v: isinstance(v, str) and v in OPERATIONS,
    ("request", "name"): _str_or_null,
    ("request", "namespace"): _str_or_null,
    ("request", "subResource"): _str_or_null,
    ("request", "requestSubResource"): _str_or_null,
    ("request", "object"): _object_or_null,
    ("request", "oldObject"): _object_or_null,
    ("request", "options"): _object_or_null,
    ("request", "dryRun"): lambda v: v is None or isinstance(v, bool),
    ("request", "userInfo"): _object_or_null,
    ("request", "userInfo", "username"): _str_or_null,
    ("request", "userInfo", "uid"): _str_or_null,
    ("request", "userInfo", "groups"): _strings_or_null,
    ("request", "userInfo", "groups", 0): lambda v: isinstance(v, str),
    ("request", "userInfo", "extra"): _object_or_null,
    ("request", "userInfo", "extra", "scopes"): _strings_or_null,
    ("request", "userInfo", "extra", "scopes", 0): lambda v: isinstance(v, str),
    **{("request", "kind", k): _str_or_null for k in ("group", "version", "kind")},
    **{("request", "resource", k): _str_or_null for k in ("group", "version", "resource")},
    **{("request", "requestKind", k): _str_or_null for k in ("group", "version", "kind")},
}
REQUIRED: list[Path] = [
    ("apiVersion",),
    ("kind",),
    ("request",),
    ("request", "uid"),
    ("request", "kind"),
    ("request", "resource"),
    ("request", "operation"),
]
REMOVE = object()

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
    # near misses of the values the envelope wants
    | st.sampled_from(["", "create", "CREATE ", "Create", "admission.k8s.io/v1beta1", "v1"])
)
json_any = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def set_path(doc: Any, path: Path, value: Any) -> None:
    """Sets (or with ``REMOVE`` deletes) ``path`` in ``doc``; a path whose parent is no
    longer a container (an earlier corruption replaced it) is left alone."""
    target = doc
    for key in path[:-1]:
        try:
            target = target[key]
        except (KeyError, IndexError, TypeError):
            return
    last = path[-1]
    if isinstance(target, dict) and isinstance(last, str):
        if value is REMOVE:
            target.pop(last, None)
        else:
            target[last] = value
    elif isinstance(target, list) and isinstance(last, int) and last < len(target):
        if value is REMOVE:
            del target[last]
        else:
            target[last] = value


def dumps(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


# --- strategies: each draws a request body that is not a readable AdmissionReview --------


@st.composite
def wrong_types(draw: st.DrawFn) -> bytes:
    """1-3 envelope fields, at any level, replaced by a value of a type the API does not
    allow there, or (if required) removed."""
    doc = draw(st.sampled_from(base_reviews()))
    locations = draw(st.lists(st.sampled_from(sorted(ENVELOPE, key=str)), min_size=1, max_size=3))
    for path in sorted(locations, key=len, reverse=True):  # deepest first: each stays wrong
        allowed = ENVELOPE[path]
        if path in REQUIRED and draw(st.booleans()):
            set_path(doc, path, REMOVE)
        else:
            set_path(doc, path, draw(json_any.filter(lambda v, ok=allowed: not ok(v))))
    return dumps(doc)


_DEEP_AT = [
    ("request",),
    ("request", "object"),
    ("request", "object", "metadata"),
    ("request", "oldObject"),
    ("request", "options"),
    ("request", "userInfo", "extra"),
    ("request", "someFutureField"),
    ("request", "kind", "kind"),
]


@st.composite
def deep_nesting(draw: st.DrawFn) -> bytes:
    """Arrays or objects nested 101 to 50 000 levels (so a review over 100 levels), closed
    or truncated, at places where an object, a string or anything is expected."""
    doc = draw(st.sampled_from(base_reviews()))
    depth = draw(st.integers(min_value=101, max_value=50_000))
    opener, closer = draw(st.sampled_from([("[", "]"), ('{"a":', "}"), ('{"a":[', "]}")]))
    closed = draw(st.booleans())
    deep = opener * depth + ("1" + closer * depth if closed else "")
    set_path(doc, draw(st.sampled_from(_DEEP_AT)), "__DEEP__")
    body = dumps(doc)
    if b'"__DEEP__"' not in body:  # the place did not exist (a DELETE has no object)
        set_path(doc, ("request", "someFutureField"), "__DEEP__")
        body = dumps(doc)
    return body.replace(b'"__DEEP__"', deep.encode())


garbage = st.one_of(
    st.binary(max_size=4096),
    st.text(max_size=512).map(str.encode),
    json_any.map(dumps),  # JSON, but not a review
)


@st.composite
def truncated(draw: st.DrawFn) -> bytes:
    """A well-formed review cut short, or with one byte that cannot be UTF-8 inserted
    (the reviews are ASCII, so any byte >= 0x80 alone is invalid)."""
    body = dumps(draw(st.sampled_from(base_reviews())))
    at = draw(st.integers(min_value=0, max_value=len(body) - 1))
    if draw(st.booleans()):
        return body[:at]
    return body[:at] + bytes([draw(st.integers(0x80, 0xFF))]) + body[at:]


@st.composite
def huge(draw: st.DrawFn) -> bytes:
    """A malformed review made 1-6 MiB large by one huge string (under the body cap)."""
    body = draw(wrong_types())
    size = draw(st.integers(min_value=1 << 20, max_value=6 << 20))
    where = draw(st.sampled_from(["object", "operation", "padding"]))
    doc = json.loads(body) if body.startswith(b"{") else None
    if not isinstance(doc, dict) or not isinstance(doc.get("request"), dict):
        return body + b" " * size  # padding keeps it malformed
    if where == "object" and isinstance(doc["request"].get("object"), dict):
        doc["request"]["object"]["huge"] = "x" * size
        return dumps(doc)
    if where == "operation":
        doc["request"]["operation"] = "C" * size  # malformed by this alone
        return dumps(doc)
    return body.replace(b"{", b'{"padding":"' + b"p" * size + b'",', 1)


def object_paths(obj: Any, prefix: Path = ()) -> Iterator[Path]:
    """Every key and index below the object's root."""
    items: Any = obj.items() if isinstance(obj, dict) else enumerate(obj)
    for key, value in items:
        yield (*prefix, key)
        if isinstance(value, dict | list):
            yield from object_paths(value, (*prefix, key))


@st.composite
def malformed_objects(draw: st.DrawFn) -> tuple[str, bytes]:
    """A well-formed envelope whose object (and old object) has 1-3 values at any depth
    replaced by arbitrary JSON: ``metadata.annotations`` a list, ``spec.containers`` a
    string... The API server never sends these; a handler may fail to read them."""
    doc = draw(st.sampled_from(base_reviews()))
    request = doc["request"]
    if request["kind"]["kind"] == "Pod":
        path = POD_WEBHOOK_PATH
    else:
        path = draw(st.sampled_from((GROUP_WEBHOOK_PATH, GROUP_DEFAULTER_PATH)))
    for key in ("object", "oldObject"):
        target = request[key]
        if target is None:
            continue
        candidates = list(object_paths(target))
        for where in draw(st.lists(st.sampled_from(candidates), min_size=1, max_size=3)):
            set_path(target, where, draw(json_any))
    return path, dumps(doc)


# --- checking the answers ----------------------------------------------------------------


def reason_of(r: httpx.Response) -> str:
    if r.headers.get("content-type", "").startswith("application/json"):
        status = r.json()
        assert status["kind"] == "Status" and status["code"] == r.status_code
        return str(status["message"])
    return r.text


def assert_refused(r: httpx.Response, body: bytes) -> None:
    assert 400 <= r.status_code < 500, (r.status_code, r.text[:300], body[:300])
    assert reason_of(r).strip(), (r.status_code, body[:300])


def assert_read_or_refused(r: httpx.Response, body: bytes) -> None:
    """A malformed object: 400 saying the object could not be read, or a verdict."""
    if r.status_code == 400:
        assert reason_of(r).startswith("the object could not be read: "), r.text[:300]
        return
    assert r.status_code == 200, (r.status_code, r.text[:300], body[:300])
    answer = r.json()["response"]
    assert answer["uid"] == "0b7f6c0e-fuzz" and isinstance(answer["allowed"], bool)
    assert answer.get("status", {}).get("code") != 500, (answer, body[:300])


# --- the tests ---------------------------------------------------------------------------


def _fuzz(port: int, ca_pem: bytes) -> tuple[dict[str, int], dict[int, int]]:
    """Runs every strategy (blocking; in a worker thread). Returns requests per kind and
    the HTTP statuses the malformed objects got."""
    context = ssl.create_default_context(cadata=ca_pem.decode())
    client = httpx.Client(
        base_url=f"https://127.0.0.1:{port}",
        verify=context,
        timeout=30,
        headers={"content-type": "application/json"},
    )
    sent: dict[str, int] = {}
    object_statuses: dict[int, int] = {}
    stop_at = time.monotonic() + FUZZ_SECONDS

    def post(path: str, body: bytes, kind: str) -> httpx.Response | None:
        if time.monotonic() > stop_at:
            return None
        sent[kind] = sent.get(kind, 0) + 1
        return client.post(f"{path}?timeout=10s", content=body)

    def refused_everywhere(kind: str) -> Callable[[bytes], None]:
        def check(body: bytes) -> None:
            for path in PATHS:
                r = post(path, body, kind)
                if r is not None:
                    assert_refused(r, body)

        return check

    common = settings(
        deadline=None,
        database=None,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.filter_too_much,
        ],
    )
    runs: list[tuple[str, st.SearchStrategy[bytes], int]] = [
        ("wrong types", wrong_types(), 1000),
        ("deep nesting", deep_nesting(), 200),
        ("garbage", garbage, 400),
        ("truncated", truncated(), 400),
        ("huge", huge(), 6),
    ]
    with client:
        for kind, strategy, examples in runs:
            settings(common, max_examples=examples)(given(strategy)(refused_everywhere(kind)))()

        @settings(common, max_examples=1000)
        @given(malformed_objects())
        def objects(case: tuple[str, bytes]) -> None:
            path, body = case
            r = post(path, body, "malformed objects")
            if r is not None:
                assert_read_or_refused(r, body)
                object_statuses[r.status_code] = object_statuses.get(r.status_code, 0) + 1

        objects()

        over_cap = b'{"apiVersion":"' + b"v" * MAX_BODY + b'"}'
        for path in PATHS:
            r = client.post(path, content=over_cap)
            assert r.status_code == 413 and "exceeds the limit" in r.text
    return sent, object_statuses


async def test_malformed_reviews_get_4xx_with_a_reason_and_the_server_keeps_serving(
    cluster: ControlPlane, client: Client, namespace: str
) -> None:
    await add_node(client, "n1", 2, labels={"zone": "a"})
    async with run_sdg(cluster) as sdg:
        # A bound group, so the pod mutator reads fuzzed pods all the way to the injection.
        await client.create(SDG_KIND, group_obj())
        await wait_bound(client, GROUP)
        port = sdg.manager.webhook_server.port
        started = time.monotonic()
        sent, statuses = await anyio.to_thread.run_sync(_fuzz, port, cluster.ca.cert_pem)
        took = time.monotonic() - started
        print(f"fuzz: {sum(sent.values())} requests in {took:.1f}s: {sent}; objects: {statuses}")
        assert sum(sent.values()) >= 3000, sent  # thousands actually reached the server

        # Still serving: well-formed reviews get verdicts, and the API server's own calls
        # go through (the pod gets its devices).
        context = ssl.create_default_context(cadata=cluster.ca.cert_pem.decode())
        async with httpx.AsyncClient(
            base_url=f"https://127.0.0.1:{port}", verify=context, timeout=10
        ) as https:
            for path, body in (
                (POD_WEBHOOK_PATH, review("Pod", pod_obj())),
                (GROUP_WEBHOOK_PATH, review(SDG_KIND.kind, group_obj())),
                (GROUP_DEFAULTER_PATH, review(SDG_KIND.kind, group_obj())),
            ):
                r = await https.post(path, json=body)
                assert r.status_code == 200, r.text
                assert r.json()["response"]["allowed"] is True, r.text
        created = await client.create(PODS, pod("after-fuzz", GROUP), namespace)
        assert env_of(created)["NVIDIA_VISIBLE_DEVICES"] in ("0", "1")

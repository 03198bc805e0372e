"""AdmissionReview ``admission.k8s.io/v1``: requests, responses and the review protocol.

A handler is an async ``(AdmissionRequest) -> AdmissionResponse``, a ``Mutator`` or a
``Validator`` (which may not return a patch: the API server would reject it). Responses:
``allowed``, ``denied``, ``patched``, ``patch_ops``, or ``raise Denied(...)``.
:meth:`Webhook.review` turns request bytes into the response: a handler that raises is a
denial with code 500, one that overruns a denial with code 504. Invariant: a handler sees
only a well-typed envelope (``parse_review`` checks it against the Go types); a body that
is not one, or a handler failing to read the object (``ObjectUnreadable``), raises
``ReviewError``, answered with HTTP 400.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import math
import traceback
import types
from collections.abc import Awaitable, Callable, Coroutine, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, cast, runtime_checkable

import orjson

from sdgruntime import jsoncodec
from sdgruntime._checks import is_async_callable, name_of
from sdgruntime.cache.store import json_copy
from sdgruntime.webhook.jsonpatch import Operation, diff

log = logging.getLogger(__name__)

API_VERSION = "admission.k8s.io/v1"
KIND = "AdmissionReview"
OPERATIONS = ("CREATE", "UPDATE", "DELETE", "CONNECT")
#: How deep a request body may nest (the review is level 1, so its object has 98).
#: Kubernetes objects are shallow: a Pod's deepest path (node affinity match expression
#: values) is about 10 levels, and CRDs have structural schemas. Bounding it far below
#: Python's recursion limit means no handler walking the object (copy, diff, its own
#: recursion) can hit a RecursionError, and the check itself is one iterative pass.
MAX_DEPTH = 100
#: Exceptions a handler raises when the object is not what the API would send: the
#: request is unreadable (HTTP 400), not a failure of ours (500).
READ_ERRORS: tuple[type[Exception], ...] = (
    TypeError,
    AttributeError,
    KeyError,
    IndexError,
    ValueError,
)


@dataclass(frozen=True, slots=True)
class AdmissionRequest:
    """The ``request`` of an AdmissionReview, with snake_case names.

    ``object`` is the object as sent (``None`` for DELETE); mutate a
    ``copy_object()`` and pass both to ``patched``. ``raw`` is the whole decoded
    ``request`` for fields not surfaced here.
    """

    uid: str
    operation: str  # CREATE, UPDATE, DELETE, CONNECT
    kind: dict[str, str]  # {"group", "version", "kind"}
    resource: dict[str, str]  # {"group", "version", "resource"}
    sub_resource: str
    name: str
    namespace: str
    user_info: dict[str, Any]
    object: dict[str, Any] | None
    old_object: dict[str, Any] | None
    dry_run: bool
    options: dict[str, Any] | None
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def from_dict(cls, request: Mapping[str, Any]) -> AdmissionRequest:
        """The request of a decoded ``request`` (checked by no one: see ``parse_review``);
        ``raw`` is a shallow copy of it."""
        return cls._of(dict(request))

    @classmethod
    def _of(cls, raw: dict[str, Any]) -> AdmissionRequest:
        """The request of ``raw``, kept as ``raw`` (the caller gives it up)."""
        get = raw.get
        return cls(
            raw["uid"],
            get("operation") or "",
            get("kind") or {},
            get("resource") or {},
            get("subResource") or "",
            get("name") or "",
            get("namespace") or "",
            get("userInfo") or {},
            get("object"),
            get("oldObject"),
            bool(get("dryRun")),
            get("options"),
            raw,
        )

    def copy_object(self) -> dict[str, Any]:
        """A deep copy of ``object`` to mutate (``{}`` when there is none)."""
        return json_copy(self.object) if self.object is not None else {}


@dataclass(slots=True)
class AdmissionResponse:
    """The verdict. ``code``/``message``/``reason`` become ``response.status``."""

    allowed: bool
    code: int | None = None
    message: str = ""
    reason: str = ""
    patch: list[Operation] | None = None
    warnings: list[str] = field(default_factory=list)
    audit_annotations: dict[str, str] = field(default_factory=dict)
    #: ``patch`` as a review carries it, and the list it was made from: a handler may
    #: answer many requests with one response (a decision it remembers), which then
    #: encodes its patch once. A patch list changed in place after that is not seen.
    _encoded: tuple[list[Operation], str] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    def encoded_patch(self) -> str:
        """``patch`` as a review carries it: its JSON, base64 (``""`` for no patch)."""
        patch = self.patch
        if not patch:
            return ""
        done = self._encoded
        if done is None or done[0] is not patch:
            # jsoncodec: a string with a lone surrogate (valid in a JSON escape) cannot fail
            done = self._encoded = (patch, base64.b64encode(jsoncodec.dumps(patch)).decode())
        return done[1]

    def to_review(self, uid: str) -> dict[str, Any]:
        """The complete response AdmissionReview for request ``uid``."""
        response: dict[str, Any] = {"uid": uid, "allowed": self.allowed}
        if not self.allowed or self.message or self.code is not None:
            status: dict[str, Any] = {"code": self.code or (200 if self.allowed else 403)}
            if self.message:
                status["message"] = self.message
            if self.reason:
                status["reason"] = self.reason
            response["status"] = status
        if self.allowed and self.patch:
            response["patchType"] = "JSONPatch"
            response["patch"] = self.encoded_patch()
        if self.warnings:
            response["warnings"] = list(self.warnings)
        if self.audit_annotations:
            response["auditAnnotations"] = dict(self.audit_annotations)
        return {"apiVersion": API_VERSION, "kind": KIND, "response": response}


def allowed(message: str = "", *, warnings: Sequence[str] = ()) -> AdmissionResponse:
    return AdmissionResponse(
        True, code=200 if message else None, message=message, warnings=list(warnings)
    )


def denied(
    message: str, code: int = 403, reason: str = "Forbidden", *, warnings: Sequence[str] = ()
) -> AdmissionResponse:
    """A denial; the API server shows ``message`` to the user as the reason."""
    return AdmissionResponse(
        False, code=code, message=message, reason=reason, warnings=list(warnings)
    )


def errored(code: int, message: str) -> AdmissionResponse:
    """A failure to decide (not a policy denial): code 4xx/5xx and what went wrong."""
    reason = "InternalError" if code >= 500 else "BadRequest"
    return AdmissionResponse(False, code=code, message=message, reason=reason)


def patch_ops(ops: Sequence[Operation], *, warnings: Sequence[str] = ()) -> AdmissionResponse:
    """Allowed with a JSON patch the handler built itself."""
    return AdmissionResponse(True, patch=list(ops) or None, warnings=list(warnings))


def patched(original: Any, mutated: Any, *, warnings: Sequence[str] = ()) -> AdmissionResponse:
    """Allowed with the JSON patch from ``original`` to ``mutated``.

    ``mutated`` must be a copy (``request.copy_object()``): passing the request's own
    object, edited in place, would diff it against itself and silently patch nothing.
    """
    if original is mutated and original is not None:
        raise ValueError(
            "patched(original, mutated) got the same object twice; mutate "
            "request.copy_object() instead of request.object"
        )
    return patch_ops(diff(original, mutated), warnings=warnings)


class Denied(Exception):
    """Raise from a handler to deny with ``message`` (as ``denied``), and ``warnings``."""

    def __init__(
        self,
        message: str,
        code: int = 403,
        reason: str = "Forbidden",
        *,
        warnings: Sequence[str] = (),
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.reason = reason
        self.warnings = list(warnings)


AdmissionHandler = Callable[[AdmissionRequest], Awaitable[AdmissionResponse]]


@runtime_checkable
class Mutator(Protocol):
    async def mutate(self, request: AdmissionRequest) -> AdmissionResponse: ...


@runtime_checkable
class Validator(Protocol):
    async def validate(self, request: AdmissionRequest) -> AdmissionResponse: ...


WebhookKind = Literal["mutating", "validating", "admission"]


class ReviewError(Exception):
    """The request is not a usable AdmissionReview: answer HTTP ``status``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class ObjectUnreadable(ReviewError):
    """The handler could not read the object it was given (HTTP 400). ``where`` is the
    source line that raised, for the log: a malformed object and a handler bug look the
    same from here, and the line tells them apart."""

    def __init__(self, error: Exception) -> None:
        super().__init__(400, f"the object could not be read: {_error_text(error)}")
        self.where = "?"
        for frame, line in traceback.walk_tb(error.__traceback__):  # to the innermost
            code = frame.f_code
            self.where = f"{Path(code.co_filename).name}:{line} in {code.co_name}"


class Webhook:
    """One admission endpoint: decodes the review, runs the handler with a deadline,
    and encodes the verdict."""

    def __init__(
        self,
        handler: Mutator | Validator | AdmissionHandler,
        *,
        name: str = "",
        timeout: float = 10.0,
    ) -> None:
        self.kind: WebhookKind
        self.handler: AdmissionHandler
        where = f" for {name}" if name else ""
        if isinstance(handler, type):
            raise TypeError(
                f"admission handler{where}: got the class {handler.__qualname__}; register "
                f"an instance, e.g. {handler.__qualname__}(...)"
            )
        if isinstance(handler, Mutator):
            self.kind, self.handler = "mutating", handler.mutate
            method = "async def mutate(self, request) -> AdmissionResponse"
        elif isinstance(handler, Validator):
            self.kind, self.handler = "validating", handler.validate
            method = "async def validate(self, request) -> AdmissionResponse"
        elif callable(handler):
            self.kind, self.handler = "admission", handler
            method = "async def handler(request) -> AdmissionResponse"
        else:
            raise TypeError(
                f"admission handler{where}: {handler!r} has no mutate(request) or "
                "validate(request) method and is not a function"
            )
        if not is_async_callable(self.handler):
            raise TypeError(
                f"admission handler{where}: {name_of(self.handler)} is not async; the "
                f"server awaits it, so define it as `{method}`"
            )
        self.name = name or getattr(handler, "__qualname__", type(handler).__qualname__)
        self.timeout = timeout

    async def review(self, body: bytes, *, max_seconds: float | None = None) -> dict[str, Any]:
        """The response AdmissionReview for the request AdmissionReview ``body``.

        ``max_seconds`` (if given) lowers the handler deadline, e.g. to stay within the
        deadline the API server announced.
        """
        request = parse_review(body)
        deadline = self.timeout if max_seconds is None else min(self.timeout, max_seconds)
        response = await self._decide(request, deadline)
        return response.to_review(request.uid)

    async def _decide(self, request: AdmissionRequest, deadline: float) -> AdmissionResponse:
        try:
            try:
                response = await _within(self.handler(request), deadline)
            except READ_ERRORS as exc:
                raise ObjectUnreadable(exc) from None
            except _Overran:
                log.warning(
                    "webhook %s: timed out after %.3gs on %s",
                    self.name,
                    deadline,
                    _describe(request),
                )
                return denied(
                    f"admission webhook timed out after {deadline:.3g}s before deciding",
                    code=504,
                    reason="Timeout",
                )
            if not isinstance(response, AdmissionResponse):
                raise TypeError(
                    f"handler returned {type(response).__name__}, not AdmissionResponse"
                )
            if self.kind == "validating" and response.patch:
                raise TypeError("a validating webhook may not return a patch")
        except Denied as exc:
            return denied(exc.message, exc.code, exc.reason, warnings=exc.warnings)
        except ObjectUnreadable as exc:
            log.warning(
                "webhook %s: %s (at %s) on %s",
                self.name,
                exc.message,
                exc.where,
                _describe(request),
            )
            raise
        except Exception as exc:
            log.exception("webhook %s: handler failed on %s", self.name, _describe(request))
            return errored(500, f"internal error: {type(exc).__name__}: {exc}")
        if not response.allowed:
            log.debug("webhook %s: denied %s: %s", self.name, _describe(request), response.message)
        return response


class _Overran(Exception):
    """The handler was still waiting when its deadline passed."""


async def _within(handler: Awaitable[AdmissionResponse], seconds: float) -> AdmissionResponse:
    """``await handler``, cancelled after ``seconds`` (then ``_Overran``).

    The handler's first step runs here and now: one that decides without waiting (a
    cached read, most reviews) needs no timer, and nothing could have interrupted it
    anyway. One that waits gets the deadline, counted from its start, for the rest, under
    asyncio's own timeout (anyio's scope per review was ~2% of the manager's CPU).
    Invariant: the handler ends here, by its answer, its exception or cancellation."""
    if not isinstance(handler, Coroutine):
        handler = _awaited(handler)
    loop = asyncio.get_running_loop()
    due = loop.time() + seconds
    try:
        waits_on = handler.send(None)
    except StopIteration as done:
        return cast(AdmissionResponse, done.value)
    timeout = asyncio.timeout_at(due)
    try:
        async with timeout:
            return await _resumed(handler, waits_on)
    except TimeoutError:
        if timeout.expired():
            raise _Overran from None
        raise  # the handler's own, not the deadline
    finally:
        handler.close()  # a no-op once it has ended; if it has not, it ends here


@types.coroutine
def _resumed(coro: Coroutine[Any, Any, Any], waits_on: Any) -> Generator[Any, Any, Any]:
    """Awaits the rest of ``coro``, which was started by hand and yielded ``waits_on``: the
    task's wake-up or exception goes to it as if it had been awaited from the start."""
    while True:
        try:
            yield waits_on
        except BaseException as exc:  # cancellation, as the task throws it
            try:
                waits_on = coro.throw(exc)
            except StopIteration as done:
                return done.value
            continue
        return (yield from coro)  # the task resumes with send(None), as ``yield from`` does


async def _awaited(awaitable: Awaitable[AdmissionResponse]) -> AdmissionResponse:
    return await awaitable


def parse_review(body: bytes, *, max_depth: int = MAX_DEPTH) -> AdmissionRequest:
    """Decodes and checks a request AdmissionReview; raises ``ReviewError(400)`` with the
    first problem found.

    Checked against the Go types of ``admission.k8s.io/v1`` (``null`` counts as absent, as
    for Go's decoder): strict UTF-8 JSON with finite numbers, nested at most ``max_depth``
    levels; ``request`` an object with a non-empty string ``uid``, ``kind``/``resource``
    objects of strings, ``operation`` one of CREATE/UPDATE/DELETE/CONNECT, strings where
    the API has strings, ``userInfo`` a UserInfo, ``object``/``oldObject``/``options``
    objects, ``dryRun`` a bool. The object's own fields are the handler's to read."""
    if not body:
        raise ReviewError(400, "request body is empty")
    try:
        # orjson takes only strict UTF-8 and finite numbers, as we do: its answer stands.
        review = orjson.loads(body)
    except orjson.JSONDecodeError:
        review = _slow_loads(body, max_depth)
    # A document nests no deeper than it has '{' and '[' (counted at C speed, in strings
    # too): most reviews have fewer than ``max_depth`` and skip the walk.
    if body.count(b"{") + body.count(b"[") > max_depth and _deeper_than(review, max_depth):
        raise ReviewError(400, f"request body nests deeper than {max_depth} levels")
    if not isinstance(review, dict):
        raise ReviewError(400, f"request body is a JSON {_type(review)}, not an object")
    api_version, kind = review.get("apiVersion"), review.get("kind")
    if kind != KIND or api_version != API_VERSION:
        raise ReviewError(
            400,
            f"expected {API_VERSION} {KIND}, got apiVersion={_show(api_version)} "
            f"kind={_show(kind)}",
        )
    request = review.get("request")
    if request is None:
        raise ReviewError(400, "AdmissionReview has no request")
    if not isinstance(request, dict):
        raise ReviewError(400, f"AdmissionReview request is a {_type(request)}, not an object")
    return AdmissionRequest._of(_checked(request))


def _slow_loads(body: bytes, max_depth: int) -> Any:
    """What orjson refused, through the json module, for its exact reason: invalid
    UTF-8, NaN, a number out of range, deep nesting. (It also takes the few documents
    only it can read, such as a lone surrogate escape.)"""
    try:
        # Strict UTF-8 first: json.loads(bytes) would also take UTF-16/32 and pass
        # encoded surrogates through.
        return json.loads(body.decode("utf-8"), parse_constant=_no_constant, parse_float=_finite)
    except RecursionError:
        raise ReviewError(400, f"request body nests deeper than {max_depth} levels") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, the two hooks
        raise ReviewError(400, f"request body is not JSON: {exc}") from None


_GVK = ("group", "version", "kind")
_GVR = ("group", "version", "resource")
#: The GroupVersionKind/Resource fields: name, their three fields, required.
_TYPES = (
    ("kind", _GVK, True),
    ("resource", _GVR, True),
    ("requestKind", _GVK, False),
    ("requestResource", _GVR, False),
)
_STRINGS = ("subResource", "requestSubResource", "name", "namespace")
_OBJECTS = ("object", "oldObject", "options")


def _checked(request: dict[str, Any]) -> dict[str, Any]:
    """``request`` (decoded JSON: exact types) with its envelope fields checked, and
    ``kind``/``resource`` normalised in place to their three strings; raises
    ``ReviewError(400)``. Runs once per review: checks inline, no copies."""
    uid = request.get("uid")
    if type(uid) is not str or not uid:
        raise _bad("uid", "a non-empty string", uid)
    for key, fields, required in _TYPES:
        value = request.get(key)
        if value is None and not required:
            continue
        if type(value) is not dict:
            raise _bad(key, f"an object of {'/'.join(fields)}", value)
        first, second, third = fields
        a, b, c = value.get(first), value.get(second), value.get(third)
        if type(a) is str and type(b) is str and type(c) is str:  # as the API server sends
            if len(value) != 3:
                request[key] = {first: a, second: b, third: c}
            continue
        for name in fields:
            if not _null_or(value.get(name), str):
                raise _bad(f"{key}.{name}", "a string", value[name])
        request[key] = {name: value.get(name) or "" for name in fields}
    operation = request.get("operation")
    if operation not in OPERATIONS:
        raise _bad("operation", f"one of {', '.join(OPERATIONS)}", operation)
    for key in _STRINGS:
        value = request.get(key)
        if value is not None and type(value) is not str:
            raise _bad(key, "a string", value)
    for key in _OBJECTS:
        value = request.get(key)
        if value is not None and type(value) is not dict:
            raise _bad(key, "an object or null", value)
    dry_run = request.get("dryRun")
    if dry_run is not None and type(dry_run) is not bool:
        raise _bad("dryRun", "a bool", dry_run)
    _check_user_info(request.get("userInfo"))
    return request


def _check_user_info(user: Any) -> None:
    """authentication/v1 UserInfo: ``username``/``uid`` strings, ``groups`` a list of
    strings, ``extra`` a map of lists of strings."""
    if user is None:
        return
    if not isinstance(user, dict):
        raise _bad("userInfo", "an object", user)
    for key in ("username", "uid"):
        if not _null_or(user.get(key), str):
            raise _bad(f"userInfo.{key}", "a string", user[key])
    if not _strings(user.get("groups")):
        raise _bad("userInfo.groups", "a list of strings", user["groups"])
    extra = user.get("extra")
    if not _null_or(extra, dict):
        raise _bad("userInfo.extra", "an object", extra)
    for key, values in (extra or {}).items():
        if not _strings(values):
            raise _bad(f"userInfo.extra[{_show(key)}]", "a list of strings", values)


def _null_or(value: Any, kind: type) -> bool:
    """``null`` is absent (Go's decoder leaves the zero value); otherwise ``kind``."""
    return value is None or isinstance(value, kind)


def _strings(value: Any) -> bool:
    return value is None or (isinstance(value, list) and all(isinstance(v, str) for v in value))


def _bad(field: str, expected: str, got: Any) -> ReviewError:
    return ReviewError(400, f"AdmissionReview request.{field} must be {expected}, got {_show(got)}")


def _show(value: Any) -> str:
    """A short rendering of a received value for a reason: strings and scalars quoted
    (cut at 40 characters), containers by type only."""
    if isinstance(value, dict | list):
        return f"a JSON {_type(value)}"
    text = json.dumps(value, ensure_ascii=True)
    return text if len(text) <= 40 else text[:37] + "..."


def _type(value: Any) -> str:
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    return "string" if isinstance(value, str) else "null"


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]} is out of range")
    return value


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether containers nest more than ``limit`` levels (iterative: one pass, level by
    level, so the check itself cannot recurse). Exact type checks suffice: the JSON
    decoders make plain dicts and lists only."""
    level = [value] if type(value) is dict or type(value) is list else []
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            return True
        below: list[Any] = []
        add = below.append
        for container in level:
            for item in container.values() if type(container) is dict else container:
                kind = type(item)
                if kind is dict or kind is list:
                    add(item)
        level = below
    return False


def _error_text(error: Exception) -> str:
    """``Type: message``, cut to a short reason (a KeyError's message is the key)."""
    text = f"{type(error).__name__}: {error}"
    return text if len(text) <= 200 else text[:197] + "..."


def _describe(request: AdmissionRequest) -> str:
    """``CREATE pods ns/name uid=...`` for logs. ``parse_review`` checked the fields, but an
    ``AdmissionRequest`` can also be made by hand (``from_dict`` checks nothing), and
    describing one for a log line must never raise."""
    try:
        res = request.resource
        resource = res.get("resource", "?") if isinstance(res, Mapping) else "?"
        where = f"{request.namespace}/{request.name}" if request.namespace else request.name
        return f"{request.operation} {resource} {where or '(unnamed)'} uid={request.uid}"
    except Exception:
        return f"uid={request.uid!r}"

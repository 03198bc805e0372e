"""AdmissionReview ``admission.k8s.io/v1``: requests, responses and the review protocol.

A handler is an async callable ``(AdmissionRequest) -> AdmissionResponse``; an object
with ``async def mutate(request)`` is a ``Mutator``, one with ``async def
validate(request)`` a ``Validator`` (which may not return a patch: the API server
rejects patches from validating webhooks, so we catch the bug here with a clear
message). Build responses with ``allowed``, ``denied``, ``patched`` (diffs the
original against a mutated copy) or ``patch_ops``; or ``raise Denied(...)`` from
anywhere in a handler.

``Webhook.review`` turns request bytes into the response AdmissionReview: a handler
that raises becomes ``allowed: false`` with code 500 ``internal error: ...``, one that
takes too long becomes a denial with code 504 that says so; a request that is not a
valid AdmissionReview raises ``ReviewError`` (an HTTP 4xx, never a crash).
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

import anyio

from sdgruntime.webhook.jsonpatch import Operation, diff, json_copy

log = logging.getLogger(__name__)

API_VERSION = "admission.k8s.io/v1"
KIND = "AdmissionReview"


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
        return cls(
            uid=request["uid"],
            operation=request.get("operation") or "",
            kind=request.get("kind") or {},
            resource=request.get("resource") or {},
            sub_resource=request.get("subResource") or "",
            name=request.get("name") or "",
            namespace=request.get("namespace") or "",
            user_info=request.get("userInfo") or {},
            object=request.get("object"),
            old_object=request.get("oldObject"),
            dry_run=bool(request.get("dryRun")),
            options=request.get("options"),
            raw=dict(request),
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
            encoded = json.dumps(self.patch, separators=(",", ":"), ensure_ascii=False)
            response["patch"] = base64.b64encode(encoded.encode()).decode("ascii")
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
    """Raise from a handler to deny with ``message`` (as ``denied``)."""

    def __init__(self, message: str, code: int = 403, reason: str = "Forbidden") -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.reason = reason


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
        if isinstance(handler, Mutator):
            self.kind, self.handler = "mutating", handler.mutate
        elif isinstance(handler, Validator):
            self.kind, self.handler = "validating", handler.validate
        elif callable(handler):
            self.kind, self.handler = "admission", handler
        else:
            raise TypeError(f"not an admission handler: {handler!r}")
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
            with anyio.move_on_after(deadline) as scope:
                response = await self.handler(request)
            if scope.cancelled_caught:
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
            return denied(exc.message, exc.code, exc.reason)
        except Exception as exc:
            log.exception("webhook %s: handler failed on %s", self.name, _describe(request))
            return errored(500, f"internal error: {type(exc).__name__}: {exc}")
        if not response.allowed:
            log.debug("webhook %s: denied %s: %s", self.name, _describe(request), response.message)
        return response


def parse_review(body: bytes) -> AdmissionRequest:
    """Decodes and checks a request AdmissionReview; raises ``ReviewError(400)``."""
    if not body:
        raise ReviewError(400, "request body is empty")
    try:
        review = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ReviewError(400, f"request body is not JSON: {exc}") from None
    if not isinstance(review, dict):
        raise ReviewError(400, "request body is not a JSON object")
    api_version, kind = review.get("apiVersion"), review.get("kind")
    if kind != KIND or api_version != API_VERSION:
        raise ReviewError(
            400, f"expected {API_VERSION} {KIND}, got apiVersion={api_version!r} kind={kind!r}"
        )
    request = review.get("request")
    if not isinstance(request, dict):
        raise ReviewError(400, "AdmissionReview has no request")
    if not isinstance(request.get("uid"), str) or not request["uid"]:
        raise ReviewError(400, "AdmissionReview request has no uid")
    for key in ("object", "oldObject"):
        if request.get(key) is not None and not isinstance(request[key], dict):
            raise ReviewError(400, f"AdmissionReview request.{key} is not an object")
    return AdmissionRequest.from_dict(request)


def _describe(request: AdmissionRequest) -> str:
    """``CREATE pods ns/name uid=...`` for logs. Only ``uid`` has been checked, so any other
    field may have any JSON type: describing a malformed request must not raise."""
    try:
        res = request.resource
        resource = res.get("resource", "?") if isinstance(res, Mapping) else "?"
        where = f"{request.namespace}/{request.name}" if request.namespace else request.name
        return f"{request.operation} {resource} {where or '(unnamed)'} uid={request.uid}"
    except Exception:
        return f"uid={request.uid!r}"

"""Per-kind webhooks on objects instead of AdmissionReviews, as controller-runtime's
``WebhookManagedBy(mgr).For(kind).WithValidator(v).WithDefaulter(d).Complete()``.

``mgr.webhook_for(kind).with_validator(v).with_defaulter(d).complete()`` registers
``/validate-<group>-<version>-<kind>`` and ``/mutate-...`` (dots as dashes, the kind lower-cased,
as kubebuilder generates them). A :class:`CustomValidator` returns warnings or raises
:class:`~sdgruntime.webhook.Denied`; a :class:`CustomDefaulter` edits the object in place
(on CREATE and UPDATE) and the patch is computed. A review for another kind is refused with
code 400. :func:`admission_request` gives the request being decided. Usage:
docs/webhooks.md, "Typed webhooks".
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from sdgruntime._checks import is_async_callable
from sdgruntime.kinds import Kind, MutableObj
from sdgruntime.webhook.admission import (
    AdmissionRequest,
    AdmissionResponse,
    allowed,
    errored,
    patched,
)

if TYPE_CHECKING:
    from sdgruntime.webhook.server import WebhookServer

__all__ = [
    "CustomDefaulter",
    "CustomValidator",
    "DefaultingWebhook",
    "ValidatingWebhook",
    "WebhookBuilder",
    "admission_request",
    "mutate_path",
    "validate_path",
]

Warnings = Sequence[str] | None

_REQUEST: contextvars.ContextVar[AdmissionRequest] = contextvars.ContextVar("admission_request")


def admission_request() -> AdmissionRequest:
    """The AdmissionRequest a typed validator or defaulter is deciding right now."""
    try:
        return _REQUEST.get()
    except LookupError:
        raise RuntimeError(
            "admission_request() is only available inside a typed validator or defaulter"
        ) from None


def _path(prefix: str, kind: Kind) -> str:
    return f"/{prefix}-{kind.group.replace('.', '-')}-{kind.version}-{kind.kind.lower()}"


def validate_path(kind: Kind) -> str:
    """``/validate-<group, dots as dashes>-<version>-<kind lower-cased>``."""
    return _path("validate", kind)


def mutate_path(kind: Kind) -> str:
    """``/mutate-<group, dots as dashes>-<version>-<kind lower-cased>``."""
    return _path("mutate", kind)


class CustomValidator:
    """Allows everything: subclass it and override the checks you need (or write any class
    with the three async methods)."""

    async def validate_create(self, obj: MutableObj) -> Warnings:
        return None

    async def validate_update(self, old: MutableObj, new: MutableObj) -> Warnings:
        return None

    async def validate_delete(self, obj: MutableObj) -> Warnings:
        return None


class CustomDefaulter(Protocol):
    """Sets defaults on ``obj`` in place (CREATE and UPDATE)."""

    async def default(self, obj: MutableObj) -> None: ...


def _kind_mismatch(kind: Kind, request: AdmissionRequest) -> AdmissionResponse | None:
    got = request.kind
    if (got.get("group", ""), got.get("version"), got.get("kind")) == (
        kind.group,
        kind.version,
        kind.kind,
    ):
        return None
    return errored(
        400,
        f"this webhook is for {kind.api_version} {kind.kind}, got "
        f"{got.get('group') or 'core'}/{got.get('version')} {got.get('kind')}: check the "
        "rules of its WebhookConfiguration",
    )


def _warnings(value: Any, method: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, Iterable):
        out = list(value)
        if all(isinstance(w, str) for w in out):
            return out
    raise TypeError(f"{method} returned {type(value).__name__}: return warnings (strings) or None")


class ValidatingWebhook:
    """A :class:`~sdgruntime.webhook.Validator` calling a typed validator for ``kind``."""

    def __init__(self, kind: Kind, validator: Any) -> None:
        _check_methods(validator, ("validate_create", "validate_update", "validate_delete"))
        self.kind = kind
        self.validator = validator

    async def validate(self, request: AdmissionRequest) -> AdmissionResponse:
        mismatch = _kind_mismatch(self.kind, request)
        if mismatch is not None:
            return mismatch
        v = self.validator
        token = _REQUEST.set(request)
        try:
            if request.operation == "CREATE":
                method, result = "validate_create", await v.validate_create(request.object or {})
            elif request.operation == "UPDATE":
                old, new = request.old_object or {}, request.object or {}
                method, result = "validate_update", await v.validate_update(old, new)
            elif request.operation == "DELETE":
                method, result = (
                    "validate_delete",
                    await v.validate_delete(request.old_object or {}),
                )
            else:
                return allowed()
        finally:
            _REQUEST.reset(token)
        return allowed(warnings=_warnings(result, method))


class DefaultingWebhook:
    """A :class:`~sdgruntime.webhook.Mutator` calling a typed defaulter for ``kind``."""

    def __init__(self, kind: Kind, defaulter: Any) -> None:
        _check_methods(defaulter, ("default",))
        self.kind = kind
        self.defaulter = defaulter

    async def mutate(self, request: AdmissionRequest) -> AdmissionResponse:
        mismatch = _kind_mismatch(self.kind, request)
        if mismatch is not None:
            return mismatch
        if request.operation not in ("CREATE", "UPDATE") or request.object is None:
            return allowed()
        obj = request.copy_object()
        token = _REQUEST.set(request)
        try:
            await self.defaulter.default(obj)
        finally:
            _REQUEST.reset(token)
        return patched(request.object, obj)


def _check_methods(target: Any, methods: Sequence[str]) -> None:
    """Refuse, naming what to write, a class instead of an instance, or methods that are
    missing or not ``async``."""
    if isinstance(target, type):
        raise TypeError(f"got the class {target.__qualname__}; pass an instance of it")
    problems = []
    for method in methods:
        fn = getattr(target, method, None)
        if fn is None:
            problems.append(f"has no {method}()")
        elif not is_async_callable(fn):
            problems.append(f"{method}() is not async")
    if problems:
        hint = "subclass CustomValidator, " if "validate_create" in methods else ""
        raise TypeError(
            f"{type(target).__qualname__.rsplit('<locals>.', 1)[-1]}: {'; '.join(problems)}: "
            f"{hint}define " + ", ".join(f"`async def {m}(...)`" for m in methods)
        )


class WebhookBuilder:
    """Collects a kind's validator and defaulter; :meth:`complete` registers them on the
    server at the conventional paths (see the module doc). ``mgr.webhook_for(kind)``
    returns one for the manager's webhook server."""

    def __init__(self, server: WebhookServer, kind: Kind) -> None:
        self.server = server
        self.kind = kind
        self._validator: ValidatingWebhook | None = None
        self._defaulter: DefaultingWebhook | None = None
        self._completed = False

    def with_validator(self, validator: Any) -> WebhookBuilder:
        """A typed validator (checked here: its three methods must be ``async``)."""
        self._validator = ValidatingWebhook(self.kind, validator)
        return self

    def with_defaulter(self, defaulter: Any) -> WebhookBuilder:
        """A typed defaulter (checked here: ``default`` must be ``async``)."""
        self._defaulter = DefaultingWebhook(self.kind, defaulter)
        return self

    def complete(self) -> list[str]:
        """Register the webhooks; returns their paths (mutating first)."""
        if self._completed:
            raise RuntimeError(f"webhook_for({self.kind.kind}).complete() was already called")
        if self._validator is None and self._defaulter is None:
            raise ValueError(
                f"webhook_for({self.kind.kind}) needs with_validator(...) and/or "
                "with_defaulter(...) before complete()"
            )
        paths = []
        if self._defaulter is not None:
            self.server.register(mutate_path(self.kind), self._defaulter)
            paths.append(mutate_path(self.kind))
        if self._validator is not None:
            self.server.register(validate_path(self.kind), self._validator)
            paths.append(validate_path(self.kind))
        self._completed = True
        return paths

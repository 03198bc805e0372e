"""Typed API errors, decoded from the server's ``Status`` body."""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """An error answer from the API server (or a transport failure with ``code == 0``)."""

    code: int = 0

    def __init__(
        self,
        message: str,
        *,
        code: int | None = None,
        reason: str = "",
        status: dict[str, Any] | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.reason = reason
        self.status = status or {}
        self.retry_after = retry_after


class BadRequest(ApiError):
    code = 400


class Unauthorized(ApiError):
    code = 401


class Forbidden(ApiError):
    code = 403


class NotFound(ApiError):
    code = 404


class MethodNotAllowed(ApiError):
    code = 405


class Conflict(ApiError):
    """409 with reason Conflict: the object changed since it was read (optimistic concurrency)."""

    code = 409


class AlreadyExists(ApiError):
    """409 with reason AlreadyExists."""

    code = 409


class Gone(ApiError):
    """410: a watch or list asked for a resourceVersion that is too old."""

    code = 410


class Invalid(ApiError):
    """422: the object failed validation; ``message`` carries the server's explanation."""

    code = 422


class TooManyRequests(ApiError):
    code = 429


class ServerError(ApiError):
    """5xx."""


class TransportError(ApiError):
    """No answer: connection refused, reset, timed out."""


_BY_CODE: dict[int, type[ApiError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    405: MethodNotAllowed,
    410: Gone,
    422: Invalid,
    429: TooManyRequests,
}


def from_status(code: int, body: Any, retry_after: float | None = None) -> ApiError:
    """Build the typed error for an HTTP status and its (decoded JSON, if any) body."""
    status = body if isinstance(body, dict) else {}
    reason = str(status.get("reason", ""))
    text = body if isinstance(body, str) else ""
    message = str(status.get("message") or text) or f"HTTP {code}"
    cls: type[ApiError]
    if code == 409:
        cls = AlreadyExists if reason == "AlreadyExists" else Conflict
    elif code >= 500:
        cls = ServerError
    else:
        cls = _BY_CODE.get(code, ApiError)
    return cls(message, code=code, reason=reason, status=status, retry_after=retry_after)


def is_retriable(err: BaseException) -> bool:
    """Transient failures worth a retry with backoff: no answer, 429, 5xx."""
    return isinstance(err, (TransportError, TooManyRequests, ServerError))

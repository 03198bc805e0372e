"""Admission webhooks: a TLS server for AdmissionReview v1, mutators and validators, and
typed per-kind validators and defaulters (:mod:`sdgruntime.webhook.typed`)."""

from __future__ import annotations

from sdgruntime.webhook.admission import (
    AdmissionHandler,
    AdmissionRequest,
    AdmissionResponse,
    Denied,
    Mutator,
    ReviewError,
    Validator,
    Webhook,
    allowed,
    denied,
    errored,
    patch_ops,
    patched,
)
from sdgruntime.webhook.certs import CertWatcher, server_context
from sdgruntime.webhook.server import WebhookServer
from sdgruntime.webhook.typed import (
    CustomDefaulter,
    CustomValidator,
    WebhookBuilder,
    admission_request,
    mutate_path,
    validate_path,
)

__all__ = [
    "AdmissionHandler",
    "AdmissionRequest",
    "AdmissionResponse",
    "CertWatcher",
    "CustomDefaulter",
    "CustomValidator",
    "Denied",
    "Mutator",
    "ReviewError",
    "Validator",
    "Webhook",
    "WebhookBuilder",
    "WebhookServer",
    "admission_request",
    "allowed",
    "denied",
    "errored",
    "mutate_path",
    "patch_ops",
    "patched",
    "server_context",
    "validate_path",
]

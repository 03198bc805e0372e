"""Admission webhooks: a TLS server for AdmissionReview v1, mutators and validators."""

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

__all__ = [
    "AdmissionHandler",
    "AdmissionRequest",
    "AdmissionResponse",
    "CertWatcher",
    "Denied",
    "Mutator",
    "ReviewError",
    "Validator",
    "Webhook",
    "WebhookServer",
    "allowed",
    "denied",
    "errored",
    "patch_ops",
    "patched",
    "server_context",
]

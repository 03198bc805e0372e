"""``admission_review``: the AdmissionReview the API server would send, for unit tests.

A webhook's ``review(body)`` (``server.webhooks[path].review``) decides a review without a
server or a cluster; this builds its ``body``, so a test states only what matters to it.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from sdgruntime.kinds import Kind

__all__ = ["admission_review"]

Operation = Literal["CREATE", "UPDATE", "DELETE", "CONNECT"]


def admission_review(
    kind: Kind,
    operation: Operation,
    obj: Mapping[str, Any] | None,
    old: Mapping[str, Any] | None = None,
    *,
    user: str = "alice",
    groups: Sequence[str] = ("system:authenticated",),
    dry_run: bool = False,
    sub_resource: str | None = None,
) -> bytes:
    """An ``admission.k8s.io/v1`` AdmissionReview request of ``kind``, as bytes.

    ``obj`` is the object (``None`` for DELETE), ``old`` the stored one (UPDATE, DELETE);
    the name and namespace are theirs. ``user`` and ``groups`` are the caller.
    """
    meta = (obj or old or {}).get("metadata") or {}
    request: dict[str, Any] = {
        "uid": str(uuid.uuid4()),
        "kind": {"group": kind.group, "version": kind.version, "kind": kind.kind},
        "resource": {"group": kind.group, "version": kind.version, "resource": kind.plural},
        "operation": operation,
        "userInfo": {"username": user, "groups": list(groups)},
        "object": obj,
        "oldObject": old,
        "dryRun": dry_run,
    }
    if meta.get("name"):
        request["name"] = meta["name"]
    if kind.namespaced and meta.get("namespace"):
        request["namespace"] = meta["namespace"]
    if sub_resource:
        request["subResource"] = sub_resource
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
    return json.dumps(review).encode()

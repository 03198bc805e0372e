"""Validating webhook for SharedDeviceGroups: rules beyond the CRD schema, and the
deletion guard that tells the user which pods still use a group.

The finalizer (``deviceshare.io/protection``) holds a group even with this webhook
down; the webhook adds the clear message up front.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from api.constants import DEFAULT_ENV_TABLE, PHASE_BOUND, SDG_KIND
from api.envvars import env_var_for
from api.pods import POD_GROUP_INDEX, is_active, pod_key
from api.validation import validate_spec
from sdgruntime.cache import Cache
from sdgruntime.kinds import PODS, spec_of, status_of
from sdgruntime.webhook import AdmissionRequest, AdmissionResponse, allowed, denied

#: How many of a group's pods a denied DELETE names.
MAX_LISTED_PODS = 5
_IMMUTABLE_WHEN_BOUND = ("resources", "nodeSelector", "devices")


class GroupValidator:
    """``/validate-deviceshare-io-v1alpha1-shareddevicegroup``."""

    def __init__(self, cache: Cache, env_table: Mapping[str, str] = DEFAULT_ENV_TABLE) -> None:
        self.cache = cache
        self.env_table = env_table

    async def validate(self, request: AdmissionRequest) -> AdmissionResponse:
        if request.kind.get("kind") != SDG_KIND.kind:
            return allowed()
        if request.operation == "DELETE":
            return self._validate_delete(request.name)
        group = request.object or {}
        spec = group.get("spec")
        problems = validate_spec(spec)
        if problems:
            return denied("; ".join(problems), code=422, reason="Invalid")
        if request.operation == "UPDATE":
            old = request.old_object or {}
            if status_of(old).get("phase") == PHASE_BOUND:
                changed = [
                    f for f in _IMMUTABLE_WHEN_BOUND if spec_of(old).get(f) != (spec or {}).get(f)
                ]
                if changed:
                    return denied(
                        f"spec.{' and spec.'.join(changed)} cannot change once the group is "
                        f"Bound (to node {old['status'].get('nodeName')}): groups never move "
                        f"or resize. Delete the group and create it again with the new spec.",
                        code=422,
                        reason="Invalid",
                    )
        return allowed(warnings=self._warnings(spec or {}))

    def _warnings(self, spec: Mapping[str, Any]) -> list[str]:
        return [
            f"spec.resources[{res}]: no device env var is known for {res}; pods of this "
            "group would be denied. Add one with the manager flag --device-env "
            f"'{res}=ENV_VAR'"
            for res in sorted(spec.get("resources") or {})
            if env_var_for(res, self.env_table) is None
        ]

    def _validate_delete(self, name: str) -> AdmissionResponse:
        users = sorted(
            pod_key(p)
            for p in self.cache.list(PODS, index=POD_GROUP_INDEX, value=name, copy=False)
            if is_active(p)
        )
        if not users:
            return allowed()
        listed = ", ".join(users[:MAX_LISTED_PODS])
        more = f" and {len(users) - MAX_LISTED_PODS} more" if len(users) > MAX_LISTED_PODS else ""
        return denied(
            f"SharedDeviceGroup {name!r} is in use by {len(users)} active pod(s): {listed}{more}. "
            "Delete those pods first (kubectl get sdg "
            f"{name} -o jsonpath='{{.status.allocatedPods}}' lists them), then delete the group."
        )

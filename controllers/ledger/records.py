"""The per-node claim record: its name, its format, and reading one.

One ConfigMap per node (``sdg-claims.<node>`` in the manager's namespace) holds that
node's claims: ``data.claims`` is ``{"group": {"nvidia.com/gpu": "0,1"}}``, ``data.uids``
the UID of each claiming group and ``data.versions`` the resourceVersion of the group
each claim was decided on. :mod:`controllers.ledger.writer` is its one writer.
Invariant: a record is identified by its ConfigMap's *name* (``record_name``), never by a
field inside it; one whose name does not match is malformed and blocks every node it
names, so it can never act as a second fence. Why a ConfigMap, and what the UIDs and
versions guard: docs/design.md, "The cluster's books".
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from api.v1alpha1 import format_ids, parse_ids
from api.validation import is_resource_name
from controllers.ledger.tracker import Devices, normalize_devices
from sdgruntime.kinds import meta_of

RECORD_LABEL = "deviceshare.io/claims"
RECORD_LABEL_VALUE = "node"
DATA_NODE = "node"
DATA_CLAIMS = "claims"
DATA_UIDS = "uids"
DATA_VERSIONS = "versions"
RECORD_PREFIX = "sdg-claims."


def record_name(node: str) -> str:
    """``sdg-claims.<node>``; a hash keeps names of very long node names within 253 chars."""
    name = f"{RECORD_PREFIX}{node}"
    if len(name) <= 253:
        return name
    return f"{RECORD_PREFIX}{hashlib.sha256(node.encode()).hexdigest()[:40]}"


def nodes_named_by(cm: Mapping[str, Any]) -> tuple[str | None, set[str]]:
    """(the node whose record ``cm`` is, if its name and contents agree; every node it
    names by its name or by ``data.node``)."""
    name = str(meta_of(cm).get("name") or "")
    data = cm.get("data") or {}
    claimed = data.get(DATA_NODE) if isinstance(data, Mapping) else None
    named: set[str] = set()
    if isinstance(claimed, str) and claimed:
        named.add(claimed)
    suffix = name[len(RECORD_PREFIX) :] if name.startswith(RECORD_PREFIX) else ""
    if suffix and record_name(suffix) == name:
        named.add(suffix)
    if isinstance(claimed, str) and claimed and record_name(claimed) == name:
        return claimed, named
    return None, named


def decode_uids(text: str | None, claims: Mapping[str, Any]) -> dict[str, str]:
    """``data.uids``: group -> UID of the claiming group. Absent (a record written before
    UIDs were recorded) is no UIDs; a UID for a group without a claim is malformed."""
    return _decode_group_map(DATA_UIDS, "UID", text, claims)


def decode_versions(text: str | None, claims: Mapping[str, Any]) -> dict[str, str]:
    """``data.versions``: group -> resourceVersion of the group its claim was decided
    on. Absent (a record written before versions were recorded) is none."""
    return _decode_group_map(DATA_VERSIONS, "resourceVersion", text, claims)


def _decode_group_map(
    key: str, what: str, text: str | None, claims: Mapping[str, Any]
) -> dict[str, str]:
    """A JSON object of group -> non-empty string, naming only groups with a claim."""
    if text is None or not str(text).strip():
        return {}
    try:
        raw: Any = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as err:
        raise ValueError(f"{key} is not JSON: {err}") from None
    if not isinstance(raw, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and v for k, v in raw.items()
    ):
        raise ValueError(f"{key} must be a JSON object of group -> {what}")
    stray = sorted(set(raw) - set(claims))
    if stray:
        raise ValueError(f"{key} names groups without a claim: {stray[:5]}")
    return dict(raw)


def decode_record(
    cm: Mapping[str, Any],
) -> tuple[dict[str, Devices], dict[str, str], dict[str, str]]:
    """A record's (claims, UIDs, group versions); ValueError says why it is malformed."""
    data = cm.get("data") or {}
    if not isinstance(data, Mapping):
        data = {}
    claims = decode_claims(data.get(DATA_CLAIMS, ""))
    return (
        claims,
        decode_uids(data.get(DATA_UIDS), claims),
        decode_versions(data.get(DATA_VERSIONS), claims),
    )


def record_holdings(
    cm: Mapping[str, Any],
) -> tuple[str | None, set[str], frozenset[tuple[str, int]] | None]:
    """What a record says, for deciding whether a change of it can free devices: (its
    node, the nodes it names, every (resource, ID) it holds; None when it is malformed)."""
    node, named = nodes_named_by(cm)
    try:
        claims, _uids, _versions = decode_record(cm)
    except ValueError:
        return node, named, None
    held = frozenset(
        (r, i) for devices in claims.values() for r, ids in devices.items() for i in ids
    )
    return node, named, held


def resource_version(obj: Mapping[str, Any]) -> int:
    """An object's resourceVersion as a number (0 when absent or not numeric)."""
    try:
        return int(meta_of(obj).get("resourceVersion") or 0)
    except ValueError:
        return 0


@dataclass(frozen=True)
class Claim:
    """One group's claim in a node's record, as a caller saw it: what a change to that
    group's claim is conditional on (``Ledger.write``'s ``expect``)."""

    devices: Devices
    #: UID of the group that made the claim ("" for a claim recorded without one).
    uid: str = ""
    #: resourceVersion of the group the claim was decided on ("" when not recorded).
    version: str = ""


@dataclass
class Record:
    """One node's claims as last seen, with the resourceVersion that fences the next write."""

    node: str
    claims: dict[str, Devices] = field(default_factory=dict)
    obj: dict[str, Any] | None = None  # the ConfigMap; None while it does not exist
    #: group -> UID of the group that made the claim ("" for claims recorded without one).
    uids: dict[str, str] = field(default_factory=dict)
    #: group -> resourceVersion of the group its claim was decided on.
    versions: dict[str, str] = field(default_factory=dict)

    @property
    def resource_version(self) -> int:
        return resource_version(self.obj) if self.obj else 0

    def claim(self, group: str) -> Claim | None:
        devices = self.claims.get(group)
        if devices is None:
            return None
        return Claim(devices, self.uids.get(group, ""), self.versions.get(group, ""))


def record_data(
    node: str, claims: Mapping[str, Devices], uids: Mapping[str, str], versions: Mapping[str, str]
) -> dict[str, str]:
    """The ``data`` of ``node``'s record holding ``claims`` with their UIDs and versions."""
    body = {DATA_NODE: node, DATA_CLAIMS: encode_claims(claims)}
    if uids:
        body[DATA_UIDS] = json.dumps(uids, separators=(",", ":"), sort_keys=True)
    if versions:
        body[DATA_VERSIONS] = json.dumps(versions, separators=(",", ":"), sort_keys=True)
    return body


def describe_claim(claim: Claim | None) -> str:
    """A claim for a message: devices, UID and group version ("absent": no claim)."""
    if claim is None:
        return "absent"
    devices = ";".join(f"{r}={','.join(map(str, ids))}" for r, ids in sorted(claim.devices.items()))
    return f"{devices} (uid {claim.uid or '-'}, group version {claim.version or '-'})"


# --- data.claims: the claims' text ----------------------------------------------------


def encode_claims(claims: Mapping[str, Mapping[str, Iterable[int] | str]]) -> str:
    """``{group: {resource: [ids]}} -> '{"g":{"nvidia.com/gpu":"0,1"}}'`` (compact, sorted).

    Deterministic output, so an unchanged record is byte-identical and needs no write.
    """
    out: dict[str, dict[str, str]] = {}
    for group, devices in claims.items():
        if not isinstance(group, str) or not group:
            raise ValueError(f"bad group name {group!r} in claims")
        normalized = normalize_devices(devices)
        for res in normalized:
            if not is_resource_name(res):
                raise ValueError(f"claim of group {group!r} has bad resource name {res!r}")
        out[group] = {res: format_ids(ids) for res, ids in normalized.items()}
    return json.dumps(out, separators=(",", ":"), sort_keys=True)


def decode_claims(text: str) -> dict[str, Devices]:
    """Parse a node's claim record. Empty text is no claims; malformed raises ValueError.

    The error names what is wrong, because a human may have to repair the annotation.
    """
    if text is None or not text.strip():
        return {}
    try:
        raw: Any = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"claim record is not JSON: {err}") from None
    if not isinstance(raw, dict):
        raise ValueError("claim record must be a JSON object of group -> {resource: ids}")
    out: dict[str, Devices] = {}
    for group, devices in raw.items():
        if not group:
            raise ValueError("claim record has an empty group name")
        if not isinstance(devices, dict) or not devices:
            raise ValueError(f"claim of group {group!r} must be a non-empty object")
        parsed: Devices = {}
        for res, ids in devices.items():
            if not is_resource_name(res):
                raise ValueError(f"claim of group {group!r} has bad resource name {res!r}")
            if not isinstance(ids, str):
                raise ValueError(f"claim of group {group!r} on {res}: IDs must be a string")
            try:
                parsed[res] = parse_ids(ids)
            except ValueError as err:
                raise ValueError(f"claim of group {group!r} on {res}: {err}") from None
            if not parsed[res]:
                raise ValueError(f"claim of group {group!r} on {res} lists no device IDs")
        out[group] = parsed
    return out

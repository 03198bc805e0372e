"""A :class:`~sdgruntime.kinds.Kind` from the API server's discovery, as client-go's
RESTMapper finds one: name the group and the kind, the API server says the version, the
plural and the scope, so nobody hand-writes them for a CRD::

    GREETINGS = await discover_kind(client, "tutorial.example.com", "Greeting")

It reads ``/apis/<group>`` (or ``/api`` for the core group) and ``/apis/<group>/<version>``:
two GETs, nothing cached. :func:`explain_missing` is the same look-up turned around: why
a Kind that answered 404 is not served (the cache's sync error says it).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from sdgruntime import errors
from sdgruntime.kinds import Kind

if TYPE_CHECKING:
    from sdgruntime.client import Client

__all__ = ["NoKindMatchError", "discover_kind", "explain_missing"]


class NoKindMatchError(LookupError):
    """The API server serves no such group, version or kind (apimachinery's
    ``meta.NoKindMatchError``); the message says what it serves instead."""


def _group_path(group: str) -> str:
    return f"/apis/{group}" if group else "/api"


def _version_path(group: str, version: str) -> str:
    return f"/apis/{group}/{version}" if group else f"/api/{version}"


def _what(group: str) -> str:
    return f"API group {group!r}" if group else "the core API group"


async def served_versions(client: Client, group: str) -> list[str]:
    """The versions the API server serves of ``group``, its preferred one first.

    Raises :class:`NoKindMatchError` if the group is not served at all.
    """
    try:
        body: Mapping[str, Any] = await client.request("GET", _group_path(group))
    except errors.NotFound:
        raise NoKindMatchError(
            f"the API server serves no {_what(group)}: is its CustomResourceDefinition "
            "installed? (kubectl get crds; the envtest pytest plugin installs config/crd)"
        ) from None
    if not group:  # APIVersions: {"versions": ["v1"]}
        return [str(v) for v in body.get("versions") or ()]
    versions = [str(v["version"]) for v in body.get("versions") or ()]
    preferred = (body.get("preferredVersion") or {}).get("version")
    if preferred in versions:
        versions.remove(preferred)
        versions.insert(0, preferred)
    return versions


async def _resources(client: Client, group: str, version: str) -> list[Mapping[str, Any]]:
    """The top-level resources (no subresources) of one group version."""
    body: Mapping[str, Any] = await client.request("GET", _version_path(group, version))
    return [r for r in body.get("resources") or () if "/" not in str(r.get("name", ""))]


def _nearest(word: str, choices: list[str]) -> str:
    near = difflib.get_close_matches(word, choices, n=1) or [
        c for c in choices if c.lower() == word.lower()
    ]
    return f" (did you mean {near[0]!r}?)" if near else ""


async def discover_kind(
    client: Client, group: str, kind: str, *, version: str | None = None
) -> Kind:
    """The :class:`Kind` ``kind`` of ``group`` (``""`` for the core group) as the API
    server serves it: in ``version``, or else the first version serving it, the group's
    preferred one first.

    Raises :class:`NoKindMatchError` naming what is served instead when the group, the
    version or the kind is not; API errors (a transport error, RBAC) as themselves.
    """
    if not kind:
        raise ValueError("discover_kind needs a kind, e.g. 'Greeting' (the CRD's names.kind)")
    versions = await served_versions(client, group)
    if version is not None:
        if version not in versions:
            raise NoKindMatchError(
                f"{_what(group)} serves versions {', '.join(versions) or 'none'}, not {version!r}"
            )
        versions = [version]
    served: dict[str, set[str]] = {}
    for v in versions:
        for res in await _resources(client, group, v):
            if res.get("kind") == kind:
                return Kind(group, v, kind, str(res["name"]), bool(res.get("namespaced")))
            served.setdefault(str(res.get("kind")), set()).add(v)
    where = _what(group) if version is None else Kind(group, version, kind, "", True).api_version
    kinds = sorted(served)
    raise NoKindMatchError(
        f"{where} serves no kind {kind!r}{_nearest(kind, kinds)}; "
        f"its kinds: {', '.join(kinds) or 'none'}"
    )


async def explain_missing(client: Client, kind: Kind) -> str:
    """Why ``kind``'s collection answered 404: its group or version is not served, or its
    plural or scope is not the served one (``kubectl api-resources`` in a sentence)."""
    try:
        versions = await served_versions(client, kind.group)
    except NoKindMatchError as exc:
        return str(exc)
    if kind.version not in versions:
        return (
            f"{_what(kind.group)} serves versions {', '.join(versions) or 'none'}, "
            f"not {kind.version!r}"
        )
    resources = await _resources(client, kind.group, kind.version)
    by_plural = {str(r["name"]): r for r in resources}
    gv = kind.api_version
    found = by_plural.get(kind.plural)
    if found is not None:
        if bool(found.get("namespaced")) != kind.namespaced:
            scope = "namespaced" if found.get("namespaced") else "cluster-scoped"
            return (
                f"{kind.plural} in {gv} is {scope}: Kind(..., "
                f"namespaced={bool(found.get('namespaced'))})"
            )
        return f"{gv} serves {kind.plural} now: it was not served yet when listed"
    same_kind = [r for r in resources if r.get("kind") == kind.kind]
    if same_kind:
        plural = str(same_kind[0]["name"])
        return (
            f"{gv} serves {kind.kind} as {plural!r}, not {kind.plural!r}: set the Kind's "
            f"plural to {plural!r}, or find the Kind with "
            f"discover_kind(client, {kind.group!r}, {kind.kind!r})"
        )
    plurals = sorted(by_plural)
    listed = ", ".join(f"{p} ({by_plural[p].get('kind')})" for p in plurals) or "nothing"
    near = _nearest(kind.plural, plurals)
    return f"{gv} has no resource {kind.plural!r}{near}; it serves: {listed}"

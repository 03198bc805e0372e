"""An in-memory stand-in for :class:`~sdgruntime.client.Client`, for unit tests.

As controller-runtime's ``pkg/client/fake``: objects live in a dict, and the API server's
rules a reconciler relies on hold (``resourceVersion`` conflicts, ``metadata.uid``
preconditions, ``AlreadyExists``, the ``status`` subresource, finalizers holding a delete,
selectors, watches). Every call is recorded in ``actions`` so a test can assert what was
written, and :meth:`FakeClient.react` answers a call in place of the store. Not an API
server: no admission, defaulting, schema or garbage collection; test those against
:class:`~sdgruntime.envtest.ControlPlane`. Details: docs/testing.md, "A client without a server".
"""

from __future__ import annotations

import builtins
import copy
import re
import uuid
from collections.abc import AsyncGenerator, Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeAlias

import anyio

from sdgruntime import errors
from sdgruntime.kinds import PODS, Kind, MutableObj
from sdgruntime.webhook.jsonpatch import unescape

__all__ = ["Action", "FakeClient", "Reaction", "parse_label_selector"]

_Key = tuple[str, str, str]  # (kind, namespace, name)


@dataclass(frozen=True, slots=True)
class Action:
    """One call: ``verb`` (get, list, watch, create, update, patch, delete, bind),
    ``kind`` (the Kind's name), ``subresource`` where one was named."""

    verb: str
    kind: str
    namespace: str | None
    name: str | None
    subresource: str | None = None


#: Answers a call in place of the store: gets the call and its body (the object of a
#: create or update, the patch, else None); returns the answer, or None to let the store
#: answer; raises an :class:`~sdgruntime.errors.ApiError` to fail the call.
Reaction: TypeAlias = Callable[[Action, Any], MutableObj | None]


# --- selectors ----------------------------------------------------------------------------

_REQUIREMENT = re.compile(
    r"\s*(?:(?P<not>!)\s*(?P<absent>[\w./-]+)"
    r"|(?P<key>[\w./-]+)\s*(?:(?P<op>==|!=|=)\s*(?P<value>[\w.-]*)"
    r"|\s+(?P<setop>in|notin)\s*\((?P<values>[^)]*)\))?)\s*(?:,|$)"
)


def parse_label_selector(selector: str) -> Callable[[Mapping[str, str]], bool]:
    """A label selector string as a test of labels; ``ValueError`` for a malformed one."""
    reqs: list[tuple[str, str, frozenset[str]]] = []  # (op, key, values)
    pos, text = 0, selector.strip()
    while pos < len(text):
        m = _REQUIREMENT.match(text, pos)
        if m is None or m.end() == pos:
            raise ValueError(f"malformed label selector {selector!r} at {text[pos:]!r}")
        pos = m.end()
        if m["absent"]:
            reqs.append(("!", m["absent"], frozenset()))
        elif m["op"]:
            reqs.append(("!=" if m["op"] == "!=" else "=", m["key"], frozenset({m["value"]})))
        elif m["setop"]:
            values = frozenset(v.strip() for v in m["values"].split(",") if v.strip())
            reqs.append((m["setop"], m["key"], values))
        else:
            reqs.append(("exists", m["key"], frozenset()))

    def matches(labels: Mapping[str, str]) -> bool:
        for op, key, values in reqs:
            value = labels.get(key)
            ok = {
                "!": value is None,
                "exists": value is not None,
                "=": value in values,
                "in": value in values,
                "!=": value not in values,
                "notin": value not in values,
            }[op]
            if not ok:
                return False
        return True

    return matches


_FIELDS: dict[str, Callable[[MutableObj], Any]] = {
    "metadata.name": lambda o: o["metadata"].get("name"),
    "metadata.namespace": lambda o: o["metadata"].get("namespace"),
    "spec.nodeName": lambda o: (o.get("spec") or {}).get("nodeName") or "",
}


def _field_test(selector: str) -> Callable[[MutableObj], bool]:
    tests = []
    for part in filter(None, (p.strip() for p in selector.split(","))):
        field, op, value = re.split(r"(!=|==|=)", part, maxsplit=1)
        read = _FIELDS.get(field.strip())
        if read is None:
            raise errors.BadRequest(
                f'field label not supported by the fake client: "{field.strip()}"', code=400
            )
        want = value.strip()
        tests.append((read, op == "!=", want))
    return lambda obj: all(
        (read(obj) != want) if neg else (read(obj) == want) for read, neg, want in tests
    )


# --- patches ------------------------------------------------------------------------------


def _partial(obj: Mapping[str, Any]) -> MutableObj:
    """The API server's answer to ``Accept: ...;as=PartialObjectMetadata``."""
    return {
        "apiVersion": "meta.k8s.io/v1",
        "kind": "PartialObjectMetadata",
        "metadata": copy.deepcopy(obj["metadata"]),
    }


def _merge(target: Any, patch: Any) -> Any:
    """RFC 7386: maps merged, ``null`` removes, anything else replaces."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = _merge(out.get(key), value)
    return out


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise errors.BadRequest(f"JSON pointer {path!r} does not start with /", code=400)
    return [unescape(p) for p in path[1:].split("/")]


def _json_patch(doc: Any, ops: Iterable[Mapping[str, Any]]) -> Any:
    """RFC 6902 (add, remove, replace, move, copy, test); a failed op is a 422."""
    doc = copy.deepcopy(doc)

    def parent(tokens: list[str]) -> tuple[Any, str]:
        node = doc
        for t in tokens[:-1]:
            node = node[int(t)] if isinstance(node, list) else node[t]
        return node, tokens[-1]

    def get(tokens: list[str]) -> Any:
        node = doc
        for t in tokens:
            node = node[int(t)] if isinstance(node, list) else node[t]
        return node

    def put(tokens: list[str], value: Any, replace: bool) -> None:
        node, last = parent(tokens)
        if isinstance(node, list):
            if last == "-":
                node.append(value)
            elif replace:
                node[int(last)] = value
            else:
                node.insert(int(last), value)
        else:
            if replace and last not in node:
                raise KeyError(last)
            node[last] = value

    def remove(tokens: list[str]) -> Any:
        node, last = parent(tokens)
        return node.pop(int(last)) if isinstance(node, list) else node.pop(last)

    for op in ops:
        try:
            kind, tokens = op["op"], _pointer(op["path"])
            if kind == "test":
                if get(tokens) != op["value"]:
                    raise errors.Invalid(f"test failed at {op['path']}", code=422)
            elif kind == "add" and not tokens:
                doc = copy.deepcopy(op["value"])
            elif kind in ("add", "replace"):
                put(tokens, copy.deepcopy(op["value"]), replace=kind == "replace")
            elif kind == "remove":
                remove(tokens)
            elif kind in ("move", "copy"):
                source = _pointer(op["from"])
                value = remove(source) if kind == "move" else copy.deepcopy(get(source))
                put(tokens, value, replace=False)
            else:
                raise errors.BadRequest(f"unknown JSON patch op {kind!r}", code=400)
        except (KeyError, IndexError, ValueError, TypeError) as err:
            raise errors.Invalid(f"JSON patch {op!r} does not apply: {err}", code=422) from err
    return doc


def _spec(obj: MutableObj) -> MutableObj:
    """What a change of bumps ``generation``: all but metadata and status."""
    return {k: v for k, v in obj.items() if k not in ("metadata", "status")}


# --- the client ---------------------------------------------------------------------------


class FakeClient:
    """Objects in memory, with the API server's write rules (module doc)."""

    def __init__(
        self,
        objects: Iterable[tuple[Kind, Mapping[str, Any]]] = (),
        *,
        status_subresource: Iterable[Kind] = (),
        history: int = 1000,
    ) -> None:
        self._objects: dict[_Key, MutableObj] = {}
        self._kinds: dict[str, Kind] = {}
        self._rv = 0
        self._status = {k.name for k in status_subresource}
        #: the last ``history`` changes (rv, kind, type, object), what watches replay
        self._events: list[tuple[int, str, str, MutableObj]] = []
        self.history = history
        self._changed = anyio.Event()
        self.actions: list[Action] = []
        self._reactions: list[tuple[str, str, Reaction]] = []
        for kind, obj in objects:
            self.add(kind, obj)

    def react(self, verb: str, kind: Kind, reaction: Reaction) -> None:
        """Ask ``reaction`` first for every ``verb`` (or ``"*"``) call on ``kind``; the
        newest reaction is asked first, as client-go's ``PrependReactor``. Watches are
        not answered by reactions."""
        self._reactions.insert(0, (verb, kind.name, reaction))

    def _call(self, action: Action, body: Any = None) -> MutableObj | None:
        """Record ``action``; the first reaction's answer, if one answers."""
        self.actions.append(action)
        for verb, kind, reaction in self._reactions:
            if kind == action.kind and verb in ("*", action.verb):
                answer = reaction(action, body)
                if answer is not None:
                    return answer
        return None

    def add(self, kind: Kind, obj: Mapping[str, Any]) -> MutableObj:
        """Store ``obj`` as given, status and uid included, replacing one of its name:
        a fixture, or what another writer did behind the code under test. A watch sees
        it ADDED (or MODIFIED); it gets a new resourceVersion."""
        new = copy.deepcopy(dict(obj))
        meta = new.setdefault("metadata", {})
        ns = self._ns(kind, None, new)
        old = self._objects.get(self._key(kind, ns, meta.get("name", "")))
        new = self._new(kind, new, ns or None)
        return self._store(kind, new, "ADDED" if old is None else "MODIFIED")

    def stored(self, kind: Kind, name: str, namespace: str | None = None) -> MutableObj:
        """The object as stored now (a copy), without recording a get."""
        return copy.deepcopy(self._find(kind, self._ns(kind, namespace), name))

    # -- helpers --
    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    @staticmethod
    def _ns(kind: Kind, namespace: str | None, obj: Mapping[str, Any] | None = None) -> str:
        if not kind.namespaced:
            return ""
        ns = namespace or ((obj or {}).get("metadata") or {}).get("namespace")
        if not ns:
            raise ValueError(f"{kind.name} is namespaced: a namespace is required")
        return str(ns)

    def _key(self, kind: Kind, namespace: str, name: str) -> _Key:
        self._kinds[kind.name] = kind
        return (kind.name, namespace, name)

    def _find(self, kind: Kind, namespace: str, name: str) -> MutableObj:
        obj = self._objects.get(self._key(kind, namespace, name))
        if obj is None:
            raise errors.NotFound(f'{kind.plural} "{name}" not found', code=404, reason="NotFound")
        return obj

    def _new(self, kind: Kind, obj: Mapping[str, Any], namespace: str | None) -> MutableObj:
        new = copy.deepcopy(dict(obj))
        meta = new.setdefault("metadata", {})
        if not meta.get("name"):
            if meta.get("generateName"):
                meta["name"] = f"{meta['generateName']}{uuid.uuid4().hex[:5]}"
            else:
                raise errors.Invalid(f"{kind.kind}: metadata.name is required", code=422)
        if kind.namespaced:
            meta["namespace"] = self._ns(kind, namespace, new)
        else:
            meta.pop("namespace", None)
        new.setdefault("apiVersion", kind.api_version)
        new.setdefault("kind", kind.kind)
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
        meta["resourceVersion"] = self._next_rv()
        meta.setdefault("generation", 1)
        return new

    def _store(self, kind: Kind, obj: MutableObj, event: str = "ADDED") -> MutableObj:
        meta = obj["metadata"]
        self._objects[self._key(kind, meta.get("namespace", ""), meta["name"])] = obj
        self._notify(kind, event, obj)
        return copy.deepcopy(obj)

    def _notify(self, kind: Kind, event: str, obj: MutableObj) -> None:
        rv = int(obj["metadata"]["resourceVersion"])
        self._events.append((rv, kind.name, event, copy.deepcopy(obj)))
        del self._events[: -self.history]  # watches from before that get 410, as on a server
        self._changed.set()
        self._changed = anyio.Event()

    def _write(
        self, kind: Kind, old: MutableObj, new: MutableObj, subresource: str | None
    ) -> MutableObj:
        """Store ``new`` in place of ``old``: status kept apart, generation on spec."""
        if kind.name in self._status:
            if subresource == "status":
                new = {**copy.deepcopy(old), "status": copy.deepcopy(new.get("status"))}
                if new["status"] is None:
                    new.pop("status")
            elif "status" in old:
                new["status"] = copy.deepcopy(old["status"])
            else:
                new.pop("status", None)
        meta = new.setdefault("metadata", {})
        for fixed in ("uid", "creationTimestamp", "namespace", "name"):
            if fixed in old["metadata"]:
                meta[fixed] = old["metadata"][fixed]
        meta["generation"] = old["metadata"].get("generation", 1) + (_spec(old) != _spec(new))
        if new == {**old, "metadata": {**old["metadata"], "generation": meta["generation"]}}:
            return copy.deepcopy(old)  # a no-op write changes nothing, as on the server
        meta["resourceVersion"] = self._next_rv()
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            del self._objects[self._key(kind, meta.get("namespace", ""), meta["name"])]
            self._notify(kind, "DELETED", new)
            return copy.deepcopy(new)
        return self._store(kind, new, "MODIFIED")

    # -- reads --
    async def get(self, kind: Kind, name: str, namespace: str | None = None) -> MutableObj:
        ns = self._ns(kind, namespace)
        if (answer := self._call(Action("get", kind.name, ns or None, name))) is not None:
            return answer
        return copy.deepcopy(self._find(kind, ns, name))

    def _select(
        self,
        kind: Kind,
        namespace: str | None,
        label_selector: str | None,
        field_selector: str | None,
    ) -> Callable[[MutableObj], bool]:
        labels = parse_label_selector(label_selector or "")
        fields = _field_test(field_selector or "")

        def test(obj: MutableObj) -> bool:
            meta = obj["metadata"]
            return (
                (not namespace or meta.get("namespace") == namespace)
                and labels(meta.get("labels") or {})
                and fields(obj)
            )

        return test

    async def list(
        self,
        kind: Kind,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        **_paging: Any,
    ) -> MutableObj:
        """All matching items in one page (``limit``/``continue_`` are accepted, unused)."""
        if (answer := self._call(Action("list", kind.name, namespace, None))) is not None:
            return answer
        test = self._select(kind, namespace, label_selector, field_selector)
        items = [
            copy.deepcopy(o)
            for (k, _, _), o in sorted(self._objects.items())
            if k == kind.name and test(o)
        ]
        return {
            "apiVersion": kind.api_version,
            "kind": f"{kind.kind}List",
            "metadata": {"resourceVersion": str(self._rv)},
            "items": items,
        }

    async def list_all(
        self,
        kind: Kind,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        transform: Callable[[MutableObj], MutableObj] | None = None,
        **_paging: Any,
    ) -> tuple[builtins.list[MutableObj], str]:
        page = await self.list(
            kind, namespace, label_selector=label_selector, field_selector=field_selector
        )
        items = [transform(i) if transform else i for i in page["items"]]
        return items, page["metadata"]["resourceVersion"]

    async def watch(
        self,
        kind: Kind,
        namespace: str | None = None,
        *,
        resource_version: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        **_options: Any,
    ) -> AsyncGenerator[MutableObj]:
        """Events after ``resource_version`` (default: now), as they happen, until the
        caller stops; a version older than the kept history is :class:`errors.Gone`."""
        self.actions.append(Action("watch", kind.name, namespace, None))
        test = self._select(kind, namespace, label_selector, field_selector)
        since = int(resource_version) if resource_version else self._rv
        if self._events and since < self._events[0][0] - 1:
            raise errors.Gone(f"too old resource version: {since}", code=410, reason="Expired")
        while True:
            changed = self._changed
            for rv, name, type_, obj in list(self._events):
                if rv > since:
                    since = rv
                    if name == kind.name and test(obj):
                        yield {"type": type_, "object": copy.deepcopy(obj)}
            await changed.wait()

    # -- writes --
    async def create(
        self,
        kind: Kind,
        obj: Mapping[str, Any],
        namespace: str | None = None,
        *,
        metadata_only: bool = False,
        **_: Any,
    ) -> MutableObj:
        ns = self._ns(kind, namespace, obj)
        name = (obj.get("metadata") or {}).get("name")
        if (answer := self._call(Action("create", kind.name, ns or None, name), obj)) is not None:
            return answer
        if name and self._key(kind, ns, name) in self._objects:
            raise errors.AlreadyExists(
                f'{kind.plural} "{name}" already exists', code=409, reason="AlreadyExists"
            )
        new = self._new(kind, obj, ns or None)
        if kind.name in self._status:
            new.pop("status", None)  # the server drops status on create of such kinds
        stored = self._store(kind, new)
        return _partial(stored) if metadata_only else stored

    async def update(
        self, kind: Kind, obj: Mapping[str, Any], *, subresource: str | None = None
    ) -> MutableObj:
        meta = obj.get("metadata") or {}
        ns = self._ns(kind, None, obj)
        action = Action("update", kind.name, ns or None, meta.get("name"), subresource)
        if (answer := self._call(action, obj)) is not None:
            return answer
        old = self._find(kind, ns, meta["name"])
        wanted = meta.get("resourceVersion")
        if wanted and wanted != old["metadata"]["resourceVersion"]:
            raise errors.Conflict(
                f'Operation cannot be fulfilled on {kind.plural} "{meta["name"]}": the object '
                "has been modified; please apply your changes to the latest version and try "
                "again",
                code=409,
                reason="Conflict",
            )
        return self._write(kind, old, copy.deepcopy(dict(obj)), subresource)

    async def update_status(self, kind: Kind, obj: Mapping[str, Any]) -> MutableObj:
        return await self.update(kind, obj, subresource="status")

    async def patch(
        self,
        kind: Kind,
        name: str,
        body: Any,
        namespace: str | None = None,
        *,
        patch_type: str = "merge",
        subresource: str | None = None,
        metadata_only: bool = False,
        **_: Any,
    ) -> MutableObj:
        ns = self._ns(kind, namespace)
        action = Action("patch", kind.name, ns or None, name, subresource)
        if (answer := self._call(action, body)) is not None:
            return answer
        old = self._find(kind, ns, name)
        if patch_type == "json":
            new = _json_patch(old, body)
        elif patch_type in ("merge", "strategic", "apply"):
            for field in ("uid", "resourceVersion"):
                wanted = ((body or {}).get("metadata") or {}).get(field)
                if wanted and wanted != old["metadata"].get(field):
                    raise errors.Conflict(
                        f"Precondition failed: {field} in precondition: {wanted}, {field} "
                        f"in object meta: {old['metadata'].get(field)}",
                        code=409,
                        reason="Conflict",
                    )
            new = _merge(old, body)
        else:
            raise ValueError(f"unknown patch type {patch_type!r}")
        written = self._write(kind, old, new, subresource)
        return _partial(written) if metadata_only else written

    async def delete(
        self,
        kind: Kind,
        name: str,
        namespace: str | None = None,
        *,
        resource_version: str | None = None,
        uid: str | None = None,
        **_: Any,
    ) -> MutableObj:
        """Gone at once, or (with finalizers) marked with ``deletionTimestamp``."""
        ns = self._ns(kind, namespace)
        if (answer := self._call(Action("delete", kind.name, ns or None, name))) is not None:
            return answer
        old = self._find(kind, ns, name)
        meta = old["metadata"]
        for field, wanted in (("uid", uid), ("resourceVersion", resource_version)):
            if wanted and wanted != meta.get(field):
                raise errors.Conflict(
                    f"Precondition failed: {field} in precondition: {wanted}, {field} in "
                    f"object meta: {meta.get(field)}",
                    code=409,
                    reason="Conflict",
                )
        if meta.get("finalizers"):
            if not meta.get("deletionTimestamp"):
                marked = copy.deepcopy(old)
                marked["metadata"]["deletionTimestamp"] = datetime.now(UTC).strftime(
                    "%Y-%m-%dT%H:%M:%SZ"
                )
                return self._write(kind, old, marked, None)
            return copy.deepcopy(old)
        del self._objects[self._key(kind, ns, name)]
        gone = copy.deepcopy(old)
        gone["metadata"]["resourceVersion"] = self._next_rv()
        self._notify(kind, "DELETED", gone)
        return gone

    async def bind(
        self, namespace: str, pod_name: str, node_name: str, *, pod_uid: str | None = None
    ) -> None:
        """Set the pod's ``spec.nodeName``; a bound pod, or another UID, is a Conflict."""
        if self._call(Action("bind", PODS.name, namespace, pod_name, "binding")) is not None:
            return
        pod = self._find(PODS, namespace, pod_name)
        if pod_uid and pod_uid != pod["metadata"].get("uid"):
            raise errors.Conflict(f"pod {pod_name}: uid {pod_uid} is not the pod's", code=409)
        if (pod.get("spec") or {}).get("nodeName"):
            raise errors.Conflict(
                f'Operation cannot be fulfilled on pods/binding "{pod_name}": pod {pod_name} '
                f'is already assigned to node "{pod["spec"]["nodeName"]}"',
                code=409,
                reason="Conflict",
            )
        bound = copy.deepcopy(pod)
        bound.setdefault("spec", {})["nodeName"] = node_name
        self._write(PODS, pod, bound, None)

    async def aclose(self) -> None:
        """Nothing to close; here so a test may use it where a Client is closed."""

    async def __aenter__(self) -> FakeClient:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        return None

    def writes(self) -> builtins.list[Action]:
        """The actions that changed something or tried to (all but get, list, watch)."""
        return [a for a in self.actions if a.verb not in ("get", "list", "watch")]

"""The shared cache: one informer per kind for every controller in the process."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc

from sdgruntime import errors
from sdgruntime.cache.informer import NAMESPACE_INDEX, Informer
from sdgruntime.cache.reflector import ReflectorOptions, Selector
from sdgruntime.cache.store import (
    IndexFunc,
    Transform,
    drop_managed_fields,
    json_copy,
    make_key,
)
from sdgruntime.cache.sync import CacheNotSynced, CacheSyncError, Notifier, wait_synced
from sdgruntime.discovery import explain_missing
from sdgruntime.kinds import Kind, MutableObj

if TYPE_CHECKING:
    from sdgruntime.client import Client

__all__ = ["Cache", "KindOptions"]


@dataclass(frozen=True, slots=True)
class KindOptions:
    """What the cache holds of one kind: a namespace, selectors, and a transform.

    ``transform=None`` means the cache's ``default_transform``; ``reflector=None`` the
    cache's reflector options.
    """

    namespace: str | None = None
    label_selector: Selector | None = None
    field_selector: Selector | None = None
    transform: Transform | None = None
    reflector: ReflectorOptions | None = None


class Cache:
    """Informers created on first use and shared, run in a task group the cache owns.

    Reads (:meth:`get`, :meth:`list`) are synchronous and return deep copies unless
    ``copy=False`` (read-only hot paths). Reading a kind creates its informer (and starts
    it if the cache runs); until it has synced, reads raise :class:`CacheNotSynced`.
    """

    def __init__(
        self,
        client: Client,
        *,
        default_transform: Transform | None = drop_managed_fields,
        by_kind: Mapping[Kind, KindOptions] | None = None,
        reflector_options: ReflectorOptions | None = None,
    ) -> None:
        self.client = client
        self.default_transform = default_transform
        self.by_kind = dict(by_kind or {})
        self.reflector_options = reflector_options or ReflectorOptions()
        self._informers: dict[Kind, Informer] = {}
        self._changed = Notifier()
        self._tg: anyio.abc.TaskGroup | None = None

    # --- informers -----------------------------------------------------------------------

    def informer(self, kind: Kind) -> Informer:
        """The kind's shared informer, created (and started, if the cache runs) on first use."""
        inf = self._informers.get(kind)
        if inf is not None:
            return inf
        opts = self.by_kind.get(kind) or KindOptions()
        inf = Informer(
            self.client,
            kind,
            namespace=opts.namespace,
            label_selector=opts.label_selector,
            field_selector=opts.field_selector,
            transform=opts.transform or self.default_transform,
            options=opts.reflector or self.reflector_options,
        )
        inf.add_state_listener(self._changed.notify)
        self._informers[kind] = inf
        if self._tg is not None:
            self._tg.start_soon(inf.run, name=f"informer {kind.name}")
        self._changed.notify()
        return inf

    @property
    def informers(self) -> dict[Kind, Informer]:
        return dict(self._informers)

    def add_index(self, kind: Kind, name: str, fn: IndexFunc) -> None:
        self.informer(kind).add_index(name, fn)

    # --- reads ---------------------------------------------------------------------------

    def _synced(self, kind: Kind) -> Informer:
        inf = self.informer(kind)
        if not inf.has_synced:
            raise CacheNotSynced(f"the cache of {kind.name} has not synced yet")
        return inf

    def get(
        self, kind: Kind, name: str, namespace: str | None = None, *, copy: bool = True
    ) -> MutableObj:
        """The cached object; :class:`errors.NotFound` if the synced cache does not hold it,
        :class:`CacheNotSynced` (not a NotFound) if the kind has not synced yet."""
        obj = self.find(kind, name, namespace, copy=copy)
        if obj is None:
            where = f" in namespace {namespace}" if kind.namespaced else ""
            raise errors.NotFound(f'{kind.name} "{name}" not found in the cache{where}', code=404)
        return obj

    def find(
        self, kind: Kind, name: str, namespace: str | None = None, *, copy: bool = True
    ) -> MutableObj | None:
        """As :meth:`get`, but ``None`` where it raises NotFound: for a lookup that is
        often empty on a hot path (an exception costs several microseconds)."""
        if kind.namespaced and not namespace:
            raise ValueError(f"{kind.name} is namespaced: a namespace is required")
        inf = self._synced(kind)
        return inf.store.get(make_key(name, namespace if kind.namespaced else None), copy=copy)

    def count(self, kind: Kind, *, index: str, value: str) -> int:
        """How many cached objects index ``index`` files under ``value``; what ``list`` with
        the same index and value would return, without building the list."""
        return self._synced(kind).store.index_count(index, value)

    def list(
        self,
        kind: Kind,
        namespace: str | None = None,
        *,
        label_selector: Mapping[str, str] | None = None,
        index: str | None = None,
        value: str | None = None,
        copy: bool = True,
    ) -> list[MutableObj]:
        """Cached objects, narrowed by namespace, an index value and equality on labels."""
        store = self._synced(kind).store
        if index is not None or value is not None:
            if index is None or value is None:
                raise ValueError("index and value go together")
            objs = store.by_index(index, value, copy=False)
            if namespace and kind.namespaced:
                objs = [o for o in objs if o["metadata"].get("namespace") == namespace]
        elif namespace and kind.namespaced:
            objs = store.by_index(NAMESPACE_INDEX, namespace, copy=False)
        else:
            objs = store.list(copy=False)
        if label_selector:
            objs = [o for o in objs if _labels_match(o, label_selector)]
        return [json_copy(o) for o in objs] if copy else objs

    # --- running -------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._tg is not None

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Run every informer (and those added later) until cancelled."""
        if self._tg is not None:
            raise RuntimeError("the cache is already running")
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                for kind, inf in self._informers.items():
                    tg.start_soon(inf.run, name=f"informer {kind.name}")
                task_status.started()
                await anyio.sleep_forever()
        finally:
            self._tg = None

    async def wait_for_sync(self, timeout: float) -> None:  # noqa: ASYNC109 - in the error
        """Return when every informer has synced.

        Raise :class:`CacheSyncError` naming the kind and the cause as soon as a first list
        fails in a way waiting will not heal (Forbidden, NotFound: CRD missing, a bad
        selector), or at ``timeout`` with each pending kind's last error. A 404 is
        explained by discovery: the group, version, plural or scope that is served.
        """
        try:
            await wait_synced(lambda: list(self._informers.values()), self._changed, timeout)
        except CacheSyncError as exc:
            hints = await self._explain_not_found(exc)
            if not hints:
                raise
            raise exc.with_hints(hints) from None

    async def _explain_not_found(self, exc: CacheSyncError) -> dict[Kind, str]:
        """What discovery says of each kind that answered 404 (a wrong plural, version or
        scope, or a CRD not installed); best effort, within a few seconds."""
        hints: dict[Kind, str] = {}
        with anyio.move_on_after(5):
            for kind, err in exc.failures:
                if isinstance(err, errors.NotFound):
                    try:
                        hints[kind] = await explain_missing(self.client, kind)
                    except Exception:  # the original error says enough without it
                        continue
        return hints


def _labels_match(obj: MutableObj, selector: Mapping[str, Any]) -> bool:
    labels = obj["metadata"].get("labels") or {}
    return all(labels.get(k) == v for k, v in selector.items())

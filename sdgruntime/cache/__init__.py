"""The shared informer cache: stores with indexes, reflectors (list + watch), informers.

``Cache`` is what controllers and webhooks use; the parts are public for tests and for
code that needs one informer without a cache.
"""

from sdgruntime.cache.backoff import Backoff
from sdgruntime.cache.cache import Cache, KindOptions
from sdgruntime.cache.informer import NAMESPACE_INDEX, Handler, Informer
from sdgruntime.cache.reflector import Reflector, ReflectorOptions, ReflectorStats, Selector
from sdgruntime.cache.store import (
    IndexFunc,
    Replaced,
    Store,
    Transform,
    drop_managed_fields,
    field_indexer,
    intern_strings,
    json_copy,
    make_key,
    object_key,
)
from sdgruntime.cache.sync import CacheNotSynced, CacheSyncError

__all__ = [
    "NAMESPACE_INDEX",
    "Backoff",
    "Cache",
    "CacheNotSynced",
    "CacheSyncError",
    "Handler",
    "IndexFunc",
    "Informer",
    "KindOptions",
    "Reflector",
    "ReflectorOptions",
    "ReflectorStats",
    "Replaced",
    "Selector",
    "Store",
    "Transform",
    "drop_managed_fields",
    "field_indexer",
    "intern_strings",
    "json_copy",
    "make_key",
    "object_key",
]

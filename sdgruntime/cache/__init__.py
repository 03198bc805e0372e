"""The shared informer cache: stores with indexes, reflectors (list + watch), informers."""

from sdgruntime.cache.store import (
    IndexFunc,
    Replaced,
    Store,
    Transform,
    drop_managed_fields,
    field_indexer,
    json_copy,
    make_key,
    object_key,
)

__all__ = [
    "IndexFunc",
    "Replaced",
    "Store",
    "Transform",
    "drop_managed_fields",
    "field_indexer",
    "json_copy",
    "make_key",
    "object_key",
]

"""RFC 6902 JSON Patch computed from two JSON documents, for mutating webhooks.

A mutator edits a copy of the object and the webhook sends the difference; the API
server applies it to the object it sent. The invariant (tested with hypothesis) is
``apply(diff(a, b), a) == b`` for any JSON documents, where equality is JSON equality:
``True`` is not ``1`` and ``1`` is not ``1.0`` (they serialise differently).

Objects are diffed key by key; arrays element by element on their common prefix, then
appended or truncated at the end (removals from the last index down, so every index is
valid when applied), or replaced whole when that is shorter than the edits.
"""

from __future__ import annotations

import json
from typing import Any

from sdgruntime.cache.store import json_copy  # the one deep copy of decoded JSON

JSON = Any
Operation = dict[str, Any]


def escape(token: str) -> str:
    """One JSON-pointer reference token (RFC 6901): ``~`` -> ``~0``, ``/`` -> ``~1``."""
    return token.replace("~", "~0").replace("/", "~1")


def unescape(token: str) -> str:
    """The inverse of :func:`escape` (``~1`` first, so ``~01`` reads as ``~1``)."""
    return token.replace("~1", "/").replace("~0", "~")


def json_equal(a: JSON, b: JSON) -> bool:
    """Equality of decoded JSON values that does not confuse bools, ints and floats."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(json_equal(v, b[k]) for k, v in a.items())
    if isinstance(a, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def diff(source: JSON, target: JSON) -> list[Operation]:
    """The operations that turn ``source`` into ``target``."""
    ops: list[Operation] = []
    _diff(source, target, "", ops)
    return ops


def _diff(source: JSON, target: JSON, path: str, ops: list[Operation]) -> None:
    if isinstance(source, dict) and isinstance(target, dict):
        for key in source:
            if key not in target:
                ops.append({"op": "remove", "path": f"{path}/{escape(key)}"})
        for key, value in target.items():
            child = f"{path}/{escape(key)}"
            if key in source:
                _diff(source[key], value, child, ops)
            else:
                ops.append({"op": "add", "path": child, "value": json_copy(value)})
    elif isinstance(source, list) and isinstance(target, list):
        element_ops: list[Operation] = []
        common = min(len(source), len(target))
        for i in range(common):
            _diff(source[i], target[i], f"{path}/{i}", element_ops)
        for i in range(len(source) - 1, common - 1, -1):
            element_ops.append({"op": "remove", "path": f"{path}/{i}"})
        for i in range(common, len(target)):
            element_ops.append({"op": "add", "path": f"{path}/{i}", "value": json_copy(target[i])})
        # A shifted or rewritten list (an insertion at the front, a reordering) diffs into
        # a cascade of per-index edits: one replace is then smaller and easier to read.
        if len(element_ops) > 1 and _size(target) < _size(element_ops):
            ops.append({"op": "replace", "path": path, "value": json_copy(target)})
        else:
            ops.extend(element_ops)
    elif not json_equal(source, target):
        ops.append({"op": "replace", "path": path, "value": json_copy(target)})


def _size(value: JSON) -> int:
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False))

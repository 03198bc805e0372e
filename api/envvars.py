"""Which environment variable tells a container runtime its visible devices.

The table maps fnmatch-style globs on device resource names to env var names, so one
entry (``huawei.com/Ascend*``) covers a vendor's product family.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from fnmatch import fnmatchcase

from api.constants import DEFAULT_ENV_TABLE, DEVICE_ENV_FLAG

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_GLOB_CHARS = frozenset("*?[")


def env_var_for(resource: str, table: Mapping[str, str] = DEFAULT_ENV_TABLE) -> str | None:
    """The env var for ``resource``: an exact key wins, then the longest matching glob.

    Longest-glob-wins makes the result independent of the table's order, so an operator
    can add ``huawei.com/Ascend310*`` next to ``huawei.com/Ascend*`` and get the specific one.
    """
    exact = table.get(resource)
    if exact is not None:
        return exact
    best: tuple[int, str] | None = None
    for pattern in table:
        if _GLOB_CHARS.isdisjoint(pattern):
            continue
        if fnmatchcase(resource, pattern):
            key = (len(pattern), pattern)
            if best is None or key > best:
                best = key
    return table[best[1]] if best is not None else None


def parse_env_table(
    items: Iterable[str], base: Mapping[str, str] = DEFAULT_ENV_TABLE
) -> dict[str, str]:
    """Parse repeated ``RESOURCE_GLOB=ENV_VAR`` flag values on top of ``base``.

    Raises ValueError naming the offending item, for a clear startup error.
    """
    table = dict(base)
    for item in items:
        pattern, sep, env = item.partition("=")
        pattern, env = pattern.strip(), env.strip()
        if not sep or not pattern or not _ENV_NAME.fullmatch(env):
            raise ValueError(
                f"{DEVICE_ENV_FLAG} {item!r}: expected RESOURCE_GLOB=ENV_VAR, "
                "e.g. amd.com/gpu=AMD_VISIBLE_DEVICES"
            )
        table[pattern] = env
    return table

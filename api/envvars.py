"""Which environment variable tells a container runtime its visible devices.

The table maps fnmatch-style globs on device resource names to env var names, so one
entry (``huawei.com/Ascend*``) covers a vendor's product family. ``env_vars_reached``
also covers the other names a vendor's devices are requested under (MIG profiles,
time-sliced ``.shared`` resources, partitions): what foreign detection and the pod
webhook count as a device resource.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from fnmatch import fnmatchcase

from api.constants import DEFAULT_ENV_TABLE, DEVICE_ENV_FLAG, NO_DEVICES, VOID_DEVICES

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_GLOB_CHARS = frozenset("*?[")

#: Values of a device env var that make no device visible, compared stripped and
#: lower-cased: empty (SDG's own under ``cdi``), NVIDIA's ``void`` and ``none``. Anything
#: else (IDs, UUIDs, ``all``) may reach devices.
NO_DEVICE_VALUES = frozenset({NO_DEVICES, VOID_DEVICES, "none"})


def names_no_device(value: object) -> bool:
    """Whether a device env var's value (None: no ``value``, i.e. empty) shows no device."""
    return str(value or "").strip().lower() in NO_DEVICE_VALUES


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


def device_env_vars(table: Mapping[str, str] = DEFAULT_ENV_TABLE) -> frozenset[str]:
    """Every env var the table names: the variables some runtime reads devices from."""
    return frozenset(table.values())


def _domain(name: str) -> str | None:
    domain, sep, rest = name.partition("/")
    return domain if sep and rest else None


def env_vars_reached(resource: str, table: Mapping[str, str] = DEFAULT_ENV_TABLE) -> frozenset[str]:
    """The env vars whose devices a request for ``resource`` may reach (empty: none).

    ``env_var_for`` when the table maps the resource; else, for a resource in a vendor's
    domain (the part before ``/``) that the table names, that domain's variables: vendors
    publish one GPU under many names (NVIDIA's MIG profiles ``nvidia.com/mig-1g.10gb``,
    time-sliced ``nvidia.com/gpu.shared``, AMD's ``amd.com/*`` partitions), and each
    reaches the same physical devices. Names in no such domain (``cpu``,
    ``example.com/fpga``) reach none.
    """
    var = env_var_for(resource, table)
    if var is not None:
        return frozenset({var})
    domain = _domain(resource)
    if domain is None:
        return frozenset()
    return frozenset(v for pattern, v in table.items() if _domain(pattern) == domain)


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

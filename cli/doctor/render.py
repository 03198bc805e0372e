"""``sdg doctor``'s output: one line per check (✓ ✗ !) with its fix, or JSON."""

from __future__ import annotations

import json
from collections.abc import Sequence
from types import MappingProxyType
from typing import Final

from cli.doctor.facts import Check

# --- rendering ------------------------------------------------------------------------------

MARKS: Final = MappingProxyType({True: "✓", False: "✗", None: "!"})
_COLORS: Final = MappingProxyType({True: "\033[32m", False: "\033[31m", None: "\033[33m"})
_RESET: Final = "\033[0m"


def render_text(checks: Sequence[Check], color: bool = False) -> str:
    """One line per check (mark, name, detail), its fix indented below it for ✗ and !;
    then a summary. ``color`` (a terminal) only adds ANSI colours to the marks."""
    width = max((len(c.name) for c in checks), default=0)
    lines = []
    for c in checks:
        mark = MARKS[c.ok]
        if color:
            mark = f"{_COLORS[c.ok]}{mark}{_RESET}"
        lines.append(f"{mark} {c.name:<{width}}  {c.detail}".rstrip())
        if c.fix and c.ok is not True:
            for i, fix in enumerate(c.fix.splitlines()):
                lines.append(f"    {'fix: ' if i == 0 else '     '}{fix}")
    failed = sum(c.ok is False for c in checks)
    warned = sum(c.ok is None for c in checks)
    if failed or warned:
        summary = f"{failed} problem(s), {warned} warning(s) in {len(checks)} checks"
    else:
        summary = f"all {len(checks)} checks passed"
    return "\n".join([*lines, "", summary]) + "\n"


def render_json(checks: Sequence[Check]) -> str:
    return json.dumps([c.as_json() for c in checks], indent=2, ensure_ascii=False) + "\n"

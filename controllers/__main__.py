"""``python -m controllers`` / ``sdg-manager``: the one SDG manager process."""

from __future__ import annotations

import contextlib
import json
import logging
import sys
from collections.abc import Sequence

import anyio

from controllers.settings import Settings, parse


class _JSONFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            out["error"] = self.formatException(record.exc_info)
        return json.dumps(out)


def setup_logging(settings: Settings) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if settings.log_format == "json":
        handler.setFormatter(_JSONFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(settings.log_level.upper())
    if settings.log_level != "debug":
        logging.getLogger("httpx").setLevel(logging.WARNING)


def main(argv: Sequence[str] | None = None) -> int:
    settings = parse(argv)
    setup_logging(settings)
    from controllers.app import SDG
    from sdgruntime.tracing import setup_tracing

    provider = setup_tracing("deviceshare-manager")
    sdg = SDG(settings, tracer_provider=provider)
    with contextlib.suppress(KeyboardInterrupt):
        anyio.run(sdg.manager.run)
    return 0


if __name__ == "__main__":
    sys.exit(main())

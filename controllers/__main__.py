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


async def resource_slices_served(settings: Settings) -> bool:
    """Whether the API server serves DRA ResourceSlices (resource.k8s.io/v1, 1.34+): an
    informer for a kind that is not served would keep the manager from starting."""
    from sdgruntime import errors
    from sdgruntime.client import Client

    async with Client.auto(settings.kubeconfig) as client:
        try:
            listing = await client.request("GET", "/apis/resource.k8s.io/v1")
        except errors.NotFound:
            return False
    return any(r.get("name") == "resourceslices" for r in listing.get("resources") or [])


def main(argv: Sequence[str] | None = None) -> int:
    settings = parse(argv)
    setup_logging(settings)
    if settings.resource_slices == "auto":
        served = anyio.run(resource_slices_served, settings)
        logging.getLogger(__name__).info(
            "device inventory from DRA ResourceSlices: %s", "on" if served else "off (not served)"
        )
        settings = settings.model_copy(update={"resource_slices": "on" if served else "off"})
    from controllers.app import SDG
    from sdgruntime.tracing import setup_tracing

    provider = setup_tracing("deviceshare-manager")
    sdg = SDG(settings, tracer_provider=provider)
    with contextlib.suppress(KeyboardInterrupt):
        anyio.run(sdg.manager.run)
    return 0


if __name__ == "__main__":
    sys.exit(main())

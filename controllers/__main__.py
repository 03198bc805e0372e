"""``python -m controllers`` / ``sdg-manager``: the one SDG manager process."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import logging
import os
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


async def resource_kinds_served(settings: Settings) -> set[str]:
    """The resources the API server serves in resource.k8s.io/v1 (ResourceSlices and
    ResourceClaims since 1.34, DeviceTaintRules since 1.37): an informer for a kind that is
    not served would keep the manager from starting."""
    from sdgruntime import errors
    from sdgruntime.client import Client

    async with Client.auto(settings.kubeconfig) as client:
        try:
            listing = await client.request("GET", "/apis/resource.k8s.io/v1")
        except errors.NotFound:
            return set()
    return {str(r.get("name")) for r in listing.get("resources") or []}


#: Net allocations of tracked objects between young collections (CPython's default: 700).
GC_YOUNG_THRESHOLD = 7000


def tune_gc() -> None:
    """Less of the manager's time in the cyclic GC. What is loaded by now lives as long as
    the process: collected once, then frozen, so no full collection walks it again; young
    collections every ``GC_YOUNG_THRESHOLD`` allocations, so the objects of a watch event
    or a review, nearly all freed by reference counting, are rarely walked while alive.
    Cycles are still collected, later. GC took 2.9-4.8% of the manager's CPU in
    ``hack/bench/ab.py`` runs, 1.1-1.7% with this (RESULTS.md, session 31)."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)


#: Allocations from this size up get their own mmap, returned to the system when freed
#: (glibc's starting M_MMAP_THRESHOLD, 128 KiB).
MMAP_THRESHOLD = 128 * 1024
_M_MMAP_THRESHOLD = -3  # glibc's malloc.h


def tune_malloc() -> bool:
    """Fix glibc's mmap threshold at ``MMAP_THRESHOLD``, as ``MALLOC_MMAP_THRESHOLD_`` in
    the image does, however the manager is started. Left dynamic, glibc raises it after
    the first big free (the initial lists), so every connection's 256 KiB TLS buffers and
    the big watch and list chunks land in the heap and leave holes: 12 MiB more RSS after
    a cold start with 10000 pods on uvloop, and a slow creep under churn (hack/bench/
    RESULTS.md, sessions 18 and 34). False where it is not glibc or the environment
    already sets the threshold (the user's value stands)."""
    if os.environ.get("MALLOC_MMAP_THRESHOLD_") or not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))


def use_uvloop(event_loop: str) -> bool:
    """Whether ``--event-loop`` runs the manager on uvloop: the same asyncio code with its
    transports and TLS in C, 7% less manager CPU per pod in S1 (hack/bench/RESULTS.md,
    session 33). ``uvloop`` where it is not installed is an error that says so."""
    if event_loop == "asyncio":
        return False
    try:
        import uvloop  # noqa: F401  (anyio's use_uvloop imports it to make the loop)
    except ImportError:
        if event_loop == "uvloop":
            raise SystemExit(
                "sdg-manager: --event-loop=uvloop, but uvloop is not installed: "
                "pip install uvloop, or use --event-loop=auto"
            ) from None
        return False
    return True


def main(argv: Sequence[str] | None = None) -> int:
    settings = parse(argv)
    tune_malloc()
    setup_logging(settings)
    uvloop = use_uvloop(settings.event_loop)
    if "auto" in (settings.resource_slices, settings.device_taint_rules):
        kinds = anyio.run(resource_kinds_served, settings)
        update = {}
        for field, kind in (
            ("resource_slices", "resourceslices"),
            ("device_taint_rules", "devicetaintrules"),
        ):
            if getattr(settings, field) == "auto":
                update[field] = "on" if kind in kinds else "off"
                logging.getLogger(__name__).info(
                    "DRA %s: %s", kind, "on" if kind in kinds else "off (not served)"
                )
        settings = settings.model_copy(update=update)
    from controllers.app import SDG
    from sdgruntime.tracing import setup_tracing

    provider = setup_tracing("deviceshare-manager")
    sdg = SDG(settings, tracer_provider=provider)
    logging.getLogger(__name__).info("event loop: %s", "uvloop" if uvloop else "asyncio")
    tune_gc()
    with contextlib.suppress(KeyboardInterrupt):
        anyio.run(sdg.manager.run, backend_options={"use_uvloop": uvloop})
    return 0


if __name__ == "__main__":
    sys.exit(main())

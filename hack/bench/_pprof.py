"""The API server's CPU by part while a phase runs: Go's CPU profile
(``/debug/pprof/profile``, in ``CHUNK_SECONDS`` pieces, back to back) read with
``go tool pprof -traces``, each sample given to the first part in ``PARTS`` whose frame is
on its stack. S10's parts come from it, so a change in S10 names what moved.

Part of the benchmarks, not of SDG.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

CHUNK_SECONDS = 5

#: (part, frames): a sample belongs to the first part with one of its frames on the stack
#: (substrings of Go function names). Most specific first: an admission webhook call runs
#: inside a pod create, a handshake inside a connection's serve loop.
PARTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # what the benchmark itself asks: its /metrics scrapes (write counts, settling)
    ("bench: /metrics scrapes", ("promhttp.", "prometheus/common/expfmt", "HandlerWithReset")),
    ("GC (background)", ("runtime.gcBgMarkWorker", "runtime.bgsweep", "runtime.bgscavenge")),
    ("mutating webhook calls", ("mutating.(*mutatingDispatcher).Dispatch",)),
    ("validating webhook calls", ("validating.(*validatingDispatcher).Dispatch",)),
    # the webhook client's connections, outside a dispatch's own goroutine
    ("webhook client: TLS handshakes", ("(*persistConn).addTLS", "(*Transport).dialConn")),
    ("webhook client: reads and writes", ("(*persistConn).writeLoop", "(*persistConn).readLoop")),
    ("admission policies", ("admission/plugin/policy/",)),
    ("authn: client certificates", ("x509.(*Authenticator).AuthenticateRequest",)),
    ("authn: tokens", ("bearertoken.(*Authenticator).AuthenticateRequest",)),
    ("TLS handshakes (clients in)", ("tls.(*Conn).serverHandshake",)),
    ("pods/binding POST", ("(*BindingREST).Create", "CreateNamedResource.createHandler")),
    ("CRD status writes", ("customresource.(*StatusREST).Update",)),
    ("CRD writes", ("apiextensions-apiserver/pkg/registry/customresource",)),
    # the handlers' closures, named after their caller where inlined (the CRD handler's
    # status PATCH is ``(*crdHandler).serveStatus.PatchResource.func3``)
    ("creates (pods, Events, ...)", ("CreateResource.createHandler",)),
    ("updates and patches", ("UpdateResource.", "PatchResource.")),
    ("watch streams", ("(*WatchServer).HandleHTTP", "handlers.serveWatch")),
    ("watch cache", ("storage/cacher.",)),
    ("etcd watch", ("etcd3.(*watchChan)",)),
    ("etcd client", ("google.golang.org/grpc", "go.etcd.io/etcd/client")),
    ("lists and gets", ("handlers.ListResource", "handlers.GetResource")),
    ("the API server's own informers", ("client-go/tools/cache", "watch.(*StreamWatcher)")),
    # a request's goroutine outside its verb's handler: authz, flow control, audit, routing
    ("request filters", ("(*timeoutHandler).ServeHTTP", "DefaultBuildHandlerChain")),
    ("connections in: reads, TLS", ("net/http.(*conn).serve", "net/http.(*connReader)")),
    ("Go scheduler", ("runtime.mcall", "runtime.sysmon", "runtime.mstart", "runtime.schedule")),
)
OTHER = "other"
log = logging.getLogger("compare")


def part_of(frames: Iterable[str]) -> str:
    """The part a sample with ``frames`` (leaf first) belongs to."""
    stack = list(frames)
    for part, marks in PARTS:
        if any(mark in frame for frame in stack for mark in marks):
            return part
    return OTHER


def _seconds(value: str) -> float:
    """``10ms``, ``1.50s``, ``250us`` as seconds."""
    for unit, scale in (("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9), ("s", 1.0)):
        if value.endswith(unit):
            return float(value[: -len(unit)]) * scale
    raise ValueError(f"not a pprof duration: {value!r}")


def parse_traces(text: str) -> list[tuple[float, list[str]]]:
    """``go tool pprof -traces`` output as (seconds, frames leaf first) per stack."""
    stacks: list[tuple[float, list[str]]] = []
    current: list[str] | None = None
    value = 0.0
    for line in text.splitlines():
        if line.startswith("-----------+"):
            if current:
                stacks.append((value, current))
            current = []
            continue
        if current is None or not line.strip():
            continue  # the header, before the first stack
        if not current:
            head, _, frame = line.strip().partition(" ")
            value = _seconds(head)
            current.append(frame.strip())
        else:
            current.append(line.strip())
    if current:
        stacks.append((value, current))
    return stacks


def parts(traces: Iterable[tuple[float, list[str]]]) -> dict[str, float]:
    """CPU seconds by part."""
    out: dict[str, float] = {}
    for seconds, frames in traces:
        part = part_of(frames)
        out[part] = out.get(part, 0.0) + seconds
    return out


class ApiServerProfile:
    """Profiles the API server behind ``session`` (an admin aiohttp session) from now until
    ``stop``; ``stop`` returns CPU seconds by part, or None where Go's pprof tool is
    missing or no profile came."""

    def __init__(self, session: Any, directory: Path, tag: str) -> None:
        self.session = session
        self.directory = directory
        self.tag = tag
        self.files: list[Path] = []
        self.error: str | None = None
        self._stopping = asyncio.Event()
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while not self._stopping.is_set():
            path = self.directory / f"pprof-{self.tag}-{len(self.files):03d}.pb.gz"
            try:
                async with self.session.get(
                    "/debug/pprof/profile", params={"seconds": str(CHUNK_SECONDS)}
                ) as resp:
                    if resp.status != 200:
                        self.error = f"/debug/pprof/profile: {resp.status}"
                        return
                    path.write_bytes(await resp.read())
            except Exception as exc:  # a bench aid: the run goes on without it
                self.error = f"/debug/pprof/profile: {exc}"
                return
            self.files.append(path)

    async def stop(self) -> dict[str, float] | None:
        parts = await self._stop()
        if parts is None:
            log.warning("%s: no API-server profile (%s)", self.tag, self.error)
        return parts

    async def _stop(self) -> dict[str, float] | None:
        self._stopping.set()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._task), CHUNK_SECONDS * 3)
        self._task.cancel()
        go = shutil.which("go")
        if not self.files:
            self.error = self.error or "no profile came back"
            return None
        if go is None:
            self.error = "go is not on PATH (go tool pprof reads the profiles)"
            return None
        text = await asyncio.to_thread(
            subprocess.run,
            [go, "tool", "pprof", "-traces", *map(str, self.files)],
            capture_output=True,
            text=True,
            check=False,
        )
        if text.returncode != 0:
            self.error = text.stderr.strip()[-300:]
            return None
        return parts(parse_traces(text.stdout))

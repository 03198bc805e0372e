"""What the comparison benchmark shares with its helper processes: a small aiohttp client
for the API server (load generation and watches with little Python CPU per request) and
per-process CPU and memory from /proc.

Used by ``compare.py`` and ``raw_binder.py``; needs the ``bench`` extra (aiohttp). With
``lean=True`` (the control runs ``floor.py`` and ``status_floor.py``), requests go through
sdgruntime's own request pool, the cheapest Python path SDG has, so a floor stays a floor.
The floors run on uvloop where it is installed (``run_loop``), as the manager does.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import re
import ssl
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from sdgruntime.rest.http1 import Pool

Obj = dict[str, Any]


def run_loop(main: Coroutine[Any, Any, dict[str, object]]) -> dict[str, object]:
    """``asyncio.run(main)`` on uvloop where installed: the manager's default loop
    (``--event-loop=auto``), so a control run stays a like-for-like floor."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def credentials(kubeconfig: str | Path) -> tuple[str, ssl.SSLContext, dict[str, str]]:
    """The server URL, a TLS context and the headers every request carries, from a
    kubeconfig with ``*-data`` fields (what ``sdgruntime.envtest`` writes): a client
    certificate goes in the context, a ServiceAccount's ``token`` in an Authorization
    header."""
    cfg = yaml.safe_load(Path(kubeconfig).read_text())
    ctx_name = cfg["current-context"]
    context = next(c["context"] for c in cfg["contexts"] if c["name"] == ctx_name)
    cluster = next(c["cluster"] for c in cfg["clusters"] if c["name"] == context["cluster"])
    user = next(u["user"] for u in cfg["users"] if u["name"] == context["user"])
    ca = base64.b64decode(cluster["certificate-authority-data"]).decode()
    ctx = ssl.create_default_context(cadata=ca)
    if "token" in user:
        return cluster["server"], ctx, {"Authorization": f"Bearer {user['token']}"}
    with tempfile.TemporaryDirectory(prefix="sdg-bench-") as tmp:
        cert, key = Path(tmp, "tls.crt"), Path(tmp, "tls.key")
        cert.write_bytes(base64.b64decode(user["client-certificate-data"]))
        key.write_bytes(base64.b64decode(user["client-key-data"]))
        ctx.load_cert_chain(str(cert), str(key))
    return cluster["server"], ctx, {}


class ApiError(RuntimeError):
    def __init__(self, status: int, text: str) -> None:
        super().__init__(f"{status}: {text[:500]}")
        self.status = status


class Kube:
    """An aiohttp session to the API server: JSON requests, lists and watches."""

    def __init__(self, kubeconfig: str | Path, limit: int = 64, *, lean: bool = False) -> None:
        self.server, self._ssl, self._auth = credentials(kubeconfig)
        self.limit = limit
        self.session: aiohttp.ClientSession | None = None
        self._pool: Pool | None = None
        if lean:
            self._pool = Pool(
                self.server,
                self._ssl,
                None,
                limit=limit,
                pool_timeout=30,
                connect_timeout=30,
                read_timeout=60,
            )

    async def __aenter__(self) -> Kube:
        connector = aiohttp.TCPConnector(ssl=self._ssl, limit=self.limit)
        self.session = aiohttp.ClientSession(
            self.server,
            connector=connector,
            headers=self._auth,
            read_bufsize=1 << 22,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=30),
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.session is not None
        if self._pool is not None:
            self._pool.close()
        await self.session.close()

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: dict[str, str] | None = None,
        content_type: str = "application/json",
        ok: tuple[int, ...] = (200, 201, 202),
    ) -> Obj:
        assert self.session is not None
        data = None if body is None else json.dumps(body)
        headers = {"Content-Type": content_type} if data is not None else {}
        if self._pool is not None:
            headers.update(self._auth)
            raw = self._pool.request_bytes(
                method, path, params, headers, None if data is None else data.encode()
            )
            status, _, content = await self._pool.request(raw, f"{method} {path}")
            if status not in ok:
                raise ApiError(status, content.decode("utf-8", "replace"))
            return json.loads(content) if content else {}
        async with self.session.request(
            method, path, data=data, params=params, headers=headers
        ) as resp:
            text = await resp.text()
            if resp.status not in ok:
                raise ApiError(resp.status, text)
            return json.loads(text) if text else {}

    async def writes(self) -> Counter[str]:
        """The API server's count of write requests so far (``apiserver_request_total``),
        by ``resource[/subresource] VERB``."""
        assert self.session is not None
        async with self.session.get("/metrics") as resp:
            text = await resp.text()
        counts: Counter[str] = Counter()
        for line in text.splitlines():
            if not line.startswith("apiserver_request_total{"):
                continue
            labels_text, _, value = line[len("apiserver_request_total{") :].rpartition("} ")
            labels = dict(_LABEL.findall(labels_text))
            if labels.get("verb") not in _WRITE_VERBS:
                continue
            what = labels.get("resource", "?")
            if labels.get("subresource"):
                what += "/" + labels["subresource"]
            counts[f"{what} {labels['verb']}"] += int(float(value))
        return counts

    async def list(self, path: str, **params: str) -> tuple[list[Obj], str]:
        items: list[Obj] = []
        cont = ""
        while True:
            q = {"limit": "2000", **params}
            if cont:
                q["continue"] = cont
            page = await self.request("GET", path, params=q)
            items += page.get("items") or []
            cont = (page.get("metadata") or {}).get("continue") or ""
            if not cont:
                return items, page["metadata"]["resourceVersion"]

    async def watch(
        self, path: str, resource_version: str, on_event: Callable[[str, Obj], None]
    ) -> None:
        """Call ``on_event(type, object)`` for every event after ``resource_version`` until
        cancelled; each call happens as the event's line arrives here."""
        assert self.session is not None
        rv = resource_version
        while True:
            params = {
                "watch": "1",
                "resourceVersion": rv,
                "allowWatchBookmarks": "true",
                "timeoutSeconds": "3600",
            }
            async with self.session.get(path, params=params) as resp:
                if resp.status != 200:
                    raise ApiError(resp.status, await resp.text())
                async for line in resp.content:
                    if not line.strip():
                        continue
                    ev = json.loads(line)
                    obj = ev.get("object") or {}
                    if ev["type"] == "ERROR":
                        raise ApiError(int(obj.get("code") or 0), json.dumps(obj))
                    rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
                    if ev["type"] != "BOOKMARK":
                        on_event(ev["type"], obj)


async def bounded(limit: int, jobs: list[Callable[[], Awaitable[Any]]]) -> list[Any]:
    """Run the jobs with at most ``limit`` in flight; results in order."""
    sem = asyncio.Semaphore(limit)

    async def one(job: Callable[[], Awaitable[Any]]) -> Any:
        async with sem:
            return await job()

    return list(await asyncio.gather(*(one(j) for j in jobs)))


# --- processes ---------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, all its threads (children excluded)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def memory(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak RSS) of a process in bytes."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) * 1024
    return out


def reset_peak(pid: int) -> bool:
    """Reset VmHWM to the current RSS (Linux 4.0+, needs ptrace rights on the process)."""
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/clear_refs").write_text("5")
        return True
    return False


_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
_WRITE_VERBS = frozenset({"POST", "PUT", "PATCH", "DELETE", "APPLY"})


class Stopwatch:
    """CPU seconds and peak RSS of some processes over a stretch of time (and, when
    ``writes0`` is set, the API server's write requests in it)."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.writes0: Counter[str] | None = None
        self.pids = {k: v for k, v in pids.items() if v}
        self.t0 = time.perf_counter()
        self.cpu0 = {k: cpu_seconds(p) for k, p in self.pids.items()}
        self.self_cpu0 = time.process_time()

    def cpu(self) -> dict[str, float]:
        out = {k: cpu_seconds(p) - self.cpu0[k] for k, p in self.pids.items()}
        out["bench"] = time.process_time() - self.self_cpu0
        return out

    def wall(self) -> float:
        return time.perf_counter() - self.t0

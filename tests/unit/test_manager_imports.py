"""The manager process imports neither the ``kubernetes`` package (and requests, urllib3,
oauthlib, websocket with it: ~32 MiB of RSS) nor ``cryptography`` (~14 MiB): it reads its
kubeconfig itself (sdgruntime.rest.kubeconfig) and needs no certificate library to serve
certificates. Benchmark goal S6 is the manager's RSS."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("kubernetes", "requests", "urllib3", "oauthlib", "websocket", "cryptography")


def test_importing_the_manager_loads_no_heavy_package() -> None:
    probe = (
        "import sys\n"
        "import controllers.__main__, controllers.app\n"
        f"print(','.join(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r}))))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == ""

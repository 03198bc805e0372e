"""An NRI plugin for the real node: ``cdiinject`` (``hack/node/cdiinject``) gives each
container the CDI devices its pod names in ``cdi-devices.noderesource.dev/container.<name>``
(the family NRI's device-injector reads), through containerd's own NRI and CDI, so SDG's
delivery ``cdi`` can be seen reaching a container. Built once per machine into
``~/.cache/sdg/cdiinject/`` (about a minute with the modules downloaded).

    with CdiInjector(node.work_dir / "cdiinject.log"):
        ...  # pods of groups on a node labelled deviceshare.io/delivery=cdi get their devices
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Self

from sdgruntime.envtest.build import GoModule
from sdgruntime.envtest.controlplane import log_tail, spawn_logged, stop_process

SOURCE = Path(__file__).resolve().parent / "cdiinject"
#: containerd's default NRI socket (its config leaves [plugins."io.containerd.nri.v1.nri"]
#: at the defaults: enabled, this path).
NRI_SOCKET = Path("/var/run/nri/nri.sock")
#: The line the plugin logs once containerd has registered it.
READY = "synchronized:"


def ensure_cdiinject() -> Path:
    """The ``cdiinject`` binary, built once per machine."""
    module = GoModule(
        name="cdiinject", source=SOURCE, targets={"cdiinject": "."}, minutes={"cdiinject": 1}
    )
    return module.ensure(["cdiinject"]) / "cdiinject"


class CdiInjector:
    """``cdiinject`` connected to containerd's NRI socket while the ``with`` block runs."""

    def __init__(self, log: Path, socket: Path = NRI_SOCKET, within: float = 30.0) -> None:
        self.log = log
        self.socket = socket
        self.within = within
        self._proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Self:
        binary = ensure_cdiinject()
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self._proc = spawn_logged([str(binary), "-socket", str(self.socket)], self.log)
        deadline = time.monotonic() + self.within
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                break
            if READY in log_tail(self.log, 200):
                return self
            time.sleep(0.1)
        self.__exit__()
        raise RuntimeError(
            f"cdiinject did not register with containerd's NRI ({self.socket}) within "
            f"{self.within:g} s:\n{log_tail(self.log)}"
        )

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None:
            stop_process(self._proc)
            self._proc = None

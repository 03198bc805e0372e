"""``python -m sdgruntime.envtest``: run a local control plane in the foreground."""

from __future__ import annotations

import argparse
import logging
import shutil
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from sdgruntime.envtest.controlplane import ControlPlane


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sdgruntime.envtest",
        description="Start etcd + kube-apiserver on loopback and serve until interrupted.",
    )
    parser.add_argument("--kubeconfig-out", type=Path, help="write the admin kubeconfig here")
    parser.add_argument(
        "--crds", type=Path, action="append", default=[], help="CRD file or folder (repeatable)"
    )
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING)

    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)

    with ControlPlane(crd_paths=args.crds) as cp:
        kubeconfig = cp.kubeconfig_path
        if args.kubeconfig_out:
            args.kubeconfig_out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(cp.kubeconfig_path, args.kubeconfig_out)
            args.kubeconfig_out.chmod(0o600)
            kubeconfig = args.kubeconfig_out
        version = cp.http.get("/version").json().get("gitVersion", "?")
        print(
            f"control plane ready: kube-apiserver {version} at {cp.host}, "
            f"kubeconfig {kubeconfig} (Ctrl-C to stop)",
            flush=True,
        )
        stop.wait()
    print("control plane stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``python -m sdgruntime.envtest``: run a local control plane in the foreground.

With ``--webhook-port``, ``--webhook-cert-dir`` and ``--install-webhooks``, the API server
calls a webhook server that runs outside it (an operator started from a shell or an IDE)
over TLS: a serving certificate for 127.0.0.1, signed by the control plane's CA, is
written to the cert dir, and the webhook configurations are installed rewritten to call
``https://127.0.0.1:<port><path>``. Run the operator with the same port and cert dir.
Options: docs/testing.md, "A control plane from the shell".
"""

from __future__ import annotations

import argparse
import logging
import shutil
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from sdgruntime.envtest.controlplane import ControlPlane, ControlPlaneError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sdgruntime.envtest",
        description="Start etcd + kube-apiserver on loopback and serve until interrupted.",
    )
    parser.add_argument("--kubeconfig-out", type=Path, help="write the admin kubeconfig here")
    parser.add_argument(
        "--crds", type=Path, action="append", default=[], help="CRD file or folder (repeatable)"
    )
    webhooks = parser.add_argument_group("webhooks (served by your process on 127.0.0.1)")
    webhooks.add_argument(
        "--webhook-port",
        type=int,
        default=9443,
        help="the port your webhook server listens on (default 9443)",
    )
    webhooks.add_argument(
        "--webhook-cert-dir",
        type=Path,
        help="write the webhook serving certificate (tls.crt, tls.key for 127.0.0.1) here",
    )
    webhooks.add_argument(
        "--install-webhooks",
        type=Path,
        action="append",
        default=[],
        metavar="PATH",
        help="webhook configurations (file or folder, repeatable) to install, calling "
        "https://127.0.0.1:<webhook-port><path>",
    )
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    if not 0 < args.webhook_port < 65536:
        parser.error(f"--webhook-port {args.webhook_port} is not a port (1-65535)")
    missing = [str(p) for p in args.install_webhooks if not p.exists()]
    if missing:
        parser.error(f"--install-webhooks: no such file or folder: {', '.join(missing)}")
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
        if args.webhook_cert_dir or args.install_webhooks:
            cert_dir = cp.webhook_cert_dir(args.webhook_cert_dir)
            print(f"webhook serving certificate: {cert_dir}/tls.crt, tls.key", flush=True)
        if args.install_webhooks:
            try:
                installed = cp.install_webhooks(args.install_webhooks, args.webhook_port)
            except ControlPlaneError as exc:
                print(f"installing webhooks failed: {exc}", file=sys.stderr, flush=True)
                return 1
            names = ", ".join(f"{o['kind']} {o['metadata']['name']}" for o in installed)
            print(
                f"webhooks installed ({names or 'none found'}): the API server calls "
                f"https://127.0.0.1:{args.webhook_port}",
                flush=True,
            )
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

"""``sdg`` (also ``kubectl sdg``): read-only views of shared devices for operators.

Commands: ``get``, ``devices``, ``explain`` (a group or ``pod/NAME``) and ``doctor``
(``--pre`` before installing, ``--probe`` what a group pod's container sees); ``sdg -h``
lists their options. ``-w``/``--watch`` keeps going until Ctrl-C (exit status 130). This
module parses the arguments and runs one command module (``cli.get``, ``cli.devices``,
``cli.explain``, ``cli.doctor``); each fetches, then prints what its pure functions make
of it.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

import anyio

from cli import devices, explain, get
from cli.doctor import command
from cli.doctor.probe import (
    CLEANUP_TIMEOUT,
    DEFAULT_PROBE_IMAGE,
    DEFAULT_TIMEOUT,
    MAX_TIMEOUT,
    PULL_POLICIES,
)
from cli.kube import DEFAULT_CLAIMS_NAMESPACE, CliError, Write, make_client
from sdgruntime import errors


def _parser() -> argparse.ArgumentParser:
    # Global flags are accepted before and after the subcommand (kubectl habit); the
    # subcommands' copies default to SUPPRESS so they never overwrite the global ones.
    def common(suppress: bool) -> argparse.ArgumentParser:
        p = argparse.ArgumentParser(add_help=False)
        d = argparse.SUPPRESS if suppress else None
        p.add_argument(
            "--kubeconfig",
            default=d,
            help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, or in-cluster)",
        )
        p.add_argument("--context", default=d, help="kubeconfig context to use")
        p.add_argument(
            "--claims-namespace",
            default=argparse.SUPPRESS if suppress else DEFAULT_CLAIMS_NAMESPACE,
            help="namespace of the per-node claim records, the manager's namespace "
            f"(default {DEFAULT_CLAIMS_NAMESPACE})",
        )
        return p

    def output(p: argparse._ActionsContainer, what: str) -> None:  # a parser or a group
        p.add_argument(
            "-o", "--output", choices=("json", "yaml"), default=None, help=f"print {what}"
        )

    def watch(p: argparse.ArgumentParser, what: str) -> None:
        p.add_argument("-w", "--watch", action="store_true", help=f"{what}; Ctrl-C stops")

    parser = argparse.ArgumentParser(
        prog="sdg",
        description="Read-only views of SharedDeviceGroups: which group holds which device, "
        "and why a group or pod is not running where you expect.",
        parents=[common(False)],
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    get = sub.add_parser(
        "get",
        parents=[common(True)],
        help="list groups like kubectl get sdg (NAME PHASE READY NODE DEVICES PODS AGE)",
        description="The groups, or GROUP, with the columns of kubectl get sdg. -o json|yaml "
        "prints the objects (a v1 List without GROUP); -w then prints a row (or the object) "
        "for every change.",
    )
    get.add_argument("name", nargs="?", metavar="GROUP", help="one group (default: all)")
    output(get, "the objects instead of the table")
    watch(get, "after the list, print a row per change")
    devices = sub.add_parser(
        "devices",
        parents=[common(True)],
        help="draw the device map: node -> device ID -> group -> pods",
        description="Every device ID of every shared node (and of any node holding claims), "
        "the group holding it, from the claim records cross-checked with group statuses, "
        "and that group's pods. Free IDs show GROUP - and STATE free. --grid draws one row "
        "of cells per node and resource, a letter (coloured on a terminal) per group; "
        "-o json|yaml gives the same map as data.",
    )
    form = devices.add_mutually_exclusive_group()
    form.add_argument(
        "--grid",
        action="store_true",
        help="one cell per device, by node: group letters, . free, x missing or unhealthy, "
        "! conflict, ? only the claim record or the status, o in use outside any group "
        "(colours on a terminal unless NO_COLOR is set)",
    )
    output(form, "the map as data: per node, resource and device its groups, state, pods")
    watch(devices, "draw the map again after every change")
    explain = sub.add_parser(
        "explain",
        parents=[common(True)],
        help="why a group is Pending / a pod is not running on its group's node",
        description="TARGET is a group (NAME, sdg/NAME) or a pod (pod/NAME, or NAME with "
        "-n). A bare NAME without -n is looked up as a group first, then as a pod in the "
        "context's namespace.",
    )
    explain.add_argument("target", metavar="TARGET")
    explain.add_argument("-n", "--namespace", default=None, help="namespace of the pod")
    output(explain, "the facts behind the explanation (group, node, devices, problems, pods)")
    check = sub.add_parser(
        "doctor",
        parents=[common(True)],
        help="check the installation: CRD, webhooks, nodes, manager; the fix for each problem",
        description="Checks what SDG needs, each with the command that fixes it: the CRD, "
        "cert-manager, the webhooks (probed with a server-side dry-run pod naming a missing "
        "group, which SDG must deny; nothing is created), the admission policies, the "
        "manager and its leader Lease, shared nodes (label, taint, devices and where their "
        "IDs come from, pods using devices outside any group) and the RuntimeClass. "
        "Exit status 1 when a check fails (warnings do not).",
    )
    check.add_argument("-o", "--output", choices=("text", "json"), default="text")
    check.add_argument(
        "-n",
        "--namespace",
        default=None,
        help="namespace of the dry-run probe pod (default: the context's namespace)",
    )
    check.add_argument(
        "--manager-namespace",
        default=None,
        help="namespace of the manager's Deployment and Lease (default: --claims-namespace)",
    )
    check.add_argument(
        "--delivery",
        default=None,
        help="how the manager delivers devices (auto, env, runtimeclass, cdi); default: "
        "read from its Deployment",
    )
    check.add_argument(
        "--runtime-class-name",
        default=None,
        help="the RuntimeClass of delivery runtimeclass; default: read from its Deployment",
    )
    mode = check.add_mutually_exclusive_group()
    mode.add_argument(
        "--pre",
        action="store_true",
        help="before installing (reads only; nothing of SDG needs to be there): Kubernetes "
        "version, nodes' runtimes and runtime handlers, CDI/NRI as far as the API shows "
        "them, DRA drivers' ResourceSlices, the RuntimeClass, and the delivery each shared "
        "node (else each node with devices) would get",
    )
    mode.add_argument(
        "--probe",
        action="store_true",
        help="per shared node, a throwaway group of one device with one pod that prints what "
        "its container sees (device variables, /dev entries, nvidia-smi -L), compared with "
        "what the group holds; exit status 1 on a mismatch. Creates and deletes a group "
        "and a pod (in -n): needs a manager running and the right to create both",
    )
    check.add_argument(
        "--probe-image",
        default=DEFAULT_PROBE_IMAGE,
        help="image of the probe pod: anything with sh, ls and head "
        f"(default {DEFAULT_PROBE_IMAGE})",
    )
    check.add_argument(
        "--probe-image-pull-policy",
        choices=PULL_POLICIES,
        default="IfNotPresent",
        help="imagePullPolicy of the probe pod (default IfNotPresent)",
    )
    check.add_argument(
        "--probe-timeout",
        type=_probe_timeout,
        default=DEFAULT_TIMEOUT,
        metavar="SECONDS",
        help="how long one node's probe may wait for its group and pod (default "
        f"{DEFAULT_TIMEOUT:g}; cleaning up has its own "
        f"{CLEANUP_TIMEOUT:g} s)",
    )
    check.add_argument(
        "--probe-node",
        action="append",
        default=[],
        metavar="NODE",
        help="probe only this shared node (repeatable; default: every shared node)",
    )
    return parser


def _probe_timeout(text: str) -> float:
    """--probe-timeout: seconds, more than 0 and bounded."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value <= MAX_TIMEOUT:
        raise argparse.ArgumentTypeError(
            f"{text}: give more than 0 and at most {MAX_TIMEOUT:g} seconds"
        )
    return value


_COMMANDS = {"get": get.run, "devices": devices.run, "explain": explain.run, "doctor": command.run}


async def _run(args: argparse.Namespace, write: Write) -> int:
    async with make_client(args) as client:
        return await _COMMANDS[args.command](client, args, write)


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()  # a watch's output must not wait in a pipe's buffer


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return anyio.run(_run, args, _write)
    except KeyboardInterrupt:  # how a watch ends
        return 130
    except BrokenPipeError:  # sdg get -w | head: the reader is gone
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except CliError as err:
        print(f"error: {err}", file=sys.stderr)
    except errors.Forbidden as err:
        print(f"error: forbidden: {err}", file=sys.stderr)
    except errors.ApiError as err:
        print(f"error: {err}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())

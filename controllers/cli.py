"""``sdg`` (also ``kubectl sdg``): read-only views of shared devices for operators.

    sdg devices                      the device map: node -> device ID -> group -> pods
    sdg explain GROUP                why a group is Pending, or where it is bound
    sdg explain pod/NAME [-n NS]     why a pod is not running on its group's node
    sdg doctor [-o json]             check the installation; exit status 1 on a problem

This module only fetches (nodes, groups, claim records, pods) and prints; what is printed
is decided by the pure functions in ``controllers.cliviews`` (and ``controllers.doctor``).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

import anyio
import kubernetes.config

from api.constants import SDG_KIND
from api.pods import pod_group
from controllers import doctor
from controllers.claims import RECORD_LABEL, RECORD_LABEL_VALUE
from controllers.cliviews import devices_view, explain_group, explain_pod
from controllers.inventory import RESOURCESLICES
from sdgruntime import errors
from sdgruntime.client import Client
from sdgruntime.kinds import CONFIGMAPS, NODES, PODS

DEFAULT_CLAIMS_NAMESPACE = "deviceshare-system"
_GROUP_TYPES = frozenset({"sdg", "shareddevicegroup", "shareddevicegroups", "group"})
_POD_TYPES = frozenset({"pod", "pods", "po"})


class CliError(Exception):
    """A failure to report in one line, without a traceback."""


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

    parser = argparse.ArgumentParser(
        prog="sdg",
        description="Read-only views of SharedDeviceGroups: which group holds which device, "
        "and why a group or pod is not running where you expect.",
        parents=[common(False)],
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser(
        "devices",
        parents=[common(True)],
        help="draw the device map: node -> device ID -> group -> pods",
        description="Every device ID of every shared node (and of any node holding claims), "
        "the group holding it, from the claim records cross-checked with group statuses, "
        "and that group's pods. Free IDs show GROUP - and STATE free.",
    )
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
        help="how the manager delivers devices (env, runtimeclass, cdi); default: read "
        "from its Deployment",
    )
    check.add_argument(
        "--runtime-class-name",
        default=None,
        help="the RuntimeClass of delivery runtimeclass; default: read from its Deployment",
    )
    return parser


def _context_namespace(kubeconfig: str | None, context: str | None) -> str:
    """The namespace of the kubeconfig context (kubectl's default for -n)."""
    try:
        contexts, active = kubernetes.config.list_kube_config_contexts(config_file=kubeconfig)
    except Exception:  # no kubeconfig (in-cluster): fall back like kubectl
        path = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
        if os.path.exists(path):
            with open(path) as f:
                return f.read().strip() or "default"
        return "default"
    chosen = next((c for c in contexts if c.get("name") == context), None) if context else active
    return str(((chosen or {}).get("context") or {}).get("namespace") or "default")


def _client(args: argparse.Namespace) -> Client:
    try:
        if args.context:
            return Client.from_kubeconfig(args.kubeconfig, args.context, max_connections=4)
        return Client.auto(args.kubeconfig, max_connections=4)
    except Exception as err:  # kubernetes.config raises several unrelated types
        raise CliError(f"cannot load the Kubernetes configuration: {err}") from None


async def _list(client: Client, kind: Any, namespace: str | None = None, **kw: Any) -> list[dict]:
    items, _ = await client.list_all(kind, namespace, **kw)
    return items


async def _groups(client: Client) -> list[dict]:
    try:
        return await _list(client, SDG_KIND)
    except errors.NotFound:
        raise CliError(
            "the SharedDeviceGroup API (deviceshare.io/v1alpha1) is not installed in this "
            "cluster: kubectl apply -k config/default"
        ) from None


async def _claim_records(client: Client, namespace: str) -> list[dict]:
    return await _list(
        client, CONFIGMAPS, namespace, label_selector=f"{RECORD_LABEL}={RECORD_LABEL_VALUE}"
    )


async def _resource_slices(client: Client) -> list[dict]:
    """DRA ResourceSlices (the device inventory's best source); none where not served."""
    try:
        return await _list(client, RESOURCESLICES)
    except (errors.NotFound, errors.Forbidden):
        return []


async def _devices(client: Client, args: argparse.Namespace) -> str:
    nodes = await _list(client, NODES)
    groups = await _groups(client)
    records = await _claim_records(client, args.claims_namespace)
    return devices_view(nodes, groups, records, await _resource_slices(client))


async def _get_or_none(client: Client, kind: Any, name: str, namespace: str | None = None) -> Any:
    try:
        return await client.get(kind, name, namespace)
    except errors.NotFound:
        return None


async def _explain(client: Client, args: argparse.Namespace) -> str:
    kind, _, name = args.target.rpartition("/")
    kind = kind.lower()
    if kind and kind not in _GROUP_TYPES | _POD_TYPES:
        raise CliError(f"unknown type {kind!r}: use sdg/NAME or pod/NAME")
    as_pod = kind in _POD_TYPES or (not kind and args.namespace is not None)
    groups = await _groups(client)
    names = sorted(g["metadata"]["name"] for g in groups)
    if not as_pod and (kind or name in names):
        if name not in names:
            raise CliError(
                f'SharedDeviceGroup "{name}" not found; groups: {", ".join(names) or "<none>"}'
            )
        nodes = await _list(client, NODES)
        records = await _claim_records(client, args.claims_namespace)
        pods = await _list(client, PODS)
        slices = await _resource_slices(client)
        return explain_group(name, groups, nodes, records, pods, slices)
    namespace = args.namespace or _context_namespace(args.kubeconfig, args.context)
    pod = await _get_or_none(client, PODS, name, namespace)
    if pod is None:
        if as_pod:
            raise CliError(f'pod "{name}" not found in namespace {namespace}')
        raise CliError(
            f'no SharedDeviceGroup "{name}", and no pod "{name}" in namespace {namespace}'
        )
    nodes = await _list(client, NODES)
    target = _group_node(groups, pod)
    others = await _list(client, PODS, field_selector=f"spec.nodeName={target}") if target else []
    return explain_pod(pod, groups, nodes, others)


def _group_node(groups: Sequence[dict], pod: dict) -> str | None:
    name = pod_group(pod)
    for g in groups:
        if g["metadata"]["name"] == name:
            return (g.get("status") or {}).get("nodeName") or None
    return None


async def _doctor(client: Client, args: argparse.Namespace) -> tuple[str, int]:
    facts = await doctor.collect(
        client,
        namespace=args.namespace or _context_namespace(args.kubeconfig, args.context),
        manager_namespace=args.manager_namespace or args.claims_namespace,
        delivery=args.delivery,
        runtime_class_name=args.runtime_class_name,
    )
    checks = doctor.judge(facts)
    if args.output == "json":
        text = doctor.render_json(checks)
    else:
        color = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
        text = doctor.render_text(checks, color=color)
    return text, doctor.exit_code(checks)


async def _run(args: argparse.Namespace) -> tuple[str, int]:
    async with _client(args) as client:
        if args.command == "devices":
            return await _devices(client, args), 0
        if args.command == "doctor":
            return await _doctor(client, args)
        return await _explain(client, args), 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        text, code = anyio.run(_run, args)
    except CliError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except errors.Forbidden as err:
        print(f"error: forbidden: {err}", file=sys.stderr)
        return 1
    except errors.ApiError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    sys.stdout.write(text)
    return code


if __name__ == "__main__":
    sys.exit(main())

"""``sdg`` (also ``kubectl sdg``): read-only views of shared devices for operators.

    sdg get [GROUP] [-o json|yaml] [-w]         groups as kubectl get sdg prints them
    sdg devices [--grid | -o json|yaml] [-w]    the device map: node -> device -> group -> pods
    sdg explain GROUP [-o json|yaml]            why a group is Pending, or where it is bound
    sdg explain pod/NAME [-n NS] [-o json|yaml] why a pod is not running on its group's node
    sdg doctor [-o json]                        check the installation; exit status 1 on a problem
    sdg doctor --pre                            before installing: what the cluster offers SDG
    sdg doctor --probe                          what a group pod's container sees, per shared node

``-w``/``--watch`` keeps going until Ctrl-C (exit status 130): ``get`` prints a row per
change, ``devices`` the whole map again after each change. This module only fetches
(nodes, groups, claim records, pods) and prints; what is printed is decided by the pure
functions in ``controllers.cliviews`` (and ``controllers.doctor``).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import shutil
import sys
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import anyio

from api.constants import SDG_KIND
from api.pods import cached_pod, pod_group
from api.v1alpha1 import group_name
from controllers import doctor, doctorprobe
from controllers.cliviews import (
    GROUP_HEADERS,
    column_widths,
    device_map,
    devices_grid,
    group_explanation,
    group_row,
    groups_table,
    object_list,
    pod_explanation,
    render_data,
    render_device_table,
    table_line,
    without_managed_fields,
)
from controllers.draclaims import RESOURCECLAIMS
from controllers.inventory import RESOURCESLICES
from controllers.ledger.records import RECORD_LABEL, RECORD_LABEL_VALUE
from sdgruntime import errors
from sdgruntime.cache.informer import Informer
from sdgruntime.cache.sync import CacheSyncError
from sdgruntime.client import Client
from sdgruntime.kinds import CONFIGMAPS, NODES, PODS, RUNTIMECLASSES
from sdgruntime.rest.kubeconfig import KubeconfigError, read_kubeconfig
from webhooks.delivery import Delivery

DEFAULT_CLAIMS_NAMESPACE = "deviceshare-system"
_GROUP_TYPES = frozenset({"sdg", "shareddevicegroup", "shareddevicegroups", "group"})
_POD_TYPES = frozenset({"pod", "pods", "po"})
#: How long a watch waits for its first list of each kind.
WATCH_SYNC_TIMEOUT = 60.0
#: A watched device map is drawn again this long after a change (changes come in bursts).
WATCH_SETTLE = 0.2
#: ANSI: cursor home + clear screen, before each map a watch draws on a terminal.
CLEAR = "\033[H\033[2J"

Write = Callable[[str], None]


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
        default=doctorprobe.DEFAULT_PROBE_IMAGE,
        help="image of the probe pod: anything with sh, ls and head "
        f"(default {doctorprobe.DEFAULT_PROBE_IMAGE})",
    )
    check.add_argument(
        "--probe-image-pull-policy",
        choices=doctorprobe.PULL_POLICIES,
        default="IfNotPresent",
        help="imagePullPolicy of the probe pod (default IfNotPresent)",
    )
    check.add_argument(
        "--probe-timeout",
        type=_probe_timeout,
        default=doctorprobe.DEFAULT_TIMEOUT,
        metavar="SECONDS",
        help="how long one node's probe may wait for its group and pod (default "
        f"{doctorprobe.DEFAULT_TIMEOUT:g}; cleaning up has its own "
        f"{doctorprobe.CLEANUP_TIMEOUT:g} s)",
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
    if not 0 < value <= doctorprobe.MAX_TIMEOUT:
        raise argparse.ArgumentTypeError(
            f"{text}: give more than 0 and at most {doctorprobe.MAX_TIMEOUT:g} seconds"
        )
    return value


def _context_namespace(kubeconfig: str | None, context: str | None) -> str:
    """The namespace of the kubeconfig context (kubectl's default for -n)."""
    try:
        cfg = read_kubeconfig(kubeconfig)
    except KubeconfigError:  # no kubeconfig (in-cluster): fall back like kubectl
        path = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
        if os.path.exists(path):
            with open(path) as f:
                return f.read().strip() or "default"
        return "default"
    name = context or cfg.current_context
    chosen = cfg.contexts.get(name) if name else None
    return str((chosen.body if chosen else {}).get("namespace") or "default")


def _client(args: argparse.Namespace) -> Client:
    try:
        if args.context:
            return Client.from_kubeconfig(args.kubeconfig, args.context, max_connections=4)
        return Client.auto(args.kubeconfig, max_connections=4)
    except Exception as err:  # a kubeconfig error, or the kubernetes package's (exec plugins)
        raise CliError(f"cannot load the Kubernetes configuration: {err}") from None


def _color() -> bool:
    """ANSI colours: only on a terminal, and not when NO_COLOR is set (no-color.org)."""
    return sys.stdout.isatty() and not os.environ.get("NO_COLOR")


async def _list(
    client: Client, kind: Any, namespace: str | None = None, **kw: Any
) -> list[dict[str, Any]]:
    items, _ = await client.list_all(kind, namespace, **kw)
    return items


async def _groups(client: Client) -> list[dict[str, Any]]:
    try:
        return await _list(client, SDG_KIND)
    except errors.NotFound:
        raise CliError(
            "the SharedDeviceGroup API (deviceshare.io/v1alpha1) is not installed in this "
            "cluster: kubectl apply -k config/default"
        ) from None


async def _claim_records(client: Client, namespace: str) -> list[dict[str, Any]]:
    return await _list(client, CONFIGMAPS, namespace, label_selector=_RECORDS_SELECTOR)


_RECORDS_SELECTOR = f"{RECORD_LABEL}={RECORD_LABEL_VALUE}"


async def _resource_slices(client: Client) -> list[dict[str, Any]] | None:
    """DRA ResourceSlices (the device inventory's best source); None where not served."""
    try:
        return await _list(client, RESOURCESLICES)
    except (errors.NotFound, errors.Forbidden):
        return None


async def _get_or_none(client: Client, kind: Any, name: str, namespace: str | None = None) -> Any:
    try:
        return await client.get(kind, name, namespace)
    except errors.NotFound:
        return None


# --- watching ---------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def _running(informers: Sequence[Informer]) -> AsyncIterator[None]:
    """Run ``informers`` (list + watch) for the body, once each has listed; an error of
    the body comes out as itself, not in a task group's ExceptionGroup."""
    try:
        async with anyio.create_task_group() as tg:
            for informer in informers:
                tg.start_soon(informer.run)
            try:
                for informer in informers:
                    await informer.wait_for_sync(WATCH_SYNC_TIMEOUT)
            except CacheSyncError as err:
                raise CliError(f"cannot watch: {err}") from None
            yield
            tg.cancel_scope.cancel()
    except ExceptionGroup as group:
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise


# --- sdg get ----------------------------------------------------------------------------------


def _now() -> datetime:
    return datetime.now(UTC)


async def _get(client: Client, args: argparse.Namespace, write: Write) -> int:
    if args.watch:
        return await _watch_groups(client, args, write)
    if args.name:
        group = await _get_or_none(client, SDG_KIND, args.name)
        if group is None:
            await _groups(client)  # says so when the API itself is missing
            raise CliError(f'SharedDeviceGroup "{args.name}" not found')
        groups = [group]
    else:
        groups = await _groups(client)
    if args.output:
        data = without_managed_fields(groups[0]) if args.name else object_list(groups)
        write(render_data(data, args.output))
    elif groups:
        write(groups_table(groups, _now()))
    else:
        print("No SharedDeviceGroups found.", file=sys.stderr)
    return 0


async def _watch_groups(client: Client, args: argparse.Namespace, write: Write) -> int:
    """kubectl get -w: the list, then a row (or an object) per change, until cancelled."""
    await _groups(client)  # a clear error when the API is missing
    selector = f"metadata.name={args.name}" if args.name else None
    informer = Informer(client, SDG_KIND, field_selector=selector)
    send, receive = anyio.create_memory_object_stream[tuple[str, dict[str, Any]]](math.inf)
    async with _running([informer]):
        initial = sorted(informer.store.list(), key=group_name)
        if args.name and not initial:
            raise CliError(f'SharedDeviceGroup "{args.name}" not found')
        rows = {group_name(g): group_row(g, _now()) for g in initial}
        widths = column_widths(rows.values())
        docs = 0

        def show(obj: dict[str, Any]) -> None:
            nonlocal docs
            data = without_managed_fields(obj)
            sep = "---\n" if args.output == "yaml" and docs else ""
            write(sep + render_data(data, str(args.output)))
            docs += 1

        if args.output:
            for g in initial:
                show(g)
        else:
            write(table_line(GROUP_HEADERS, widths) + "\n")
            for row in rows.values():
                write(table_line(row, widths) + "\n")
        live = False  # add_handler replays the stored objects as adds: those are shown

        def added(obj: dict[str, Any]) -> None:
            if live:
                send.send_nowait(("ADDED", obj))

        informer.add_handler(
            on_add=added,
            on_update=lambda _old, new: send.send_nowait(("MODIFIED", new)),
            on_delete=lambda obj: send.send_nowait(("DELETED", obj)),
        )
        live = True
        async for event, obj in receive:
            if args.output:
                show(obj)
                continue
            name, row = group_name(obj), group_row(obj, _now())
            if event != "DELETED" and rows.get(name, ())[:-1] == row[:-1]:
                continue  # nothing kubectl get sdg shows has changed
            rows[name] = row
            if event == "DELETED":
                rows.pop(name)
            widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
            write(table_line(row, widths) + "\n")
    return 0


# --- sdg devices ------------------------------------------------------------------------------


def _render_devices(args: argparse.Namespace, data: dict[str, Any]) -> str:
    if args.output:
        return render_data(data, args.output)
    if args.grid:
        return devices_grid(data, width=shutil.get_terminal_size().columns, color=_color())
    return render_device_table(data)


async def _devices(client: Client, args: argparse.Namespace, write: Write) -> int:
    if args.watch:
        return await _watch_devices(client, args, write)
    nodes = await _list(client, NODES)
    groups = await _groups(client)
    records = await _claim_records(client, args.claims_namespace)
    slices = await _resource_slices(client) or []
    unread: list[tuple[str, str]] = []
    pods = await _readable(client, PODS, unread, field_selector=_ACTIVE_PODS, transform=cached_pod)
    claims = await _readable(client, RESOURCECLAIMS, unread) if slices else []
    data = device_map(nodes, groups, records, slices, pods, claims)
    data["warnings"] += [
        f"{what} not readable ({why}): devices they hold outside any group are not shown"
        for what, why in unread
    ]
    write(_render_devices(args, data))
    return 0


#: Pods that may hold devices (the API server filters out finished ones).
_ACTIVE_PODS = "status.phase!=Succeeded,status.phase!=Failed"


async def _readable(
    client: Client, kind: Any, unread: list[tuple[str, str]], **kw: Any
) -> list[dict[str, Any]]:
    """Every ``kind`` object, or none when this user may not list them (or the server does
    not serve them), noted in ``unread``."""
    try:
        return await _list(client, kind, **kw)
    except (errors.NotFound, errors.Forbidden) as err:
        unread.append((kind.plural, str(err).splitlines()[0][:120]))
        return []


async def _watch_devices(client: Client, args: argparse.Namespace, write: Write) -> int:
    """The device map, drawn again after every change that changes it, until cancelled:
    on a terminal over the previous one (text and grid), else one after the other."""
    await _groups(client)
    kinds = [
        Informer(client, NODES),
        Informer(client, SDG_KIND),
        Informer(
            client, CONFIGMAPS, namespace=args.claims_namespace, label_selector=_RECORDS_SELECTOR
        ),
    ]
    if await _resource_slices(client) is not None:
        kinds.append(Informer(client, RESOURCESLICES))
    send, receive = anyio.create_memory_object_stream[None](math.inf)
    redraw = sys.stdout.isatty() and not args.output
    async with _running(kinds):
        for informer in kinds:
            informer.add_handler(
                on_add=lambda _obj: send.send_nowait(None),
                on_update=lambda _old, _new: send.send_nowait(None),
                on_delete=lambda _obj: send.send_nowait(None),
            )
        last = None
        while True:
            data = device_map(*(i.store.list(copy=False) for i in kinds))
            text = _render_devices(args, data)
            if text != last:
                if redraw:
                    stamp = datetime.now().strftime("%H:%M:%S")
                    write(f"{CLEAR}sdg devices --watch (Ctrl-C stops), {stamp}\n\n{text}")
                elif last is not None:  # one map after the other; YAML as a stream
                    write({"json": "", "yaml": "---\n"}.get(args.output, "\n") + text)
                else:
                    write(text)
                last = text
            await receive.receive()
            await anyio.sleep(WATCH_SETTLE)
            while True:
                try:
                    receive.receive_nowait()
                except anyio.WouldBlock:
                    break
    return 0


# --- sdg explain ------------------------------------------------------------------------------


async def _explain(client: Client, args: argparse.Namespace, write: Write) -> int:
    text, facts = await _explanation(client, args)
    write(render_data(facts, args.output) if args.output else text)
    return 0


async def _explanation(client: Client, args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
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
        slices = await _resource_slices(client) or []
        delivery, runtime_classes, holders = await _delivery_settings(client, args.claims_namespace)
        return group_explanation(
            name, groups, nodes, records, pods, slices, runtime_classes, delivery, holders
        )
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
    return pod_explanation(pod, groups, nodes, others)


async def _delivery_settings(
    client: Client, namespace: str
) -> tuple[Delivery, dict[str, dict[str, Any]], bool | None]:
    """The manager's delivery settings, from its Deployment's flags as ``sdg doctor``
    reads them (its defaults where it cannot be read), its RuntimeClass by name, and
    whether it runs holder pods (None: no Deployment says)."""
    try:
        deployment = await _get_or_none(
            client, doctor.DEPLOYMENTS, doctor.MANAGER_DEPLOYMENT, namespace
        )
    except errors.Forbidden:
        deployment = None
    config = doctor.manager_config(deployment, namespace)
    settings = doctor.delivery_settings(config)
    holders = config.holders != "off" if isinstance(deployment, Mapping) else None
    try:
        rc = await _get_or_none(client, RUNTIMECLASSES, settings.runtime_class_name)
    except errors.Forbidden:
        rc = None
    return settings, ({settings.runtime_class_name: rc} if rc is not None else {}), holders


def _group_node(groups: Sequence[dict[str, Any]], pod: dict[str, Any]) -> str | None:
    name = pod_group(pod)
    for g in groups:
        if g["metadata"]["name"] == name:
            return (g.get("status") or {}).get("nodeName") or None
    return None


# --- sdg doctor -------------------------------------------------------------------------------


async def _doctor(client: Client, args: argparse.Namespace, write: Write) -> int:
    if args.pre:
        pre = await doctor.collect_pre(
            client, delivery=args.delivery, runtime_class_name=args.runtime_class_name
        )
        return _report(doctor.judge_pre(pre), args, write)
    if args.probe:
        return await _probe(client, args, write)
    facts = await doctor.collect(
        client,
        namespace=args.namespace or _context_namespace(args.kubeconfig, args.context),
        manager_namespace=args.manager_namespace or args.claims_namespace,
        delivery=args.delivery,
        runtime_class_name=args.runtime_class_name,
    )
    return _report(doctor.judge(facts), args, write)


def _report(checks: list[doctor.Check], args: argparse.Namespace, write: Write) -> int:
    if args.output == "json":
        write(doctor.render_json(checks))
    else:
        write(doctor.render_text(checks, color=_color()))
    return doctor.exit_code(checks)


async def _probe(client: Client, args: argparse.Namespace, write: Write) -> int:
    """sdg doctor --probe, with the manager's device variables and DRA drivers as its
    Deployment runs it (its defaults where it cannot be read)."""
    namespace = args.manager_namespace or args.claims_namespace
    try:
        deployment = await _get_or_none(
            client, doctor.DEPLOYMENTS, doctor.MANAGER_DEPLOYMENT, namespace
        )
    except errors.Forbidden:
        deployment = None
    config = doctor.manager_config(deployment, namespace)
    try:
        options = doctorprobe.ProbeOptions(
            namespace=args.namespace or _context_namespace(args.kubeconfig, args.context),
            image=args.probe_image,
            pull_policy=args.probe_image_pull_policy,
            timeout=args.probe_timeout,
            nodes=tuple(args.probe_node),
            env_table=config.env_table,
            dra_drivers=config.dra_drivers,
        )
    except ValueError as err:
        raise CliError(str(err)) from None
    return _report(await doctorprobe.run_probes(client, options), args, write)


_COMMANDS = {"get": _get, "devices": _devices, "explain": _explain, "doctor": _doctor}


async def _run(args: argparse.Namespace, write: Write) -> int:
    async with _client(args) as client:
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

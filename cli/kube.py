"""What every ``sdg`` command reads from the cluster, and how: the client, the
context's namespace, lists that say what is missing, informers for ``-w``."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import anyio

from api.constants import MANAGER_NAMESPACE, SDG_KIND
from controllers.inventory import RESOURCESLICES
from controllers.ledger.records import RECORD_LABEL, RECORD_LABEL_VALUE
from sdgruntime import errors
from sdgruntime.cache.informer import Informer
from sdgruntime.cache.sync import CacheSyncError
from sdgruntime.client import Client
from sdgruntime.kinds import CONFIGMAPS
from sdgruntime.rest.kubeconfig import KubeconfigError, read_kubeconfig

DEFAULT_CLAIMS_NAMESPACE = MANAGER_NAMESPACE
#: How long a watch waits for its first list of each kind.
WATCH_SYNC_TIMEOUT = 60.0
#: A watched device map is drawn again this long after a change (changes come in bursts).
WATCH_SETTLE = 0.2
Write = Callable[[str], None]


class CliError(Exception):
    """A failure to report in one line, without a traceback."""


def context_namespace(kubeconfig: str | None, context: str | None) -> str:
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


def make_client(args: argparse.Namespace) -> Client:
    try:
        if args.context:
            return Client.from_kubeconfig(args.kubeconfig, args.context, max_connections=4)
        return Client.auto(args.kubeconfig, max_connections=4)
    except Exception as err:  # a kubeconfig error, or the kubernetes package's (exec plugins)
        raise CliError(f"cannot load the Kubernetes configuration: {err}") from None


def use_color() -> bool:
    """ANSI colours: only on a terminal, and not when NO_COLOR is set (no-color.org)."""
    return sys.stdout.isatty() and not os.environ.get("NO_COLOR")


async def list_objects(
    client: Client, kind: Any, namespace: str | None = None, **kw: Any
) -> list[dict[str, Any]]:
    items, _ = await client.list_all(kind, namespace, **kw)
    return items


async def list_groups(client: Client) -> list[dict[str, Any]]:
    try:
        return await list_objects(client, SDG_KIND)
    except errors.NotFound:
        raise CliError(
            "the SharedDeviceGroup API (deviceshare.io/v1alpha1) is not installed in this "
            "cluster: kubectl apply -k config/default"
        ) from None


async def claim_records(client: Client, namespace: str) -> list[dict[str, Any]]:
    return await list_objects(client, CONFIGMAPS, namespace, label_selector=RECORDS_SELECTOR)


RECORDS_SELECTOR = f"{RECORD_LABEL}={RECORD_LABEL_VALUE}"


async def resource_slices(client: Client) -> list[dict[str, Any]] | None:
    """DRA ResourceSlices (the device inventory's best source); None where not served."""
    try:
        return await list_objects(client, RESOURCESLICES)
    except (errors.NotFound, errors.Forbidden):
        return None


async def get_or_none(client: Client, kind: Any, name: str, namespace: str | None = None) -> Any:
    try:
        return await client.get(kind, name, namespace)
    except errors.NotFound:
        return None


# --- watching ---------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def informers_running(informers: Sequence[Informer]) -> AsyncIterator[None]:
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

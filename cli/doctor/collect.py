"""``sdg doctor``'s I/O: reads what the checks need into ``Facts``/``PreFacts``
(``None`` for 404, ``Unreadable`` for any other API error, so one Forbidden read fails
one check), the manager's settings from its Deployment, and the dry-run pod probe."""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Mapping
from datetime import UTC, datetime
from typing import Any

from api.constants import (
    DEFAULT_ENV_TABLE,
    DEFAULT_RUNTIME_CLASS,
    DELIVERY_AUTO,
    LEASE_NAME,
    MANAGER_NAMESPACE,
    SDG_KIND,
)
from api.envvars import parse_env_table
from api.nodes import is_shared
from cli.doctor.facts import (
    BINDING_KIND,
    CERT_MANAGER_CRD,
    CERTIFICATES,
    CRD_NAME,
    DEPLOYMENTS,
    MANAGER_CONTAINER,
    MANAGER_DEPLOYMENT,
    POLICIES,
    POLICY_KIND,
    PRIORITYCLASSES,
    PROBE_PREFIX,
    SERVING_CERTIFICATE,
    WEBHOOK_CONFIGURATIONS,
    WEBHOOK_KINDS,
    Facts,
    Fetched,
    ManagerConfig,
    PreFacts,
    Probe,
    Unreadable,
)
from cli.doctor.judge import name_of, probe_pod, quote, runtime_class_users
from controllers.inventory import (
    RESOURCESLICES,
)
from controllers.ledger.records import RECORD_LABEL, RECORD_LABEL_VALUE
from controllers.settings import TRUE_WORDS, Settings, dra_driver_table, read_known
from sdgruntime import errors
from sdgruntime.client import Client
from sdgruntime.kinds import (
    CONFIGMAPS,
    CRDS,
    LEASES,
    NODES,
    PODS,
    RUNTIMECLASSES,
    Kind,
    Obj,
    spec_of,
)

# --- manager settings, from its Deployment -----------------------------------------------


def _container(deployment: Obj) -> Obj:
    containers = (spec_of(deployment).get("template") or {}).get("spec") or {}
    listed = [c for c in containers.get("containers") or () if isinstance(c, Mapping)]
    for c in listed:
        if c.get("name") == MANAGER_CONTAINER:
            return c
    return listed[0] if listed else {}


def manager_flags(deployment: Obj) -> dict[str, Any]:
    """The manager's settings its Deployment sets, read by the manager's own flag parser
    (``controllers.settings.read_known``): flags win over ``SDG_*`` env values; values
    from ``valueFrom`` are not known here and are skipped; booleans come out as bools."""
    c = _container(deployment)
    environ = {
        str(entry.get("name") or ""): str(entry.get("value") or "")
        for entry in c.get("env") or ()
        if isinstance(entry, Mapping) and "value" in entry
    }
    tokens = [str(t) for t in [*(c.get("command") or ())[1:], *(c.get("args") or ())]]
    values: dict[str, Any] = read_known(tokens, environ)
    for name, info in Settings.model_fields.items():
        if info.annotation is bool and isinstance(values.get(name), str):
            values[name] = values[name].strip().lower() in TRUE_WORDS
    return values


def manager_config(
    deployment: Fetched,
    manager_namespace: str,
    *,
    delivery: str | None = None,
    runtime_class_name: str | None = None,
) -> ManagerConfig:
    """What the checks need to know of the manager: from its Deployment when there is one
    (else the manager's defaults), with doctor's ``--delivery``/``--runtime-class-name``
    on top (for a manager that runs elsewhere)."""
    flags: dict[str, Any] = {}
    source = "defaults"
    if isinstance(deployment, Mapping):
        flags = manager_flags(deployment)
        source = f"Deployment {manager_namespace}/{name_of(deployment)}"
    try:
        env_table = parse_env_table(flags.get("device_env") or ())
    except ValueError:
        env_table = dict(DEFAULT_ENV_TABLE)
    namespace = (
        flags.get("leader_election_namespace") or flags.get("claims_namespace") or manager_namespace
    )
    return ManagerConfig(
        delivery=delivery or str(flags.get("delivery") or DELIVERY_AUTO),
        runtime_class_name=runtime_class_name
        or str(flags.get("runtime_class_name") or DEFAULT_RUNTIME_CLASS),
        device_ids=str(flags.get("device_ids") or "auto"),
        # The manager's own default is off, but config/manager turns it on; without a
        # Deployment to read, expect the Lease (a manager elsewhere may run either way).
        leader_elect=bool(flags.get("leader_elect", not isinstance(deployment, Mapping))),
        lease_name=str(flags.get("leader_election_id") or LEASE_NAME),
        lease_namespace=str(namespace),
        env_table=env_table,
        dra_drivers=dra_driver_table(str(flags.get("dra_drivers") or ""), strict=False),
        resource_slices=str(flags.get("resource_slices") or "auto"),
        holders=str(flags.get("holders") or "auto"),
        holder_priority_class=str(flags.get("holder_priority_class", "deviceshare-holder")),
        source=source,
        delivery_source="sdg doctor --delivery" if delivery else source,
    )


# --- fetching ---------------------------------------------------------------------------------


async def _read(call: Awaitable[Any]) -> Any:
    """The object, None on 404, or ``Unreadable``; no answer at all still raises (the
    cluster is unreachable: nothing else can be checked)."""
    try:
        return await call
    except errors.NotFound:
        return None
    except errors.TransportError:
        raise
    except errors.ApiError as err:
        return Unreadable(f"{err.code} {err.reason or ''} {quote(err.message)}".replace("  ", " "))


async def read_list(client: Client, kind: Kind, namespace: str | None = None, **kw: Any) -> Any:
    got = await _read(client.list_all(kind, namespace, **kw))
    return got[0] if isinstance(got, tuple) else got


async def _pods_on(client: Client, facts: Facts, node_name: str) -> list[Obj] | Unreadable:
    """The pods on a shared node: every namespace's where the reader may list pods
    cluster-wide (the opt-in deviceshare-doctor-pods role; pods carry their env values),
    else only the manager's namespace's (SDG's holder pods, which deviceshare-doctor-records
    reads), with ``facts.pods_refused`` saying why the rest were not read."""
    selector = f"spec.nodeName={node_name}"
    if facts.pods_refused is None:
        pods = await read_list(client, PODS, field_selector=selector)
        if not isinstance(pods, Unreadable):
            return [] if pods is None else pods
        facts.pods_refused = pods.error
    own = await read_list(client, PODS, facts.manager_namespace, field_selector=selector)
    return [] if own is None else own


async def run_probe(client: Client, namespace: str) -> Probe | Unreadable:
    """The server-side dry-run CREATE: nothing is stored, admission runs in full."""
    group = PROBE_PREFIX + secrets.token_hex(4)
    try:
        await client.create(PODS, probe_pod(group), namespace, dry_run=True)
    except errors.TransportError:
        raise
    except errors.ApiError as err:
        return Probe(group, namespace, admitted=False, code=err.code, message=err.message)
    return Probe(group, namespace, admitted=True)


async def collect(
    client: Client,
    *,
    namespace: str = "default",
    manager_namespace: str = MANAGER_NAMESPACE,
    delivery: str | None = None,
    runtime_class_name: str | None = None,
) -> Facts:
    """Read everything the checks need (read-only but for the dry-run probe)."""
    facts = Facts(manager_namespace=manager_namespace)
    facts.crd = await _read(client.get(CRDS, CRD_NAME))
    if isinstance(facts.crd, Mapping):
        groups = await read_list(client, SDG_KIND)
        if isinstance(groups, Unreadable):
            facts.groups_error = groups.error
        elif groups is None:
            facts.groups_error = f"{SDG_KIND.path()} is not found (404)"
        else:
            facts.group_count = len(groups)
            facts.groups = groups
            records = await read_list(
                client,
                CONFIGMAPS,
                manager_namespace,
                label_selector=f"{RECORD_LABEL}={RECORD_LABEL_VALUE}",
            )
            facts.records = [] if records is None else records
    for kind, config_name in WEBHOOK_CONFIGURATIONS.items():
        facts.webhooks[config_name] = await _read(client.get(WEBHOOK_KINDS[kind], config_name))
    for policy in POLICIES:
        facts.policies[policy] = await _read(client.get(POLICY_KIND, policy))
        facts.bindings[policy] = await _read(client.get(BINDING_KIND, policy))
    facts.probe = await run_probe(client, namespace)
    facts.cert_manager_crd = await _read(client.get(CRDS, CERT_MANAGER_CRD))
    if isinstance(facts.cert_manager_crd, Mapping):
        facts.certificate = await _read(
            client.get(CERTIFICATES, SERVING_CERTIFICATE, manager_namespace)
        )
    facts.deployment = await _read(client.get(DEPLOYMENTS, MANAGER_DEPLOYMENT, manager_namespace))
    facts.config = manager_config(
        facts.deployment,
        manager_namespace,
        delivery=delivery,
        runtime_class_name=runtime_class_name,
    )
    facts.lease = await _read(
        client.get(LEASES, facts.config.lease_name, facts.config.lease_namespace)
    )
    facts.now = datetime.now(UTC)  # just after the read the Lease's age is measured from
    nodes = await read_list(client, NODES)
    facts.nodes = [] if nodes is None else nodes
    facts.slices = await read_list(client, RESOURCESLICES)  # None: resource.k8s.io/v1 not served
    if isinstance(facts.nodes, list):
        for node in facts.nodes:
            if is_shared(node):
                node_name = name_of(node)
                facts.pods[node_name] = await _pods_on(client, facts, node_name)
    if facts.config.holders == "auto" and facts.config.holder_priority_class:
        facts.priority_class = await _read(
            client.get(PRIORITYCLASSES, facts.config.holder_priority_class)
        )
    if facts.config.delivery == DELIVERY_AUTO or runtime_class_users(facts.config, facts.nodes):
        facts.runtime_class = await _read(
            client.get(RUNTIMECLASSES, facts.config.runtime_class_name)
        )
    return facts


async def collect_pre(
    client: Client, *, delivery: str | None = None, runtime_class_name: str | None = None
) -> PreFacts:
    """Read what --pre needs: /version, nodes, ResourceSlices, the RuntimeClass."""
    facts = PreFacts()
    facts.config = manager_config(
        None, MANAGER_NAMESPACE, delivery=delivery, runtime_class_name=runtime_class_name
    )
    facts.version = await _read(client.request("GET", "/version"))
    nodes = await read_list(client, NODES)
    facts.nodes = [] if nodes is None else nodes
    facts.slices = await read_list(client, RESOURCESLICES)
    facts.runtime_class = await _read(client.get(RUNTIMECLASSES, facts.config.runtime_class_name))
    return facts

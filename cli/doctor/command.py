"""``sdg doctor``: collect, judge, render; ``--pre`` and ``--probe`` the same way."""

from __future__ import annotations

import argparse

from cli.doctor.collect import collect, collect_pre, manager_config
from cli.doctor.facts import DEPLOYMENTS, MANAGER_DEPLOYMENT, Check
from cli.doctor.judge import exit_code, judge, judge_pre
from cli.doctor.probe import ProbeOptions, run_probes
from cli.doctor.render import render_json, render_text
from cli.kube import CliError, Write, context_namespace, get_or_none, use_color
from sdgruntime import errors
from sdgruntime.client import Client

# --- sdg doctor -------------------------------------------------------------------------------


async def run(client: Client, args: argparse.Namespace, write: Write) -> int:
    if args.pre:
        pre = await collect_pre(
            client, delivery=args.delivery, runtime_class_name=args.runtime_class_name
        )
        return _report(judge_pre(pre), args, write)
    if args.probe:
        return await _probe(client, args, write)
    facts = await collect(
        client,
        namespace=args.namespace or context_namespace(args.kubeconfig, args.context),
        manager_namespace=args.manager_namespace or args.claims_namespace,
        delivery=args.delivery,
        runtime_class_name=args.runtime_class_name,
    )
    return _report(judge(facts), args, write)


def _report(checks: list[Check], args: argparse.Namespace, write: Write) -> int:
    if args.output == "json":
        write(render_json(checks))
    else:
        write(render_text(checks, color=use_color()))
    return exit_code(checks)


async def _probe(client: Client, args: argparse.Namespace, write: Write) -> int:
    """sdg doctor --probe, with the manager's device variables and DRA drivers as its
    Deployment runs it (its defaults where it cannot be read)."""
    namespace = args.manager_namespace or args.claims_namespace
    try:
        deployment = await get_or_none(client, DEPLOYMENTS, MANAGER_DEPLOYMENT, namespace)
    except errors.Forbidden:
        deployment = None
    config = manager_config(deployment, namespace)
    try:
        options = ProbeOptions(
            namespace=args.namespace or context_namespace(args.kubeconfig, args.context),
            image=args.probe_image,
            pull_policy=args.probe_image_pull_policy,
            timeout=args.probe_timeout,
            nodes=tuple(args.probe_node),
            env_table=config.env_table,
            dra_drivers=config.dra_drivers,
        )
    except ValueError as err:
        raise CliError(str(err)) from None
    return _report(await run_probes(client, options), args, write)

"""configmap-mirror: keeps a Secret with the data of every ConfigMap labelled
``mirror.example.com/enabled=true``, built only on sdgruntime's public API.

- The Secret is named by the ConfigMap's annotation ``mirror.example.com/secret-name``
  (a mutating webhook sets it to the ConfigMap's own name) and is controlled by the
  ConfigMap (owner reference): editing or deleting the Secret restores it.
- A finalizer deletes the Secret when the ConfigMap is deleted *or* loses its label; a
  Secret someone else owns is never taken over.
- A validating webhook refuses an invalid Secret name and a change of it while mirroring.
"""

from __future__ import annotations

import argparse
import base64
import logging
import re
from typing import Any

import anyio

from sdgruntime import Manager, ManagerOptions, Request, TerminalError, errors
from sdgruntime.cache import KindOptions
from sdgruntime.controllerutil import (
    OperationResult,
    add_finalizer,
    contains_finalizer,
    create_or_update,
    is_controlled_by,
    remove_finalizer,
    set_controller_reference,
)
from sdgruntime.kinds import CONFIGMAPS, SECRETS, Kind
from sdgruntime.predicate import label_selector_predicate
from sdgruntime.webhook import CustomValidator, Denied

NAME = "configmap-mirror"
LABEL = "mirror.example.com/enabled"
TARGET = "mirror.example.com/secret-name"
FINALIZER = "mirror.example.com/cleanup"
MANAGED_BY = "app.kubernetes.io/managed-by"
SECRET_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")

Obj = dict[str, Any]


def selected(cm: Obj) -> bool:
    return (cm["metadata"].get("labels") or {}).get(LABEL) == "true"


def cm_ns(cm: Obj) -> str:
    return str(cm["metadata"]["namespace"])


def target_of(cm: Obj) -> str:
    return (cm["metadata"].get("annotations") or {}).get(TARGET) or cm["metadata"]["name"]


def secret_data(cm: Obj) -> dict[str, str]:
    data = {k: base64.b64encode(v.encode()).decode() for k, v in (cm.get("data") or {}).items()}
    return {**data, **(cm.get("binaryData") or {})}  # binaryData is base64 already


class MirrorReconciler:
    def __init__(self, mgr: Manager) -> None:
        self.cache, self.client = mgr.cache, mgr.client
        self.events = mgr.event_recorder(NAME)

    async def reconcile(self, request: Request) -> None:
        try:
            cm = self.cache.get(CONFIGMAPS, request.name, request.namespace)
        except errors.NotFound:
            return  # gone: the finalizer already removed its Secret
        if cm["metadata"].get("deletionTimestamp") or not selected(cm):
            await self._unmirror(cm)
            return
        if add_finalizer(cm, FINALIZER):  # before the Secret exists, so it is never leaked
            cm = await self.client.update(CONFIGMAPS, cm)
        name = target_of(cm)

        def mirror(secret: Obj) -> None:
            if secret["metadata"].get("uid") and not is_controlled_by(secret, cm):
                raise TerminalError(f"Secret {name} exists and is not ours: not taking it over")
            set_controller_reference(cm, secret)
            secret["metadata"].setdefault("labels", {})[MANAGED_BY] = NAME
            secret["type"] = "Opaque"
            secret["data"] = secret_data(cm)

        try:
            result, _ = await create_or_update(self.client, SECRETS, name, cm_ns(cm), mirror)
        except TerminalError as exc:
            self.events.emit(cm, "Warning", "SecretTaken", str(exc))
            raise
        if result is not OperationResult.UNCHANGED:
            self.events.emit(cm, "Normal", "Mirrored", f"Secret {name} {result.value}")

    async def _unmirror(self, cm: Obj) -> None:
        """Delete our Secret, then let the ConfigMap go (or stay, unmirrored)."""
        if not contains_finalizer(cm, FINALIZER):
            return
        name, namespace = target_of(cm), cm_ns(cm)
        try:
            secret = await self.client.get(SECRETS, name, namespace)
            if is_controlled_by(secret, cm):
                await self.client.delete(SECRETS, name, namespace, uid=secret["metadata"]["uid"])
        except errors.NotFound:
            pass
        remove_finalizer(cm, FINALIZER)
        await self.client.update(CONFIGMAPS, cm)
        self.events.emit(cm, "Normal", "Unmirrored", f"Secret {name} deleted")


class SecretNameDefaulter:
    async def default(self, obj: Obj) -> None:
        if selected(obj):
            annotations = obj["metadata"].setdefault("annotations", {})
            annotations.setdefault(TARGET, obj["metadata"]["name"])


class MirrorValidator(CustomValidator):
    async def validate_create(self, obj: Obj) -> list[str]:
        return self._check(obj)

    async def validate_update(self, old: Obj, new: Obj) -> list[str]:
        if selected(old) and selected(new) and target_of(old) != target_of(new):
            raise Denied(
                f"{TARGET} cannot change while the ConfigMap is mirrored (to {target_of(old)}): "
                f"remove the {LABEL} label first, which deletes that Secret"
            )
        return self._check(new)

    def _check(self, cm: Obj) -> list[str]:
        if not selected(cm):
            return []
        name = target_of(cm)
        if len(name) > 253 or not SECRET_NAME.fullmatch(name):
            raise Denied(f"{TARGET} {name!r} is not a valid Secret name (a DNS subdomain)")
        return [] if secret_data(cm) else ["the ConfigMap has no data: the Secret is empty"]


def cache_options(namespace: str | None = None) -> dict[Kind, KindOptions]:
    """Only our own Secrets are cached (a cluster's Secrets are many, and private)."""
    return {
        CONFIGMAPS: KindOptions(namespace=namespace),
        SECRETS: KindOptions(namespace=namespace, label_selector={MANAGED_BY: NAME}),
    }


def build(options: ManagerOptions) -> Manager:
    mgr = Manager(options=options)
    (
        mgr.controller(NAME)
        .for_(CONFIGMAPS, predicates=[label_selector_predicate({"matchLabels": {LABEL: "true"}})])
        .owns(SECRETS)
        .complete(MirrorReconciler(mgr))
    )
    hooks = mgr.webhook_for(CONFIGMAPS)  # /mutate--v1-configmap, /validate--v1-configmap
    hooks.with_defaulter(SecretNameDefaulter()).with_validator(MirrorValidator()).complete()
    return mgr


def main() -> None:
    parser = argparse.ArgumentParser(prog=NAME, description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig")
    parser.add_argument("--webhook-port", type=int, default=9443)
    parser.add_argument("--webhook-cert-dir", default="/tmp/k8s-webhook-server/serving-certs")
    parser.add_argument("--leader-elect", action="store_true")
    parser.add_argument("--leader-election-namespace")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per API request
    options = ManagerOptions(
        kubeconfig=args.kubeconfig,
        webhook_port=args.webhook_port,
        webhook_cert_dir=args.webhook_cert_dir,
        leader_election=args.leader_elect,
        leader_election_id=f"{NAME}-leader",
        leader_election_namespace=args.leader_election_namespace,
        leader_election_release_on_cancel=True,
        cache_by_kind=cache_options(),
    )
    anyio.run(build(options).run)


if __name__ == "__main__":
    main()

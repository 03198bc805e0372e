"""examples/operator (configmap-mirror) against the real API server, under its own RBAC
(examples/operator/rbac.yaml) and with the API server calling its webhooks over TLS: a
labelled ConfigMap gets a Secret it controls, kept in sync and restored; its Secret name
is defaulted and validated; a Secret someone else owns is not taken; removing the label
or deleting the ConfigMap deletes the Secret (the finalizer), unlabelled ones are left
alone."""

from __future__ import annotations

import base64
import importlib.util
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from types import ModuleType
from typing import Any

import anyio
import pytest

from sdgruntime import errors
from sdgruntime.client import Client
from sdgruntime.envtest import ControlPlane, eventually, load_manifests
from sdgruntime.kinds import CONFIGMAPS, EVENTS, SECRETS
from sdgruntime.manager import ManagerOptions

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "operator"


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("configmap_mirror", EXAMPLE / "mirror.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


mirror = load_example()


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def configmap(name: str, labelled: bool = True, **data: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if labelled:
        meta["labels"] = {mirror.LABEL: "true"}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}


@pytest.fixture
async def operator(
    control_plane: ControlPlane, namespace: str, tmp_path: Path
) -> AsyncIterator[None]:
    """The example's manager, as a user with only the example's ClusterRole (bound in the
    test's namespace), serving its webhooks to the API server."""
    for obj in load_manifests([EXAMPLE / "rbac.yaml"]):
        control_plane.apply(obj)  # the ClusterRole configmap-mirror
    user = f"configmap-mirror-{uuid.uuid4().hex[:6]}"
    control_plane.bind_cluster_role(user, "configmap-mirror", namespace)  # a RoleBinding
    options = ManagerOptions(
        kubeconfig=str(control_plane.user_kubeconfig(user)),
        metrics_bind_address="0",
        health_probe_bind_address="0",
        webhook_host="127.0.0.1",
        webhook_port=0,  # any free port: mgr.webhook_server.port once it runs
        webhook_cert_dir=str(control_plane.webhook_cert_dir(tmp_path / "certs")),
        cache_by_kind=mirror.cache_options(namespace),
    )
    mgr = mirror.build(options)
    async with anyio.create_task_group() as tg:
        await tg.start(mgr.run_until_cancelled)
        port = mgr.webhook_server.port
        # Named apart and scoped to the test's namespace: the control plane is shared.
        with control_plane.webhooks([EXAMPLE / "webhooks.yaml"], port, namespace):
            yield
        tg.cancel_scope.cancel()


async def test_a_labelled_configmap_is_mirrored_kept_in_sync_and_cleaned_up(
    client: Client, namespace: str, operator: None
) -> None:
    created = await client.create(CONFIGMAPS, configmap("app", password="s3cret"), namespace)
    # The mutating webhook made the Secret's name explicit.
    assert created["metadata"]["annotations"] == {mirror.TARGET: "app"}

    async def secret_data() -> dict[str, str] | None:
        return (await client.get(SECRETS, "app", namespace)).get("data")

    assert await eventually(secret_data, "the Secret") == {"password": b64("s3cret")}
    secret = await client.get(SECRETS, "app", namespace)
    assert secret["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "name": "app",
            "uid": created["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert secret["metadata"]["labels"] == {mirror.MANAGED_BY: mirror.NAME}
    cm = await client.get(CONFIGMAPS, "app", namespace)
    assert cm["metadata"]["finalizers"] == [mirror.FINALIZER]

    # A change of the ConfigMap reaches the Secret; an edit of the Secret is undone.
    await client.patch(CONFIGMAPS, "app", {"data": {"password": "n3w"}}, namespace)

    async def synced() -> bool:
        return await secret_data() == {"password": b64("n3w")}

    await eventually(synced, "the new password in the Secret")
    await client.patch(SECRETS, "app", {"data": {"password": b64("hacked")}}, namespace)
    await eventually(synced, "the Secret restored")

    # Removing the label (an update the old object matched) deletes the Secret and lets
    # the ConfigMap go unmirrored.
    await client.patch(CONFIGMAPS, "app", {"metadata": {"labels": {mirror.LABEL: None}}}, namespace)

    async def secret_gone() -> bool:
        try:
            await client.get(SECRETS, "app", namespace)
        except errors.NotFound:
            return True
        return False

    await eventually(secret_gone, "the Secret deleted after the label was removed")
    cm = await eventually(
        lambda: _without_finalizer(client, "app", namespace), "the finalizer removed"
    )
    assert cm["data"] == {"password": "n3w"}

    # Labelled again, then deleted: the finalizer deletes the Secret before it goes.
    await client.patch(
        CONFIGMAPS, "app", {"metadata": {"labels": {mirror.LABEL: "true"}}}, namespace
    )
    await eventually(synced, "the Secret re-created")
    await client.delete(CONFIGMAPS, "app", namespace)
    await eventually(secret_gone, "the Secret deleted with its ConfigMap")

    async def configmap_gone() -> bool:
        try:
            await client.get(CONFIGMAPS, "app", namespace)
        except errors.NotFound:
            return True
        return False

    await eventually(configmap_gone, "the ConfigMap deleted once its finalizer was removed")


async def _without_finalizer(client: Client, name: str, namespace: str) -> dict[str, Any] | None:
    cm = await client.get(CONFIGMAPS, name, namespace)
    return None if cm["metadata"].get("finalizers") else cm


async def test_the_webhooks_refuse_bad_secret_names_and_renames(
    client: Client, namespace: str, operator: None
) -> None:
    bad = configmap("bad", k="v")
    bad["metadata"]["annotations"] = {mirror.TARGET: "Not_A_Name"}
    with pytest.raises(errors.ApiError) as info:
        await client.create(CONFIGMAPS, bad, namespace)
    assert info.value.code == 403
    assert (
        'admission webhook "vconfigmap.mirror.example.com" denied the request: '
        f"{mirror.TARGET} 'Not_A_Name' is not a valid Secret name (a DNS subdomain)"
    ) in info.value.message

    await client.create(CONFIGMAPS, configmap("named", k="v"), namespace)
    rename = {"metadata": {"annotations": {mirror.TARGET: "elsewhere"}}}
    with pytest.raises(errors.ApiError, match="cannot change while the ConfigMap is mirrored"):
        await client.patch(CONFIGMAPS, "named", rename, namespace)


async def test_unlabelled_configmaps_and_secrets_of_others_are_left_alone(
    client: Client, namespace: str, operator: None
) -> None:
    plain = await client.create(CONFIGMAPS, configmap("plain", labelled=False, k="v"), namespace)
    assert "annotations" not in plain["metadata"]  # no webhook was called for it
    theirs = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "taken"},
        "data": {"k": b64("theirs")},
    }
    await client.create(SECRETS, theirs, namespace)
    await client.create(CONFIGMAPS, configmap("taken", k="ours"), namespace)
    await client.create(CONFIGMAPS, configmap("later", k="v"), namespace)

    async def warned() -> bool:
        events, _ = await client.list_all(EVENTS, namespace)
        return any(
            e["reason"] == "SecretTaken" and e["involvedObject"]["name"] == "taken" for e in events
        )

    await eventually(warned, "a SecretTaken warning on the ConfigMap")
    assert (await client.get(SECRETS, "taken", namespace))["data"] == {"k": b64("theirs")}
    await eventually(lambda: client.get(SECRETS, "later", namespace), "the later Secret")
    # By the time a later labelled ConfigMap is mirrored, the plain one has been passed over.
    with pytest.raises(errors.NotFound):
        await client.get(SECRETS, "plain", namespace)
    assert not (await client.get(CONFIGMAPS, "plain", namespace))["metadata"].get("finalizers")

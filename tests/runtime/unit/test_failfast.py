"""Mistakes fail when the operator is wired, not at its first event, with a message that
says what to write: sync reconcilers and webhook handlers, classes passed for instances,
two controllers of one name, ManagerOptions that could only fail in run()."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from sdgruntime import manager as manager_module
from sdgruntime.controller import Controller
from sdgruntime.envtest import FakeClient
from sdgruntime.kinds import CONFIGMAPS, SECRETS
from sdgruntime.manager import Manager, ManagerOptions
from sdgruntime.reconcile import Request, Result
from sdgruntime.webhook import AdmissionRequest, AdmissionResponse, WebhookServer, allowed
from tests.runtime.helpers import as_client

OPTIONS = ManagerOptions(metrics_bind_address="0", health_probe_bind_address="0")


def manager(**options: Any) -> Manager:
    opts = OPTIONS.model_copy(update=options) if options else OPTIONS
    return Manager(client=as_client(FakeClient()), options=opts)


class AsyncReconciler:
    async def reconcile(self, request: Request) -> Result | None:
        return None


class SyncReconciler:
    def reconcile(self, request: Request) -> Result | None:
        return None


def sync_fn(request: Request) -> None:
    return None


async def async_fn(request: Request) -> None:
    return None


# --- reconcilers -----------------------------------------------------------------------------


def test_a_sync_reconcile_method_is_refused_at_complete() -> None:
    mgr = manager()
    with pytest.raises(TypeError, match=r"SyncReconciler\.reconcile is not async.*async def"):
        mgr.controller("c").for_(CONFIGMAPS).complete(SyncReconciler())
    assert mgr.controllers == {}  # nothing half-added


def test_a_sync_function_is_refused_at_complete() -> None:
    with pytest.raises(TypeError, match="reconciler sync_fn is not async"):
        manager().controller("c").for_(CONFIGMAPS).complete(sync_fn)
    with pytest.raises(TypeError, match="is not async"):
        manager().controller("c").for_(CONFIGMAPS).complete(lambda r: async_fn(r))


def test_a_class_instead_of_an_instance_is_refused() -> None:
    with pytest.raises(TypeError, match=r"pass an instance, e\.g\. complete\(AsyncReconciler"):
        manager().controller("c").for_(CONFIGMAPS).complete(AsyncReconciler)  # type: ignore[arg-type]


def test_an_object_without_reconcile_is_refused() -> None:
    with pytest.raises(TypeError, match="neither a Reconciler"):
        manager().controller("c").for_(CONFIGMAPS).complete(object())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="has no reconcile"):
        Controller("c", object(), cache=None)  # type: ignore[arg-type]


def test_async_reconcilers_of_every_shape_are_accepted() -> None:
    class Callable:
        async def __call__(self, request: Request) -> None:
            return None

    mgr = manager()
    mgr.controller("a").for_(CONFIGMAPS).complete(AsyncReconciler())
    mgr.controller("b").for_(CONFIGMAPS).complete(async_fn)
    mgr.controller("c").for_(CONFIGMAPS).complete(Callable())
    assert sorted(mgr.controllers) == ["a", "b", "c"]


def test_unknown_controller_options_are_refused_where_they_are_given() -> None:
    with pytest.raises(TypeError, match=r"unknown controller options \['max_concurrent'\]"):
        manager().controller("c").for_(CONFIGMAPS).with_options(max_concurrent=4)


# --- controller names ------------------------------------------------------------------------


def test_two_controllers_of_one_name_are_refused_with_what_to_do() -> None:
    mgr = manager()
    mgr.controller("mirror").for_(CONFIGMAPS).complete(AsyncReconciler())
    with pytest.raises(ValueError, match="'mirror' was already added: give each controller"):
        mgr.controller("mirror").for_(SECRETS).complete(AsyncReconciler())
    # The default name is the kind's: two unnamed controllers for one kind collide too.
    mgr.controller().for_(SECRETS).complete(AsyncReconciler())
    with pytest.raises(ValueError, match="'secret' was already added"):
        mgr.controller().for_(SECRETS).complete(AsyncReconciler())
    assert sorted(mgr.controllers) == ["mirror", "secret"]


def test_skip_name_validation_allows_a_shared_name() -> None:
    mgr = manager()
    first = mgr.controller("shared").for_(CONFIGMAPS).complete(AsyncReconciler())
    second = (
        mgr.controller("shared")
        .for_(SECRETS)
        .with_options(skip_name_validation=True)
        .complete(AsyncReconciler())
    )
    assert mgr.controllers == {"shared": first}  # by name: the first
    assert {first.run, second.run} <= set(mgr._split(leader=True))  # both run
    # For every controller of a manager at once:
    everyone = manager(skip_name_validation=True)
    for _ in range(2):
        everyone.controller("same").for_(CONFIGMAPS).complete(AsyncReconciler())
    # Adding the same controller object twice is always a mistake.
    c = Controller("once", AsyncReconciler(), everyone.cache, skip_name_validation=True)
    everyone.add_controller(c)
    with pytest.raises(ValueError, match="'once' was already added"):
        everyone.add_controller(c)


# --- webhooks --------------------------------------------------------------------------------


class SyncValidator:
    def validate(self, request: AdmissionRequest) -> AdmissionResponse:
        return allowed()


class AsyncValidator:
    async def validate(self, request: AdmissionRequest) -> AdmissionResponse:
        return allowed()


def test_sync_webhook_handlers_are_refused_at_register() -> None:
    server = WebhookServer("127.0.0.1", 0, "/nonexistent")
    with pytest.raises(TypeError, match=r"for /v: SyncValidator\.validate is not async.*async"):
        server.register("/v", SyncValidator())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"for /f: \S*<lambda> is not async"):
        server.register("/f", lambda request: allowed())  # type: ignore[arg-type, return-value]
    with pytest.raises(TypeError, match=r"register an instance, e\.g\. AsyncValidator"):
        server.register("/c", AsyncValidator)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="has no mutate"):
        server.register("/o", object())  # type: ignore[arg-type]
    assert server.webhooks == {}
    server.register("/v", AsyncValidator())
    assert list(server.webhooks) == ["/v"]


# --- manager options -------------------------------------------------------------------------


def test_leader_election_without_a_namespace_fails_at_construction_outside_a_cluster(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(manager_module, "_SA_NAMESPACE", tmp_path / "absent")
    with pytest.raises(ValidationError, match=r"set ManagerOptions\(leader_election_namespace="):
        ManagerOptions(leader_election=True, leader_election_id="my-op")
    # In a pod, the service account's namespace is the default.
    (tmp_path / "namespace").write_text("operators\n")
    monkeypatch.setattr(manager_module, "_SA_NAMESPACE", tmp_path / "namespace")
    ManagerOptions(leader_election=True, leader_election_id="my-op")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"leader_election": True}, "needs leader_election_id"),
        ({"leader_election": True, "leader_election_id": "My_Lease"}, "cannot name a Lease"),
        ({"metrics_bind_address": "8080"}, "metrics_bind_address: listen address must be"),
        ({"health_probe_bind_address": ":99999"}, "port 99999 is over 65535"),
        ({"webhook_port": 70000}, "webhook_port"),
        ({"webhook_max_connections": 0}, "webhook_max_connections"),
    ],
)
def test_options_that_could_only_fail_in_run_fail_at_construction(
    options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        ManagerOptions(leader_election_namespace="ns", **options)


def test_a_misspelt_option_names_itself_the_nearest_field_and_all_fields() -> None:
    with pytest.raises(ValidationError) as typo:
        ManagerOptions(webhok_port=9443)  # type: ignore[call-arg]
    message = str(typo.value)
    assert "ManagerOptions has no field 'webhok_port' (did you mean 'webhook_port'?)" in message
    assert "Extra inputs are not permitted" not in message
    fields = message.split("its fields are: ")[1]
    assert "webhook_cert_dir" in fields and "leader_election_namespace" in fields
    # From a mapping too (a config file), and with no near field: no guess.
    with pytest.raises(ValidationError, match=r"no field 'zzz'; its fields are: cache_by_kind"):
        ManagerOptions.model_validate({"zzz": 1})
    # Known fields still go through every other check.
    with pytest.raises(ValidationError, match="webhook_port"):
        ManagerOptions(webhook_port=70000)


# --- the builder: what a controller watches ----------------------------------------------------


def test_complete_without_for_or_watches_is_refused_naming_what_to_call() -> None:
    """controller-runtime's builder refuses it too ("there are no watches configured")."""
    mgr = manager()
    with pytest.raises(ValueError, match=r"controller 'a' has no watches.*call \.for_\(kind\)"):
        mgr.controller("a").complete(AsyncReconciler())
    with pytest.raises(ValueError, match=r"owns\(\) needs for_\(\).*call \.for_\(kind\) first"):
        mgr.controller("b").owns(SECRETS).complete(AsyncReconciler())
    assert mgr.controllers == {}  # nothing half-added


def test_a_named_controller_of_watches_alone_is_accepted() -> None:
    """As controller-runtime's Named(...).Watches(...) without For()."""
    from sdgruntime.handler import EnqueueRequestsFromMapFunc

    mgr = manager()
    to_cm = EnqueueRequestsFromMapFunc(lambda obj: [Request("config", "ns")])
    c = mgr.controller("by-secret").watches(SECRETS, to_cm).complete(AsyncReconciler())
    assert mgr.controllers == {"by-secret": c} and c.kinds == [SECRETS]
    with pytest.raises(ValueError, match=r"without for_\(\) needs a name: mgr\.controller\(name"):
        manager().controller().watches(SECRETS, to_cm).complete(AsyncReconciler())

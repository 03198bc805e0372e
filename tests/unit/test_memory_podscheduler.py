"""What the pod scheduler keeps per pod under churn (issue 24): a deleted pod's assumed
bind (which holds the whole cached pod) goes with the pod's delete event, not only after
``ASSUME_TTL``; its reconcile is never queued for a delete, so the informer's handler is
what frees it."""

from __future__ import annotations

from typing import Any
from unittest import mock

from controllers import podscheduler
from controllers.podscheduler import PodScheduler
from sdgruntime.cache import Cache
from sdgruntime.envtest import FakeClient
from sdgruntime.events import EventRecorder
from sdgruntime.kinds import PODS
from tests import factories
from tests.factories import as_client


def pod(i: int) -> dict[str, Any]:
    return factories.pod(f"p-{i}", node="n1")


def scheduler() -> PodScheduler:
    """A pod scheduler that is never run: its cache unsynced, its client in memory."""
    client = as_client(FakeClient())
    return PodScheduler(client, Cache(client), EventRecorder(client, "deviceshare-scheduler"))


def test_deleted_pods_leave_no_assumed_binds_and_the_book_is_back_to_empty() -> None:
    sched = scheduler()
    for i in range(300):
        sched._assumed.assume(f"ns/p-{i}", f"n{i % 10}", pod(i))
    assert len(sched._assumed) == 300
    for i in range(300):
        sched.pod_deleted(pod(i))
    assert len(sched._assumed) == 0
    assert sched._assumed._by_node == {}


def test_a_deleted_pod_stops_counting_on_its_node_at_once() -> None:
    sched = scheduler()
    sched._assumed.assume("ns/p-1", "n1", pod(1))
    sched._assumed.assume("ns/p-2", "n1", pod(2))
    sched.pod_deleted(pod(1))
    assert sched._assumed.on("n1", []) == [pod(2)]


def test_setup_feeds_the_pod_informers_deletes_to_the_scheduler() -> None:
    mgr, sched = mock.MagicMock(), scheduler()
    podscheduler.setup(mgr, sched)
    mgr.cache.informer.assert_any_call(PODS)
    mgr.cache.informer.return_value.add_handler.assert_any_call(on_delete=sched.pod_deleted)

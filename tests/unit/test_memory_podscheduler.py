"""What the pod scheduler keeps per pod under churn (issue 24): a deleted pod's entry in
its ``NodeBook`` (an assumed bind included) goes with the pod's delete event, not only
after ``ASSUME_TTL``; its reconcile is never queued for a delete, so the informer's
handler is what frees it."""

from __future__ import annotations

from typing import Any
from unittest import mock

from controllers.podfit import share_of
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
        sched.book.assume(f"ns/p-{i}", f"n{i % 10}", share_of(pod(i)))
    assert (len(sched.book), sched.book.assumed) == (300, 300)
    for i in range(300):
        sched.book.pod_deleted(pod(i))
    assert (len(sched.book), sched.book.assumed) == (0, 0)
    assert sched.book._nodes == {}


def test_a_deleted_pod_stops_counting_on_its_node_at_once() -> None:
    sched = scheduler()
    sched.book.assume("ns/p-1", "n1", share_of(pod(1)))
    sched.book.assume("ns/p-2", "n1", share_of(pod(2)))
    sched.book.pod_deleted(pod(1))
    assert sched.book.usage("n1").pods == 1


def test_the_scheduler_feeds_its_book_from_the_pod_informer() -> None:
    """The book is the fit check's only view of a node's pods: every pod event reaches it
    (a scheduler made without ``setup`` too)."""
    cache = mock.MagicMock()
    client = as_client(FakeClient())
    sched = PodScheduler(client, cache, EventRecorder(client, "deviceshare-scheduler"))
    cache.informer.assert_called_once_with(PODS)
    cache.informer.return_value.add_handler.assert_called_once_with(
        sched.book.pod_added, sched.book.pod_updated, sched.book.pod_deleted
    )

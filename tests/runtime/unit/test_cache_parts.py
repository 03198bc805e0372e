"""Pure parts of the cache: reconnect backoff, selector strings, sync error messages."""

from __future__ import annotations

import pytest

from sdgruntime import errors
from sdgruntime.cache import Backoff
from sdgruntime.cache.reflector import selector_string
from sdgruntime.cache.sync import describe_sync_error, is_permanent
from sdgruntime.envtest import FakeClient
from sdgruntime.kinds import PODS, Kind
from tests.runtime.helpers import as_client

SDGS = Kind("deviceshare.io", "v1alpha1", "SharedDeviceGroup", "shareddevicegroups", False)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_backoff_doubles_to_the_cap_and_resets_after_a_healthy_period() -> None:
    clock = FakeClock()
    b = Backoff(0.8, 30.0, jitter=0.5, reset_after=120.0, clock=clock, rand=lambda: 0.0)
    delays = []
    for _ in range(8):
        delays.append(b.next())
        clock.now += 1
    assert delays == [0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30.0, 30.0]
    clock.now += 120  # healthy for two minutes since the last failure
    assert b.next() == 0.8
    assert b.next() == 1.6


def test_backoff_jitter_spreads_up_to_the_factor() -> None:
    b = Backoff(1.0, 30.0, jitter=0.5, clock=FakeClock(), rand=lambda: 1.0)
    assert b.next() == 1.5
    assert b.next() == 3.0
    with pytest.raises(ValueError):
        Backoff(0, 1)


def test_selector_string() -> None:
    assert selector_string({"app": "web", "tier": "a"}) == "app=web,tier=a"
    assert selector_string("app in (a,b)") == "app in (a,b)"
    assert selector_string({}) is None and selector_string("") is None
    assert selector_string(None) is None


def test_which_list_errors_are_permanent() -> None:
    assert is_permanent(errors.Forbidden("no"))
    assert is_permanent(errors.NotFound("no"))
    assert is_permanent(errors.BadRequest("field label not supported"))
    assert is_permanent(KeyError("a transform bug"))
    assert not is_permanent(None)
    assert not is_permanent(errors.TransportError("refused"))
    assert not is_permanent(errors.ServerError("etcd", code=503))
    assert not is_permanent(errors.TooManyRequests("slow down"))
    assert not is_permanent(errors.Gone("expired"))


def test_sync_error_messages_name_the_kind_and_the_cause() -> None:
    forbidden = errors.Forbidden(
        'pods is forbidden: User "x" cannot list resource "pods" in API group "" at the'
        " cluster scope"
    )
    assert describe_sync_error(PODS, forbidden, timeout=None) == (
        'pods: forbidden: User "x" cannot list resource "pods" in API group "" at the cluster scope'
    )
    no_group = errors.NotFound("404 page not found\n")  # plain text: no Status body
    assert describe_sync_error(SDGS, no_group, timeout=None) == (
        "shareddevicegroups.deviceshare.io: the server could not find the resource"
        " (CRD not installed, or the Kind's version or plural not the served one?)"
    )
    # What discovery found out (the cache asks it on a 404) replaces the guess.
    hint = "deviceshare.io/v1alpha1 serves SharedDeviceGroup as 'sdgs', not ..."
    assert describe_sync_error(SDGS, no_group, timeout=None, hint=hint) == (
        f"shareddevicegroups.deviceshare.io: the server could not find the resource: {hint}"
    )
    status = {"kind": "Status", "reason": "NotFound"}
    no_resource = errors.NotFound("the server could not find the requested resource", status=status)
    assert describe_sync_error(PODS, no_resource, timeout=None) == (
        "pods: the server could not find the requested resource"  # built in: no CRD hint
    )
    refused = errors.TransportError("GET /api/v1/pods: ConnectError")
    assert describe_sync_error(PODS, refused, timeout=5) == (
        "pods: not synced within 5s; last error: GET /api/v1/pods: ConnectError"
    )
    assert describe_sync_error(PODS, None, timeout=2.5) == (
        "pods: not synced within 2.5s (still listing, no error yet)"
    )


def test_a_read_before_sync_is_not_a_not_found() -> None:
    """``except NotFound: return`` in a reconciler means "deleted": a cache that has not
    synced yet must not look like that."""
    from sdgruntime.cache import Cache, CacheNotSynced

    cache = Cache(as_client(FakeClient()))  # never run: nothing syncs
    reads = (
        lambda: cache.get(PODS, "p", "ns"),
        lambda: cache.find(PODS, "p", "ns"),
        lambda: cache.list(SDGS),
    )
    for read in reads:
        with pytest.raises(CacheNotSynced, match="has not synced") as info:
            read()
        assert not isinstance(info.value, errors.NotFound)
        assert isinstance(info.value, errors.ApiError) and info.value.code == 503

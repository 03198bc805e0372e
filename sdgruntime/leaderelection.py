"""Leader election on a ``coordination.k8s.io/v1`` Lease, as client-go's leaderelection.

Every candidate runs :meth:`LeaderElector.run`; it raises :class:`LeaderElectionLost`
when leadership is lost. Invariants: every write is conditional (resourceVersion, or a
create that fails if the lease exists); expiry is judged on our own monotonic clock,
never on another host's timestamps; and since ``renew_deadline < lease_duration`` we stop
leading before anyone else may start. ``leader_election_master_status{name}`` is 1 while
leading. The rules in full: docs/contracts.md, "Leader election".
"""

from __future__ import annotations

import logging
import math
import random
import socket
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import anyio

from sdgruntime import errors, metrics
from sdgruntime.client import Client
from sdgruntime.kinds import LEASES

__all__ = ["LeaderElectionLost", "LeaderElector", "check_durations", "default_identity"]

log = logging.getLogger(__name__)

JITTER_FACTOR = 1.2  # client-go's: retries wait retry_period * [1, 1.2)
RELEASE_TIMEOUT = 5.0  # a release must not hold up shutdown


class LeaderElectionLost(Exception):
    """This process stopped being the leader (could not renew, or another holder won)."""


def check_durations(lease_duration: float, renew_deadline: float, retry_period: float) -> None:
    """Raise ``ValueError`` unless the durations keep the safety argument of the module doc.

    ``lease_duration`` must be a whole number of seconds: the Lease stores
    ``leaseDurationSeconds`` as an integer and other candidates wait exactly that long, so
    the value we validate against ``renew_deadline`` must be the one we write (a rounded
    10.4 would become 10 and no longer exceed a renew deadline of 10.3).
    """
    for what, value in (
        ("lease_duration", lease_duration),
        ("renew_deadline", renew_deadline),
        ("retry_period", retry_period),
    ):
        if not math.isfinite(value) or value <= 0:
            raise ValueError(f"{what} must be a finite number of seconds > 0, not {value!r}")
    if not float(lease_duration).is_integer():
        raise ValueError(
            f"lease_duration must be a whole number of seconds (the Lease stores an integer), "
            f"not {lease_duration!r}"
        )
    if lease_duration <= renew_deadline:
        raise ValueError("lease_duration must be greater than renew_deadline")
    if renew_deadline <= JITTER_FACTOR * retry_period:
        raise ValueError(f"renew_deadline must be greater than {JITTER_FACTOR} * retry_period")


def default_identity() -> str:
    """``hostname_<uuid>``: unique per process, readable in ``kubectl get lease``."""
    return f"{socket.gethostname()}_{uuid.uuid4()}"


def _micro_time(dt: datetime | None = None) -> str:
    """A ``metav1.MicroTime`` (RFC 3339 with microseconds, UTC)."""
    return (dt or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _record(lease: dict[str, Any] | None) -> tuple[Any, ...]:
    """What must change for a lease to count as renewed (client-go compares the record)."""
    spec = (lease or {}).get("spec") or {}
    return (
        spec.get("holderIdentity") or "",
        spec.get("renewTime"),
        spec.get("acquireTime"),
        spec.get("leaseDurationSeconds"),
        spec.get("leaseTransitions"),
    )


class LeaderElector:
    """Campaigns for, holds and releases one Lease (see the module doc).

    Durations are seconds; client-go's (and controller-runtime's) defaults: lease 15,
    renew deadline 10, retry period 2. ``lease_duration`` is whole seconds (see
    :func:`check_durations`). ``clock`` is a monotonic clock (tests).
    """

    def __init__(
        self,
        client: Client,
        name: str,
        namespace: str,
        *,
        identity: str | None = None,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        release_on_cancel: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not name or not namespace:
            raise ValueError("leader election needs a lease name and namespace")
        check_durations(lease_duration, renew_deadline, retry_period)
        self.client = client
        self.name = name
        self.namespace = namespace
        self.identity = identity or default_identity()
        self.lease_duration = lease_duration
        self._lease_seconds = int(lease_duration)  # what leaseDurationSeconds says
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self.release_on_cancel = release_on_cancel
        self._clock = clock
        self._lease: dict[str, Any] | None = None  # last lease we read or wrote
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0  # our clock when the record last changed
        self._leading = False
        self._status = metrics.LEADER_ELECTION_STATUS.labels(name=name)
        self._status.set(0)

    @property
    def is_leader(self) -> bool:
        return self._leading

    @property
    def leader(self) -> str:
        """The holder we last observed ("" if none)."""
        return _record(self._lease)[0]

    async def run(
        self,
        on_started_leading: Callable[[], None],
        on_stopped_leading: Callable[[], None] = lambda: None,
    ) -> None:
        """Campaign until elected, call ``on_started_leading``, renew until cancelled.

        The callbacks are synchronous so that stopping leader work cannot be delayed: the
        caller starts its work in its own task group and cancels it in
        ``on_stopped_leading``, which runs exactly once if ``on_started_leading`` did.
        Raises :class:`LeaderElectionLost` on loss; returns only by cancellation.
        """
        log.info(
            "leader election: %s campaigning for lease %s/%s",
            self.identity,
            self.namespace,
            self.name,
        )
        lost = False
        try:
            acquired_at = await self._acquire()
            self._set_leading(True)
            on_started_leading()
            await self._renew_until_lost(acquired_at)
            lost = True
            raise LeaderElectionLost(
                f"{self.identity} lost lease {self.namespace}/{self.name} "
                f"(holder now: {self.leader or 'none'})"
            )
        finally:
            was_leading = self._leading
            self._set_leading(False)
            if was_leading:
                try:
                    on_stopped_leading()
                finally:
                    if self.release_on_cancel and not lost:
                        with anyio.CancelScope(shield=True):
                            await self._release()

    def _set_leading(self, leading: bool) -> None:
        if leading != self._leading:
            log.info(
                "leader election: %s %s lease %s/%s",
                self.identity,
                "acquired" if leading else "stopped leading",
                self.namespace,
                self.name,
            )
        self._leading = leading
        self._status.set(1 if leading else 0)

    async def _sleep_retry(self) -> None:
        await anyio.sleep(self.retry_period * random.uniform(1.0, JITTER_FACTOR))

    async def _acquire(self) -> float:
        """Campaign until we hold the lease; return when the successful attempt *started*.

        Others measure our lease from when they saw the write, which is no earlier than
        the start of the attempt that made it, so that start is the safe base for our
        renew deadline (the attempt itself may have taken up to ``renew_deadline``).
        """
        while True:
            attempt_at = self._clock()
            try:
                with anyio.fail_after(self.renew_deadline):
                    if await self._try_acquire_or_renew():
                        return attempt_at
            except (errors.ApiError, TimeoutError) as err:
                log.info("leader election: could not acquire %s: %s", self.name, err)
            await self._sleep_retry()

    async def _renew_until_lost(self, renewed_at: float) -> None:
        """Renew every retry period; return when leadership is lost. ``renewed_at`` is when
        the attempt that acquired the lease started."""
        while True:
            await anyio.sleep(self.retry_period)
            deadline = renewed_at + self.renew_deadline
            while True:
                attempt_at = self._clock()
                if attempt_at >= deadline:
                    log.warning(
                        "leader election: %s could not renew lease %s within %.1fs",
                        self.identity,
                        self.name,
                        self.renew_deadline,
                    )
                    return
                ok = False
                with anyio.move_on_after(deadline - attempt_at):
                    try:
                        ok = await self._try_acquire_or_renew()
                    except errors.ApiError as err:
                        log.info("leader election: renewing %s failed: %s", self.name, err)
                if ok:
                    renewed_at = attempt_at
                    break
                if self.leader and self.leader != self.identity:
                    return  # someone else holds it: no point retrying until the deadline
                with anyio.move_on_after(max(0.0, deadline - self._clock())):
                    await anyio.sleep(self.retry_period)

    def _observe(self, lease: dict[str, Any] | None) -> None:
        record = _record(lease)
        if record != self._observed:
            self._observed = record
            self._observed_at = self._clock()
        self._lease = lease

    async def _try_acquire_or_renew(self) -> bool:
        """One round of client-go's tryAcquireOrRenew: True if we hold the lease now."""
        now = _micro_time()
        try:
            lease = await self.client.get(LEASES, self.name, self.namespace)
        except errors.NotFound:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": {
                    "holderIdentity": self.identity,
                    "leaseDurationSeconds": self._lease_seconds,
                    "acquireTime": now,
                    "renewTime": now,
                    "leaseTransitions": 0,
                },
            }
            try:
                created = await self.client.create(LEASES, body, self.namespace)
            except errors.AlreadyExists:
                return False  # another candidate created it first
            self._observe(created)
            return True

        self._observe(lease)
        spec = dict(lease.get("spec") or {})
        holder = spec.get("holderIdentity") or ""
        if holder and holder != self.identity:
            duration = spec.get("leaseDurationSeconds") or self.lease_duration
            if self._clock() < self._observed_at + duration:
                return False  # held, and renewed recently as far as we have seen
        if holder != self.identity:  # a transition (also from a released lease)
            spec["acquireTime"] = now
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
        spec["holderIdentity"] = self.identity
        spec["leaseDurationSeconds"] = self._lease_seconds
        spec["renewTime"] = now
        spec.setdefault("acquireTime", now)
        spec.setdefault("leaseTransitions", 0)
        try:
            updated = await self.client.update(LEASES, {**lease, "spec": spec})
        except errors.Conflict:
            return False  # someone else wrote since we read: re-read next round
        self._observe(updated)
        return True

    async def _release(self) -> None:
        """Give the lease up (conditionally: only if it is still ours as we last wrote it)."""
        lease = self._lease
        if lease is None or _record(lease)[0] != self.identity:
            return
        spec = dict(lease.get("spec") or {})
        now = _micro_time()
        spec.update(holderIdentity="", leaseDurationSeconds=1, renewTime=now, acquireTime=now)
        try:
            with anyio.fail_after(RELEASE_TIMEOUT):
                self._lease = await self.client.update(LEASES, {**lease, "spec": spec})
            log.info("leader election: %s released lease %s", self.identity, self.name)
        except (errors.ApiError, TimeoutError) as err:
            log.warning("leader election: could not release lease %s: %s", self.name, err)

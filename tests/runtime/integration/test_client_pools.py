"""Sibling clients (``Client.with_pool``) against the real API server: the same identity
on a pool of their own, so a full pool of one never delays the other; and the manager's
siblings (reviews of secure metrics, webhook reads), closed when it stops."""

from __future__ import annotations

import time

import anyio
import pytest

from sdgruntime.client import Client
from sdgruntime.kinds import NAMESPACES, PODS
from sdgruntime.manager import Manager, ManagerOptions
from sdgruntime.securemetrics import SecureMetricsServer

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

HOLD = 2  # seconds a watch request keeps its pooled connection


async def test_a_sibling_is_served_while_the_first_pool_is_full(
    kubeconfig: str, namespace: str
) -> None:
    async with Client.from_kubeconfig(kubeconfig, max_connections=1) as client:
        sibling = client.with_pool(2)
        assert (client.pool_limit, sibling.pool_limit) == (1, 2)
        async with sibling, anyio.create_task_group() as tg:
            # A watch sent as a plain request holds the client's only connection for HOLD s.
            held = anyio.Event()

            async def hold() -> None:
                held.set()
                await client.request(
                    "GET", PODS.path(namespace), params={"watch": "true", "timeoutSeconds": HOLD}
                )

            tg.start_soon(hold)
            await held.wait()
            await anyio.sleep(0.3)  # the watch is on the wire
            start = time.monotonic()
            got = await sibling.get(NAMESPACES, namespace)  # the same rights, its own pool
            sibling_took = time.monotonic() - start
            assert got["metadata"]["name"] == namespace
            await client.get(NAMESPACES, namespace)  # the first pool: waits for the watch
            client_took = time.monotonic() - start
        print(f"sibling answered in {sibling_took:.3f}s, the full pool in {client_took:.3f}s")
        assert sibling_took < 1.0, sibling_took
        assert client_took > HOLD - 0.5, client_took  # the first pool really was full

        # Closing one leaves the other working.
        other = client.with_pool(1)
        await other.aclose()
        assert (await client.get(NAMESPACES, namespace))["metadata"]["name"] == namespace
        with pytest.raises(RuntimeError, match="closed"):
            await other.get(NAMESPACES, namespace)


async def test_a_pool_needs_a_connection(kubeconfig: str) -> None:
    async with Client.from_kubeconfig(kubeconfig) as client:
        with pytest.raises(ValueError, match="at least 1 connection"):
            client.with_pool(0)


async def test_the_manager_reviews_and_webhook_reads_on_their_own_pools(
    kubeconfig: str, namespace: str
) -> None:
    async with Client.from_kubeconfig(kubeconfig) as client:
        mgr = Manager(
            client,
            options=ManagerOptions(
                metrics_bind_address="127.0.0.1:0",
                metrics_secure=True,
                health_probe_bind_address="0",
                metrics_auth_max_concurrent_reviews=3,
                webhook_client_max_connections=5,
            ),
        )
        webhook_client = mgr.webhook_client
        assert webhook_client is not client and webhook_client.pool_limit == 5
        async with anyio.create_task_group() as tg:
            await tg.start(mgr.run_until_cancelled)
            server = mgr._metrics_server
            assert isinstance(server, SecureMetricsServer)
            auth_client = server.auth.client
            assert auth_client is not client and auth_client is not webhook_client
            assert auth_client.pool_limit == 3
            assert (await webhook_client.get(NAMESPACES, namespace))["metadata"]["name"]
            tg.cancel_scope.cancel()
        for sibling in (auth_client, webhook_client):  # closed with the manager
            with pytest.raises(RuntimeError, match="closed"):
                await sibling.get(NAMESPACES, namespace)
        # The client the manager was given is the caller's: still open.
        assert (await client.get(NAMESPACES, namespace))["metadata"]["name"] == namespace

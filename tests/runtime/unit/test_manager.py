"""Manager behaviour that needs no API server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from sdgruntime.envtest import FakeClient
from sdgruntime.leaderelection import LeaderElectionLost
from sdgruntime.manager import Manager, ManagerOptions
from sdgruntime.webhook import AdmissionRequest, AdmissionResponse, allowed
from tests.runtime.helpers import as_client


@pytest.mark.anyio
@pytest.mark.parametrize("error", [LeaderElectionLost("lost"), ValueError("no certificates")])
async def test_run_raises_errors_as_themselves_not_in_an_exception_group(
    error: Exception,
) -> None:
    """``except LeaderElectionLost`` around ``mgr.run()`` must work, as documented."""
    mgr = Manager(client=as_client(FakeClient()), options=ManagerOptions())

    async def failing(**kwargs: object) -> None:
        raise error

    mgr.run_until_cancelled = failing  # type: ignore[method-assign]
    with pytest.raises(type(error)) as info:
        await mgr.run()
    assert info.value is error


def quiet(**options: Any) -> ManagerOptions:
    """Options of a manager that opens no probe or metrics port."""
    return ManagerOptions(metrics_bind_address="0", health_probe_bind_address="0", **options)


async def allow(request: AdmissionRequest) -> AdmissionResponse:
    return allowed()


@pytest.mark.anyio
async def test_no_serving_certificate_names_the_file_and_webhook_cert_dir(
    tmp_path: Path,
) -> None:
    options = quiet(webhook_port=0, webhook_cert_dir=str(tmp_path))
    mgr = Manager(client=as_client(FakeClient()), options=options)
    mgr.webhook_server.register("/validate", allow)
    with anyio.fail_after(10), pytest.raises(RuntimeError) as info:
        await mgr.run_until_cancelled()
    message = str(info.value)
    assert message.startswith(f"cannot load serving certificate {tmp_path}/tls.crt / ")
    assert f"No such file or directory: {tmp_path}/tls.crt" in message
    assert "ManagerOptions(webhook_cert_dir=...)" in message
    assert "control_plane.webhook_cert_dir(folder)" in message  # how tests get a pair


@pytest.mark.anyio
async def test_a_runnables_error_stops_the_manager_and_is_raised_as_itself() -> None:
    """And a task group around the manager wraps it, as docs/contracts.md says."""

    class Broken(Exception):
        pass

    def manager() -> Manager:
        mgr = Manager(client=as_client(FakeClient()), options=quiet())

        async def fails() -> None:
            raise Broken("the runnable failed")

        mgr.add_runnable(fails)
        return mgr

    with anyio.fail_after(10), pytest.raises(Broken, match="the runnable failed"):
        await manager().run_until_cancelled()
    with anyio.fail_after(10), pytest.raises(ExceptionGroup) as wrapped:
        async with anyio.create_task_group() as tg:
            await tg.start(manager().run_until_cancelled)
            await anyio.sleep_forever()
    (error,) = wrapped.value.exceptions
    assert isinstance(error, Broken)

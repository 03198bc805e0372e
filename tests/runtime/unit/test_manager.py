"""Manager behaviour that needs no API server."""

from __future__ import annotations

import pytest

from sdgruntime.leaderelection import LeaderElectionLost
from sdgruntime.manager import Manager, ManagerOptions


@pytest.mark.anyio
@pytest.mark.parametrize("error", [LeaderElectionLost("lost"), ValueError("no certificates")])
async def test_run_raises_errors_as_themselves_not_in_an_exception_group(
    error: Exception,
) -> None:
    """``except LeaderElectionLost`` around ``mgr.run()`` must work, as documented."""
    mgr = Manager(client=object(), options=ManagerOptions())  # type: ignore[arg-type]

    async def failing(**kwargs: object) -> None:
        raise error

    mgr.run_until_cancelled = failing  # type: ignore[method-assign]
    with pytest.raises(type(error)) as info:
        await mgr.run()
    assert info.value is error

"""``--event-loop``: which loop the manager runs on (``controllers.__main__.use_uvloop``)."""

from __future__ import annotations

import sys

import anyio
import pytest

from controllers.__main__ import use_uvloop
from controllers.settings import parse


def test_auto_is_uvloop_where_installed() -> None:
    assert parse([]).event_loop == "auto"
    assert use_uvloop("auto") is True  # a dependency of the package on Linux
    assert use_uvloop("uvloop") is True


def test_asyncio_turns_uvloop_off() -> None:
    assert use_uvloop(parse(["--event-loop=asyncio"]).event_loop) is False
    assert use_uvloop(parse([], environ={"SDG_EVENT_LOOP": "asyncio"}).event_loop) is False


def test_without_uvloop_auto_falls_back_and_uvloop_says_what_is_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop: ImportError
    assert use_uvloop("auto") is False
    with pytest.raises(SystemExit, match="uvloop is not installed: pip install uvloop"):
        use_uvloop("uvloop")


def test_an_unknown_loop_is_refused_with_the_choices(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse(["--event-loop=trio"])
    assert "auto" in capsys.readouterr().err


def test_the_uvloop_option_runs_the_manager_code_on_uvloop() -> None:
    async def loop_module() -> str:
        import asyncio

        return type(asyncio.get_running_loop()).__module__

    assert anyio.run(loop_module, backend_options={"use_uvloop": use_uvloop("auto")}).startswith(
        "uvloop"
    )

"""sdgruntime.log: inside a reconcile, every record carries the controller, the request and
a reconcile id (from_context's logger, and, with ContextFilter, any logger's); the text and
JSON formats print them; setup_logging configures the root logger once."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

from sdgruntime import errors
from sdgruntime.controller import Controller
from sdgruntime.kinds import CONFIGMAPS
from sdgruntime.log import (
    ContextFilter,
    JSONFormatter,
    TextFormatter,
    current,
    from_context,
    reconciling,
    setup_logging,
)
from sdgruntime.reconcile import Request
from tests.runtime.helpers import settle
from tests.runtime.unit.test_controller import FakeCache, obj, unique

pytestmark = pytest.mark.anyio


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def records() -> Iterator[Records]:
    """Every record of the root logger, with the reconcile's fields (ContextFilter)."""
    handler = Records()
    handler.addFilter(ContextFilter())
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)


def fields(record: logging.LogRecord) -> tuple[Any, ...]:
    return (getattr(record, "controller", None), getattr(record, "request", None))


def test_outside_a_reconcile_records_carry_nothing(records: Records) -> None:
    assert current() is None
    from_context("my.operator").info("hello")
    assert fields(records.records[0]) == (None, None)
    assert records.records[0].name == "my.operator"


def test_inside_a_reconcile_every_record_carries_it(records: Records) -> None:
    request = Request("app", "shop")
    with reconciling("greeting", request) as info:
        log = from_context()
        log.info("wrote %s", "app", extra={"configmap": "app"})
        logging.getLogger("some.library").warning("any logger")  # via ContextFilter
    first, second = records.records
    assert first.name == "sdgruntime.reconcile" and first.getMessage() == "wrote app"
    assert fields(first) == fields(second) == ("greeting", request)
    assert first.reconcile_id == second.reconcile_id == info.reconcile_id  # type: ignore[attr-defined]
    assert first.configmap == "app"  # type: ignore[attr-defined]
    assert current() is None
    with reconciling("greeting", request) as again:
        assert again.reconcile_id != info.reconcile_id  # one id per reconcile


async def test_the_controller_marks_each_reconcile(records: Records) -> None:
    seen: list[tuple[Any, ...]] = []

    class Logging:
        async def reconcile(self, request: Request) -> None:
            log = from_context(__name__)
            log.info("reconciling")
            seen.append((log.extra, current()))
            if request.name == "bad":
                raise errors.Conflict("stale")

    name = unique("logging")
    cache = FakeCache()
    controller = Controller(name, Logging(), cache)
    controller.watch(CONFIGMAPS)
    async with anyio.create_task_group() as tg:
        await tg.start(controller.run)
        cache.informer(CONFIGMAPS).add(obj("app"))
        cache.informer(CONFIGMAPS).add(obj("bad"))
        await settle()
        tg.cancel_scope.cancel()
    (extra, info), _ = seen
    assert info is not None and extra == info.fields()
    assert (info.controller, info.request) == (name, Request("app", "ns"))
    mine = [r for r in records.records if r.name == __name__]
    assert [fields(r) for r in mine] == [(name, Request("app", "ns")), (name, Request("bad", "ns"))]
    (failed,) = [r for r in records.records if "failed" in r.getMessage()]
    assert failed.name == "sdgruntime.controller"  # the controller's own record, too
    assert failed.getMessage().endswith("failed: Conflict: stale")
    assert fields(failed) == (name, Request("bad", "ns"))


def record(**extra: Any) -> logging.LogRecord:
    r = logging.LogRecord("my.operator", logging.INFO, __file__, 1, "wrote %s", ("app",), None)
    r.__dict__.update(extra)
    return r


def test_the_formats_print_the_reconcile() -> None:
    request = Request("app", "shop")
    inside = record(controller="greeting", request=request, reconcile_id="r-1")
    text = TextFormatter().format(inside)
    assert text.endswith(
        " INFO my.operator: wrote app controller=greeting request=shop/app reconcileID=r-1"
    )
    assert TextFormatter().format(record()).endswith(" INFO my.operator: wrote app")
    line = json.loads(JSONFormatter().format(inside))
    assert line.pop("ts")
    assert line == {
        "level": "info",
        "logger": "my.operator",
        "msg": "wrote app",
        "controller": "greeting",
        "namespace": "shop",
        "name": "app",
        "reconcileID": "r-1",
    }
    cluster_scoped = record(controller="c", request=Request("node-1"), reconcile_id="r-2")
    assert "namespace" not in json.loads(JSONFormatter().format(cluster_scoped))


def test_setup_logging_installs_one_handler_on_the_root() -> None:
    root = logging.getLogger()
    saved, level = root.handlers[:], root.level
    out = io.StringIO()
    try:
        handler = setup_logging("debug", "json", stream=out, levels={"noisy": "ERROR"})
        assert root.handlers == [handler] and root.level == logging.DEBUG
        assert logging.getLogger("noisy").level == logging.ERROR
        with reconciling("greeting", Request("app", "shop")):
            logging.getLogger("my.operator").info("hi")
        line = json.loads(out.getvalue())
        assert (line["msg"], line["controller"], line["name"]) == ("hi", "greeting", "app")
        with pytest.raises(ValueError, match="not 'text' or 'json'"):
            setup_logging(format="yaml")  # type: ignore[arg-type]
    finally:
        root.handlers[:] = saved
        root.setLevel(level)
        logging.getLogger("noisy").setLevel(logging.NOTSET)

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Iterator

import pytest
import structlog

from llm_epp.observability.logging import (
    TRACE,
    VERBOSE,
    bind_request,
    clear_request,
    configure_logging,
    level_for_verbosity,
)

log = logging.getLogger("llm_epp.tests.observability")


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    httpx_level = logging.getLogger("httpx").level
    yield
    for h in root.handlers:
        if h not in handlers:
            root.removeHandler(h)
            h.close()
    root.setLevel(level)
    logging.getLogger("httpx").setLevel(httpx_level)
    structlog.contextvars.clear_contextvars()
    structlog.reset_defaults()


def lines(buf: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in buf.getvalue().splitlines() if line]


@pytest.mark.parametrize(
    ("verbosity", "level"),
    [(0, logging.INFO), (1, logging.INFO), (2, logging.INFO), (3, VERBOSE), (4, logging.DEBUG), (5, TRACE)],
)
def test_verbosity_levels(verbosity: int, level: int) -> None:
    assert level_for_verbosity(verbosity) == level
    configure_logging(verbosity, stream=io.StringIO())
    assert logging.getLogger().level == level


def test_level_names() -> None:
    assert logging.getLevelName(VERBOSE) == "VERBOSE"
    assert logging.getLevelName(TRACE) == "TRACE"


def test_json_line_carries_request_context() -> None:
    buf = io.StringIO()
    configure_logging(2, json=True, stream=buf)
    bind_request("req-1", model="food-review", target_model="food-review-1")
    log.info("endpoint_picked", extra={"endpoint": "10.0.0.1:8000"})
    clear_request()
    log.info("after_request")
    first, second = lines(buf)
    assert first["event"] == "endpoint_picked"
    assert first["request_id"] == "req-1"
    assert first["model"] == "food-review"
    assert first["target_model"] == "food-review-1"
    assert first["endpoint"] == "10.0.0.1:8000"
    assert first["level"] == "info"
    assert first["logger"] == "llm_epp.tests.observability"
    assert isinstance(first["timestamp"], str) and first["timestamp"].endswith("Z")
    assert "request_id" not in second and second["event"] == "after_request"


def test_percent_formatting_is_applied() -> None:
    buf = io.StringIO()
    configure_logging(2, json=True, stream=buf)
    log.info("filter_failed plugin=%s", "f/header-based-testing-filter")
    assert lines(buf)[0]["event"] == "filter_failed plugin=f/header-based-testing-filter"


def test_debug_only_from_v4() -> None:
    buf = io.StringIO()
    configure_logging(2, json=True, stream=buf)
    log.debug("hidden")
    log.log(VERBOSE, "hidden_verbose")
    assert lines(buf) == []
    configure_logging(4, json=True, stream=buf)
    log.debug("shown")
    log.log(TRACE, "hidden_trace")
    assert [line["event"] for line in lines(buf)] == ["shown"]
    assert lines(buf)[0]["level"] == "debug"


def test_verbose_and_trace_levels_render_their_names() -> None:
    buf = io.StringIO()
    configure_logging(5, json=True, stream=buf)
    log.log(VERBOSE, "v")
    log.log(TRACE, "t")
    assert [(line["event"], line["level"]) for line in lines(buf)] == [("v", "verbose"), ("t", "trace")]


def test_reconfigure_replaces_own_handler_only() -> None:
    root = logging.getLogger()
    before = len(root.handlers)
    configure_logging(2, stream=io.StringIO())
    configure_logging(3, stream=io.StringIO())
    assert len(root.handlers) == before + 1


def test_exceptions_are_rendered_in_json() -> None:
    buf = io.StringIO()
    configure_logging(2, json=True, stream=buf)
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        log.exception("scorer_failed")
    (line,) = lines(buf)
    assert line["level"] == "error"
    assert "RuntimeError: boom" in str(line["exception"])


def test_structlog_loggers_share_the_setup() -> None:
    buf = io.StringIO()
    configure_logging(2, json=True, stream=buf)
    bind_request("req-2")
    structlog.get_logger("llm_epp.x").info("scrape_failed", endpoint="e1")
    structlog.get_logger("llm_epp.x").debug("dropped")
    (line,) = lines(buf)
    assert line["event"] == "scrape_failed"
    assert line["endpoint"] == "e1"
    assert line["request_id"] == "req-2"
    assert line["logger"] == "llm_epp.x"


def test_console_output() -> None:
    buf = io.StringIO()
    configure_logging(2, json=False, stream=buf)
    bind_request("req-3")
    log.info("endpoint_picked")
    out = buf.getvalue()
    assert "endpoint_picked" in out and "req-3" in out and "\x1b[" not in out  # no colours off a tty


def test_chatty_libraries_are_quiet_below_trace() -> None:
    configure_logging(4, stream=io.StringIO())
    assert logging.getLogger("httpx").level == logging.WARNING
    configure_logging(5, stream=io.StringIO())
    assert logging.getLogger("httpx").level == logging.NOTSET


async def test_request_context_is_per_task() -> None:
    buf = io.StringIO()
    configure_logging(2, json=True, stream=buf)

    async def handle(request_id: str) -> None:
        bind_request(request_id)
        await asyncio.sleep(0)
        log.info("endpoint_picked", extra={"who": request_id})

    await asyncio.gather(handle("a"), handle("b"))
    assert sorted((line["who"], line["request_id"]) for line in lines(buf)) == [("a", "a"), ("b", "b")]

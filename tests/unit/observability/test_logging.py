from __future__ import annotations

import asyncio
import io
import json
import logging
import re
import time
from collections.abc import Iterator

import pytest

from llm_epp.observability.logging import (
    TRACE,
    VERBOSE,
    ConsoleFormatter,
    InfoOncePerInterval,
    JsonFormatter,
    bind_request,
    clear_request,
    configure_logging,
    level_for_flags,
    level_for_verbosity,
    stacktrace_level,
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
    clear_request()


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
    assert list(line)[:4] == ["timestamp", "level", "logger", "event"]


def test_console_line_format() -> None:
    buf = io.StringIO()
    configure_logging(2, json=False, stream=buf)
    bind_request("req-3", model="food-review")
    log.info("endpoint_picked pod=%s", "p1", extra={"endpoint": "10.0.0.1:8000", "score": 0.5})
    clear_request()
    log.warning("no_context")
    first, second = buf.getvalue().splitlines()
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z INFO  llm_epp\.tests\.observability: endpoint_picked pod=p1"
        r" request_id=req-3 model=food-review endpoint=10\.0\.0\.1:8000 score=0\.5",
        first,
    )
    assert second.endswith(" WARNING llm_epp.tests.observability: no_context")
    assert "\x1b[" not in buf.getvalue()


def test_console_quotes_values_with_spaces_and_renders_tracebacks() -> None:
    buf = io.StringIO()
    configure_logging(2, json=False, stream=buf)
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        log.exception("scorer_failed", extra={"reason": 'a "b"', "empty": "", "nl": "x\ny"})
    first, *rest = buf.getvalue().splitlines()
    assert first.endswith(r' ERROR llm_epp.tests.observability: scorer_failed reason="a \"b\"" empty="" nl="x\ny"')
    assert rest[0] == "Traceback (most recent call last):"
    assert rest[-1] == "RuntimeError: boom"


def test_timestamp_is_utc_with_milliseconds() -> None:
    record = log.makeRecord(log.name, logging.INFO, "f.py", 1, "e", (), None)
    for created in (1_700_000_000.0071, 1_700_000_000.9999, 1_700_000_001.5):  # the second changes: no stale cache
        record.created, record.msecs = created, (created - int(created)) * 1000
        expected = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created)) + f".{int(record.msecs):03d}Z"
        assert json.loads(JsonFormatter().format(record))["timestamp"] == expected
        assert ConsoleFormatter().format(record).startswith(expected + " INFO  ")
    assert expected == "2023-11-14T22:13:21.500Z"


def test_unserialisable_values_are_rendered_with_str() -> None:
    buf = io.StringIO()
    configure_logging(2, json=True, stream=buf)

    class Pod:
        def __str__(self) -> str:
            return "pod-1"

    log.info("picked", extra={"pod": Pod(), "ids": {1: "a"}, "ok": [1, 2.5, None]})
    log.info("picked", extra={"huge": 2**70, "ok": [1, 2.5, None]})  # orjson rejects the int outright
    first, second = lines(buf)
    assert (first["pod"], first["ids"], first["ok"]) == ("pod-1", {"1": "a"}, [1, 2.5, None])
    assert (second["huge"], second["ok"], second["event"]) == (str(2**70), [1, 2.5, None], "picked")


def test_record_attributes_set_by_other_formatters_are_not_extras() -> None:
    other = io.StringIO()
    first = logging.StreamHandler(other)
    first.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    logging.getLogger().addHandler(first)  # runs before ours and adds `message` / `asctime` to the record
    buf = io.StringIO()
    configure_logging(2, json=True, stream=buf)
    log.info("picked", extra={"endpoint": "e1"})
    (line,) = lines(buf)
    assert set(line) == {"timestamp", "level", "logger", "event", "endpoint"}
    assert other.getvalue().endswith("picked\n")


def test_bind_request_replaces_the_previous_identity() -> None:
    buf = io.StringIO()
    configure_logging(2, json=True, stream=buf)
    bind_request("req-1", model="m", target_model="t")
    bind_request("req-2")
    log.info("e")
    (line,) = lines(buf)
    assert (line["request_id"], "model" in line, "target_model" in line) == ("req-2", False, False)


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


# --- the zap flags ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("verbosity", "zap_log_level", "level"),
    [
        (2, "", logging.INFO),
        (1, "", logging.INFO),  # the reference chart's `--v 1`
        (4, "", logging.DEBUG),
        (5, "", TRACE),
        (2, "5", TRACE),  # --zap-log-level N means -v N and wins over -v
        (5, "info", logging.INFO),
        (5, "debug", logging.INFO),  # zap debug is V(1), below the default V(2)
        (2, "error", logging.ERROR),
        (2, "panic", logging.CRITICAL),
        (-1, "", logging.WARNING),  # -v -1: zap level 1 (warn)
    ],
)
def test_zap_levels(verbosity: int, zap_log_level: str, level: int) -> None:
    assert level_for_flags(verbosity, zap_log_level) == level


def test_zap_log_level_error_drops_info_and_warning() -> None:
    buf = io.StringIO()
    configure_logging(2, json=True, stream=buf, level=level_for_flags(2, "error"))
    log.info("quiet")
    log.warning("quiet too")
    log.error("loud")
    assert [line["event"] for line in lines(buf)] == ["loud"]


def test_stacktrace_level_adds_the_callers_stack() -> None:
    buf = io.StringIO()
    configure_logging(2, json=True, stream=buf, stack_level=stacktrace_level("error"))

    def failing_operation_in_the_caller() -> None:
        log.error("broken")

    log.warning("no stack")
    failing_operation_in_the_caller()
    warning, error = lines(buf)
    assert "exception" not in warning
    stack = str(error["exception"])
    assert stack.startswith("Stack (most recent call last):")
    assert "failing_operation_in_the_caller" in stack
    assert "logging/__init__.py" not in stack  # logging's own frames are cut off
    assert stacktrace_level("") is None and stacktrace_level("panic") == logging.CRITICAL


@pytest.mark.parametrize(
    ("encoding", "pattern"),
    [
        ("epoch", r"^1\d{9}\.\d+$"),
        ("millis", r"^1\d{12}\.?\d*$"),
        ("nanos", r"^1\d{18}$"),
        ("iso8601", r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$"),
        ("rfc3339", r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$"),
        ("rfc3339nano", r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?Z$"),
    ],
)
def test_time_encodings(encoding: str, pattern: str) -> None:
    before = time.time()
    buf = io.StringIO()
    configure_logging(2, json=True, stream=buf, time_encoding=encoding)
    log.info("stamped")
    stamp = lines(buf)[0]["timestamp"]
    assert re.match(pattern, str(stamp)), stamp
    if encoding in ("epoch", "millis", "nanos"):
        assert isinstance(stamp, int | float)
        scale = {"epoch": 1, "millis": 1e3, "nanos": 1e9}[encoding]
        assert before * scale - scale <= float(stamp) <= (before + 60) * scale
    console = io.StringIO()
    configure_logging(2, stream=console, time_encoding=encoding)
    log.info("stamped")
    assert re.match(pattern, console.getvalue().split(" ", 1)[0])


def test_info_once_per_interval_then_verbose(caplog: pytest.LogCaptureFixture) -> None:
    now = [100.0]
    logger = logging.getLogger("llm_epp.test_once")
    once = InfoOncePerInterval(logger, 10.0, clock=lambda: now[0])
    caplog.set_level(VERBOSE, logger=logger.name)
    for i, step in enumerate((0.0, 9.5, 0.5, 5.0)):
        now[0] += step
        once.log("refused n=%d", i)
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.INFO, "refused n=0"),
        (VERBOSE, "refused n=1"),
        (logging.INFO, "refused n=2"),  # 10 s after the last INFO line
        (VERBOSE, "refused n=3"),
    ]
    caplog.clear()
    caplog.set_level(logging.INFO, logger=logger.name)  # the default level: the VERBOSE lines are not written
    now[0] += 1.0
    once.log("refused again")
    assert caplog.records == []

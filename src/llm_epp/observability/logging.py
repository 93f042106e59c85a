"""Logging setup on the stdlib `logging` module: the codebase logs through `logging.getLogger(__name__)`
and one handler on the root logger renders each record as a single line, either JSON (one object per
line, serialised with orjson) or for the console (`<timestamp> <LEVEL> <logger>: <event> key=value ...`).

`-v N` mirrors the reference: ≤2 DEFAULT → INFO, 3 VERBOSE (15), 4 DEBUG, ≥5 TRACE (5). The controller-runtime
zap flags map onto this: `--zap-log-level` (debug, info, error, panic or N) replaces -v as in the reference
(`level_for_flags`), `--zap-encoder` / `--zap-devel` pick JSON or console lines, `--zap-stacktrace-level` adds
the calling stack to lines at or above it, `--zap-time-encoding` sets the timestamp format. Request
context (`request_id`, `model`, `target_model`) is bound once per request in a context variable; every
line logged in that context (the ext_proc stream's task: asyncio tasks copy contexts) carries it.
`extra={...}` fields of a log call are rendered after the request context.

Formatting is kept cheap (it runs several times per request): no `datetime` per line (the
`YYYY-MM-DDTHH:MM:SS` prefix is cached per second), no `logging.Formatter.format` machinery."""

from __future__ import annotations

import logging
import sys
import time
import traceback
from contextvars import ContextVar
from typing import IO, Any

import orjson

VERBOSE = 15
TRACE = 5
logging.addLevelName(VERBOSE, "VERBOSE")
logging.addLevelName(TRACE, "TRACE")

# Chatty libraries (httpx logs one INFO line per scrape) stay at WARNING below TRACE.
_QUIET_LOGGERS = ("httpx", "httpcore", "urllib3", "kubernetes")
_HANDLER_MARK = "_llm_epp_handler"

# The request context of the current task: its fields and their console rendering (" key=value ..."),
# rendered once at bind time. Never mutated; bind_request installs a new one.
_REQUEST: ContextVar[tuple[dict[str, str], str] | None] = ContextVar("llm_epp_request", default=None)

# Attributes every LogRecord has; anything else on a record came in through `extra={...}`. "message" and
# "asctime" are added by `logging.Formatter.format` (another handler may have formatted the record first),
# "taskName" exists from Python 3.12.
_PLAIN_RECORD = vars(logging.LogRecord("", 0, "", 0, "", None, None))
_PLAIN_RECORD_SIZE = len(_PLAIN_RECORD)
_RECORD_ATTRS = frozenset(_PLAIN_RECORD) | {"message", "asctime", "taskName"}

_MILLIS = tuple(f"{ms:03d}Z" for ms in range(1000))
_TIME_ENCODINGS = ("epoch", "millis", "nanos", "iso8601", "rfc3339", "rfc3339nano")


class InfoOncePerInterval:
    """For events any client can cause (a malformed connection, a refused call): one INFO line per
    `interval_s`, the others at VERBOSE (`-v 3`), so that no client can flood the log at the default level."""

    __slots__ = ("_clock", "_last", "interval_s", "logger")

    def __init__(self, logger: logging.Logger, interval_s: float = 10.0, clock: Any = time.monotonic) -> None:
        self.logger = logger
        self.interval_s = interval_s
        self._clock = clock
        self._last: float | None = None

    def log(self, msg: str, *args: object) -> None:
        now = self._clock()
        level = VERBOSE
        if self._last is None or now - self._last >= self.interval_s:
            self._last = now
            level = logging.INFO
        if self.logger.isEnabledFor(level):
            self.logger.log(level, msg, *args)


def level_for_verbosity(verbosity: int) -> int:
    if verbosity <= 2:
        return logging.INFO
    if verbosity == 3:
        return VERBOSE
    if verbosity == 4:
        return logging.DEBUG
    return TRACE


def level_for_zap(zap_level: int) -> int:
    """The stdlib level for a zap level (logr's V(n) is zap level -n): -5 and below TRACE, -4 DEBUG, -3
    VERBOSE, -2..0 INFO (llm-epp's INFO lines are the reference's V(0)..V(2) lines), 1 WARNING, 2..3 ERROR,
    4 and above CRITICAL."""
    if zap_level <= 0:
        return level_for_verbosity(-zap_level)
    if zap_level == 1:
        return logging.WARNING
    return logging.ERROR if zap_level < 4 else logging.CRITICAL


_ZAP_NAMED_LEVELS = {"debug": -1, "info": 0, "error": 2, "panic": 4}
_ZAP_STACK_LEVELS = {"info": logging.INFO, "error": logging.ERROR, "panic": logging.CRITICAL}


def level_for_flags(verbosity: int, zap_log_level: str = "") -> int:
    """The root level for `-v N` and `--zap-log-level` (which wins when given), as the reference: zap level
    = -v unless --zap-log-level (debug, info, error, panic, or N > 0 meaning -N) is given."""
    if not zap_log_level:
        return level_for_zap(-verbosity)
    named = _ZAP_NAMED_LEVELS.get(zap_log_level.lower())
    return level_for_zap(named if named is not None else -int(zap_log_level))


def stacktrace_level(name: str) -> int | None:
    """The stdlib level for `--zap-stacktrace-level` (info, error, panic); None when not given."""
    return _ZAP_STACK_LEVELS[name.lower()] if name else None


def configure_logging(
    verbosity: int = 2,
    json: bool = False,
    *,
    stream: IO[str] | None = None,
    level: int | None = None,
    stack_level: int | None = None,
    time_encoding: str = "",
) -> None:
    """Installs one handler on the root logger writing to `stream` (default stderr), replacing a previous
    one installed here (other handlers are left alone), and sets the root level. Idempotent.

    `level` (a stdlib level) overrides `verbosity`; lines at or above `stack_level` carry the stack of the
    logging call; `time_encoding` is one of zap's (`epoch`, `millis`, `nanos`, `iso8601`, `rfc3339`,
    `rfc3339nano`), "" for the default ISO 8601 UTC with milliseconds."""
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter(time_encoding) if json else ConsoleFormatter(time_encoding))
    if stack_level is not None:
        handler.addFilter(_StackFilter(stack_level))
    setattr(handler, _HANDLER_MARK, True)

    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, _HANDLER_MARK, False)]:
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    if level is None:
        level = level_for_verbosity(verbosity)
    root.setLevel(level)
    for name in _QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET if level <= TRACE else logging.WARNING)


def bind_request(request_id: str, model: str = "", target_model: str = "") -> None:
    """Binds the request's identity to the current context (the ext_proc stream's task), replacing any
    identity bound before in it. Empty `model` / `target_model` are left out."""
    values = {"request_id": request_id}
    if model:
        values["model"] = model
    if target_model:
        values["target_model"] = target_model
    _REQUEST.set((values, _console_fields(values)))


def clear_request() -> None:
    _REQUEST.set(None)


class _StackFilter(logging.Filter):
    """Adds the stack of the logging call to records at or above `level` (`--zap-stacktrace-level`)."""

    def __init__(self, level: int) -> None:
        super().__init__()
        self._level = level

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= self._level and not record.stack_info and not record.exc_info:
            frames = traceback.extract_stack()
            while frames and frames[-1].filename in _LOGGING_FILES:
                frames.pop()
            record.stack_info = "Stack (most recent call last):\n" + "".join(traceback.format_list(frames)).rstrip()
        return True


_LOGGING_FILES = frozenset({logging.__file__, __file__})


class _LineFormatter(logging.Formatter):
    """Shared pieces: the timestamp, the extras, the traceback text (cached on the record like the stdlib
    does). `format` is overridden whole; `logging.Formatter` only contributes `formatException`."""

    def __init__(self, time_encoding: str = "") -> None:
        super().__init__()
        self._second = (-1, "")  # (whole second, "YYYY-MM-DDTHH:MM:SS."); one tuple, so threads see a pair
        self._levels: dict[str, str] = {}  # levelname → rendered level
        if time_encoding and time_encoding not in _TIME_ENCODINGS:
            raise ValueError(f"unknown time encoding {time_encoding!r}; one of {', '.join(_TIME_ENCODINGS)}")
        self._encoding = time_encoding

    def _timestamp(self, record: logging.LogRecord) -> str:
        second = int(record.created)
        cached_second, prefix = self._second
        if second != cached_second:
            prefix = time.strftime("%Y-%m-%dT%H:%M:%S.", time.gmtime(second))
            self._second = (second, prefix)
        return prefix + _MILLIS[int(record.msecs)]

    def _time(self, record: logging.LogRecord) -> str | float | int:
        """The timestamp in the configured encoding: numbers for epoch, millis and nanos."""
        encoding = self._encoding
        if not encoding or encoding == "iso8601":
            return self._timestamp(record)
        if encoding == "epoch":
            return record.created
        if encoding == "millis":
            return record.created * 1000
        if encoding == "nanos":
            return int(record.created * 1_000_000_000)
        whole = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(int(record.created)))
        if encoding == "rfc3339":
            return whole + "Z"
        fraction = f"{record.created % 1:.9f}"[2:].rstrip("0")  # rfc3339nano: trailing zeros dropped
        return f"{whole}.{fraction}Z" if fraction else whole + "Z"

    def _tail(self, record: logging.LogRecord) -> tuple[dict[str, Any] | None, str | None]:
        """The record's `extra={...}` fields (None if none) and its traceback / stack text (None if none)."""
        attrs = record.__dict__
        extras = None
        if len(attrs) != _PLAIN_RECORD_SIZE:  # something was added to the record
            extras = {key: value for key, value in attrs.items() if key not in _RECORD_ATTRS} or None
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        trace = record.exc_text or None
        if record.stack_info:
            trace = f"{trace}\n{record.stack_info}" if trace else record.stack_info
        return extras, trace


class JsonFormatter(_LineFormatter):
    """`{"timestamp", "level", "logger", "event", <request context>, <extras>, "exception"?}`; `exception`
    holds the traceback and/or the stack (`stack_info=True`)."""

    def format(self, record: logging.LogRecord) -> str:
        level = self._levels.get(record.levelname)
        if level is None:
            level = self._levels[record.levelname] = record.levelname.lower()
        line: dict[str, Any] = {
            "timestamp": self._time(record) if self._encoding else self._timestamp(record),
            "level": level,
            "logger": record.name,
            "event": record.getMessage(),
        }
        context = _REQUEST.get()
        if context is not None:
            line.update(context[0])
        extras, trace = self._tail(record)
        if extras:
            line.update(extras)
        if trace:
            line["exception"] = trace
        try:
            return _dumps(line)
        except TypeError:  # e.g. an int beyond 64 bits, which `default` is not asked about: str() that field
            return _dumps({key: _json_safe(value) for key, value in line.items()})


class ConsoleFormatter(_LineFormatter):
    """`2026-11-29T12:00:00.123Z INFO  logger.name: event key=value ...`, traceback on following lines."""

    def format(self, record: logging.LogRecord) -> str:
        level = self._levels.get(record.levelname)
        if level is None:
            level = self._levels[record.levelname] = f"{record.levelname:<5}"
        stamp = self._time(record) if self._encoding else self._timestamp(record)
        line = f"{stamp} {level} {record.name}: {record.getMessage()}"
        context = _REQUEST.get()
        if context is not None:
            line += context[1]
        extras, trace = self._tail(record)
        if extras:
            line += _console_fields(extras)
        if trace:
            line += "\n" + trace
        return line


def _dumps(value: object) -> str:
    return orjson.dumps(value, default=str, option=orjson.OPT_NON_STR_KEYS).decode()


def _json_safe(value: object) -> object:
    try:
        _dumps(value)
    except TypeError:
        return str(value)
    return value


def _console_fields(fields: dict[str, Any]) -> str:
    return "".join([f" {key}={_console_value(value)}" for key, value in fields.items()])


def _console_value(value: object) -> str:
    text = value if isinstance(value, str) else str(value)
    if not text or " " in text or '"' in text or not text.isprintable():
        return orjson.dumps(text).decode()  # quoted, with escapes
    return text

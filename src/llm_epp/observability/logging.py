"""Logging setup: stdlib `logging` records (the codebase logs through `logging.getLogger(__name__)`)
rendered by structlog's ProcessorFormatter, as JSON (one object per line) or for the console.

`-v N` mirrors the reference: ≤2 DEFAULT → INFO, 3 VERBOSE (15), 4 DEBUG, ≥5 TRACE (5). Request
context (`request_id`, `model`, `target_model`) is bound through contextvars once per request and then
appears on every line logged by that request's task."""

from __future__ import annotations

import logging
import sys
from typing import IO

import structlog

VERBOSE = 15
TRACE = 5
logging.addLevelName(VERBOSE, "VERBOSE")
logging.addLevelName(TRACE, "TRACE")

# Chatty libraries (httpx logs one INFO line per scrape) stay at WARNING below TRACE.
_QUIET_LOGGERS = ("httpx", "httpcore", "urllib3", "kubernetes")
_HANDLER_MARK = "_llm_epp_handler"
_REQUEST_KEYS = ("request_id", "model", "target_model")


def level_for_verbosity(verbosity: int) -> int:
    if verbosity <= 2:
        return logging.INFO
    if verbosity == 3:
        return VERBOSE
    if verbosity == 4:
        return logging.DEBUG
    return TRACE


def configure_logging(verbosity: int = 2, json: bool = False, *, stream: IO[str] | None = None) -> None:
    """Installs one handler on the root logger (replacing a previous one installed here; other handlers
    are left alone) and routes `structlog.get_logger()` through the same formatter. Idempotent."""
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    out = stream if stream is not None else sys.stderr
    renderer: structlog.types.Processor
    if json:
        final: list[structlog.types.Processor] = [
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ]
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=_isatty(out))
        final = [structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer]
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*shared, structlog.stdlib.ExtraAdder()],
        processors=final,
    )
    handler = logging.StreamHandler(out)
    handler.setFormatter(formatter)
    setattr(handler, _HANDLER_MARK, True)

    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, _HANDLER_MARK, False)]:
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    level = level_for_verbosity(verbosity)
    root.setLevel(level)
    for name in _QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET if level <= TRACE else logging.WARNING)

    structlog.configure(
        processors=[
            structlog.stdlib.filter_by_level,
            *shared,
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )


def bind_request(request_id: str, model: str = "", target_model: str = "") -> None:
    """Binds the request's identity to the current context (the ext_proc stream's task)."""
    values = {"request_id": request_id}
    if model:
        values["model"] = model
    if target_model:
        values["target_model"] = target_model
    structlog.contextvars.bind_contextvars(**values)


def clear_request() -> None:
    structlog.contextvars.unbind_contextvars(*_REQUEST_KEYS)


def _isatty(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False

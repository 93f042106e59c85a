"""Parser resolution: which parser reads a request, chosen by the request path.

Each parser claims path suffixes; the longest claimed suffix that the path ends with wins, whatever the
registration order. A parser claiming no path is the fallback for every unclaimed path; parsers listed after
the first fallback are never used (they would receive no traffic). A second parser of an already-registered
type is skipped. No match and no fallback is a 400 that names the path."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from llm_epp.framework import EppError, ErrorCode
from llm_epp.framework.parsing import Parser

log = logging.getLogger(__name__)

DEFAULT_PATH = "/v1/completions"
_PATH_HEADERS = (":path", "x-original-path", "x-forwarded-path")


def request_path(headers: Mapping[str, str]) -> str:
    """The request path without its query: `:path`, else `x-original-path`, else `x-forwarded-path`, else
    /v1/completions (the reference's order and default)."""
    for name in _PATH_HEADERS:
        value = headers.get(name)
        if value:
            return value.split("?", 1)[0]
    return DEFAULT_PATH


def _normalize(suffix: str) -> str:
    return suffix.strip().strip("/")


def path_matches(path: str, suffix: str) -> bool:
    """The reference's suffix match: trailing slashes and surrounding blanks ignored on both sides."""
    return path.strip().removesuffix("/").endswith(_normalize(suffix))


class ParserTable:
    """The resolution table built once from the configured parsers (in order)."""

    __slots__ = ("_entries", "fallback", "parsers")

    def __init__(self, parsers: Sequence[Parser]) -> None:
        self._entries: list[tuple[str, Parser]] = []
        self.fallback: Parser | None = None
        self.parsers: list[Parser] = []
        seen: set[str] = set()
        for i, parser in enumerate(parsers):
            kind = parser.typed_name.type
            duplicate = kind in seen
            if duplicate:
                log.warning("parser_skipped reason=duplicate_type parser=%s", parser.typed_name)
            else:
                seen.add(kind)
                self.parsers.append(parser)
            paths = parser.claims().paths
            if not paths:  # the fallback (even of a duplicate type), as the reference does
                self.fallback = parser
                for skipped in parsers[i + 1 :]:
                    log.warning(
                        "parser_skipped reason=after_fallback parser=%s fallback=%s",
                        skipped.typed_name,
                        parser.typed_name,
                    )
                break
            if not duplicate:
                self._entries.extend((_normalize(p), parser) for p in paths if _normalize(p))
        # longest suffix first: the first match is the winner
        self._entries.sort(key=lambda entry: -len(entry[0]))

    def resolve(self, path: str) -> Parser:
        """The parser for `path`. Raises EppError(BadRequest) when none claims it and there is no fallback."""
        trimmed = path.strip().removesuffix("/")
        for suffix, parser in self._entries:
            if trimmed.endswith(suffix):
                return parser
        if self.fallback is not None:
            return self.fallback
        raise EppError(
            ErrorCode.BAD_REQUEST,
            f"no parser is configured for the request path {path!r}: send it to a path a configured parser "
            "claims, or configure a parser that claims no path (e.g. passthrough-parser) as the fallback",
        )

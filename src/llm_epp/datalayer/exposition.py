"""A Prometheus text-format (0.0.4) reader that returns only the samples an extractor asked for.

vLLM pages are 50-200 KB, mostly histogram buckets nobody here reads. Instead of tokenising every line,
`parse` looks for each wanted sample name at the start of a line with `bytes.find` (C speed), checks the
character after the name (`{`, space or tab: anything else is another metric sharing the prefix) and
parses that line. The format keeps all lines of a family in one group, so the search for a name ends
when a `# HELP`/`# TYPE` line follows its samples (the next family begins; a non-conforming second
group after it is not read). Those comments never match a name themselves (they start with `#`).

Tolerated: escaped label values (`\\"`, `\\\\`, `\\n`), a trailing comma in the label set, blanks
around tokens, timestamps, `NaN`/`+Inf`/`-Inf`, blank lines and CRLF line ends. Not recognised: sample
lines with leading blanks (no exporter writes them).

Outcomes:
  * `ExpositionError`: the page is not an exposition at all (HTML error page, JSON, binary data).
  * `ScrapedPage(truncated=True)`: no final newline, the last (possibly cut) line was dropped.
  * `ScrapedPage(problems=...)`: wanted lines that did not parse; they are left out, the rest is kept.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from types import MappingProxyType

from llm_epp.framework.datalayer import Sample, ScrapedPage

__all__ = ["ExpositionError", "parse"]

_NEXT_FAMILY = (b"# HELP ", b"# TYPE ")
_NO_LABELS: MappingProxyType[str, str] = MappingProxyType({})
_NAME_START = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_:#")
_AFTER_NAME = (b"{", b" ", b"\t", b"\r", b"\n")  # a bare name is a (malformed) sample too
_LABEL = re.compile(r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"([^"\\]*(?:\\.[^"\\]*)*)"[ \t]*(,?)[ \t]*')
_ESCAPE = re.compile(r"\\(.)")
_ESCAPES = {"n": "\n", "\\": "\\", '"': '"'}
_INT = re.compile(r"[+-]?[0-9]+\Z")
_MAX_PROBLEMS = 5
LABEL_SETS_REMEMBERED = 4096
"""Distinct label sets whose parse is kept (least recently used dropped first): a bound, whatever pages say."""


class ExpositionError(ValueError):
    """The body is not a Prometheus text exposition; `reason` is short and stable (used in logs)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@functools.lru_cache(maxsize=256)
def _patterns(names: frozenset[str]) -> tuple[tuple[str, bytes, bytes], ...]:
    return tuple((n, n.encode(), b"\n" + n.encode()) for n in sorted(names))


def parse(page: bytes, names: Iterable[str]) -> ScrapedPage:
    """The samples of `page` whose name is in `names`, in page order per name."""
    head = page[:256].lstrip()
    if not head:
        return ScrapedPage({})
    if head[0] == 0x3C:  # "<"
        raise ExpositionError("HTML page, not metrics")
    if head[0] not in _NAME_START:
        raise ExpositionError("not a Prometheus text page")
    if b"\x00" in page:
        raise ExpositionError("binary data in page")
    truncated = not page.endswith(b"\n")
    wanted = names if isinstance(names, frozenset) else frozenset(names)
    found: dict[str, tuple[Sample, ...]] = {}
    problems: list[str] = []
    for name, raw, pattern in _patterns(wanted):
        size = len(raw)
        out: list[Sample] = []
        pos = 0 if page.startswith(raw) else _after_newline(page.find(pattern))
        while pos >= 0:
            end_name = pos + size
            if page[end_name : end_name + 1] not in _AFTER_NAME:  # another metric sharing the prefix
                pos = _after_newline(page.find(pattern, end_name))
                continue
            eol = page.find(b"\n", end_name)
            if eol < 0:
                break  # the cut last line of a truncated page
            try:
                out.append(_sample(name, page[end_name:eol]))
            except ValueError as e:
                if len(problems) < _MAX_PROBLEMS:
                    problems.append(f"{name}: {e}")
            pos = eol + 1
            if page.startswith(raw, pos):
                continue
            if page.startswith(_NEXT_FAMILY, pos):
                break  # HELP/TYPE after our samples start another family: the group is over
            pos = _after_newline(page.find(pattern, eol))
        if out:
            found[name] = tuple(out)
    return ScrapedPage(found, truncated, tuple(problems))


def _after_newline(found: int) -> int:
    return found + 1 if found >= 0 else -1


def _sample(name: str, rest_bytes: bytes) -> Sample:
    """Parses what follows the metric name on a sample line. Raises ValueError with a short reason."""
    try:
        rest = rest_bytes.decode()
    except UnicodeDecodeError:
        raise ValueError("not UTF-8") from None
    labels: MappingProxyType[str, str] = _NO_LABELS
    rest = rest.lstrip(" \t")
    if rest.startswith("{"):
        labels, end = _labels_of_line(rest)
        rest = rest[end:]
    parts = rest.split()
    if not parts or len(parts) > 2:
        raise ValueError("expected a value and an optional timestamp")
    value = _float(parts[0])
    timestamp: int | None = None
    if len(parts) == 2:
        if not _INT.match(parts[1]):
            raise ValueError(f"bad timestamp {parts[1][:20]!r}")
        timestamp = int(parts[1])
    return Sample(name, labels, value, timestamp)


def _labels_of_line(rest: str) -> tuple[MappingProxyType[str, str], int]:
    """`_labels(rest)`, remembered by the label set's text. A page repeats the same label sets poll after poll
    (only values change), and a value or timestamp cannot hold a `}`: the label set ends at the last one on
    the line. Anything unusual (no such set, or it does not end there) is parsed afresh, with its own error."""
    close = rest.rfind("}") + 1
    if close:
        try:
            labels, end = _label_set(rest[:close])
        except ValueError:
            pass
        else:
            if end == close:
                return labels, end
    return _labels(rest)


@functools.lru_cache(maxsize=LABEL_SETS_REMEMBERED)
def _label_set(text: str) -> tuple[MappingProxyType[str, str], int]:
    return _labels(text)


def _labels(text: str) -> tuple[MappingProxyType[str, str], int]:
    """Parses `{k="v",...}` at the start of `text`; returns the labels and the index after `}`."""
    if "\\" not in text:
        return _plain_labels(text)
    labels: dict[str, str] = {}
    i = 1
    size = len(text)
    while True:
        while i < size and text[i] in " \t":
            i += 1
        if i < size and text[i] == "}":
            return MappingProxyType(labels), i + 1
        m = _LABEL.match(text, i)
        if m is None:
            raise ValueError("malformed label set")
        value = m.group(2)
        if "\\" in value:
            value = _ESCAPE.sub(lambda e: _ESCAPES.get(e.group(1), e.group(0)), value)
        labels[m.group(1)] = value
        i = m.end()
        if not m.group(3) and not (i < size and text[i] == "}"):
            raise ValueError("malformed label set")


def _plain_labels(text: str) -> tuple[MappingProxyType[str, str], int]:
    """The common case, no escapes: a value cannot contain a quote, so splitting on quotes gives the
    separators (`{name=`, `,name=`) at even and the values at odd positions."""
    parts = text.split('"')
    last = len(parts) - 1
    if last % 2:
        raise ValueError("unbalanced quotes in label set")
    labels: dict[str, str] = {}
    opener = "{"
    for i in range(0, last, 2):
        sep = parts[i].strip(" \t")
        if sep[:1] != opener or sep[-1:] != "=":
            raise ValueError("malformed label set")
        name = sep[1:-1].strip(" \t")
        if not (name.isidentifier() and name.isascii()):
            raise ValueError(f"bad label name {name[:20]!r}")
        labels[name] = parts[i + 1]
        opener = ","
    stripped = parts[last].lstrip(" \t")
    if opener == "{":  # no labels: `{}`
        if stripped[:1] != "{":
            raise ValueError("malformed label set")
        stripped = stripped[1:].lstrip(" \t")
    elif stripped[:1] == ",":
        stripped = stripped[1:].lstrip(" \t")
    if stripped[:1] != "}":
        raise ValueError("malformed label set")
    return MappingProxyType(labels), len(text) - len(stripped) + 1


def _float(text: str) -> float:
    if "_" in text:
        raise ValueError(f"bad value {text[:20]!r}")
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"bad value {text[:20]!r}") from None

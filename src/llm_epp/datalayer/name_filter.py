"""Asking a model server for only the samples the metrics extractor reads (`--metrics-name-filter`).

Servers that expose their metrics with prometheus_client's exposition apps (`make_asgi_app`,
`make_wsgi_app`, `start_http_server`) read the repeatable query parameter `name[]` and answer only the
samples whose name is listed: a few hundred bytes instead of a 100 KB page of histogram buckets, which
saves the EPP's fetch CPU and the server's rendering. Not every server can be trusted with it:

* a server that ignores the parameter answers the full page (harmless; it is detected by the families
  it answers that were not asked for, and the endpoint is then polled without the parameter);
* prometheus_client in multiprocess mode (`MultiProcessCollector` on a `CollectorRegistry()`, as SGLang
  always runs and vLLM with several API servers) finds no collector for any name, since that collector
  declares none, and answers an empty page.

So the page is never trusted blindly. Per endpoint, `NameFilter` keeps these rules:

1. Poll the configured URL unchanged until one page shows at least one of the wanted names: that page
   says what the server exposes.
2. Then poll with `name[]`. When a filtered page lacks a wanted name that the last full page had, fetch
   the full page at once (that poll uses it); when the full page has a name the filtered one lacked, the
   filter loses data on this server and the endpoint is polled unfiltered for good.
3. While some wanted name is missing from the filtered pages (a family that appears later, a LoRA gauge
   on a server without LoRA), the same comparison runs again every `RECHECK_SECONDS`.
4. A filtered request answered with an HTTP 4xx or something that is not a metrics page turns the
   filter off for good (and the poll fetches the full page).

Each endpoint that goes back to full pages is logged once, at info level, with the reason.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from urllib.parse import parse_qs, quote, urlsplit, urlunsplit

__all__ = ["MAX_ADDED_QUERY", "NAME_PARAM", "RECHECK_SECONDS", "NameFilter", "filtered_url"]

log = logging.getLogger(__name__)

NAME_PARAM = "name[]"
"""The query parameter prometheus_client's exposition apps read (repeatable, one sample name each)."""
_ENCODED_PARAM = quote(NAME_PARAM, safe="")  # name%5B%5D
MAX_ADDED_QUERY = 2048
"""Characters of `name[]` parameters at most: past that, the endpoint is polled without them."""
RECHECK_SECONDS = 30.0
"""While a wanted name is missing from the filtered pages, how often the full page is fetched to compare."""


def filtered_url(url: str, names: Collection[str]) -> str | None:
    """`url` with one `name[]` parameter per name (sorted, percent-encoded) appended to its query; None
    when it cannot be filtered: no names, more than `MAX_ADDED_QUERY` characters of parameters, or a query
    that already names samples itself (its author restricted the page)."""
    if not names:
        return None
    parts = urlsplit(url)
    if NAME_PARAM in parse_qs(parts.query, keep_blank_values=True):
        return None
    added = "&".join(f"{_ENCODED_PARAM}={quote(name, safe='')}" for name in sorted(names))
    if len(added) > MAX_ADDED_QUERY:
        return None
    query = f"{parts.query}&{added}" if parts.query else added
    return urlunsplit((parts.scheme, parts.netloc, parts.path, query, parts.fragment))


class NameFilter:
    """One endpoint's filtering state (see the module docstring). `url` is the configured URL,
    `filtered` the same with `name[]` parameters for `names`."""

    __slots__ = ("endpoint", "exposed", "filtered", "filtering", "last_full", "learned", "names", "off_reason", "url")

    def __init__(self, url: str, filtered: str, names: frozenset[str], endpoint: object = "") -> None:
        self.endpoint = endpoint  # named in the log line when the filter is turned off
        self.url = url
        self.filtered = filtered
        self.names = names
        self.filtering = False  # polls use `filtered`
        self.learned = False  # a full page has shown a wanted name
        self.exposed: frozenset[str] = frozenset()  # wanted names on the last full page
        self.last_full = 0.0  # when the last full page was seen (the clock the runtime passes)
        self.off_reason: str | None = None  # set once the filter is off for good

    @classmethod
    def for_url(cls, url: str, names: frozenset[str], endpoint: object = "") -> NameFilter | None:
        """A filter for `url`, or None when `url` cannot be filtered (see `filtered_url`)."""
        filtered = filtered_url(url, names)
        return None if filtered is None else cls(url, filtered, names, endpoint)

    def saw_full(self, present: frozenset[str], now: float) -> None:
        """A full (unfiltered) page was parsed; `present`: the wanted names it has."""
        self.exposed = present
        self.last_full = now
        if present and not self.learned and self.off_reason is None:
            self.learned = True
            self.filtering = True

    def needs_full(self, body: bytes, present: frozenset[str], now: float) -> bool:
        """After a filtered page (`body`, with the wanted names `present`): whether to fetch the full page
        now and compare (`compare`). A page answering more families than were asked for comes from a server
        that ignores the parameter: the filter is turned off (nothing is lost, nothing to compare)."""
        if body.count(b"# TYPE ") > len(self.names):
            self.turn_off("the server ignores name[] (it answers families that were not asked for)")
            return False
        if self.exposed - present:
            return True
        return len(present) < len(self.names) and now - self.last_full >= RECHECK_SECONDS

    def compare(self, filtered_present: frozenset[str], full_present: frozenset[str], now: float) -> None:
        """The full page fetched after a filtered one: when it has wanted names the filtered page lacked,
        the filter loses data on this server and is turned off."""
        self.saw_full(full_present, now)
        lost = full_present - filtered_present
        if lost:
            self.turn_off(f"the filtered page lacks {', '.join(sorted(lost))}, which the full page has")

    def turn_off(self, reason: str) -> None:
        """Polls go back to the configured URL for good; logged once, at info level."""
        self.filtering = False
        if self.off_reason is None:
            self.off_reason = reason
            log.info("metrics_name_filter_off endpoint=%s url=%s reason=%s", self.endpoint, self.url, reason)

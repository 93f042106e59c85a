"""Polling of the data sources that publish endpoint attributes rather than `Metrics` (a DCGM exporter's
GPU page, an engine's `/v1/models` listing, ...): one poll task per endpoint and source, each fetching
`source.url(endpoint)` every `interval` seconds and merging what the source's extractors return into the
endpoint's attributes in the datastore.

Unlike the metrics runtime, a failing source never takes an endpoint out of the candidate set (a GPU
exporter that is down says nothing about the model server); its attributes simply stop being refreshed,
and each failure is counted in `datalayer_poll_errors_total{source_type}` (an extractor that reports a
problem or raises: `datalayer_extract_errors_total{source_type,extractor_type}`), as upstream. Failures are
logged once per change of reason. A failing endpoint is retried with a backoff doubling up to
`max_backoff` (at least the interval).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from llm_epp.datalayer.datastore import Datastore
from llm_epp.datalayer.exposition import ExpositionError, parse
from llm_epp.datalayer.scrape import DEFAULT_POLL_TIMEOUT, ScrapeError, Scraper, ScrapeSession
from llm_epp.framework.datalayer import (
    PAYLOAD_JSON,
    AttributeExtraction,
    BodyExtractor,
    DataSource,
    PageAttributeExtractor,
    source_payload,
)
from llm_epp.framework.types import EndpointKey, EndpointMetadata

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 4 << 20
_JSON_ACCEPT = "application/json"

AttributeExtractor = PageAttributeExtractor | BodyExtractor


class DataLayerErrors(Protocol):
    """Where poll and extract failures are counted (`observability.metrics.PrometheusRecorder`)."""

    def datalayer_poll_error(self, source_type: str) -> None: ...

    def datalayer_extract_error(self, source_type: str, extractor_type: str) -> None: ...


@dataclass
class SourceState:
    """What the poller of one source knows about one endpoint."""

    polls: int = 0
    failures: int = 0
    streak: int = 0
    failure: str | None = None
    problems: str | None = None


class AttributeSourceRuntime:
    """Polls one attribute-publishing source for every endpoint of the datastore."""

    def __init__(
        self,
        datastore: Datastore,
        source: DataSource,
        extractors: Sequence[AttributeExtractor],
        *,
        interval: float,
        poll_timeout: float = DEFAULT_POLL_TIMEOUT,
        max_backoff: float = 1.0,
        errors: DataLayerErrors | None = None,
        rng: random.Random | None = None,
        scraper: Scraper | None = None,
    ) -> None:
        if interval <= 0 or poll_timeout <= 0:
            raise ValueError("interval and poll_timeout must be > 0")
        self._json = source_payload(source) == PAYLOAD_JSON
        for ex in extractors:
            wanted = BodyExtractor if self._json else PageAttributeExtractor
            if not isinstance(ex, wanted):
                raise TypeError(f"extractor {ex.typed_name} cannot read the answers of {source.typed_name}")
        self._datastore = datastore
        self.source = source
        self.extractors = tuple(extractors)
        self.interval = interval
        self._poll_timeout = poll_timeout
        self._max_backoff = max(max_backoff, interval)
        self._errors = errors
        self._rng = rng or random.Random()
        self._given_scraper = scraper
        self._scraper: Scraper | None = None
        self._pollers: dict[EndpointKey, tuple[EndpointMetadata, asyncio.Task[None]]] = {}
        self._stopping: set[asyncio.Task[None]] = set()
        self._states: dict[EndpointKey, SourceState] = {}
        self._running = False
        self._listening = False
        self.polls = 0
        self.failures = 0

    def state(self, key: EndpointKey) -> SourceState | None:
        return self._states.get(key)

    async def run(self) -> None:
        if self._running:
            raise RuntimeError("AttributeSourceRuntime.run() is already running")
        self._scraper = self._given_scraper or Scraper(
            timeout=self._poll_timeout, verify=not self.source.insecure_skip_verify
        )
        self._running = True
        if not self._listening:
            self._datastore.add_listener(self._sync)
            self._listening = True
        try:
            self._sync()
            await asyncio.Event().wait()
        finally:
            self._running = False
            tasks = [t for _, t in self._pollers.values()]
            self._pollers.clear()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, *self._stopping, return_exceptions=True)
            await self._scraper.aclose()
            self._scraper = None

    def _sync(self) -> None:
        if not self._running:
            return
        current = {m.key: m for m in self._datastore.metadata()}
        for key, (md, task) in list(self._pollers.items()):
            if current.get(key) != md:
                task.cancel()
                self._stopping.add(task)
                task.add_done_callback(self._stopping.discard)
                del self._pollers[key]
        for key in [k for k in self._states if k not in current]:
            del self._states[key]
        for key, md in current.items():
            if key not in self._pollers:
                task = asyncio.get_running_loop().create_task(
                    self._poll_loop(md), name=f"poll {self.source.typed_name} {key}"
                )
                task.add_done_callback(_poller_done)
                self._pollers[key] = (md, task)

    async def _poll_loop(self, md: EndpointMetadata) -> None:
        loop = asyncio.get_running_loop()
        state = self._states.setdefault(md.key, SourceState())
        assert self._scraper is not None
        session = (
            self._scraper.session(accept=_JSON_ACCEPT, max_body=MAX_BODY_BYTES, text_plain=False)
            if self._json
            else self._scraper.session()
        )
        families = frozenset().union(
            *(ex.families(md) for ex in self.extractors if isinstance(ex, PageAttributeExtractor))
        )
        try:
            await asyncio.sleep(self._rng.uniform(0.0, self.interval))
            next_at = loop.time()
            while True:
                if await self.poll_once(session, md, families, state):
                    next_at += self.interval
                else:
                    next_at = loop.time() + min(self.interval * 2.0 ** min(state.streak - 1, 16), self._max_backoff)
                now = loop.time()
                if next_at < now:
                    next_at = now
                await asyncio.sleep(next_at - now)
        finally:
            await session.aclose()

    async def poll_once(
        self,
        session: ScrapeSession,
        md: EndpointMetadata,
        families: frozenset[str],
        state: SourceState,
    ) -> bool:
        """One poll of one endpoint; True when the source answered."""
        self.polls += 1
        state.polls += 1
        url = self.source.url(md)
        try:
            body = await session.fetch(url)
            page = None if self._json else parse(body, families)
        except (ScrapeError, ExpositionError) as e:
            return self._failed(md, url, state, e.reason)
        source_type = self.source.typed_name.type
        values: dict[str, object] = {}
        problems: list[str] = []
        for ex in self.extractors:
            try:
                if page is not None and isinstance(ex, PageAttributeExtractor):
                    result = ex.extract_attributes(page, md)
                elif isinstance(ex, BodyExtractor):
                    result = ex.extract_body(body, md)
                else:  # pragma: no cover - checked in __init__
                    continue
            except Exception as e:  # a plugin's bug: isolated, counted, logged
                log.exception("extractor_failed extractor=%s endpoint=%s", ex.typed_name, md.key)
                result = AttributeExtraction(problems=(f"extractor {ex.typed_name} raised {type(e).__name__}",))
            if result.problems:
                problems.extend(result.problems)
                if self._errors is not None:
                    self._errors.datalayer_extract_error(source_type, ex.typed_name.type)
            values.update(result.values)
        self._datastore.update_attributes(md.key, values)
        if state.failure is not None:
            log.info(
                "poll_recovered source=%s endpoint=%s after_failures=%d", self.source.typed_name, md.key, state.streak
            )
            state.failure = None
        state.streak = 0
        joined = "; ".join(problems) or None
        if joined != state.problems:
            if joined is not None:
                log.warning(
                    "attributes_incomplete source=%s endpoint=%s problems=%s", self.source.typed_name, md.key, joined
                )
            state.problems = joined
        return True

    def _failed(self, md: EndpointMetadata, url: str, state: SourceState, reason: str) -> bool:
        self.failures += 1
        state.failures += 1
        state.streak += 1
        if self._errors is not None:
            self._errors.datalayer_poll_error(self.source.typed_name.type)
        if reason != state.failure:
            log.warning(
                "poll_failed source=%s endpoint=%s url=%s reason=%s", self.source.typed_name, md.key, url, reason
            )
            state.failure = reason
        return False


def _poller_done(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and (err := task.exception()) is not None:
        log.error("poller_crashed task=%s", task.get_name(), exc_info=err)

"""The metrics runtime: one poll task per endpoint, started and stopped as the datastore's membership
changes, each swapping a new frozen `Metrics` into the datastore after every successful scrape; plus a
task refreshing the pool gauges (`inference_pool_*`) from the endpoints whose metrics are fresh.

Per endpoint: the first poll is jittered over one interval, then polls run every `interval` seconds
(ticks missed by a slow poll are dropped, so polls of one endpoint never overlap), each bounded by the
scraper's deadline. A failing endpoint is retried with a backoff doubling up to `max_backoff`. Failures
are logged once per change of reason; the endpoint's metrics are then simply not refreshed, and
`Metrics.update_time` (monotonic seconds) lets every consumer see how old they are (`is_stale`).

With `name_filter` (on by default, `--metrics-name-filter`) each endpoint is asked for only the sample
names the extractor reads, through prometheus_client's `name[]` query parameter; `name_filter.py` says how
a server that ignores the parameter, or answers a filtered page that lacks data, is found out and polled
with the full page again.

An endpoint nothing can connect to (connection refused, connect timeout, host unreachable) is dead, not
just unmeasured: it is marked unreachable in the datastore at its first such failure, which takes it out
of the candidate set (within one poll: at once when refused, after the 1 s deadline when connects hang).
Its poller keeps probing it with the backoff (at most `max_backoff`, 1 s), and the first successful
scrape puts it back.

`DataLayer` drives every configured `dataLayer.sources` entry: the source feeding the metrics extractor
through a `MetricsRuntime`, every source publishing endpoint attributes through an `AttributeSourceRuntime`
(`sources.py`), each at its own interval. Intervals follow the reference: the base tick is
`--refresh-metrics-interval`, lowered to the smallest source `interval` (never below 50 ms by that
lowering); a source with an interval polls every round(interval / base) ticks (at least one), a source
without one every base tick.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from llm_epp.datalayer.datastore import Datastore
from llm_epp.datalayer.exposition import ExpositionError, parse
from llm_epp.datalayer.name_filter import NameFilter
from llm_epp.datalayer.notifications import EndpointEvents, ObjectEvents
from llm_epp.datalayer.scrape import DEFAULT_POLL_TIMEOUT, ScrapeError, Scraper, ScrapeSession, unreachable
from llm_epp.datalayer.sources import AttributeExtractor, AttributeSourceRuntime, DataLayerErrors
from llm_epp.datalayer.tls import TLSScraper, source_ssl_context
from llm_epp.framework.datalayer import (
    DEFAULT_STALENESS,
    BodyExtractor,
    DataSource,
    EndpointEventExtractor,
    EndpointEventSource,
    Extractor,
    ObjectEventExtractor,
    ObjectEventSource,
    PageAttributeExtractor,
    ScrapedPage,
    is_stale,
    source_interval,
)
from llm_epp.framework.types import EMPTY_METRICS, EndpointKey, EndpointMetadata, Metrics

log = logging.getLogger(__name__)

DEFAULT_INTERVAL = 0.05
DEFAULT_GAUGE_INTERVAL = 5.0
DEFAULT_MAX_BACKOFF = 1.0
MIN_BASE_TICK = 0.05  # a source interval lowers the base tick down to this, not below
_ANSWERED = ("HTTP ", "content type")  # scrape failures where the server answered, but not with a page


class PoolGauges(Protocol):
    """Where the pool gauges go (`observability.metrics.PrometheusRecorder` implements it)."""

    def set_pool_gauges(
        self,
        pool_name: str,
        avg_kv: float,
        avg_queue: float,
        avg_running: float,
        ready_pods: int,
        per_pod_queue: Mapping[str, float],
    ) -> None: ...


@dataclass
class EndpointState:
    """What the runtime knows about one endpoint; survives poller restarts while the endpoint stays."""

    metrics: Metrics = EMPTY_METRICS
    failure: str | None = None  # reason of the failing streak, None when the last poll succeeded
    problems: str | None = None  # the last extraction problems logged
    stale: bool = False  # as last reported by the gauge task
    polls: int = 0
    failures: int = 0
    streak: int = 0  # consecutive failures
    unreachable: bool = False  # marked so in the datastore (nothing could connect)
    name_filter: NameFilter | None = None  # None: the endpoint is polled at its URL as configured


@dataclass
class _Poller:
    metadata: EndpointMetadata
    task: asyncio.Task[None]


class MetricsRuntime:
    def __init__(
        self,
        datastore: Datastore,
        source: DataSource,
        extractor: Extractor,
        *,
        interval: float = DEFAULT_INTERVAL,
        staleness: float = DEFAULT_STALENESS,
        recorder: PoolGauges | None = None,
        pool_name: str | None = None,
        refresh_prometheus_interval: float = DEFAULT_GAUGE_INTERVAL,
        poll_timeout: float = DEFAULT_POLL_TIMEOUT,
        max_backoff: float = DEFAULT_MAX_BACKOFF,
        scraper: Scraper | None = None,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        errors: DataLayerErrors | None = None,
        name_filter: bool = True,
    ) -> None:
        if interval <= 0 or staleness <= 0 or refresh_prometheus_interval <= 0 or poll_timeout <= 0:
            raise ValueError("interval, staleness, refresh_prometheus_interval and poll_timeout must be > 0")
        self._datastore = datastore
        self._source = source
        self._extractor = extractor
        self.interval = interval
        self.staleness = staleness
        self._recorder = recorder
        self._errors = errors
        self.name_filter = name_filter
        self._pool_name = pool_name
        self.refresh_prometheus_interval = refresh_prometheus_interval
        self._poll_timeout = poll_timeout
        self._max_backoff = max(max_backoff, interval)
        self._given_scraper = scraper
        self._scraper: Scraper | None = None
        self._clock = clock
        self._rng = rng or random.Random()
        self._pollers: dict[EndpointKey, _Poller] = {}
        self._stopping: set[asyncio.Task[None]] = set()  # cancelled pollers still closing their session
        self._states: dict[EndpointKey, EndpointState] = {}
        self._running = False
        self._listening = False
        self.polls = 0
        self.failures = 0

    # --- reads --------------------------------------------------------------------------------------
    def is_stale(self, key: EndpointKey, now: float | None = None) -> bool:
        """True when `key` has no metrics yet or its last successful scrape is older than `staleness`."""
        state = self._states.get(key)
        metrics = state.metrics if state is not None else EMPTY_METRICS
        return is_stale(metrics, self._clock() if now is None else now, self.staleness)

    def state(self, key: EndpointKey) -> EndpointState | None:
        return self._states.get(key)

    def polled_endpoints(self) -> frozenset[EndpointKey]:
        return frozenset(self._pollers)

    # --- lifecycle ----------------------------------------------------------------------------------
    async def run(self) -> None:
        """Polls until cancelled; then stops every poller and closes its own scraper."""
        if self._running:
            raise RuntimeError("MetricsRuntime.run() is already running")
        self._scraper = self._given_scraper or Scraper(
            timeout=self._poll_timeout, verify=not self._source.insecure_skip_verify
        )
        self._running = True
        if not self._listening:
            self._datastore.add_listener(self._sync)
            self._listening = True
        try:
            self._sync()
            while True:
                await asyncio.sleep(self.refresh_prometheus_interval)
                self.refresh_pool_gauges()
        finally:
            self._running = False
            tasks = [p.task for p in self._pollers.values()]
            self._pollers.clear()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, *self._stopping, return_exceptions=True)
            if self._given_scraper is None:
                await self._scraper.aclose()
            self._scraper = None

    def _sync(self) -> None:
        """Datastore listener: start pollers for new endpoints, stop those of removed ones, restart those
        whose metadata (address, port, labels, ...) changed."""
        if not self._running:
            return
        current = {m.key: m for m in self._datastore.metadata()}
        for key, poller in list(self._pollers.items()):
            md = current.get(key)
            if md != poller.metadata:
                poller.task.cancel()
                self._stopping.add(poller.task)
                poller.task.add_done_callback(self._stopping.discard)
                del self._pollers[key]
                log.debug("scrape_stopped endpoint=%s", key)
        for key in [k for k in self._states if k not in current]:
            del self._states[key]
        for key, md in current.items():
            if key not in self._pollers:
                task = asyncio.get_running_loop().create_task(self._poll_loop(md), name=f"scrape {key}")
                task.add_done_callback(self._poller_done)
                self._pollers[key] = _Poller(md, task)
                log.debug("scrape_started endpoint=%s", key)

    @staticmethod
    def _poller_done(task: asyncio.Task[None]) -> None:
        if not task.cancelled() and (err := task.exception()) is not None:
            # A bug (or a data-source plugin failing in url()): this endpoint is no longer scraped and goes stale.
            log.error("scrape_poller_crashed task=%s", task.get_name(), exc_info=err)

    # --- polling ------------------------------------------------------------------------------------
    async def _poll_loop(self, md: EndpointMetadata) -> None:
        loop = asyncio.get_running_loop()
        state = self._states.setdefault(md.key, EndpointState())
        url = self._source.url(md)
        families = self._extractor.families(md)
        if self.name_filter:
            nf = state.name_filter
            if nf is None or nf.url != url or nf.names != families:  # kept across restarts for the same URL
                state.name_filter = NameFilter.for_url(url, families, md.key)
        else:
            state.name_filter = None
        assert self._scraper is not None
        session = self._scraper.session()
        try:
            await asyncio.sleep(self._rng.uniform(0.0, self.interval))
            next_at = loop.time()
            while True:
                if await self._poll_once(session, md, url, families, state):
                    next_at += self.interval
                else:
                    next_at = loop.time() + min(self.interval * 2.0 ** min(state.streak - 1, 16), self._max_backoff)
                now = loop.time()
                if next_at < now:
                    next_at = now  # drop the ticks a slow poll missed
                await asyncio.sleep(next_at - now)
        finally:
            await session.aclose()

    async def _poll_once(
        self, session: ScrapeSession, md: EndpointMetadata, url: str, families: frozenset[str], state: EndpointState
    ) -> bool:
        self.polls += 1
        state.polls += 1
        try:
            page = await self._fetch(session, url, families, state.name_filter)
        except (ScrapeError, ExpositionError) as e:
            return self._failed(md, url, state, e.reason)
        if page.truncated:
            return self._failed(md, url, state, "truncated page")
        try:
            result = self._extractor.extract(page, md, state.metrics, self._clock())
        except Exception as e:  # a plugin's bug: isolate it like the profile runner does
            log.exception("extractor_failed extractor=%s endpoint=%s", self._extractor.typed_name, md.key)
            if self._errors is not None:
                self._errors.datalayer_extract_error(self._source.typed_name.type, self._extractor.typed_name.type)
            return self._failed(md, url, state, f"extractor {self._extractor.typed_name} raised {type(e).__name__}")
        problems = "; ".join((*page.problems, *result.problems)) or None
        if result.metrics is None:
            return self._failed(md, url, state, f"nothing extracted: {problems}")
        state.metrics = result.metrics
        self._datastore.update_metrics(md.key, result.metrics)
        if result.attributes:
            self._datastore.update_attributes(md.key, result.attributes)
        if state.unreachable:
            state.unreachable = False
            self._datastore.set_reachable(md.key, True)
            log.info("endpoint_reachable endpoint=%s", md.key)
        if state.failure is not None:
            log.info("scrape_recovered endpoint=%s after_failures=%d", md.key, state.streak)
            state.failure = None
        state.streak = 0
        if problems != state.problems:
            if problems is not None:
                log.warning("metrics_incomplete endpoint=%s problems=%s", md.key, problems)
            else:
                log.info("metrics_complete endpoint=%s", md.key)
            state.problems = problems
        return True

    async def _fetch(
        self, session: ScrapeSession, url: str, families: frozenset[str], nf: NameFilter | None
    ) -> ScrapedPage:
        """The page of one poll: filtered when the endpoint's name filter says so, else (or when the filtered
        page cannot be trusted) the full page at `url`."""
        if nf is None or not nf.filtering:
            page = parse(await session.fetch(url), families)
            if nf is not None and nf.off_reason is None and not page.truncated:  # nothing to learn once off
                nf.saw_full(frozenset(page.samples), self._clock())
            return page
        try:
            body = await session.fetch(nf.filtered)
            page = parse(body, families)
        except ScrapeError as e:
            if not e.reason.startswith(_ANSWERED):
                raise  # the network or a slow server failed the poll, not the parameter
            nf.turn_off(f"the filtered URL answered {e.reason}")
            return await self._fetch(session, url, families, nf)
        except ExpositionError as e:
            nf.turn_off(f"the filtered page is not a metrics page ({e.reason})")
            return await self._fetch(session, url, families, nf)
        if page.truncated:
            return page
        present = frozenset(page.samples)
        now = self._clock()
        if not nf.needs_full(body, present, now):
            return page
        full = parse(await session.fetch(url), families)
        if full.truncated:
            return full
        nf.compare(present, frozenset(full.samples), now)
        return full

    def _failed(self, md: EndpointMetadata, url: str, state: EndpointState, reason: str) -> bool:
        self.failures += 1
        state.failures += 1
        state.streak += 1
        if self._errors is not None:
            self._errors.datalayer_poll_error(self._source.typed_name.type)
        if reason != state.failure:
            log.warning("scrape_failed endpoint=%s url=%s reason=%s", md.key, url, reason)
            state.failure = reason
        if unreachable(reason) and not state.unreachable:
            state.unreachable = True
            self._datastore.set_reachable(md.key, False)
            log.warning(
                "endpoint_unreachable endpoint=%s reason=%s: no requests go to it until it answers", md.key, reason
            )
        return False

    # --- pool gauges --------------------------------------------------------------------------------
    def refresh_pool_gauges(self, now: float | None = None) -> None:
        """Averages over the endpoints with fresh metrics (0 when there are none) and every endpoint's
        queue; also logs endpoints whose metrics went stale or came back since the last refresh."""
        now = self._clock() if now is None else now
        endpoints = self._datastore.snapshot()
        fresh = [e for e in endpoints if not is_stale(e.metrics, now, self.staleness)]
        for e in endpoints:
            state = self._states.get(e.key)
            stale = is_stale(e.metrics, now, self.staleness)
            if state is None or stale == state.stale:
                continue
            state.stale = stale
            if stale:
                age = f"{now - e.metrics.update_time:.1f}s" if e.metrics.update_time > 0 else "never scraped"
                log.warning("metrics_stale endpoint=%s age=%s reason=%s", e.key, age, state.failure or "unknown")
            else:
                log.info("metrics_fresh endpoint=%s", e.key)
        if self._recorder is None:
            return
        n = len(fresh)
        self._recorder.set_pool_gauges(
            self._pool_name or self._datastore.pool_name,
            sum(e.metrics.kv_cache_usage for e in fresh) / n if n else 0.0,
            sum(e.metrics.waiting_queue_size for e in fresh) / n if n else 0.0,
            sum(e.metrics.running_requests for e in fresh) / n if n else 0.0,
            n,
            {e.key.name: float(e.metrics.waiting_queue_size) for e in endpoints},
        )


class ReachabilityProbe:
    """For configurations that scrape no metrics: connects to every endpoint's port (TCP only, closed at
    once) every `interval` seconds, and marks the endpoints nothing can connect to unreachable in the
    datastore, as the metrics runtime does from its scrapes. An unreachable endpoint is probed again with
    a backoff from `interval / 4` doubling to `interval`; the first connect that succeeds puts it back."""

    def __init__(self, datastore: Datastore, *, interval: float = 1.0, timeout: float = DEFAULT_POLL_TIMEOUT) -> None:
        if interval <= 0 or timeout <= 0:
            raise ValueError("interval and timeout must be > 0")
        self._datastore = datastore
        self.interval = interval
        self.timeout = timeout
        self._next: dict[EndpointKey, tuple[float, float]] = {}  # key -> (next probe at, current backoff)
        self.probes = 0

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            now = loop.time()
            endpoints = {m.key: m for m in self._datastore.metadata()}
            for key in [k for k in self._next if k not in endpoints]:
                del self._next[key]
            due = [m for k, m in endpoints.items() if self._next.get(k, (0.0, 0.0))[0] <= now]
            if due:
                await asyncio.gather(*(self._probe(md) for md in due))
            wake = min((at for at, _ in self._next.values()), default=now + self.interval)
            await asyncio.sleep(min(max(wake - loop.time(), 0.01), self.interval))

    async def _probe(self, md: EndpointMetadata) -> None:
        loop = asyncio.get_running_loop()
        self.probes += 1
        ok = True
        try:
            async with asyncio.timeout(self.timeout):
                _, writer = await asyncio.open_connection(md.address, md.port)
            writer.close()
        except (OSError, TimeoutError) as e:
            ok = isinstance(e, OSError) and not _is_connect_failure(e)
        was = self._datastore.is_reachable(md.key)
        self._datastore.set_reachable(md.key, ok)
        _, backoff = self._next.get(md.key, (0.0, self.interval / 4))
        if ok:
            self._next[md.key] = (loop.time() + self.interval, self.interval / 4)
            if not was:
                log.info("endpoint_reachable endpoint=%s", md.key)
        else:
            self._next[md.key] = (loop.time() + backoff, min(backoff * 2, self.interval))
            if was:
                log.warning("endpoint_unreachable endpoint=%s: no requests go to it until it answers", md.key)


def _is_connect_failure(err: OSError) -> bool:
    """Refused, host or network unreachable, timed out: nothing listens there."""
    return isinstance(err, ConnectionRefusedError) or err.errno in (
        errno.ECONNREFUSED,
        errno.EHOSTUNREACH,
        errno.ENETUNREACH,
        errno.ETIMEDOUT,
    )


def base_tick(refresh_interval: float, source_intervals: Sequence[float]) -> float:
    """The data layer's base tick: `refresh_interval`, lowered to the smallest source interval (not below
    50 ms by that lowering)."""
    base = refresh_interval
    given = [iv for iv in source_intervals if iv > 0]
    if given and min(given) < base:
        base = max(min(given), min(base, MIN_BASE_TICK))
    return base


def effective_interval(base: float, interval: float) -> float:
    """A source's poll period: `interval` rounded to the nearest multiple of `base` (halves up, at least one
    tick); 0 (no interval) polls every tick."""
    if interval <= 0:
        return base
    ns_interval, ns_base = round(interval * 1e9), round(base * 1e9)  # as Go: durations in ns, half rounds up
    return base * max(1, (2 * ns_interval + ns_base) // (2 * ns_base))


@dataclass
class DataLayer:
    """Everything that collects endpoint data for one configuration: the metrics runtime (None when no
    source feeds a metrics extractor), one runtime per attribute-publishing polled source, the endpoint
    notification sources (`start_events()` subscribes them to the datastore) and the Kubernetes
    notification sources (their watches are started by the app, which has the API client)."""

    metrics: MetricsRuntime | None
    sources: list[AttributeSourceRuntime] = field(default_factory=list)
    endpoint_events: EndpointEvents | None = None
    object_events: list[ObjectEvents] = field(default_factory=list)

    def start_events(self) -> None:
        if self.endpoint_events is not None:
            self.endpoint_events.start()

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            if self.metrics is not None:
                tg.create_task(self.metrics.run())
            for source in self.sources:
                tg.create_task(source.run())


def build_data_layer(
    datastore: Datastore,
    bindings: Sequence[tuple[object, Sequence[object]]],
    *,
    refresh_interval: float = DEFAULT_INTERVAL,
    staleness: float = DEFAULT_STALENESS,
    recorder: PoolGauges | None = None,
    errors: DataLayerErrors | None = None,
    refresh_prometheus_interval: float = DEFAULT_GAUGE_INTERVAL,
    poll_timeout: float = DEFAULT_POLL_TIMEOUT,
    name_filter: bool = True,
) -> DataLayer:
    """One runtime per source and role. `bindings`: each source with its extractors, as configured (the
    loader has checked that each extractor can read its source). A source with a metrics extractor and
    attribute extractors is polled twice: once for the metrics, once for the attributes."""
    base = base_tick(refresh_interval, [source_interval(src) for src, _ in bindings if isinstance(src, DataSource)])
    metrics: MetricsRuntime | None = None
    sources: list[AttributeSourceRuntime] = []
    endpoint_bindings: list[tuple[EndpointEventSource, list[EndpointEventExtractor]]] = []
    object_events: list[ObjectEvents] = []
    for src, extractors in bindings:
        if isinstance(src, EndpointEventSource):
            endpoint_bindings.append((src, [e for e in extractors if isinstance(e, EndpointEventExtractor)]))
            continue
        if isinstance(src, ObjectEventSource):
            watched = [e for e in extractors if isinstance(e, ObjectEventExtractor)]
            object_events.append(ObjectEvents(datastore, src, watched, errors))
            continue
        if not isinstance(src, DataSource):
            raise TypeError(f"{src!r} is not a data source")
        interval = effective_interval(base, source_interval(src))
        context = source_ssl_context(src)  # raises ValueError for unusable CA / client certificate files
        scraper = TLSScraper(context, timeout=poll_timeout) if context is not None else None
        attribute_extractors: list[AttributeExtractor] = []
        for ex in extractors:
            if isinstance(ex, Extractor):
                if metrics is not None:
                    raise ValueError("only one data source may feed a metrics extractor")
                metrics = MetricsRuntime(
                    datastore,
                    src,
                    ex,
                    interval=interval,
                    staleness=staleness,
                    recorder=recorder,
                    refresh_prometheus_interval=refresh_prometheus_interval,
                    poll_timeout=poll_timeout,
                    errors=errors,
                    scraper=scraper,
                    name_filter=name_filter,
                )
            elif isinstance(ex, PageAttributeExtractor | BodyExtractor):
                attribute_extractors.append(ex)
        if attribute_extractors:
            sources.append(
                AttributeSourceRuntime(
                    datastore,
                    src,
                    attribute_extractors,
                    interval=interval,
                    poll_timeout=poll_timeout,
                    errors=errors,
                    scraper=scraper,
                )
            )
    endpoint_events = EndpointEvents(datastore, endpoint_bindings, errors) if endpoint_bindings else None
    return DataLayer(metrics, sources, endpoint_events, object_events)

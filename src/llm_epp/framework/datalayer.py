"""Data-layer extension points: a `DataSource` says where to poll an endpoint, an `Extractor` turns a
scraped page into a new `Metrics`. The data-layer runtime does the I/O (HTTP fetch, text parsing) and
swaps the result into the datastore; plugins stay free of I/O.

A poll cycle for one endpoint: `url = source.url(md)` → fetch → parse only `extractor.families(md)` →
`extractor.extract(page, md, current, now)` → `Extraction.metrics` replaces the endpoint's metrics.

Sources and extractors that publish endpoint attributes (read by scheduling plugins from
`Endpoint.attributes`): a `PageAttributeExtractor` reads a parsed Prometheus page, a `BodyExtractor` the raw
body of a source whose `payload` is `"json"`. Each `dataLayer.sources` entry is polled on its own, every
`interval` seconds when the source sets one (0: every base tick). Optional members of a `DataSource`:
`payload` (`"prometheus"` when absent) and `interval` (seconds; 0 when absent).

Event-driven extractors (`EndpointEventExtractor`) are handed endpoint add/update/delete events by an
endpoint notification source instead of polling.

Freshness is `Metrics.update_time` (monotonic seconds, 0 = never scraped); consumers that must not
trust old numbers use `is_stale`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from llm_epp.framework.plugin import TypedName
from llm_epp.framework.types import EndpointKey, EndpointMetadata, Metrics

DEFAULT_STALENESS = 2.0
"""Seconds after which scraped metrics are stale (the reference's `--metrics-staleness-threshold`)."""


@dataclass(frozen=True, slots=True)
class Sample:
    """One exposition sample: `name{labels} value [timestamp_ms]`."""

    name: str
    labels: Mapping[str, str]
    value: float
    timestamp_ms: int | None = None


@dataclass(frozen=True, slots=True)
class ScrapedPage:
    """The samples of one scrape, grouped by sample name, for the names that were asked for only.

    `truncated`: the page did not end with a newline, so its last line was dropped. `problems`: lines of
    requested samples that could not be parsed (they are left out). A page with neither is `complete`."""

    samples: Mapping[str, tuple[Sample, ...]]
    truncated: bool = False
    problems: tuple[str, ...] = ()

    @property
    def complete(self) -> bool:
        return not self.truncated and not self.problems


@dataclass(frozen=True, slots=True)
class Extraction:
    """What an extractor made of a page. `metrics` is None when nothing could be extracted; otherwise
    it is a new `Metrics` with `update_time = now`. `problems` name what was missing or malformed (a
    partial update still applies, as in the reference)."""

    metrics: Metrics | None
    problems: tuple[str, ...] = field(default=())
    attributes: Mapping[str, object] = field(default_factory=dict)  # endpoint attributes (custom metrics)


@runtime_checkable
class DataSource(Protocol):
    """A polled source: the URL to fetch for an endpoint. Pure; called once per poll."""

    @property
    def typed_name(self) -> TypedName: ...

    @property
    def insecure_skip_verify(self) -> bool: ...

    def url(self, endpoint: EndpointMetadata) -> str: ...


@runtime_checkable
class Extractor(Protocol):
    """Turns a scraped page into metrics. Pure and synchronous; must not mutate `current`."""

    @property
    def typed_name(self) -> TypedName: ...

    def families(self, endpoint: EndpointMetadata) -> frozenset[str]:
        """The sample names this extractor reads for `endpoint` (the parser skips everything else)."""
        ...

    def extract(self, page: ScrapedPage, endpoint: EndpointMetadata, current: Metrics, now: float) -> Extraction: ...


@dataclass(frozen=True, slots=True)
class AttributeExtraction:
    """What an attribute extractor made of one poll: values by attribute name, and what was wrong."""

    values: Mapping[str, object] = field(default_factory=dict)
    problems: tuple[str, ...] = ()


@runtime_checkable
class PageAttributeExtractor(Protocol):
    """Publishes endpoint attributes from a Prometheus page. Pure and synchronous."""

    @property
    def typed_name(self) -> TypedName: ...

    def families(self, endpoint: EndpointMetadata) -> frozenset[str]: ...

    def extract_attributes(self, page: ScrapedPage, endpoint: EndpointMetadata) -> AttributeExtraction: ...


@runtime_checkable
class BodyExtractor(Protocol):
    """Publishes endpoint attributes from the raw body of a non-Prometheus source (JSON). Pure."""

    @property
    def typed_name(self) -> TypedName: ...

    def extract_body(self, body: bytes, endpoint: EndpointMetadata) -> AttributeExtraction: ...


PAYLOAD_PROMETHEUS = "prometheus"
PAYLOAD_JSON = "json"


def source_payload(source: DataSource) -> str:
    """What a source's answers are: `"prometheus"` (text exposition, the default) or `"json"`."""
    payload = getattr(source, "payload", PAYLOAD_PROMETHEUS)
    return payload if isinstance(payload, str) else PAYLOAD_PROMETHEUS


def source_interval(source: DataSource) -> float:
    """A source's own poll period in seconds; 0 means every base tick (`--refresh-metrics-interval`)."""
    value = getattr(source, "interval", 0.0)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) and value > 0 else 0.0


@dataclass(frozen=True, slots=True)
class DiscoveredEndpoints:
    """What a discovery plugin made of its input: the endpoints, and the entries it skipped (why)."""

    endpoints: tuple[EndpointMetadata, ...]
    problems: tuple[str, ...] = ()


@runtime_checkable
class EndpointDiscovery(Protocol):
    """A `dataLayer.discovery` plugin reading endpoints from a file: `path`, whether to reload it when it
    changes (`watch_file`), and how to read its text (pure). The data layer does the reading and applies
    the result to the datastore."""

    @property
    def typed_name(self) -> TypedName: ...

    @property
    def path(self) -> str: ...

    @property
    def watch_file(self) -> bool: ...

    def parse_endpoints(self, text: str) -> DiscoveredEndpoints:
        """Raises ValueError when the file as a whole cannot be read (not YAML/JSON, wrong shape)."""
        ...


EVENT_ADD_OR_UPDATE = "add-or-update"
EVENT_DELETE = "delete"

AttributeUpdates = Mapping[EndpointKey, Mapping[str, object]]
"""Attribute values an event extractor publishes, per endpoint (a value of None removes the attribute)."""


@dataclass(frozen=True, slots=True)
class EndpointEvent:
    """An endpoint joined or changed (`add-or-update`) or left the pool (`delete`)."""

    type: str
    endpoint: EndpointMetadata


@dataclass(frozen=True, slots=True)
class GroupVersionKind:
    """A Kubernetes resource type; `group` "" is the core API group."""

    group: str
    version: str
    kind: str

    def __str__(self) -> str:
        return f"{self.group}/{self.version}, Kind={self.kind}" if self.group else f"{self.version}, Kind={self.kind}"


@dataclass(frozen=True, slots=True)
class ObjectEvent:
    """A Kubernetes object of the watched kind was added or changed (`add-or-update`, the whole object as
    JSON) or deleted (`delete`, at least its metadata.name and metadata.namespace)."""

    type: str
    object: Mapping[str, Any]

    @property
    def name(self) -> str:
        meta = self.object.get("metadata")
        return str(meta.get("name", "")) if isinstance(meta, Mapping) else ""

    @property
    def namespace(self) -> str:
        meta = self.object.get("metadata")
        return str(meta.get("namespace", "")) if isinstance(meta, Mapping) else ""


@runtime_checkable
class EndpointEventSource(Protocol):
    """A notification source of endpoint lifecycle events (`endpoint-notification-source`): it may pass an
    event on (possibly changed) or drop it (None)."""

    @property
    def typed_name(self) -> TypedName: ...

    def notify_endpoint(self, event: EndpointEvent) -> EndpointEvent | None: ...


@runtime_checkable
class EndpointEventExtractor(Protocol):
    """Handed every endpoint event of the endpoint notification source it is listed under."""

    @property
    def typed_name(self) -> TypedName: ...

    def extract_endpoint_event(self, event: EndpointEvent) -> AttributeUpdates: ...


@runtime_checkable
class ObjectEventSource(Protocol):
    """A notification source of Kubernetes object events of one kind (`k8s-notification-source`)."""

    @property
    def typed_name(self) -> TypedName: ...

    @property
    def gvk(self) -> GroupVersionKind: ...

    def notify_object(self, event: ObjectEvent) -> ObjectEvent | None: ...


@runtime_checkable
class ObjectEventExtractor(Protocol):
    """Handed every object event of the Kubernetes notification source (of its own `gvk`) it is listed under."""

    @property
    def typed_name(self) -> TypedName: ...

    @property
    def gvk(self) -> GroupVersionKind: ...

    def extract_object_event(self, event: ObjectEvent) -> AttributeUpdates: ...


@dataclass(frozen=True, slots=True)
class DataDependency:
    """A source an extractor needs, declared by the plugin (`DataLayerRegistrant`) rather than configured:
    the extractor is added to the configured source of `source_type` (for a Kubernetes notification source,
    the one watching `gvk`), or `default_source` is added with it when none is configured."""

    source_type: str
    extractor: Any
    default_source: Any
    gvk: GroupVersionKind | None = None


@runtime_checkable
class DataLayerRegistrant(Protocol):
    """A plugin that wires its own extractors into the data layer (as the reference's RegisterDependencies)."""

    def data_dependencies(self) -> tuple[DataDependency, ...]: ...


def is_stale(metrics: Metrics, now: float, threshold: float = DEFAULT_STALENESS) -> bool:
    """True when `metrics` were never scraped or are older than `threshold` seconds at `now`."""
    return metrics.update_time <= 0.0 or now - metrics.update_time > threshold

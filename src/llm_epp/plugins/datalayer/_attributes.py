"""Endpoint attributes published by data-layer extractors and read by scheduling plugins.

An endpoint attribute is named as the reference's DataKey prints itself, `<attribute>/<producer>`
(`GPUUtilization/dcgm-extractor`, `custom.queue_depth/core-metrics-extractor`), and lives in
`Endpoint.attributes` under that name.

Attribute extractors are pure: `extract_attributes(page, endpoint)` returns the values to publish for one
endpoint from one scraped page. Publishing them is the data-layer runtime's job: for each data source
configured under `dataLayer.sources`, fetch `source.url(endpoint)`, parse `extractor.families(endpoint)`,
call `extract_attributes`, and swap the values into that endpoint's `attributes` (keeping other
producers' values), exactly as it swaps `Metrics` today."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from llm_epp.framework import Endpoint


def attribute_key(attribute: str, producer: str) -> str:
    """The name an attribute is stored under: `<attribute>/<producer>`."""
    return f"{attribute}/{producer}"


@dataclass(frozen=True, slots=True)
class AttributeExtraction:
    """What an attribute extractor made of one page: values by attribute name, and what was wrong."""

    values: Mapping[str, object] = field(default_factory=dict)
    problems: tuple[str, ...] = ()


def scalar(endpoint: Endpoint, key: str) -> float | None:
    """A numeric attribute of `endpoint`, or None when it is absent or not a number."""
    value = endpoint.attributes.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)

"""Endpoint attributes published by data-layer extractors and read by scheduling plugins.

An endpoint attribute is named as the reference's DataKey prints itself, `<attribute>/<producer>`
(`GPUUtilization/dcgm-extractor`, `custom.queue_depth/core-metrics-extractor`), and lives in
`Endpoint.attributes` under that name.

Attribute extractors are pure: `extract_attributes(page, endpoint)` (or `extract_body(body, endpoint)`)
returns the values to publish for one endpoint from one poll. Publishing them is the data-layer runtime's
job: it merges the values into that endpoint's `attributes`, keeping other producers' values."""

from __future__ import annotations

from llm_epp.framework import Endpoint
from llm_epp.framework.datalayer import AttributeExtraction

__all__ = ["AttributeExtraction", "attribute_key", "scalar"]


def attribute_key(attribute: str, producer: str) -> str:
    """The name an attribute is stored under: `<attribute>/<producer>`."""
    return f"{attribute}/{producer}"


def scalar(endpoint: Endpoint, key: str) -> float | None:
    """A numeric attribute of `endpoint`, or None when it is absent or not a number."""
    value = endpoint.attributes.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)

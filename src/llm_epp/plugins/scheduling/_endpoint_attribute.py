"""What `endpoint-attribute-filter` and `endpoint-attribute-scorer` share: which endpoint attribute a
configuration names.

llm-d-router v0.10 spells the attribute as one key, `<attribute>/<producer>` (e.g.
`GPUUtilization/dcgm-extractor`); later versions split it into `attribute` and `producer`, an omitted
producer meaning `core-metrics-extractor` (the custom metrics). Both spellings are accepted: with a producer
the key is `<attribute>/<producer>` (an empty producer: the attribute alone); without one, an attribute
containing "/" is the whole key, and one without is a custom metric of `core-metrics-extractor`."""

from __future__ import annotations

DEFAULT_PRODUCER = "core-metrics-extractor"


def resolve_key(attribute: str, producer: str | None) -> str:
    """The name the attribute is stored under in `Endpoint.attributes`."""
    if producer is not None:
        return f"{attribute}/{producer}" if producer else attribute
    if "/" in attribute:
        return attribute
    return f"{attribute}/{DEFAULT_PRODUCER}"

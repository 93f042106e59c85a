"""What `endpoint-attribute-filter` and `endpoint-attribute-scorer` share: which endpoint attribute a
configuration names (`attribute` + `producer`, as the reference resolves them)."""

from __future__ import annotations

DEFAULT_PRODUCER = "core-metrics-extractor"


def resolve_key(what: str, attribute: str, producer: str | None) -> str:
    """The attribute name `<attribute>/<producer>`. Without a producer the attribute is a custom metric of
    `core-metrics-extractor`; an attribute containing "/" then needs the producer spelled out."""
    if producer is not None:
        return f"{attribute}/{producer}"
    if "/" in attribute:
        head, _, tail = attribute.rpartition("/")
        raise ValueError(
            f"{what} {attribute!r} contains '/' but no producer is set: the attribute and its producer are "
            f"separate parameters (e.g. {what}: {head!r} and producer: {tail!r}); if the name itself contains "
            "'/', set producer explicitly"
        )
    return f"{attribute}/{DEFAULT_PRODUCER}"

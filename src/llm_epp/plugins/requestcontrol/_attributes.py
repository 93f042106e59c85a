"""Request attributes: values that request-control plugins publish about one request for later plugins
(the reference's `InferenceRequest.PutAttribute` / `GetAttribute`).

An attribute is named by its data type and the name of the plugin that produced it, as the reference's
`DataKey` is (`agent-identity` publishes under (`agent-identity`, ""), `session-id-producer` under
(`SessionIDDataKey`, <its instance name>)). The values live in the request's CycleState, so they last
from PrepareData to the response hooks and die with the request."""

from __future__ import annotations

from llm_epp.framework import CycleState, StateKey

REQUEST_ATTRIBUTES_KEY: StateKey[dict[tuple[str, str], object]] = StateKey("request-attributes")


def put_attribute(cycle: CycleState, name: str, producer: str, value: object) -> None:
    """Publishes `value` under (`name`, `producer`), replacing an earlier value."""
    attributes = cycle.read(REQUEST_ATTRIBUTES_KEY)
    if attributes is None:
        attributes = {}
        cycle.write(REQUEST_ATTRIBUTES_KEY, attributes)
    attributes[(name, producer)] = value


def get_attribute(cycle: CycleState, name: str, producer: str = "") -> object | None:
    """The value published under (`name`, `producer`), or None."""
    attributes = cycle.read(REQUEST_ATTRIBUTES_KEY)
    if attributes is None:
        return None
    return attributes.get((name, producer))

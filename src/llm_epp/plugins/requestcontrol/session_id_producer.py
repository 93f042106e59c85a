"""session-id-producer

Scheduling intent:
    Publish the request's session id as a request attribute, so session-aware plugins (the
    `session_id` strategy of `session-affinity-scorer` / `-filter`, with a source
    `{attribute: SessionIDDataKey, producer: <this plugin's name>}`) need not know whether the client sent
    it in a header or in a cookie. Publishes nothing when the configured source is absent or blank.

Inputs consumed:
    The configured request header, or the named cookie of the `cookie` request header
    (`a=1; name=value`; the first pair with that exact name wins).

Configuration:
    Exactly one of:
    headerName (string): the request header holding the session id (matched case-insensitively).
    cookieName (string): the cookie holding the session id.

Outputs produced:
    Request attribute (`SessionIDDataKey`, <plugin name>) = the session id string, written in PrepareData.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field, model_validator

from llm_epp.framework import CycleState, Endpoint, Handle, InferenceRequest, PluginParams, TypedName
from llm_epp.plugins.requestcontrol._attributes import get_attribute, put_attribute

TYPE = "session-id-producer"
ATTRIBUTE = "SessionIDDataKey"


class Params(PluginParams):
    header_name: str = Field(default="", alias="headerName")
    cookie_name: str = Field(default="", alias="cookieName")

    @model_validator(mode="after")
    def _exactly_one(self) -> Params:
        header, cookie = self.header_name.strip(), self.cookie_name.strip()
        if not header and not cookie:
            raise ValueError(f"{TYPE} needs exactly one of headerName or cookieName")
        if header and cookie:
            raise ValueError(f"{TYPE} needs exactly one of headerName or cookieName, not both")
        return self


def cookie_value(header: str, name: str) -> str:
    """The value of cookie `name` in a `cookie` header value, or ""."""
    for pair in header.split(";"):
        k, eq, v = pair.strip().partition("=")
        if eq and k == name:
            return v
    return ""


class SessionIdProducer:
    def __init__(self, name: str, params: Params) -> None:
        self._typed_name = TypedName(TYPE, name)
        self.header = params.header_name.strip().lower()
        self.cookie = params.cookie_name.strip()
        self.produces = frozenset({f"{ATTRIBUTE}/{name}"})

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def session_id(self, request: InferenceRequest) -> str:
        if self.header:
            return request.headers.get(self.header, "").strip()
        return cookie_value(request.headers.get("cookie", ""), self.cookie).strip()

    async def prepare_data(self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> None:
        session = self.session_id(request)
        if session:
            put_attribute(cycle, ATTRIBUTE, self._typed_name.name, session)


def read_session_id(cycle: CycleState, producer: str = TYPE) -> str | None:
    """The session id a `session-id-producer` named `producer` published for this request."""
    value = get_attribute(cycle, ATTRIBUTE, producer)
    return value if isinstance(value, str) else None


def factory(name: str, params: Params, handle: Handle) -> SessionIdProducer:
    return SessionIdProducer(name, params)

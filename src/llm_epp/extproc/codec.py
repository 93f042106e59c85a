"""protobuf <-> domain: read headers, body chunks and metadata out of ProcessingRequests; build the
(serialised) ProcessingResponses. EppError is mapped to an ImmediateResponse here, and only here."""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import orjson
from envoy.config.core.v3.base_pb2 import HeaderValue, HeaderValueOption
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.type.v3.http_status_pb2 import HttpStatus
from google.protobuf.struct_pb2 import Struct

from llm_epp.extproc import headers as h
from llm_epp.framework import EppError, ErrorCode

_ERROR_TYPES = {
    ErrorCode.BAD_REQUEST: "invalid_request_error",
    ErrorCode.PAYLOAD_TOO_LARGE: "invalid_request_error",
    ErrorCode.NOT_FOUND: "not_found_error",
    ErrorCode.UNAUTHORIZED: "authentication_error",
    ErrorCode.FORBIDDEN: "permission_error",
    ErrorCode.RESOURCE_EXHAUSTED: "rate_limit_error",
    ErrorCode.SERVICE_UNAVAILABLE: "service_unavailable_error",
    ErrorCode.INTERNAL: "internal_error",
    ErrorCode.MODEL_SERVER_ERROR: "internal_error",
}


def read_headers(msg: Any) -> dict[str, str]:
    """HeaderMap -> dict. Envoy sends lower-case names and puts values in raw_value (bytes)."""
    return {hv.key: hv.raw_value.decode("utf-8", "replace") or hv.value for hv in msg.headers.headers}


def read_some_headers(msg: Any, names: frozenset[str]) -> dict[str, str]:
    """Only the named headers (response headers: the EPP needs a handful of the many a server sends)."""
    return {
        hv.key: hv.raw_value.decode("utf-8", "replace") or hv.value for hv in msg.headers.headers if hv.key in names
    }


def read_metadata(req: Any, namespace: str, key: str) -> Any:
    """A value from metadata_context.filter_metadata[namespace][key], or None."""
    if not req.HasField("metadata_context"):
        return None
    fm = req.metadata_context.filter_metadata
    if namespace not in fm:
        return None
    fields = fm[namespace].fields
    if key not in fields:
        return None
    value = fields[key]
    kind = value.WhichOneof("kind")
    if kind == "list_value":
        return [v.string_value for v in value.list_value.values if v.WhichOneof("kind") == "string_value"]
    if kind == "string_value":
        return value.string_value
    return None


def read_subset(req: Any) -> list[str] | None:
    """The gateway's subset hint: None when absent (all endpoints), a list (possibly empty) when present.
    A comma-separated string is accepted too."""
    value = read_metadata(req, h.SUBSET_NAMESPACE, h.DESTINATION_SUBSET)
    if value is None:
        return None
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    return list(value)


def _hvo(key: str, value: str) -> HeaderValueOption:
    return HeaderValueOption(header=HeaderValue(key=key, raw_value=value.encode()))


# --- wire encoding of the per-request answers --------------------------------------------------------------
# The answers sent for every request (routing header mutation, body echo, response-headers answer) are written
# as protobuf wire bytes directly: a handful of length-delimited fields, several times cheaper than building
# and serialising message objects. Field numbers come from the generated descriptors; tests check that the
# bytes parse back to the same messages protobuf builds (and equal its serialisation).


def _tag(message: Any, field: str) -> bytes:
    """The key byte(s) of a length-delimited or varint field (wire type from the field's kind)."""
    fd = message.DESCRIPTOR.fields_by_name[field]
    wire_type = 2 if fd.type in (fd.TYPE_MESSAGE, fd.TYPE_STRING, fd.TYPE_BYTES) else 0
    return _varint(fd.number << 3 | wire_type)


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_SMALL_LENGTHS = tuple(bytes((n,)) for n in range(0x80))


def _field(tag: bytes, payload: bytes) -> bytes:
    size = len(payload)
    return tag + (_SMALL_LENGTHS[size] if size < 0x80 else _varint(size)) + payload


_T_REQUEST_HEADERS = _tag(pb.ProcessingResponse, "request_headers")
_T_RESPONSE_HEADERS = _tag(pb.ProcessingResponse, "response_headers")
_T_REQUEST_BODY = _tag(pb.ProcessingResponse, "request_body")
_T_RESPONSE_BODY = _tag(pb.ProcessingResponse, "response_body")
_T_HEADERS_RESPONSE = _tag(pb.HeadersResponse, "response")
_T_BODY_RESPONSE = _tag(pb.BodyResponse, "response")
_T_HEADER_MUTATION = _tag(pb.CommonResponse, "header_mutation")
_T_BODY_MUTATION = _tag(pb.CommonResponse, "body_mutation")
_CLEAR_ROUTE_CACHE = _tag(pb.CommonResponse, "clear_route_cache") + b"\x01"
_T_SET_HEADERS = _tag(pb.HeaderMutation, "set_headers")
_T_REMOVE_HEADERS = _tag(pb.HeaderMutation, "remove_headers")
_T_HEADER = _tag(HeaderValueOption, "header")
_T_KEY = _tag(HeaderValue, "key")
_T_RAW_VALUE = _tag(HeaderValue, "raw_value")
_T_BODY = _tag(pb.BodyMutation, "body")
_T_STREAMED = _tag(pb.BodyMutation, "streamed_response")
_T_STREAMED_BODY = _tag(pb.StreamedBodyResponse, "body")
_STREAMED_EOS = _tag(pb.StreamedBodyResponse, "end_of_stream") + b"\x01"


def _set_header(key: str, value: str) -> bytes:
    """One `set_headers` entry (a HeaderValueOption with key and raw_value), as a HeaderMutation field."""
    raw = value.encode()
    header = _field(_T_KEY, key.encode()) + (_field(_T_RAW_VALUE, raw) if raw else b"")
    return _field(_T_SET_HEADERS, _field(_T_HEADER, header))


def _mutation(sets: bytes, remove: Sequence[str]) -> bytes:
    """The HeaderMutation field of a CommonResponse; `sets` is concatenated `_set_header` entries."""
    for name in remove:
        sets += _field(_T_REMOVE_HEADERS, name.encode())
    return _field(_T_HEADER_MUTATION, sets) if sets else b""


_WENT_INTO_RESP_HEADERS = _set_header(h.WENT_INTO_RESP_HEADERS, "true")


@functools.lru_cache(maxsize=4096)
def _destination_header(destination: str) -> bytes:
    """The destination `set_headers` entry, kept per destination (a pool has few)."""
    return _set_header(h.DESTINATION, destination)


class _MetadataCache:
    """Serialised `dynamic_metadata` fragments per destination. A ProcessingResponse's wire form is the
    concatenation of its fields, so the fragment is appended to the serialised headers answer."""

    def __init__(self, size: int = 4096) -> None:
        self._size = size
        self._cache: OrderedDict[str, bytes] = OrderedDict()

    def get(self, destination: str) -> bytes:
        data = self._cache.get(destination)
        if data is None:
            md = Struct()
            md.update({h.LB_NAMESPACE: {h.DESTINATION: destination}})
            data = pb.ProcessingResponse(dynamic_metadata=md).SerializeToString()
            self._cache[destination] = data
            if len(self._cache) > self._size:
                self._cache.popitem(last=False)
        return data


_metadata = _MetadataCache()


def _lb_metadata(destination: str, scores: Mapping[str, float] | None) -> bytes:
    if not scores:
        return _metadata.get(destination)
    md = Struct()
    md.update({h.LB_NAMESPACE: {h.DESTINATION: destination, h.SCORES: dict(scores)}})
    return pb.ProcessingResponse(dynamic_metadata=md).SerializeToString()


def dynamic_metadata(metadata: Mapping[str, Mapping[str, object]]) -> bytes:
    """A serialised ProcessingResponse carrying only `dynamic_metadata` (namespace -> key -> value), to append
    to another serialised answer; b"" when there is nothing to send."""
    if not metadata:
        return b""
    md = Struct()
    fields: dict[str, Any] = {ns: dict(values) for ns, values in metadata.items()}
    md.update(fields)
    return pb.ProcessingResponse(dynamic_metadata=md).SerializeToString()


def _routing_common(
    destination: str,
    content_length: int | None,
    extra: Sequence[tuple[str, str]],
    remove: Sequence[str],
    new_body: bytes | None = None,
) -> bytes:
    """A CommonResponse (wire bytes) setting the destination header (and content-length, extra headers),
    removing `remove`, replacing the body when `new_body` is given, and clearing the route cache."""
    sets = _destination_header(destination)
    if content_length is not None:
        sets += _set_header(h.CONTENT_LENGTH, str(content_length))
    for k, v in extra:
        sets += _set_header(k, v)
    common = _mutation(sets, remove)
    if new_body is not None:
        common += _field(_T_BODY_MUTATION, _field(_T_BODY, new_body))  # a oneof member: sent even when empty
    return common + _CLEAR_ROUTE_CACHE


def route_headers_response(
    destination: str,
    content_length: int | None = None,
    extra: Sequence[tuple[str, str]] = (),
    remove: Sequence[str] = (),
    scores: Mapping[str, float] | None = None,
) -> bytes:
    """The request-headers answer naming the endpoint (FULL_DUPLEX_STREAMED, or a body-less request).
    `scores` (`ip:port` -> score) go to `envoy.lb` / `x-gateway-destination-endpoint-scores`."""
    common = _routing_common(destination, content_length, extra, remove)
    return _field(_T_REQUEST_HEADERS, _field(_T_HEADERS_RESPONSE, common)) + _lb_metadata(destination, scores)


def route_body_response(
    destination: str,
    new_body: bytes | None,
    extra: Sequence[tuple[str, str]] = (),
    remove: Sequence[str] = (),
    scores: Mapping[str, float] | None = None,
) -> bytes:
    """BUFFERED mode: the routing header mutation rides on the request-body answer; a changed body is
    sent whole with its new Content-Length."""
    common = _routing_common(destination, len(new_body) if new_body is not None else None, extra, remove, new_body)
    return _field(_T_REQUEST_BODY, _field(_T_BODY_RESPONSE, common)) + _lb_metadata(destination, scores)


EMPTY_REQUEST_HEADERS = pb.ProcessingResponse(request_headers=pb.HeadersResponse()).SerializeToString()
EMPTY_REQUEST_BODY = pb.ProcessingResponse(request_body=pb.BodyResponse()).SerializeToString()
EMPTY_RESPONSE_BODY = pb.ProcessingResponse(response_body=pb.BodyResponse()).SerializeToString()
REQUEST_TRAILERS = pb.ProcessingResponse(request_trailers=pb.TrailersResponse()).SerializeToString()
RESPONSE_TRAILERS = pb.ProcessingResponse(response_trailers=pb.TrailersResponse()).SerializeToString()


def _streamed(field: str, body: bytes, eos: bool) -> bytes:
    streamed = (_field(_T_STREAMED_BODY, body) if body else b"") + (_STREAMED_EOS if eos else b"")
    common = _field(_T_BODY_MUTATION, _field(_T_STREAMED, streamed))
    tag = _T_REQUEST_BODY if field == "request_body" else _T_RESPONSE_BODY
    return _field(tag, _field(_T_BODY_RESPONSE, common))


def streamed_request_body(body: bytes, eos: bool) -> Iterator[bytes]:
    """The body re-chunked into streamed_response pieces of at most 62,000 bytes; EoS on the last."""
    size = h.BODY_CHUNK_BYTES
    if len(body) <= size:
        yield _streamed("request_body", body, eos)
        return
    last = (len(body) - 1) // size * size
    for start in range(0, len(body), size):
        yield _streamed("request_body", body[start : start + size], eos and start == last)


def streamed_response_body(body: bytes, eos: bool) -> list[bytes]:
    size = h.BODY_CHUNK_BYTES
    if len(body) <= size:
        return [_streamed("response_body", body, eos)]
    last = (len(body) - 1) // size * size
    return [_streamed("response_body", body[s : s + size], eos and s == last) for s in range(0, len(body), size)]


def response_headers_response(
    set_headers: Mapping[str, str], remove: Sequence[str], metadata: Mapping[str, Mapping[str, object]] | None = None
) -> bytes:
    """The response-headers answer; `x-went-into-resp-headers: true` is always set, as the reference does."""
    if not set_headers and not remove and not metadata:
        return _PLAIN_RESPONSE_HEADERS  # the usual answer: nothing but the marker header
    sets = _WENT_INTO_RESP_HEADERS
    for k, v in set_headers.items():
        sets += _set_header(k, v)
    answer = _field(_T_RESPONSE_HEADERS, _field(_T_HEADERS_RESPONSE, _mutation(sets, remove)))
    return answer + dynamic_metadata(metadata) if metadata else answer


_PLAIN_RESPONSE_HEADERS = _field(
    _T_RESPONSE_HEADERS, _field(_T_HEADERS_RESPONSE, _mutation(_WENT_INTO_RESP_HEADERS, ()))
)


def error_body(err: EppError) -> bytes:
    """An OpenAI-style error object."""
    return orjson.dumps(
        {
            "error": {
                "message": err.message,
                "type": _ERROR_TYPES.get(err.code, "internal_error"),
                "code": err.code.value,
            }
        }
    )


def immediate_response(err: EppError, request_id: str = "", headers: Sequence[tuple[str, str]] = ()) -> bytes:
    sets = [_hvo(h.CONTENT_TYPE, "application/json")]
    if request_id:
        sets.append(_hvo(h.REQUEST_ID, request_id))
    sets.extend(_hvo(k, v) for k, v in headers)
    ir = pb.ImmediateResponse(
        status=HttpStatus(code=err.code.http_status),
        headers=pb.HeaderMutation(set_headers=sets),
        body=error_body(err),
        details=f"llm_epp_{err.code.value}",
    )
    return pb.ProcessingResponse(immediate_response=ir).SerializeToString()


EVICTED_BODY = b"request evicted by flow control"


def evicted_response(request_id: str = "") -> bytes:
    """The answer that ends a dispatched request flow control evicted (llm-d-router's): 429, a plain-text
    body and the dropped-reason header `evicted`. Envoy resets the upstream request; a client whose response
    had already started sees its stream cut."""
    sets = [_hvo(h.DROPPED_REASON, "evicted")]
    if request_id:
        sets.append(_hvo(h.REQUEST_ID, request_id))
    ir = pb.ImmediateResponse(
        status=HttpStatus(code=ErrorCode.RESOURCE_EXHAUSTED.http_status),
        headers=pb.HeaderMutation(set_headers=sets),
        body=EVICTED_BODY,
        details="llm_epp_evicted",
    )
    return pb.ProcessingResponse(immediate_response=ir).SerializeToString()

"""The hand-encoded answers are the messages protobuf builds: byte for byte, and equal once parsed."""

from __future__ import annotations

import pytest
from envoy.config.core.v3.base_pb2 import HeaderValue, HeaderValueOption
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from google.protobuf.struct_pb2 import Struct

from llm_epp.extproc import codec


def _hvo(key: str, value: str) -> HeaderValueOption:
    return HeaderValueOption(header=HeaderValue(key=key, raw_value=value.encode()))


def _metadata(destination: str) -> bytes:
    md = Struct()
    md.update({"envoy.lb": {"x-gateway-destination-endpoint": destination}})
    return pb.ProcessingResponse(dynamic_metadata=md).SerializeToString()


def _common(destination: str, length: int | None, extra: list[tuple[str, str]], remove: list[str]) -> pb.CommonResponse:
    sets = [_hvo("x-gateway-destination-endpoint", destination)]
    if length is not None:
        sets.append(_hvo("content-length", str(length)))
    sets.extend(_hvo(k, v) for k, v in extra)
    return pb.CommonResponse(
        header_mutation=pb.HeaderMutation(set_headers=sets, remove_headers=remove), clear_route_cache=True
    )


ROUTES = [
    ("10.0.0.1:8000", None, [], []),
    ("10.0.0.1:8000", 331, [], []),
    ("10.0.0.2:8000", 70000, [("x-request-id", "r-1"), ("x-empty", "")], ["x-gateway-model-name-rewrite"]),
    ("[fd00::1]:8000", 12, [("traceparent", "00-" + "a" * 32 + "-" + "b" * 16 + "-01")], ["a", "b"]),
    ("10.0.0.3:8000," + ",".join(f"10.0.1.{i}:8000" for i in range(60)), 5, [("k" * 300, "v" * 300)], []),
]


@pytest.mark.parametrize(("destination", "length", "extra", "remove"), ROUTES)
def test_route_headers_answer_is_protobufs_serialisation(
    destination: str, length: int | None, extra: list[tuple[str, str]], remove: list[str]
) -> None:
    want = pb.ProcessingResponse(
        request_headers=pb.HeadersResponse(response=_common(destination, length, extra, remove))
    ).SerializeToString() + _metadata(destination)
    got = codec.route_headers_response(destination, length, extra, remove)
    assert got == want
    assert pb.ProcessingResponse.FromString(got) == pb.ProcessingResponse.FromString(want)


@pytest.mark.parametrize("new_body", [None, b"", b'{"model":"m"}', b"x" * 200_000])
def test_route_body_answer_is_protobufs_serialisation(new_body: bytes | None) -> None:
    common = _common("10.0.0.1:8000", len(new_body) if new_body is not None else None, [("a", "1")], ["b"])
    if new_body is not None:
        common.body_mutation.body = new_body
    want = pb.ProcessingResponse(request_body=pb.BodyResponse(response=common)).SerializeToString()
    got = codec.route_body_response("10.0.0.1:8000", new_body, [("a", "1")], ["b"])
    assert got == want + _metadata("10.0.0.1:8000")
    parsed = pb.ProcessingResponse.FromString(got)
    assert parsed.request_body.response.body_mutation.HasField("body") == (new_body is not None)


@pytest.mark.parametrize("body", [b"", b"data: {}\n\n", b"y" * 62_000])
@pytest.mark.parametrize("eos", [False, True])
def test_streamed_chunks_are_protobufs_serialisation(body: bytes, eos: bool) -> None:
    streamed = pb.StreamedBodyResponse(body=body, end_of_stream=eos)
    common = pb.CommonResponse(body_mutation=pb.BodyMutation(streamed_response=streamed))
    assert list(codec.streamed_request_body(body, eos)) == [
        pb.ProcessingResponse(request_body=pb.BodyResponse(response=common)).SerializeToString()
    ]
    assert codec.streamed_response_body(body, eos) == [
        pb.ProcessingResponse(response_body=pb.BodyResponse(response=common)).SerializeToString()
    ]
    parsed = pb.ProcessingResponse.FromString(codec.streamed_response_body(body, eos)[0])
    assert parsed.response_body.response.body_mutation.HasField("streamed_response")


def test_a_long_body_is_split_into_chunks_that_parse_back() -> None:
    body = bytes(range(256)) * 600  # 153,600 bytes: three chunks
    chunks = [pb.ProcessingResponse.FromString(m) for m in codec.streamed_request_body(body, True)]
    parts = [c.request_body.response.body_mutation.streamed_response for c in chunks]
    assert b"".join(p.body for p in parts) == body
    assert [p.end_of_stream for p in parts] == [False, False, True]


@pytest.mark.parametrize(
    ("sets", "remove"),
    [({}, []), ({"x-a": "1", "x-b": ""}, ["content-length", "x-gateway-destination-endpoint-served"])],
)
def test_response_headers_answer_is_protobufs_serialisation(sets: dict[str, str], remove: list[str]) -> None:
    hvos = [_hvo("x-went-into-resp-headers", "true"), *(_hvo(k, v) for k, v in sets.items())]
    want = pb.ProcessingResponse(
        response_headers=pb.HeadersResponse(
            response=pb.CommonResponse(header_mutation=pb.HeaderMutation(set_headers=hvos, remove_headers=remove))
        )
    ).SerializeToString()
    assert codec.response_headers_response(sets, remove) == want
    with_metadata = codec.response_headers_response(sets, remove, {"ns": {"k": "v"}})
    parsed = pb.ProcessingResponse.FromString(with_metadata)
    assert parsed.response_headers == pb.ProcessingResponse.FromString(want).response_headers
    assert parsed.dynamic_metadata.fields["ns"].struct_value.fields["k"].string_value == "v"

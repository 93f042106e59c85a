"""Property-based fuzzing of every registered parser on the paths it claims: any request body gives a parsed
request or a 400 that says what was wrong, never another error; any response bytes, split anywhere, are
read without an error and the reader holds no more than one message of them."""

from __future__ import annotations

import json
import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llm_epp.framework import EppError, ErrorCode
from llm_epp.framework.parsing import Parser
from llm_epp.plugins.parsers.anthropic_parser import AnthropicParser
from llm_epp.plugins.parsers.grpc_frames import frame
from llm_epp.plugins.parsers.openai_parser import OpenaiParser
from llm_epp.plugins.parsers.sglanghttp_parser import SglanghttpParser
from llm_epp.plugins.parsers.vertexai_parser import VertexaiParser
from llm_epp.plugins.parsers.vllmgrpc_parser import VllmgrpcParser
from llm_epp.plugins.parsers.vllmhttp_parser import VllmhttpParser

FUZZ = settings(
    max_examples=int(os.environ.get("LLM_EPP_FUZZ_EXAMPLES", "80")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
PARSERS: list[tuple[Parser, list[str]]] = [
    (OpenaiParser(), ["/v1/completions", "/v1/chat/completions", "/v1/responses"]),
    (AnthropicParser(), ["/v1/messages", "/v1/messages/count_tokens"]),
    (VllmhttpParser(), ["/inference/v1/generate"]),
    (SglanghttpParser(), ["/generate", "/health_generate"]),
    (VllmgrpcParser(), ["/vllm.grpc.engine.VllmEngine/Generate", "/vllm.grpc.engine.VllmEngine/Embed"]),
    (
        VertexaiParser(),
        [
            "/google.cloud.aiplatform.v1beta1.PredictionService/ChatCompletions",
            "/google.cloud.aiplatform.v1beta1.PredictionService/RawPredict",
        ],
    ),
]
CASES = [(parser, path) for parser, paths in PARSERS for path in paths]

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**40), max_value=2**40)
    | st.floats(allow_nan=False)
    | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20,
)
keys = st.sampled_from(
    ["model", "messages", "system", "prompt", "token_ids", "input_ids", "extra_key", "stream", "tools", "content"]
)
json_bodies = st.dictionaries(keys, json_values, max_size=5).map(lambda d: json.dumps(d).encode())
bodies = st.one_of(
    json_bodies,
    json_bodies.map(frame),  # JSON inside a gRPC frame
    st.binary(max_size=200).map(frame),  # random protobuf-ish messages
    st.binary(max_size=200),
)


@FUZZ
@given(case=st.sampled_from(CASES), body=bodies)
def test_every_parser_answers_every_body_with_a_result_or_a_bad_request(case: tuple[Parser, str], body: bytes) -> None:
    parser, path = case
    try:
        parsed = parser.parse_request(path, {":path": path}, body)
    except EppError as e:
        assert e.code is ErrorCode.BAD_REQUEST, e
        assert e.message
        return
    assert isinstance(parsed.model, str)
    reader = parser.response_reader(parsed, {"content-type": "text/event-stream"})
    if reader is not None:
        reader.feed(body, True)


@FUZZ
@given(
    case=st.sampled_from(CASES),
    content_type=st.sampled_from(["application/json", "text/event-stream", "application/grpc"]),
    data=st.binary(max_size=400),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=6),
)
def test_response_readers_take_any_bytes_split_anywhere(
    case: tuple[Parser, str], content_type: str, data: bytes, cuts: list[int]
) -> None:
    parser, path = case
    parsed = None
    for body in (
        b'{"model": "m", "prompt": "p", "messages": [{"role": "user", "content": "x"}], "token_ids": [1], '
        b'"input_ids": [1], "input": "x"}',
        frame(b"\x1a\x01x"),
    ):
        try:
            parsed = parser.parse_request(path, {":path": path}, body)
            break
        except EppError:
            continue
    if parsed is None:
        return
    reader = parser.response_reader(parsed, {"content-type": content_type})
    if reader is None:
        return
    start = 0
    for cut in sorted(cuts):
        reader.feed(data[start:cut], False)
        start = max(start, cut)
    reader.feed(data[start:], True)
    usage = reader.usage
    assert usage is None or min(usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens) >= 0

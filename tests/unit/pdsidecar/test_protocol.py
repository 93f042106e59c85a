"""Pure request/response rewriting of the sidecar: NIXL v2 legs, generate sampling params, usage folding."""

from __future__ import annotations

from llm_epp.pdsidecar import protocol as p


def test_generate_limits_live_in_sampling_params() -> None:
    body = {"token_ids": [1, 2], "sampling_params": {"max_tokens": 9, "temperature": 0}}
    prefill = p.nixl_prefill_body(body, p.ApiStyle.GENERATE)
    assert prefill["sampling_params"] == {"max_tokens": 1, "min_tokens": 1, "temperature": 0}
    assert body["sampling_params"] == {"max_tokens": 9, "temperature": 0}  # the client's copy is untouched
    assert p.nixl_prefill_body({"token_ids": [1]}, p.ApiStyle.GENERATE)["sampling_params"] == {
        "max_tokens": 1,
        "min_tokens": 1,
    }


def test_responses_usage_uses_input_tokens_details() -> None:
    doc = {"usage": {"input_tokens": 5, "output_tokens": 1}}
    assert p.set_cached_tokens(doc, 3)
    assert doc["usage"]["input_tokens_details"] == {"cached_tokens": 3}
    assert p.cached_tokens(doc) == 3
    event = {"type": "response.completed", "response": {"usage": {"input_tokens": 5}}}
    assert p.set_cached_tokens(event, 2) and p.cached_tokens(event) == 2


def test_sse_rewriter_keeps_non_usage_lines_byte_for_byte() -> None:
    rewriter = p.SseRewriter(7)
    stream = b'data: {"a":1}\r\n\r\nevent: x\ndata: {"usage":{"prompt_tokens":1}}\n\ndata: [DONE]\n\n'
    out = b"".join(rewriter.feed(stream[i : i + 5]) for i in range(0, len(stream), 5)) + rewriter.flush()
    assert out.startswith(b'data: {"a":1}\r\n\r\nevent: x\n')
    assert b'"prompt_tokens_details":{"cached_tokens":7}' in out
    assert out.endswith(b"\n\ndata: [DONE]\n\n")


def test_no_usage_no_change() -> None:
    assert p.rewrite_json(b'{"x": 1}', 5) == b'{"x": 1}'
    assert p.rewrite_json(b"not json", 5) == b"not json"
    assert p.cached_tokens({"usage": {"prompt_tokens": 3}}) is None

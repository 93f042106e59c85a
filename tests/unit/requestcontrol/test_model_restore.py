"""The streaming model-name restorer: every split position, both spacings, end-of-stream flush."""

from __future__ import annotations

import json

import pytest

from llm_epp.requestcontrol.model_restore import ModelNameRestorer

TARGET, INCOMING = "meta/llama-3-8b-v2", "llama"


def restore(chunks: list[bytes], target: str = TARGET, incoming: str = INCOMING) -> bytes:
    r = ModelNameRestorer(target, incoming)
    return b"".join(r.feed(c) for c in chunks) + r.flush()


def expected(doc: bytes, target: str = TARGET, incoming: str = INCOMING) -> bytes:
    t, i = json.dumps(target).encode(), json.dumps(incoming).encode()
    return doc.replace(b'"model":' + t, b'"model":' + i).replace(b'"model": ' + t, b'"model": ' + i)


DOCS = [
    b'{"id":"x","model":"meta/llama-3-8b-v2","choices":[]}',
    b'{"id": "x", "model": "meta/llama-3-8b-v2", "choices": []}',
    b'data: {"model":"meta/llama-3-8b-v2"}\n\ndata: {"model": "meta/llama-3-8b-v2"}\n\ndata: [DONE]\n\n',
    b'{"model":"meta/llama-3-8b-v2-other","note":"\\"model\\""}',  # a longer name is not the target
    b'{"model":"meta/llama-3-8b-v2"',  # ends right after a match
    b'{"text":"no model field here", "q": "\\"model\\":"}',
]


@pytest.mark.parametrize("doc", DOCS, ids=["compact", "spaced", "sse", "longer-name", "ends-on-match", "none"])
def test_every_single_split_position(doc: bytes) -> None:
    want = expected(doc)
    if b"-other" in doc:
        assert want == doc  # the closing quote is part of the pattern
    for cut in range(len(doc) + 1):
        assert restore([doc[:cut], doc[cut:]]) == want, cut


@pytest.mark.parametrize("doc", DOCS[:3], ids=["compact", "spaced", "sse"])
def test_every_pair_of_split_positions(doc: bytes) -> None:
    want = expected(doc)
    for a in range(len(doc) + 1):
        for b in range(a, len(doc) + 1):
            assert restore([doc[:a], doc[a:b], doc[b:]]) == want, (a, b)


def test_byte_at_a_time() -> None:
    doc = DOCS[2]
    assert restore([doc[i : i + 1] for i in range(len(doc))]) == expected(doc)


def test_holds_back_only_a_possible_match() -> None:
    r = ModelNameRestorer(TARGET, INCOMING)
    assert r.feed(b'{"id":"abc",') == b'{"id":"abc",'  # nothing that could become a match
    assert r.feed(b'"mod') == b""
    assert r.feed(b"el-x") == b'"model-x'  # no longer a possible match: released at once
    assert r.flush() == b""


def test_flush_releases_an_unfinished_tail_unchanged() -> None:
    r = ModelNameRestorer(TARGET, INCOMING)
    assert r.feed(b'{"model":"meta/lla') == b"{"
    assert r.flush() == b'"model":"meta/lla'


def test_a_name_that_looks_like_the_field() -> None:
    doc = b'{"model":"model","x":"model"}'
    for cut in range(len(doc) + 1):
        assert restore([doc[:cut], doc[cut:]], target="model", incoming="m") == b'{"model":"m","x":"model"}'

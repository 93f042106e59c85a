"""mm-embeddings-cache-producer / -scorer: requests with the same images go where those images were
encoded; the LRU is bounded per endpoint, forgets deleted endpoints, and the loader wires the pair (with a
token-producer whose render backend reports the images)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from llm_epp.config.loader import load_config_text
from llm_epp.framework import ApiKind, CycleState, Endpoint, EndpointMetadata, InferenceRequest, Metrics, RequestBody
from llm_epp.framework.datalayer import EVENT_DELETE, EndpointEvent
from llm_epp.framework.recorder import NullRecorder
from llm_epp.framework.tokenization import TOKENIZED_PROMPT_KEY, MultiModalFeature, TokenizedPrompt
from llm_epp.framework.types import ProfileResult, SchedulingResult
from llm_epp.plugins import builtin_registry
from llm_epp.plugins.requestcontrol.mm_embeddings_cache_producer import (
    DEFAULT_MATCH_KEY,
    MmEmbeddingsCacheProducer,
    Params,
    lru_capacity,
    match_key,
)
from llm_epp.plugins.scheduling.mm_embeddings_cache_scorer import MmEmbeddingsCacheScorer
from tests.unit.builders import FakeHandle, key


def ep(name: str, i: int) -> Endpoint:
    return Endpoint(EndpointMetadata(key(name), f"10.0.4.{i}", 8000), Metrics())


A, B, C = ep("a", 1), ep("b", 2), ep("c", 3)
POOL = [A, B, C]


def chat(images: list[str]) -> InferenceRequest:
    content: list[dict[str, object]] = [{"type": "text", "text": "what is in these?"}]
    content += [{"type": "image_url", "image_url": {"url": u}} for u in images]
    payload = {"model": "m", "messages": [{"role": "user", "content": content}]}
    return InferenceRequest("r", "m", "m", RequestBody(ApiKind.CHAT_COMPLETIONS, payload))


def tokenized(*hashes: str) -> TokenizedPrompt:
    return TokenizedPrompt(
        tuple(range(40)), mm_features=tuple(MultiModalFeature("image", h, 5 + 8 * i, 8) for i, h in enumerate(hashes))
    )


def routed(result_to: Endpoint) -> SchedulingResult:
    return SchedulingResult({"default": ProfileResult((result_to,))}, "default")


def serve(producer: MmEmbeddingsCacheProducer, prompt: TokenizedPrompt | None, to: Endpoint) -> CycleState:
    cycle = CycleState()
    if prompt is not None:
        cycle.write(TOKENIZED_PROMPT_KEY, prompt)
    asyncio.run(producer.prepare_data(cycle, chat([]), POOL))
    producer.pre_request(cycle, chat([]), routed(to))
    return cycle


def scores(cycle: CycleState, scorer: MmEmbeddingsCacheScorer | None = None) -> dict[str, float]:
    scorer = scorer or MmEmbeddingsCacheScorer()
    return {k.name: v for k, v in scorer.score(cycle, chat([]), POOL).items()}


def test_a_request_scores_the_share_of_its_images_an_endpoint_encoded() -> None:
    producer = MmEmbeddingsCacheProducer("mm-embeddings-cache-producer", Params(), FakeHandle(pool=POOL))
    serve(producer, tokenized("img-1", "img-2"), B)
    serve(producer, tokenized("img-3"), C)
    cycle = serve(producer, tokenized("img-1", "img-3", "img-1", "img-4"), A)  # img-1 twice: counted once
    assert scores(cycle) == {"a": 0.0, "b": pytest.approx(1 / 3), "c": pytest.approx(1 / 3)}
    match = cycle.read(DEFAULT_MATCH_KEY)
    assert match is not None and [i.hash for i in match.items] == ["img-1", "img-3", "img-4"]
    # the routed request's items now count for its endpoint too
    assert scores(serve(producer, tokenized("img-4"), B)) == {"a": 1.0, "b": 0.0, "c": 0.0}


def test_a_request_without_images_leaves_every_endpoint_at_zero() -> None:
    producer = MmEmbeddingsCacheProducer("p", Params(), FakeHandle(pool=POOL))
    serve(producer, tokenized("img-1"), A)
    for prompt in (TokenizedPrompt((1, 2, 3)), None):
        cycle = serve(producer, prompt, A)
        assert cycle.read(producer.match_key) is None
        assert scores(cycle, MmEmbeddingsCacheScorer("s", producer.match_key)) == {"a": 0.0, "b": 0.0, "c": 0.0}
    assert list(producer.caches[A.key]) == ["img-1"]  # nothing recorded for the requests without items


def test_the_lru_holds_cache_size_over_two_mib_items_per_endpoint() -> None:
    assert lru_capacity(4096) == 2048 and lru_capacity(0) == 2048 and lru_capacity(-5) == 2048
    assert lru_capacity(1) == 1
    producer = MmEmbeddingsCacheProducer("p", Params.model_validate({"cacheSizeInMBPerServer": 4}), FakeHandle())
    assert producer.capacity == 2
    for h in ("x", "y", "z"):
        serve(producer, tokenized(h), A)
    assert list(producer.caches[A.key]) == ["y", "z"]
    serve(producer, tokenized("y"), A)  # a hit refreshes the item
    serve(producer, tokenized("w"), A)
    assert list(producer.caches[A.key]) == ["y", "w"]


def test_deleted_and_departed_endpoints_are_forgotten() -> None:
    handle = FakeHandle(pool=POOL)
    producer = MmEmbeddingsCacheProducer("p", Params(), handle)
    for target in POOL:
        serve(producer, tokenized("img"), target)
    assert producer.extract_endpoint_event(EndpointEvent(EVENT_DELETE, B.metadata)) == {}
    assert set(producer.caches) == {A.key, C.key}
    handle.pool = [A]
    handle.clock = 60.0
    serve(producer, None, A)
    assert set(producer.caches) == {A.key, C.key}  # the sweep runs every 2 minutes
    handle.clock = 121.0
    serve(producer, None, A)
    assert set(producer.caches) == {A.key}


def test_a_named_producer_feeds_the_scorer_that_names_it() -> None:
    loaded = load_config_text(
        """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- {type: token-producer}
- {name: enc, type: mm-embeddings-cache-producer, parameters: {cacheSizeInMBPerServer: 8}}
- {type: mm-embeddings-cache-scorer, parameters: {producerName: enc}}
- {name: default-scorer, type: mm-embeddings-cache-scorer}
schedulingProfiles:
- name: default
  plugins: [{pluginRef: mm-embeddings-cache-scorer}, {pluginRef: default-scorer}]
""",
        builtin_registry(),
        NullRecorder(),
    )
    named, created = loaded.plugins["enc"], loaded.plugins["mm-embeddings-cache-producer"]
    assert isinstance(named, MmEmbeddingsCacheProducer) and isinstance(created, MmEmbeddingsCacheProducer)
    assert named.capacity == 4 and created.capacity == 2048  # the unnamed scorer got a default producer
    scorer, default_scorer = loaded.plugins["mm-embeddings-cache-scorer"], loaded.plugins["default-scorer"]
    assert isinstance(scorer, MmEmbeddingsCacheScorer) and isinstance(default_scorer, MmEmbeddingsCacheScorer)
    assert scorer.match_key is match_key("enc") and default_scorer.match_key is DEFAULT_MATCH_KEY


class _Render(BaseHTTPRequestHandler):
    """A render endpoint answering as vLLM does: token ids and, for images, their hashes and placeholders."""

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        urls = [
            part["image_url"]["url"]
            for m in body.get("messages", [])
            if isinstance(m.get("content"), list)
            for part in m["content"]
            if part.get("type") == "image_url"
        ]
        answer = {
            "token_ids": list(range(10 + 8 * len(urls))),
            "features": {
                "mm_hashes": {"image": [f"hash-of-{u}" for u in urls]},
                "mm_placeholders": {"image": [{"offset": 2 + 8 * i, "length": 8} for i in range(len(urls))]},
            }
            if urls
            else None,
        }
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def render_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Render)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_images_reported_by_the_render_endpoint_steer_the_next_request(render_url: str) -> None:
    """The reference sample configuration's pipeline: token-producer (render) -> producer -> scorer."""
    loaded = load_config_text(
        f"""
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: token-producer
  parameters: {{modelName: vlm, vllm: {{url: "{render_url}"}}}}
- type: mm-embeddings-cache-producer
- type: mm-embeddings-cache-scorer
schedulingProfiles:
- name: default
  plugins: [{{pluginRef: mm-embeddings-cache-scorer}}]
""",
        builtin_registry(),
        NullRecorder(),
    )
    scorer = loaded.plugins["mm-embeddings-cache-scorer"]
    assert isinstance(scorer, MmEmbeddingsCacheScorer)

    def run(request: InferenceRequest, to: Endpoint) -> dict[str, float]:
        cycle = CycleState()
        for p in loaded.prepare_data:
            asyncio.run(p.prepare_data(cycle, request, POOL))
        prompt = cycle.read(TOKENIZED_PROMPT_KEY)
        assert prompt is not None
        out = {k.name: v for k, v in scorer.score(cycle, request, POOL).items()}
        for q in loaded.pre_request:
            q.pre_request(cycle, request, routed(to))
        return out

    assert run(chat(["cat.png", "dog.png"]), C) == {"a": 0.0, "b": 0.0, "c": 0.0}
    assert run(chat(["dog.png"]), A) == {"a": 0.0, "b": 0.0, "c": 1.0}
    assert run(chat(["dog.png", "fox.png"]), B) == {"a": 0.5, "b": 0.0, "c": 0.5}
    assert run(chat([]), B) == {"a": 0.0, "b": 0.0, "c": 0.0}

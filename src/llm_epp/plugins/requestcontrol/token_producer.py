"""token-producer

Scheduling intent:
    Tokenize the request's prompt once, before scheduling, so that token-based plugins (above all
    `precise-prefix-cache-producer`, whose block keys must match the engine's blocks) work on the model's
    own token ids. The result goes into the request's CycleState under `TOKENIZED_PROMPT_KEY`.

    Backends (exactly one; `estimate` when none is set):
    - `vllm` (or only `modelName`): the model server's render endpoints, `POST {url}/v1/completions/render`
      (completions; the answer is a list with `token_ids` per prompt, the first is used) and
      `POST {url}/v1/chat/completions/render` (chat; `{token_ids, features, ...}`), sent the client's body
      with `model` set to `modelName` — typically a GPU-less `vllm launch render <model>` sidecar. A chat
      answer's `features.mm_hashes` / `features.mm_placeholders` (per modality, in prompt order) become
      the prompt's multimodal items (`TokenizedPrompt.mm_features`, ordered by placeholder offset), which
      `mm-embeddings-cache-producer` reads.
    - `tokenizerPath` (llm-epp): a local Hugging Face `tokenizer.json` loaded with the `tokenizers`
      library. It tokenizes completions prompts (string, or the first of a list) as the engine does, with
      special tokens added and any padding or truncation the file configures turned off; chat completions
      need the model's chat template, which only the render backend applies, so chat requests get no
      tokens from it.
    - `estimate`: no tokenizer. Token ids the client sent (generate, completions with token-id prompts)
      are used as they are; otherwise the prompt text's UTF-8 bytes are packed four to an id (`exact` is
      False: the ids never match an engine's, so precise prefix routing degrades to no hits).

    Tokenizing runs in a worker thread (`asyncio.to_thread`), never on the event loop. Results are kept in
    a bounded LRU (at most 1024 prompts and 4M token ids) keyed by a digest of the prompt, so a repeated
    prompt is not tokenized again. A request that already carries token ids (`RequestBody.token_ids`) is
    not tokenized. A failure (render endpoint down, timeout) leaves no tokens for the request and is
    counted in `failures`; routing continues without token-based data. The first failure after a success
    is logged as a WARNING (`tokenize_failing`), the first success after failures at INFO
    (`tokenize_recovered`, with how many failed); the failures between are logged at DEBUG.

Inputs consumed:
    InferenceRequest.body (api, payload, token_ids, cache_salt).

Configuration:
    modelName (string): the model the tokens are for; required with `vllm` and `tokenizerPath`.
    vllm.url (string, default http://localhost:8000): base URL of the render endpoints (http only).
    vllm.timeout (duration, default 5s): per render request, text-only prompts.
    vllm.mmTimeout (duration, default 30s): per render request when a chat message has content parts.
    estimate (object): selects the estimate backend. Its `image` / `video` placeholder estimation is not
        supported yet (rejected).
    tokenizerPath (string, llm-epp): a local `tokenizer.json`.
    udsTokenizerConfig: the deprecated UDS tokenizer sidecar is not supported yet (rejected).
    The legacy type name `tokenizer` is accepted as an alias (see `tokenizer`).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import urllib.error
import urllib.request
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, model_validator

from llm_epp.framework import ApiKind, CycleState, Endpoint, Handle, InferenceRequest, PluginParams, TypedName
from llm_epp.framework.durations import parse_go_duration
from llm_epp.framework.tokenization import TOKENIZED_PROMPT_KEY, MultiModalFeature, TokenizedPrompt

log = logging.getLogger(__name__)

TYPE = "token-producer"
DEFAULT_RENDER_URL = "http://localhost:8000"
COMPLETIONS_RENDER_PATH = "/v1/completions/render"
CHAT_RENDER_PATH = "/v1/chat/completions/render"
CACHE_ENTRIES = 1024
CACHE_TOKENS = 4_000_000
_MAX_RENDER_RESPONSE = 64 * 1024 * 1024
_MAX_MM_ITEMS = 1024  # multimodal items taken from one render answer

Rendered = tuple[tuple[int, ...], tuple[MultiModalFeature, ...]]
"""A tokenized prompt: token ids and multimodal items."""


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class VllmConfig(_Strict):
    url: str = DEFAULT_RENDER_URL
    timeout: str = "5s"
    mm_timeout: str = Field(default="30s", alias="mmTimeout")

    @model_validator(mode="after")
    def _check(self) -> VllmConfig:
        if not self.url.startswith("http://"):
            raise ValueError(f"vllm.url {self.url!r}: only plain http:// URLs are supported (as upstream)")
        for name, value in (("timeout", self.timeout), ("mmTimeout", self.mm_timeout)):
            if parse_go_duration(value) <= 0:
                raise ValueError(f"vllm.{name} must be > 0, got {value!r}")
        return self


class Params(PluginParams):
    model_name: str = Field(default="", alias="modelName")
    vllm: VllmConfig | None = None
    estimate: dict[str, Any] | None = None
    tokenizer_path: str = Field(default="", alias="tokenizerPath")
    uds_tokenizer_config: dict[str, Any] | None = Field(default=None, alias="udsTokenizerConfig")

    @model_validator(mode="after")
    def _check(self) -> Params:
        if self.uds_tokenizer_config:
            raise ValueError(
                "udsTokenizerConfig (the UDS tokenizer sidecar) is not supported yet; use vllm.url (a render "
                "endpoint) or tokenizerPath"
            )
        if self.estimate:
            unsupported = sorted(set(self.estimate) & {"image", "video"})
            if unsupported:
                raise ValueError(f"estimate.{unsupported[0]} (multimodal placeholder estimation) is not supported yet")
            unknown = sorted(set(self.estimate) - {"image", "video"})
            if unknown:
                raise ValueError(f"estimate.{unknown[0]}: unknown parameter")
        chosen = [
            n
            for n, on in (
                ("estimate", self.estimate is not None),
                ("vllm", self.vllm is not None or (bool(self.model_name) and not self.tokenizer_path)),
                ("tokenizerPath", bool(self.tokenizer_path)),
            )
            if on
        ]
        if len(chosen) > 1:
            raise ValueError(f"only one of 'estimate', 'vllm' and 'tokenizerPath' may be set (got {', '.join(chosen)})")
        if chosen and chosen[0] in ("vllm", "tokenizerPath") and not self.model_name:
            raise ValueError("'modelName' must be specified with 'vllm' or 'tokenizerPath'")
        return self

    @property
    def backend(self) -> str:
        if self.tokenizer_path:
            return "local"
        if self.vllm is not None or self.model_name:
            return "vllm"
        return "estimate"


def _pack_bytes(data: bytes) -> tuple[int, ...]:
    """UTF-8 bytes, four to a little-endian id (the last one zero-padded)."""
    pad = (-len(data)) % 4
    data += b"\x00" * pad
    return tuple(int.from_bytes(data[i : i + 4], "little") for i in range(0, len(data), 4))


def _prompt_text(payload: Mapping[str, Any]) -> str | None:
    prompt = payload.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        prompt = prompt[0]
    return prompt if isinstance(prompt, str) else None


def _token_prompt(payload: Mapping[str, Any]) -> tuple[int, ...] | None:
    """Token ids a completions client sent as its prompt (`[1, 2, 3]` or `[[1, 2, 3], ...]`)."""
    prompt = payload.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
        prompt = prompt[0]
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return tuple(prompt)
    return None


def _mm_features(features: object) -> tuple[MultiModalFeature, ...]:
    """The multimodal items of a render answer's `features`: `mm_hashes` (modality -> hashes) paired by
    position with `mm_placeholders` (modality -> [{offset, length}]), ordered by offset. Items without a
    string hash are left out; at most `_MAX_MM_ITEMS`."""
    if not isinstance(features, dict):
        return ()
    hashes, places = features.get("mm_hashes"), features.get("mm_placeholders")
    if not isinstance(hashes, dict):
        return ()
    out: list[MultiModalFeature] = []
    for modality, values in hashes.items():
        if not isinstance(modality, str) or not isinstance(values, list):
            continue
        ranges = places.get(modality) if isinstance(places, dict) else None
        for i, value in enumerate(values):
            if not isinstance(value, str) or not value or len(out) >= _MAX_MM_ITEMS:
                continue
            where = ranges[i] if isinstance(ranges, list) and i < len(ranges) else None
            offset = where.get("offset") if isinstance(where, dict) else None
            length = where.get("length") if isinstance(where, dict) else None
            out.append(
                MultiModalFeature(
                    modality,
                    value,
                    offset if isinstance(offset, int) and not isinstance(offset, bool) else 0,
                    length if isinstance(length, int) and not isinstance(length, bool) else 0,
                )
            )
    out.sort(key=lambda f: f.offset)
    return tuple(out)


class _Cache:
    """A bounded LRU of tokenized prompts (entries and total tokens). Used from one thread at a time."""

    def __init__(self, entries: int = CACHE_ENTRIES, tokens: int = CACHE_TOKENS) -> None:
        self._data: OrderedDict[bytes, Rendered] = OrderedDict()
        self._max_entries = entries
        self._max_tokens = tokens
        self._tokens = 0

    def __len__(self) -> int:
        return len(self._data)

    def get(self, key: bytes) -> Rendered | None:
        found = self._data.get(key)
        if found is not None:
            self._data.move_to_end(key)
        return found

    def put(self, key: bytes, rendered: Rendered) -> None:
        size = len(rendered[0]) + len(rendered[1])
        if size > self._max_tokens or key in self._data:
            return
        self._data[key] = rendered
        self._tokens += size
        while len(self._data) > self._max_entries or self._tokens > self._max_tokens:
            _, old = self._data.popitem(last=False)
            self._tokens -= len(old[0]) + len(old[1])


class TokenProducer:
    """PrepareData; see the module docstring."""

    produces = frozenset({TOKENIZED_PROMPT_KEY.name})
    consumes: frozenset[str] = frozenset()

    def __init__(self, name: str, params: Params, type_name: str = TYPE) -> None:
        self._typed_name = TypedName(type_name, name)
        self.params = params
        self.backend = params.backend
        self.failures = 0
        self._failing = False  # the last backend call failed (logged once per outage)
        self._failed_since = 0  # `failures` at the outage's first failure
        self._cache = _Cache()
        self._tokenizer: Any = None
        if self.backend == "local":
            from tokenizers import Tokenizer

            try:
                self._tokenizer = Tokenizer.from_file(params.tokenizer_path)
            except Exception as e:  # the library raises its own exception types
                raise ValueError(f"tokenizerPath {params.tokenizer_path!r}: cannot load a tokenizer.json: {e}") from e
            # a prompt is never padded or cut by the engine (files made for embedding models set both)
            self._tokenizer.no_padding()
            self._tokenizer.no_truncation()
        vllm = params.vllm or VllmConfig()
        self._url = vllm.url.rstrip("/")
        self._timeout = parse_go_duration(vllm.timeout)
        self._mm_timeout = parse_go_duration(vllm.mm_timeout)

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    async def prepare_data(self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> None:
        if cycle.read(TOKENIZED_PROMPT_KEY) is not None:
            return
        body = request.body
        salt = body.cache_salt
        if body.token_ids:
            cycle.write(TOKENIZED_PROMPT_KEY, TokenizedPrompt(body.token_ids, salt))
            return
        sent = _token_prompt(body.payload) if body.api is ApiKind.COMPLETIONS else None
        if sent is not None:
            cycle.write(TOKENIZED_PROMPT_KEY, TokenizedPrompt(sent, salt))
            return
        if self.backend == "estimate":
            text = self._estimate_bytes(request)
            if text:
                cycle.write(TOKENIZED_PROMPT_KEY, TokenizedPrompt(_pack_bytes(text), salt, exact=False))
            return
        try:
            rendered = await asyncio.to_thread(self.tokenize, body.api, body.payload)
        except (OSError, ValueError, urllib.error.URLError) as e:
            self.failures += 1
            if not self._failing:
                self._failing = True
                self._failed_since = self.failures
                log.warning(
                    "tokenize_failing plugin=%s error=%s: requests route without their token ids until the "
                    "tokenizer answers again",
                    self._typed_name,
                    e,
                )
            else:
                log.debug("tokenize_failed plugin=%s error=%s", self._typed_name, e)
            return
        if self._failing:
            self._failing = False
            log.info(
                "tokenize_recovered plugin=%s failed_requests=%d",
                self._typed_name,
                self.failures - self._failed_since + 1,
            )
        if rendered and rendered[0]:
            cycle.write(TOKENIZED_PROMPT_KEY, TokenizedPrompt(rendered[0], salt, mm_features=rendered[1]))

    # --- backends (run in a worker thread) -------------------------------------------------------------
    def tokenize(self, api: ApiKind, payload: Mapping[str, Any]) -> Rendered | None:
        """The prompt's token ids and multimodal items, from the cache or the backend; None when the backend
        has none for this kind of request. Raises OSError / ValueError on backend failures."""
        if api not in (ApiKind.COMPLETIONS, ApiKind.CHAT_COMPLETIONS):
            return None
        if self.backend == "local":
            if api is not ApiKind.COMPLETIONS:
                return None
            text = _prompt_text(payload)
            if text is None:
                return None
            key = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()
            found = self._cache.get(key)
            if found is None:
                found = (tuple(self._tokenizer.encode(text, add_special_tokens=True).ids), ())
                self._cache.put(key, found)
            return found
        body = dict(payload)
        body["model"] = self.params.model_name
        body.pop("stream", None)
        data = orjson.dumps(body, option=orjson.OPT_SORT_KEYS)
        key = hashlib.blake2b(api.value.encode() + b"\x00" + data, digest_size=16).digest()
        found = self._cache.get(key)
        if found is None:
            found = self._render(api, data, payload)
            if found[0]:
                self._cache.put(key, found)
        return found

    def _render(self, api: ApiKind, data: bytes, payload: Mapping[str, Any]) -> Rendered:
        chat = api is ApiKind.CHAT_COMPLETIONS
        timeout = self._timeout
        if chat and any(
            isinstance(m, dict) and isinstance(m.get("content"), list) for m in payload.get("messages") or ()
        ):
            timeout = self._mm_timeout
        req = urllib.request.Request(
            self._url + (CHAT_RENDER_PATH if chat else COMPLETIONS_RENDER_PATH),
            data=data,
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # http only (checked at load)
            raw = resp.read(_MAX_RENDER_RESPONSE)
        try:
            answer = json.loads(raw)
        except json.JSONDecodeError as e:
            raise ValueError(f"render answer is not JSON: {e}") from e
        if isinstance(answer, list):
            answer = answer[0] if answer else None
        ids = answer.get("token_ids") if isinstance(answer, dict) else None
        if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise ValueError("render answer has no token_ids list")
        features = answer.get("features") if chat and isinstance(answer, dict) else None
        return tuple(ids), _mm_features(features)

    def _estimate_bytes(self, request: InferenceRequest) -> bytes:
        payload = request.body.payload
        api = request.body.api
        if api is ApiKind.COMPLETIONS:
            text = _prompt_text(payload)
            return text.encode("utf-8", "surrogatepass") if text else b""
        if api is ApiKind.CHAT_COMPLETIONS:
            messages = payload.get("messages")
            return orjson.dumps(messages) if messages else b""
        if api is ApiKind.MESSAGES:
            return orjson.dumps([payload.get("system"), payload.get("messages")])
        if api is ApiKind.RESPONSES:
            return orjson.dumps([payload.get("instructions"), payload.get("input")])
        if api is ApiKind.EMBEDDINGS:
            value = payload.get("input")
            return orjson.dumps(value) if value is not None else b""
        return b""


def factory(name: str, params: Params, handle: Handle) -> TokenProducer:
    return TokenProducer(name, params)

"""HTTP/1.1 front end of a live simulated vLLM or SGLang pod (:class:`~llm_epp.sim.live.LivePod`).

Stdlib asyncio streams, keep-alive, request bodies with ``content-length`` or chunked.  Binds 127.0.0.1
(port 0 = a free port).  Every response carries ``x-sim-pod: <name>``.  Routes (vLLM-compatible where
vLLM has them; the peer routers' extras as in the team's peers notes):

* ``POST /v1/completions``, ``POST /v1/chat/completions``: JSON with ``usage`` (incl.
  ``prompt_tokens_details.cached_tokens``) or vLLM-style SSE when ``"stream": true``.  ``kv_transfer_params``
  as vLLM's NIXL connector takes them (:mod:`llm_epp.sim.disagg`): a prefill leg's JSON answer names the KV
  to pull; a decode request naming one pulls it (the modelled transfer time) and skips that prefill.  Output length is
  ``max_tokens`` (``max_completion_tokens`` for chat; default 16); the text is synthetic (`` t0 t1 ...``).
  ``model`` selects the base model or a LoRA adapter; unknown models answer 404.
* ``GET /v1/models``, ``GET /health``, ``GET /metrics`` (:mod:`llm_epp.sim.vllm_metrics`, or
  :mod:`llm_epp.sim.sglang_metrics` for a pod with ``engine="sglang"``). A vLLM pod answers the ``name[]``
  query parameter as prometheus_client does (:mod:`llm_epp.sim.metric_names`); an SGLang pod answers it
  with an empty page, as SGLang's multiprocess prometheus_client registry does.
* ``POST /tokenize``, ``POST /v1/completions/render``, ``POST /v1/chat/completions/render``.
* ``POST /reset_prefix_cache`` (vLLM's; 400 while requests run), which publishes ``AllBlocksCleared`` when
  the pod publishes KV-cache events (``kv_events``, :mod:`llm_epp.sim.kv_events`).
* ``GET /get_load`` (``{"load": N}`` as vllm-router reads it, or SGLang's per-rank list with
  ``load_format="sglang"``; the default for an SGLang pod), ``GET /server_info`` (alias
  ``/get_server_info``), ``GET /model_info`` (alias ``/get_model_info``); an SGLang pod answers the last
  two in SGLang's shape (server arguments + scheduler limits + ``internal_states``; model paths and kind).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import orjson

from llm_epp.sim import tokenizer
from llm_epp.sim.disagg import RemotePrefill, is_remote_decode, prefill_kv_transfer_params
from llm_epp.sim.engine import EventKind
from llm_epp.sim.http import BadHTTPRequest, HTTPRequest, read_request
from llm_epp.sim.kv_events import LiveKVEvents, PublisherConfig, kv_topic
from llm_epp.sim.live import LivePod, LiveRequest
from llm_epp.sim.metric_names import requested_names, restrict

__all__ = ["SimServer"]

_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 413: "Payload Too Large"}
_ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 405: "MethodNotAllowed", 413: "BadRequestError"}
DEFAULT_MAX_TOKENS = 16


class HTTPError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param


def error_body(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    """An OpenAI-style error object as vLLM returns it."""
    return {"error": {"message": message, "type": _ERROR_TYPES.get(status, "Error"), "param": param, "code": status}}


def _token_text(index: int) -> str:
    return f" t{index}"


class SimServer:
    """One HTTP server in front of one :class:`LivePod`."""

    def __init__(
        self,
        pod: LivePod,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        load_format: str | None = None,
        kv_events: PublisherConfig | None = None,
    ) -> None:
        """``load_format`` None: ``"sglang"`` for an SGLang pod, else ``"vllm-router"``. ``kv_events``: publish
        KV-cache events over ZMQ as vLLM does (:mod:`llm_epp.sim.kv_events`)."""
        if load_format is None:
            load_format = "sglang" if pod.engine_kind == "sglang" else "vllm-router"
        if load_format not in ("vllm-router", "sglang"):
            raise ValueError("load_format must be 'vllm-router' or 'sglang'")
        self.pod = pod
        self.host = host
        self.port = port
        self.load_format = load_format
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.Task[Any]] = set()
        self._created = int(time.time())
        self.kv_events_config = kv_events
        self.kv_events: LiveKVEvents | None = None

    @property
    def name(self) -> str:
        return self.pod.name

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    async def start(self) -> SimServer:
        await self.pod.start()
        self._server = await asyncio.start_server(self._handle, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        if self.kv_events_config is not None:
            events = LiveKVEvents(self.pod, self.kv_events_config, kv_topic(self.address, self.pod.model))
            try:
                self.kv_events = await asyncio.to_thread(events.start)
            except BaseException:
                await self.stop()
                raise
        return self

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
            for task in list(self._conns):
                task.cancel()
            if self._conns:
                await asyncio.gather(*self._conns, return_exceptions=True)
            await server.wait_closed()
        await self.pod.stop()
        events, self.kv_events = self.kv_events, None
        if events is not None:
            await asyncio.to_thread(events.stop)

    async def __aenter__(self) -> SimServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ------------------------------------------------------------------ HTTP/1.1

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        try:
            while True:
                try:
                    req = await read_request(reader, writer)
                except BadHTTPRequest as exc:
                    self._send_json(writer, exc.status, error_body(exc.status, exc.message), keep_alive=False)
                    await writer.drain()
                    break
                if req is None:
                    break
                keep_alive = "close" not in req.headers.get("connection", "").lower()
                try:
                    await self._dispatch(req, writer, keep_alive)
                except HTTPError as exc:
                    self._send_json(writer, exc.status, error_body(exc.status, exc.message, exc.param), keep_alive)
                await writer.drain()
                if not keep_alive:
                    break
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.CancelledError):
            pass
        finally:
            self._conns.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    def _head(self, status: int, content_type: str, keep_alive: bool, extra: str) -> bytes:
        return (
            f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}\r\ncontent-type: {content_type}\r\n"
            f"x-sim-pod: {self.pod.name}\r\nconnection: {'keep-alive' if keep_alive else 'close'}\r\n{extra}\r\n"
        ).encode("latin-1")

    def _send(
        self, writer: asyncio.StreamWriter, status: int, body: bytes, content_type: str, keep_alive: bool
    ) -> None:
        writer.write(self._head(status, content_type, keep_alive, f"content-length: {len(body)}\r\n") + body)

    def _send_json(self, writer: asyncio.StreamWriter, status: int, obj: Any, keep_alive: bool) -> None:
        self._send(writer, status, orjson.dumps(obj), "application/json", keep_alive)

    # ------------------------------------------------------------------ routes

    async def _dispatch(self, req: HTTPRequest, writer: asyncio.StreamWriter, keep_alive: bool) -> None:
        path, method = req.path, req.method
        post_routes = ("/v1/completions", "/v1/chat/completions", "/tokenize", "/v1/completions/render",
                       "/v1/chat/completions/render", "/reset_prefix_cache")  # fmt: skip
        get_routes = ("/v1/models", "/health", "/metrics", "/get_load", "/server_info", "/get_server_info",
                      "/model_info", "/get_model_info")  # fmt: skip
        if (path in post_routes and method != "POST") or (path in get_routes and method != "GET"):
            raise HTTPError(405, "Method Not Allowed")
        pod = self.pod
        if path in ("/v1/completions", "/v1/chat/completions"):
            await self._completion(req, writer, keep_alive, chat=path == "/v1/chat/completions")
        elif path == "/metrics":
            page = pod.metrics_text()
            if (names := requested_names(req.target)) is not None:
                # SGLang serves prometheus_client in multiprocess mode, whose restricted answer is empty
                page = "" if pod.engine_kind == "sglang" else restrict(page, names)
            self._send(writer, 200, page.encode(), "text/plain; version=0.0.4; charset=utf-8", keep_alive)
        elif path == "/reset_prefix_cache":
            if not pod.reset_prefix_cache():
                raise HTTPError(400, "Failed to reset prefix cache: requests are running")
            self._send(writer, 200, b"", "text/plain", keep_alive)
        elif path == "/health":
            self._send(writer, 200, b"", "text/plain", keep_alive)
        elif path == "/v1/models":
            data = [self._model_card(m, None if m == pod.model else pod.model) for m in pod.served_models]
            self._send_json(writer, 200, {"object": "list", "data": data}, keep_alive)
        elif path == "/tokenize":
            payload = _json(req.body)
            self._model(payload)
            ids = self._prompt_ids(payload, chat="messages" in payload and "prompt" not in payload)
            obj = {
                "count": len(ids),
                "max_model_len": pod.profile.max_model_len,
                "tokens": list(ids),
                "token_strs": None,
            }
            self._send_json(writer, 200, obj, keep_alive)
        elif path in ("/v1/completions/render", "/v1/chat/completions/render"):
            chat = path.startswith("/v1/chat")
            payload = _json(req.body)
            model, _lora = self._model(payload)
            ids = self._prompt_ids(payload, chat=chat)
            item = {"request_id": f"render-{pod.name}", "token_ids": list(ids), "sampling_params": {}, "model": model}
            self._send_json(writer, 200, item if chat else [item], keep_alive)
        elif path == "/get_load":
            m = pod.engine.metrics()
            load: Any
            if self.load_format == "sglang":
                tokens = round(m.kv_cache_usage_perc * pod.profile.kv_capacity_tokens)
                load = [{"dp_rank": 0, "num_reqs": m.num_requests_running + m.num_requests_waiting,
                         "num_waiting_reqs": m.num_requests_waiting, "num_tokens": tokens}]  # fmt: skip
            else:
                load = {"load": m.num_requests_running + m.num_requests_waiting}
            self._send_json(writer, 200, load, keep_alive)
        elif path in ("/server_info", "/get_server_info") and pod.engine_kind == "sglang":
            self._send_json(writer, 200, self._sglang_server_info(), keep_alive)
        elif path in ("/model_info", "/get_model_info") and pod.engine_kind == "sglang":
            info = {"model_path": f"sim/{pod.model}", "tokenizer_path": f"sim/{pod.model}", "is_generation": True,
                    "preferred_sampling_params": None, "weight_version": "default",
                    "has_image_understanding": False, "has_audio_understanding": False}  # fmt: skip
            self._send_json(writer, 200, info, keep_alive)
        elif path in ("/server_info", "/get_server_info"):
            p = pod.profile
            info = {"model_path": f"sim/{pod.model}", "served_model_name": pod.model, "tp_size": 1, "dp_size": 1,
                    "max_model_len": p.max_model_len, "max_running_requests": p.max_num_seqs,
                    "max_total_num_tokens": p.kv_capacity_tokens, "page_size": p.block_size}  # fmt: skip
            self._send_json(writer, 200, info, keep_alive)
        elif path in ("/model_info", "/get_model_info"):
            info = {"model_path": f"sim/{pod.model}", "tokenizer_path": f"sim/{pod.model}", "is_generation": True}
            self._send_json(writer, 200, info, keep_alive)
        else:
            raise HTTPError(404, f"no route for {method} {path}")

    def _sglang_server_info(self) -> dict[str, Any]:
        """``/get_server_info`` as SGLang shapes it: server arguments, scheduler limits, one rank's state."""
        pod = self.pod
        p = pod.profile
        args = {"model_path": f"sim/{pod.model}", "tokenizer_path": f"sim/{pod.model}",
                "served_model_name": pod.model, "host": self.host, "port": self.port,
                "context_length": p.max_model_len, "tp_size": 1, "pp_size": 1, "dp_size": 1,
                "max_running_requests": p.max_num_seqs, "max_total_tokens": p.kv_capacity_tokens,
                "chunked_prefill_size": p.max_num_batched_tokens, "max_prefill_tokens": p.max_num_batched_tokens,
                "page_size": p.block_size, "enable_metrics": True, "enable_lora": bool(pod.loras),
                "max_loras_per_batch": p.max_loras, "lora_paths": list(pod.loras) or None}  # fmt: skip
        limits = {"max_total_num_tokens": p.kv_capacity_tokens, "max_req_input_len": p.max_model_len - 1}
        return {**args, **limits, "internal_states": [dict(limits)], "version": "llm-epp-sim"}

    def _model_card(self, model_id: str, parent: str | None) -> dict[str, Any]:
        return {"id": model_id, "object": "model", "created": self._created, "owned_by": "llm-epp-sim",
                "root": model_id, "parent": parent, "max_model_len": self.pod.profile.max_model_len}  # fmt: skip

    def _model(self, payload: dict[str, Any]) -> tuple[str, str | None]:
        """(model name echoed back, LoRA adapter or None); 404 for a model this pod does not serve."""
        model = payload.get("model")
        pod = self.pod
        if model is None or model == pod.model:
            return pod.model, None
        if isinstance(model, str) and model in pod.loras:
            return model, model
        raise HTTPError(404, f"The model `{model}` does not exist.", "model")

    def _prompt_ids(self, payload: dict[str, Any], *, chat: bool) -> tuple[int, ...]:
        if chat:
            messages = payload.get("messages")
            if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
                raise HTTPError(400, "'messages' must be a non-empty list of message objects", "messages")
            ids = tokenizer.encode_chat(messages, bool(payload.get("add_generation_prompt", True)))
        else:
            prompt = payload.get("prompt")
            if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
                prompt = prompt[0]
            if isinstance(prompt, str):
                ids = tokenizer.encode(prompt)
            elif isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
                ids = tuple(prompt)
            elif prompt is None:
                raise HTTPError(400, "'prompt' is required", "prompt")
            else:
                raise HTTPError(400, "'prompt' must be a string or a list of token ids", "prompt")
        if not ids:
            raise HTTPError(400, "The prompt cannot be empty", "prompt")
        return ids

    async def _completion(
        self, req: HTTPRequest, writer: asyncio.StreamWriter, keep_alive: bool, *, chat: bool
    ) -> None:
        pod = self.pod
        payload = _json(req.body)
        model, lora = self._model(payload)
        ids = self._prompt_ids(payload, chat=chat)
        raw_max = payload.get("max_completion_tokens") if chat else None
        if raw_max is None:
            raw_max = payload.get("max_tokens")
        max_tokens = DEFAULT_MAX_TOKENS if raw_max is None else raw_max
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise HTTPError(400, "max_tokens must be an integer >= 1", "max_tokens")
        limit = pod.profile.max_model_len
        if len(ids) + max_tokens > limit:
            raise HTTPError(
                400,
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{len(ids) + max_tokens} tokens ({len(ids)} in the messages, {max_tokens} in the completion). "
                "Please reduce the length of the messages or completion.",
                "max_tokens" if len(ids) < limit else "prompt",
            )
        stream = bool(payload.get("stream"))
        kv_params = payload.get("kv_transfer_params")
        external = 0
        if RemotePrefill.parse(kv_params) is not None:  # the prefill ran elsewhere: pull its KV first
            await pod.pull_kv(ids, lora)
            external = len(ids)
        try:
            live = pod.submit(ids, max_tokens, lora, stream=stream, external_tokens=external)
        except ValueError as exc:
            raise HTTPError(400, str(exc)) from None
        prefix = "chatcmpl" if chat else "cmpl"
        base = {"id": f"{prefix}-{live.id}", "object": "", "created": int(time.time()), "model": model}
        try:
            if stream:
                opts = payload.get("stream_options")
                usage_chunk = isinstance(opts, dict) and bool(opts.get("include_usage"))
                await self._stream(live, writer, keep_alive, base, chat, max_tokens, usage_chunk)
            else:
                ev = await live.queue.get()
                usage = _usage(ev.prompt_tokens, ev.cached_tokens, ev.completion_tokens)
                text = "".join(_token_text(i) for i in range(max_tokens))
                choice: dict[str, Any]
                if chat:
                    base["object"] = "chat.completion"
                    choice = {"index": 0, "message": {"role": "assistant", "content": text, "tool_calls": []},
                              "logprobs": None, "finish_reason": "length", "stop_reason": None}  # fmt: skip
                else:
                    base["object"] = "text_completion"
                    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length",
                              "stop_reason": None, "prompt_logprobs": None}  # fmt: skip
                answer = {**base, "choices": [choice], "usage": usage}
                if is_remote_decode(kv_params):  # a prefill leg: say where the decode pod pulls the KV from
                    answer["kv_transfer_params"] = prefill_kv_transfer_params(
                        engine_id=pod.engine_id,
                        request_id=live.id,
                        num_prompt_tokens=ev.prompt_tokens,
                        block_size=pod.profile.block_size,
                        host=self.host,
                        port=self.port,
                    )
                self._send_json(writer, 200, answer, keep_alive)
        except BaseException:
            pod.abandon(live)
            raise

    async def _stream(
        self,
        live: LiveRequest,
        writer: asyncio.StreamWriter,
        keep_alive: bool,
        base: dict[str, Any],
        chat: bool,
        max_tokens: int,
        usage_chunk: bool,
    ) -> None:
        base["object"] = "chat.completion.chunk" if chat else "text_completion"
        extra = "transfer-encoding: chunked\r\ncache-control: no-cache\r\n"
        writer.write(self._head(200, "text/event-stream; charset=utf-8", keep_alive, extra))
        queue = live.queue
        dumps = orjson.dumps
        while True:
            ev = await queue.get()
            if ev.kind is EventKind.FINISHED:
                break
            i = ev.token_index
            finish = "length" if i == max_tokens - 1 else None
            choice: dict[str, Any]
            if chat:
                if i == 0:
                    role = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                            "finish_reason": None}  # fmt: skip
                    _chunk(writer, b"data: " + dumps({**base, "choices": [role]}) + b"\n\n")
                choice = {"index": 0, "delta": {"content": _token_text(i)}, "logprobs": None, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": _token_text(i), "logprobs": None, "finish_reason": finish,
                          "stop_reason": None}  # fmt: skip
            _chunk(writer, b"data: " + dumps({**base, "choices": [choice]}) + b"\n\n")
            if queue.empty():
                await writer.drain()
        if usage_chunk:
            usage = _usage(ev.prompt_tokens, ev.cached_tokens, ev.completion_tokens)
            _chunk(writer, b"data: " + dumps({**base, "choices": [], "usage": usage}) + b"\n\n")
        _chunk(writer, b"data: [DONE]\n\n")
        writer.write(b"0\r\n\r\n")


def _chunk(writer: asyncio.StreamWriter, data: bytes) -> None:
    writer.write(b"%x\r\n%s\r\n" % (len(data), data))


def _usage(prompt: int, cached: int, completion: int) -> dict[str, Any]:
    return {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion,
            "prompt_tokens_details": {"cached_tokens": cached}}  # fmt: skip


def _json(body: bytes) -> dict[str, Any]:
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise HTTPError(400, f"Invalid JSON body: {exc}") from None
    if not isinstance(payload, dict):
        raise HTTPError(400, "The request body must be a JSON object")
    return payload

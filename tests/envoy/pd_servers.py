"""Loopback stand-ins for the model servers of a prefill/decode pool, and `llm-epp pd-sidecar` as a child
process in front of the decode one.

`VllmStandin` answers the two legs of a disaggregated request the way vLLM with the NIXL connector does:
a prefill leg (`kv_transfer_params.do_remote_decode: true`) gets a one-token JSON completion carrying the
`kv_transfer_params` a decode instance needs to pull the KV blocks (engine id, block ids, host, port) and
the usage with the prefill's cached prompt tokens; a prompt holding `REJECT_MARKER` is refused with HTTP 400 and vLLM's
error object; any other completion request, with or without those
parameters, is answered in full, as one JSON body or as a server-sent-events stream ending in a usage
chunk when `stream_options.include_usage` is set. Every request is recorded. Responses close the
connection, so a stopped stand-in is really unreachable (no pooled connection keeps talking to it).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from llm_epp.sim.metric_names import requested_names, restrict
from tests.support.http_body import read_request_body
from tests.support.ports import free_port

COMPLETION_PATHS = ("/v1/completions", "/v1/chat/completions")
CHARS_PER_TOKEN = 4  # the stand-ins count prompt tokens as characters / 4
REJECT_MARKER = "[too-long]"  # a prompt holding this is refused with HTTP 400, as vLLM refuses a too long one


@dataclass(frozen=True)
class Received:
    method: str
    path: str
    headers: dict[str, str]  # lower-case names
    body: Any  # the decoded JSON body (None when there was none)


def prompt_text(body: dict[str, Any]) -> str:
    if "messages" in body:
        return "".join(str(m.get("content", "")) for m in body["messages"] if isinstance(m, dict))
    prompt = body.get("prompt", "")
    return prompt if isinstance(prompt, str) else json.dumps(prompt)


class VllmStandin:
    """One model server on 127.0.0.1. `cached_tokens` is what its usage reports as cached prompt tokens."""

    def __init__(self, name: str, *, cached_tokens: int = 0) -> None:
        self.name = name
        self.cached_tokens = cached_tokens
        self.engine_id = f"engine-{name}"
        self.received: list[Received] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def completions(self) -> list[Received]:
        """The completion requests received so far (scrapes and health checks left out)."""
        with self._lock:
            return [r for r in self.received if r.method == "POST" and r.path in COMPLETION_PATHS]

    def reset(self) -> None:
        with self._lock:
            self.received.clear()

    def start(self) -> VllmStandin:
        """Listens on a free port, or again on the same port after `stop`."""
        server = ThreadingHTTPServer(("127.0.0.1", self.port), _handler(self))
        server.daemon_threads = True
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name=f"standin-{self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def record(self, received: Received) -> None:
        with self._lock:
            self.received.append(received)

    def kv_transfer_params(self) -> dict[str, Any]:
        """What vLLM's NIXL connector returns from a prefill for the decode instance."""
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_engine_id": self.engine_id,
            "remote_block_ids": [11, 12, 13, 14],
            "remote_host": "127.0.0.1",
            "remote_port": 5600,
            "tp_size": 1,
        }


def _usage(prompt_tokens: int, completion_tokens: int, cached: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def _handler(standin: VllmStandin) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass

        def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("content-type", ctype)
            self.send_header("content-length", str(len(body)))
            self.send_header("connection", "close")
            self.end_headers()
            self.wfile.write(body)
            self.close_connection = True

        def do_GET(self) -> None:
            standin.record(Received("GET", self.path, {k.lower(): v for k, v in self.headers.items()}, None))
            if self.path.split("?", 1)[0] == "/metrics":
                text = (
                    "# TYPE vllm:num_requests_waiting gauge\n"
                    'vllm:num_requests_waiting{model_name="m"} 0\n'
                    "# TYPE vllm:num_requests_running gauge\n"
                    'vllm:num_requests_running{model_name="m"} 0\n'
                    "# TYPE vllm:kv_cache_usage_perc gauge\n"
                    'vllm:kv_cache_usage_perc{model_name="m"} 0.1\n'
                )
                if (names := requested_names(self.path)) is not None:
                    text = restrict(text, names)
                self._send(200, text.encode(), "text/plain; version=0.0.4")
            else:
                self._send(200, b"{}")

        def do_POST(self) -> None:
            raw = read_request_body(self)
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = None
            standin.record(Received("POST", self.path, {k.lower(): v for k, v in self.headers.items()}, body))
            if self.path not in COMPLETION_PATHS or not isinstance(body, dict):
                self._send(404, b'{"error": "not found"}')
                return
            chat = self.path == "/v1/chat/completions"
            prompt_tokens = max(1, len(prompt_text(body)) // CHARS_PER_TOKEN)
            kv = body.get("kv_transfer_params")
            if REJECT_MARKER in prompt_text(body):
                error = {
                    "object": "error",
                    "message": f"This model's maximum context length is 8 tokens; the prompt has {prompt_tokens}",
                    "type": "BadRequestError",
                    "param": None,
                    "code": 400,
                }
                self._send(400, json.dumps(error).encode())
            elif isinstance(kv, dict) and kv.get("do_remote_decode"):
                self._prefill(body, chat, prompt_tokens)
            else:
                # a decode that pulled the KV blocks counts the transferred prompt as cached
                pulled = isinstance(kv, dict) and kv.get("remote_engine_id") is not None
                cached = prompt_tokens - 1 if pulled else standin.cached_tokens
                self._answer(body, chat, prompt_tokens, cached)

        def _prefill(self, body: dict[str, Any], chat: bool, prompt_tokens: int) -> None:
            answer = {
                "id": "cmpl-prefill",
                "object": "chat.completion" if chat else "text_completion",
                "model": body.get("model"),
                "choices": [_choice(chat, "x", "length")],
                "usage": _usage(prompt_tokens, 1, standin.cached_tokens),
                "kv_transfer_params": standin.kv_transfer_params(),
            }
            self._send(200, json.dumps(answer).encode())

        def _answer(self, body: dict[str, Any], chat: bool, prompt_tokens: int, cached: int) -> None:
            n = int(body.get("max_tokens") or 16)
            usage = _usage(prompt_tokens, n, cached)
            if not body.get("stream"):
                answer = {
                    "id": "cmpl-decode",
                    "object": "chat.completion" if chat else "text_completion",
                    "model": body.get("model"),
                    "choices": [_choice(chat, "".join(f"t{i} " for i in range(n)), "length")],
                    "usage": usage,
                }
                self._send(200, json.dumps(answer).encode())
                return
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("transfer-encoding", "chunked")
            self.send_header("connection", "close")
            self.end_headers()
            events = []
            for i in range(n):
                chunk = {"id": "cmpl-decode", "model": body.get("model"), "choices": [_delta(chat, f"t{i} ")]}
                events.append(chunk)
            if (body.get("stream_options") or {}).get("include_usage"):
                events.append({"id": "cmpl-decode", "model": body.get("model"), "choices": [], "usage": usage})
            for event in events:
                self._chunk(b"data: " + json.dumps(event).encode() + b"\n\n")
            self._chunk(b"data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
            self.close_connection = True

        def _chunk(self, data: bytes) -> None:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

    return Handler


def _choice(chat: bool, text: str, finish: str) -> dict[str, Any]:
    if chat:
        return {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
    return {"index": 0, "text": text, "finish_reason": finish}


def _delta(chat: bool, text: str) -> dict[str, Any]:
    if chat:
        return {"index": 0, "delta": {"content": text}, "finish_reason": None}
    return {"index": 0, "text": text, "finish_reason": None}


class SidecarProcess:
    """`llm-epp pd-sidecar` as a child process on a free loopback port, in front of `model_server`."""

    def __init__(self, model_server: VllmStandin, *args: str, startup_timeout: float = 30.0) -> None:
        self.model_server = model_server
        self.args = list(args)
        self.startup_timeout = startup_timeout
        self.port = free_port()  # known before the start, for the pool file that names the sidecar
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = Path(tempfile.mkdtemp(prefix="pd-sidecar-")) / "sidecar.log"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def url(self, path: str) -> str:
        return f"http://{self.address}{path}"

    def start(self) -> SidecarProcess:
        exe = str(Path(sys.executable).parent / "llm-epp")
        cmd = [
            exe,
            "pd-sidecar",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--model-server-host",
            "127.0.0.1",
            "--model-server-port",
            str(self.model_server.port),
            *self.args,
        ]
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.startup_timeout
        while True:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"llm-epp pd-sidecar did not start:\n{self.log()}")
            try:
                with urllib.request.urlopen(self.url("/health"), timeout=1) as resp:
                    if resp.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(0.05)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if getattr(self, "_log", None) is not None:
            self._log.close()

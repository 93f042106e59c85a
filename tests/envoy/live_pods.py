"""Live simulated vLLM pods publishing KV-cache events over ZMQ on 127.0.0.1, for real-Envoy tests.

The pods run on an asyncio loop in a background thread. Pod `i` is named `sim-rank-<i>` and binds its PUB
socket on `zmq_base + i` and its replay ROUTER on `replay_base + i`, so an EPP configured with
`socketPort: zmq_base`, `replaySocketPort: replay_base` finds each one through the data-parallel rank
offset of its name. One extra pod, not in the pool, answers the token-producer's render requests."""

from __future__ import annotations

import asyncio
import random
import socket
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

import httpx
import yaml

from llm_epp.sim.kv_events import KVEventsOptions, PublisherConfig, ZmqKVEventPublisher
from llm_epp.sim.live import LivePod
from llm_epp.sim.profiles import TINY
from llm_epp.sim.server import SimServer

T = TypeVar("T")
MODEL = "sim-model"


def free_port_range(n: int) -> int:
    """A base port P with P..P+n-1 free on 127.0.0.1 right now."""
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20000, 60000 - n)
        socks: list[socket.socket] = []
        try:
            for port in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no {n} consecutive free ports found")


class LivePods:
    def __init__(
        self, n: int, *, encodings: tuple[str, ...] = ("array",), time_scale: float = 0.05, engine: str = "vllm"
    ) -> None:
        """Pod `i` encodes its batches with `encodings[i % len(encodings)]` (vLLM pods); `engine` "sglang":
        SGLang pods publishing SGLang's events."""
        self.n = n
        self.engine = engine
        self.encodings = encodings if engine == "vllm" else ("array",)
        self.time_scale = time_scale
        base = free_port_range(2 * n)
        self.zmq_base, self.replay_base = base, base + n
        self.servers: list[SimServer] = []
        self.render: SimServer | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="live-pods", daemon=True)

    def _server(self, i: int, port: int = 0) -> SimServer:
        pod = LivePod(f"sim-rank-{i}", TINY, model=MODEL, time_scale=self.time_scale, engine=self.engine)
        kv = PublisherConfig(
            f"tcp://127.0.0.1:{self.zmq_base + i}",
            replay_endpoint=f"tcp://127.0.0.1:{self.replay_base + i}",
            bind=True,
            options=KVEventsOptions(engine=self.engine, encoding=self.encodings[i % len(self.encodings)]),
        )
        return SimServer(pod, port=port, kv_events=kv)

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(30)

    def start(self) -> LivePods:
        self._thread.start()

        async def up() -> None:
            for i in range(self.n):
                self.servers.append(await self._server(i).start())
            self.render = await SimServer(LivePod("render", TINY, model=MODEL)).start()

        self.call(up())
        return self

    def stop(self) -> None:
        async def down() -> None:
            await asyncio.gather(*(s.stop() for s in [*self.servers, *([self.render] if self.render else [])]))

        self.call(down())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def restart(self, i: int) -> None:
        """Stops pod `i` and starts a new one on the same ports: an empty cache, sequence numbers from 0."""
        old = self.servers[i]

        async def again() -> SimServer:
            await old.stop()
            return await self._server(i, old.port).start()

        self.servers[i] = self.call(again())

    def publisher(self, i: int) -> ZmqKVEventPublisher:
        events = self.servers[i].kv_events
        assert events is not None
        return events.publisher

    def index_of(self, name: str) -> int:
        return [s.name for s in self.servers].index(name)

    def endpoints_yaml(self) -> str:
        eps = [{"name": s.name, "address": "127.0.0.1", "port": s.port} for s in self.servers]
        return yaml.safe_dump({"endpoints": eps})

    def config(self) -> str:
        assert self.render is not None
        return f"""\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: token-producer
  parameters:
    modelName: {MODEL}
    vllm: {{url: "{self.render.url}"}}
- type: precise-prefix-cache-producer
  parameters:
    indexerConfig:
      kvBlockIndexConfig: {{enableMetrics: true}}
    kvEventsConfig:
      engineType: {self.engine}
      concurrency: 2
      podDiscoveryConfig: {{socketPort: {self.zmq_base}, replaySocketPort: {self.replay_base}}}
- type: precise-prefix-cache-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: precise-prefix-cache-scorer
  - pluginRef: max-score-picker
"""

    def post_direct(self, i: int, prompt: str, max_tokens: int = 4) -> None:
        """A request straight to pod `i` (not through the gateway)."""
        body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens}
        r = httpx.post(self.servers[i].url + "/v1/completions", json=body, timeout=30)
        r.raise_for_status()

    def cached_tokens(self, i: int, prompt_ids: tuple[int, ...]) -> int:
        """Leading tokens of `prompt_ids` pod `i` holds in its prefix cache now."""
        engine = self.servers[i].pod.engine

        async def read() -> int:
            return engine.cached_prefix_tokens(prompt_ids)

        return self.call(read())

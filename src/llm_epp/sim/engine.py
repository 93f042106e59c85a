"""A vLLM-like engine model of ONE pod, advanced by a virtual clock it is given.

Pure code: no asyncio, no sockets, no wall clock.  The caller owns time::

    engine = Engine(TINY)
    engine.submit(SimRequest("a", prompt_ids, max_tokens=32), now=0.0)
    while (t := engine.next_event_time()) is not None:
        for event in engine.advance(t):
            ...

What is modelled (see ``docs/simulator.md``):

* Continuous batching in steps.  Each step first serves the running batch (oldest first): a decoding
  request gets one token, a request still prefilling gets a chunk of its remaining prompt, within the
  step budget ``max_num_batched_tokens`` (chunked prefill).  If no running request was preempted, waiting
  requests are then admitted in FIFO order while there is a seat (``max_num_seqs``), budget and KV room;
  the first one that does not fit in the KV cache stops admission (head-of-line).  A request waiting for a
  LoRA slot is skipped (keeps its place) and later requests may go first, as in vLLM.
* Step duration from :class:`~llm_epp.sim.profiles.Profile`:
  ``step_base + prefill_cost_per_token * prefill_tokens + decode_cost_per_seq * decoding_seqs +
  kv_read_cost_per_token * kv_tokens + lora_load_time * adapters_loaded``, where ``kv_tokens`` is the
  context (computed + newly scheduled tokens) of every request scheduled in the step.  Tokens produced by a
  step are emitted at its end.
* Block-level prefix cache, as vLLM V1's block pool: ``block_size`` tokens per block, ``num_gpu_blocks``
  blocks.  Every full block whose KV has been computed is content-addressed, prompt and generated tokens
  alike: block ``i``'s id is ``xxh3_64(parent id || token ids of block i)`` with a root id derived from the
  LoRA adapter name (so adapters never share blocks).  Generated tokens are a deterministic function of the
  request id and their position, so a request's generated blocks are its own.  Blocks held by running
  requests are pinned (reference counted).  Free blocks form ONE queue: blocks never used yet first, then
  freed blocks, cached or not, in the order they were freed (a request's blocks are freed tail first, so its
  tail is evicted first); an allocation takes the head of the queue and evicts its cached content.  A request
  being admitted reuses the longest cached run of its full blocks, at most ``num_tokens - 1`` tokens (one
  token is always computed, as in vLLM); those tokens are not prefilled.  Prefix-cache queries and hits
  count new requests only (vLLM counts resumed ones apart); ``cached_tokens`` is the first admission's hit.
* Remote prefill (P/D disaggregation): a request may say that its first ``external_tokens`` prompt tokens
  were computed elsewhere and their KV received (:mod:`llm_epp.sim.disagg` models the transfer); at first
  admission those count as computed (blocks are allocated for them, no prefill cost), all but the last
  prompt token at most.
* Preemption by recompute (vLLM V1, FCFS): when a running request needs a block and none is free, the
  running request scheduled last is preempted: its blocks are freed (their cached content stays until
  evicted) and it goes back to the FRONT of the waiting queue; when readmitted it looks up prompt + tokens
  generated so far in the prefix cache, like any request, prefills what was evicted in the meantime, and
  continues.  Tokens already emitted are not emitted again.  No new request is admitted in a step that
  preempted.
* LoRA: ``max_loras`` resident adapters.  Admitting a request whose adapter is not resident loads it
  into a free slot, or unloads the least recently used resident adapter that no running request uses;
  otherwise the request waits.  A load adds ``lora_load_time`` to that step; a resident adapter is not
  paid for again.
* Output length: exactly ``max_tokens`` tokens, always (as if ``ignore_eos`` were set; the model never
  stops early, so runs are deterministic).

* KV-cache events: an optional ``kv_listener`` (:class:`KVCacheListener`) is told of blocks becoming full,
  cached blocks evicted and ``reset_prefix_cache``, as vLLM's block pool reports them
  (:mod:`llm_epp.sim.kv_events` turns that into vLLM's events).  Generated tokens have ids
  (:func:`generated_token_id`) so blocks holding output can be published too.

Timing rules: a step starts when the previous one ends, or when a request arrives at an idle engine.  The
step's composition is fixed when it starts; a request submitted at exactly a step's start time is
included if it is submitted before the engine is asked about that step (``next_event_time`` / an
``advance`` past it).  ``submit(now)`` requires the engine to have been advanced to ``now``.
"""

from __future__ import annotations

import enum
import struct
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import xxhash

from llm_epp.sim.profiles import Profile

__all__ = [
    "Engine",
    "EngineMetrics",
    "EventKind",
    "KVCacheListener",
    "RequestEvent",
    "SimRequest",
    "StepInfo",
    "block_hashes",
    "generated_token_id",
]

_ROOT_NO_LORA = xxhash.xxh3_64_intdigest(b"llm-epp-sim:root")
_GENERATED = struct.Struct("<QQQ")
"""Content id of a block holding generated tokens: (parent id, request salt, block index) + any prompt tail."""


def _root_hash(lora: str | None) -> int:
    if lora is None:
        return _ROOT_NO_LORA
    return xxhash.xxh3_64_intdigest(b"llm-epp-sim:lora:" + lora.encode("utf-8"))


def block_hashes(token_ids: Sequence[int], block_size: int, lora: str | None = None) -> list[int]:
    """Chained content ids (64-bit) of the full blocks of ``token_ids``; a trailing partial block has none.

    Block ``i``'s id hashes block ``i - 1``'s id and the block's token ids (signed 64-bit), so equal ids mean
    equal prefixes.  The chain's root depends on ``lora``.
    """
    packer = struct.Struct(f"<Q{block_size}q")
    parent = _root_hash(lora)
    out: list[int] = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = xxhash.xxh3_64_intdigest(packer.pack(parent, *token_ids[start : start + block_size]))
        out.append(parent)
    return out


_GENERATED_TOKEN = struct.Struct("<QQ")
_VOCAB = 151_936


def generated_token_id(salt: int, index: int) -> int:
    """The id of output token ``index`` of the request whose salt is ``salt`` (a pure function, like the
    content ids of generated blocks; only needed where token ids are shown, e.g. in KV events)."""
    return xxhash.xxh3_64_intdigest(_GENERATED_TOKEN.pack(salt, index)) % _VOCAB


class KVCacheListener(Protocol):
    """Told when the prefix cache changes, as vLLM's block pool reports it for KV-cache events.

    Called from inside :meth:`Engine.advance` / :meth:`Engine.next_event_time` (no time is passed: the
    owner reads the events after advancing, as vLLM publishes them after each step)."""

    def blocks_stored(
        self,
        block_ids: Sequence[int],
        parent_id: int | None,
        first_block: int,
        lora: str | None,
        tokens: Callable[[int, int], Sequence[int]],
    ) -> None:
        """Blocks ``first_block..`` of one request became full (their KV was computed); ``parent_id`` is the
        content id of block ``first_block - 1`` (None for block 0) and ``tokens(start, end)`` gives the
        request's token ids in ``[start, end)`` (prompt, then generated)."""
        ...

    def block_removed(self, block_id: int) -> None:
        """A cached block was evicted to make room."""
        ...

    def all_cleared(self) -> None:
        """The whole prefix cache was reset."""
        ...


@dataclass(frozen=True, slots=True)
class SimRequest:
    """One generation request: ``max_tokens`` output tokens are produced (see the module docstring)."""

    id: str
    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    lora: str | None = None
    external_tokens: int = 0
    """Leading prompt tokens whose KV another pod computed and this one has received (a remote prefill): at
    first admission they count as computed, beyond the local prefix-cache hit and capped at all tokens but
    the last, and are not prefilled (the last token is, as vLLM does after a KV transfer)."""


class EventKind(enum.Enum):
    FIRST_TOKEN = "first_token"
    """Output token 0 was produced (``time`` - arrival = TTFT)."""
    TOKEN = "token"
    """Output token ``token_index`` >= 1 was produced."""
    FINISHED = "finished"
    """The request completed; follows its last token's event, at the same time."""


@dataclass(frozen=True, slots=True)
class RequestEvent:
    kind: EventKind
    request_id: str
    time: float
    token_index: int = 0
    """0-based index of the output token (FIRST_TOKEN / TOKEN)."""
    prompt_tokens: int = 0
    """FIRST_TOKEN and FINISHED."""
    cached_tokens: int = 0
    """FIRST_TOKEN and FINISHED: prompt tokens served from the prefix cache at first admission."""
    completion_tokens: int = 0
    """FINISHED."""
    preemptions: int = 0
    """FINISHED: how many times the request was preempted."""


@dataclass(frozen=True, slots=True)
class StepInfo:
    """One engine step, as :attr:`Engine.step_observer` is told of it when the step is planned."""

    start: float
    duration: float
    decoding: int
    """Sequences that emit their next output token in this step."""
    prefill_tokens: int
    """Prompt (or recomputed) tokens computed in this step."""
    kv_tokens: int
    """Context tokens the scheduled sequences read."""


@dataclass(frozen=True, slots=True)
class EngineMetrics:
    """A snapshot of the values vLLM exports (names in ``docs/simulator.md``); counters are cumulative."""

    num_requests_running: int
    num_requests_waiting: int
    kv_cache_usage_perc: float
    """Pinned blocks / num_gpu_blocks, 0..1 (cached but unpinned blocks count as free, as in vLLM)."""
    prefix_cache_queries: int
    """Tokens looked up in the prefix cache by new requests (a request resumed after preemption is not counted,
    as vLLM counts those apart)."""
    prefix_cache_hits: int
    """Of those, tokens found cached."""
    running_lora_adapters: tuple[str, ...]
    waiting_lora_adapters: tuple[str, ...]
    max_lora: int
    block_size: int
    num_gpu_blocks: int
    num_preemptions: int
    prompt_tokens: int
    """Prompt tokens of finished requests."""
    generation_tokens: int
    """Output tokens produced."""
    lora_loads: int
    loaded_lora_adapters: tuple[str, ...]
    evicted_blocks: int


class _Block:
    __slots__ = ("hash", "ref")

    def __init__(self, block_hash: int | None) -> None:
        self.hash = block_hash
        self.ref = 1


class _Req:
    __slots__ = (
        "aborted",
        "blocks",
        "cached_tokens",
        "external",
        "hashes",
        "lora",
        "max_tokens",
        "num_computed",
        "num_hashed",
        "num_output",
        "num_prompt",
        "num_tokens",
        "preemptions",
        "prompt",
        "rid",
        "salt",
        "tail",
    )

    def __init__(self, request: SimRequest, hashes: list[int], block_size: int) -> None:
        self.rid = request.id
        self.lora = request.lora
        self.max_tokens = request.max_tokens
        self.num_prompt = len(request.prompt_token_ids)
        self.prompt = request.prompt_token_ids
        self.hashes = hashes
        """Ids of the request's full blocks known so far (prompt blocks, then blocks with generated tokens)."""
        self.salt = xxhash.xxh3_64_intdigest(request.id.encode("utf-8"))
        """Stands for the generated token ids, which depend on the request and their position only."""
        n_tail = self.num_prompt % block_size
        tail = request.prompt_token_ids[self.num_prompt - n_tail :] if n_tail else ()
        self.tail = struct.pack(f"<{len(tail)}q", *tail)
        """The prompt tokens after its last full block: the start of the first block with generated tokens."""
        self.num_tokens = self.num_prompt  # prompt + output tokens so far
        self.num_computed = 0  # tokens whose KV is in the cache
        self.num_hashed = 0  # leading blocks already matched/registered in the prefix cache
        self.num_output = 0
        self.blocks: list[_Block] = []
        self.cached_tokens = -1  # set at first admission
        self.preemptions = 0
        self.external = request.external_tokens
        self.aborted = False

    def tokens(self, start: int, end: int) -> list[int]:
        """Token ids in ``[start, end)``: prompt, then generated (:func:`generated_token_id`)."""
        n = self.num_prompt
        out = list(self.prompt[start : min(end, n)])
        out.extend(generated_token_id(self.salt, i - n) for i in range(max(start, n), end))
        return out


@dataclass(slots=True)
class _Step:
    end: float
    scheduled: list[tuple[_Req, int]]


class Engine:
    """One simulated pod.  ``token_events=False`` omits per-token ``TOKEN`` events (faster)."""

    def __init__(
        self,
        profile: Profile,
        clock_start: float = 0.0,
        *,
        token_events: bool = True,
        kv_listener: KVCacheListener | None = None,
    ) -> None:
        self.profile = profile
        self.kv_listener = kv_listener
        """Told of blocks stored, evicted and cleared (KV-cache events); None: nobody listens."""
        self.step_observer: Callable[[StepInfo], None] | None = None
        """Told of every step when it is planned (its start, duration and work); None: nobody listens."""
        self._bs = profile.block_size
        self._token_events = token_events
        self._clock = clock_start
        self._waiting: deque[_Req] = deque()
        self._running: list[_Req] = []
        self._active_ids: set[str] = set()
        self._cache: dict[int, _Block] = {}
        self._never_used = profile.num_gpu_blocks
        """Blocks never allocated yet: the head of vLLM's free queue."""
        self._free: OrderedDict[int, _Block] = OrderedDict()
        """Freed blocks in the order they were freed (least recently used first); key: the block's content id,
        or a unique negative number for a block with no content id."""
        self._anon_keys = 0
        self._loaded: OrderedDict[str, None] = OrderedDict()
        self._step_start: float | None = None
        self._step: _Step | None = None
        self._queries = 0
        self._hits = 0
        self._preemptions = 0
        self._prompt_tokens = 0
        self._generation_tokens = 0
        self._lora_loads = 0
        self._evictions = 0

    # ---------------------------------------------------------------- public API

    @property
    def clock(self) -> float:
        """The time the engine has been advanced to."""
        return self._clock

    @property
    def idle(self) -> bool:
        return not self._running and not self._waiting

    def submit(self, request: SimRequest, now: float) -> None:
        """Queue ``request`` arriving at ``now`` (>= the time the engine was advanced to)."""
        p = self.profile
        n_prompt = len(request.prompt_token_ids)
        if request.id in self._active_ids:
            raise ValueError(f"request id {request.id!r} is already in the engine")
        if request.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        if n_prompt < 1:
            raise ValueError("the prompt must have at least one token")
        total = n_prompt + request.max_tokens
        if total > p.max_model_len:
            raise ValueError(f"prompt + max_tokens = {total} exceeds max_model_len {p.max_model_len}")
        if -(-total // self._bs) > p.num_gpu_blocks:
            raise ValueError(f"prompt + max_tokens = {total} exceeds the KV capacity {p.kv_capacity_tokens}")
        if request.lora is not None and p.max_loras == 0:
            raise ValueError("LoRA request on a profile with max_loras = 0")
        if now < self._clock:
            raise ValueError(f"submit at {now} is before the engine clock {self._clock}")
        if self._step is not None and self._step.end < now:
            raise ValueError(f"advance the engine to {now} before submitting (a step ends at {self._step.end})")
        if self._step is None and self._step_start is not None and self._step_start < now:
            self._plan()  # the pending step started before this arrival: fix its composition first
            if self._step is not None and self._step.end < now:
                raise ValueError(f"advance the engine to {now} before submitting")
        self._clock = now
        self._active_ids.add(request.id)
        hashes = block_hashes(request.prompt_token_ids, self._bs, request.lora)
        self._waiting.append(_Req(request, hashes, self._bs))
        if self._step is None and self._step_start is None:
            self._step_start = now

    def abort(self, request_id: str) -> bool:
        """Ends ``request_id`` without further events, as vLLM aborts a request whose client went away: a
        request in the step being executed leaves at the step's end (its blocks free then), any other at once.
        False when the engine does not have it."""
        if request_id not in self._active_ids:
            return False
        step = self._step
        for r, _n in step.scheduled if step is not None else ():
            if r.rid == request_id:
                r.aborted = True
                return True
        self._active_ids.discard(request_id)
        for queue in (self._waiting, self._running):
            for r in queue:
                if r.rid == request_id:
                    queue.remove(r)
                    self._release(r)
                    break
        if not self._running and not self._waiting:
            self._step_start = None
        return True

    def next_event_time(self) -> float | None:
        """When the current step ends (its events are then due), or None when there is nothing to do."""
        if self._step is None and self._step_start is not None:
            self._plan()
        return None if self._step is None else self._step.end

    def advance(self, until: float) -> list[RequestEvent]:
        """Execute every step that ends at or before ``until``; their events, in time order."""
        if until < self._clock:
            raise ValueError(f"advance to {until} is before the engine clock {self._clock}")
        events: list[RequestEvent] = []
        while True:
            if self._step is None:
                # A step starting exactly at ``until`` stays unplanned so that arrivals at ``until`` join it.
                if self._step_start is None or self._step_start >= until:
                    break
                self._plan()
                if self._step is None:
                    break
            if self._step.end > until:
                break
            self._finish_step(events)
        self._clock = until
        return events

    def metrics(self) -> EngineMetrics:
        """The current state; does not plan or run anything."""
        p = self.profile
        pinned = p.num_gpu_blocks - self._available()
        return EngineMetrics(
            num_requests_running=len(self._running),
            num_requests_waiting=len(self._waiting),
            kv_cache_usage_perc=pinned / p.num_gpu_blocks,
            prefix_cache_queries=self._queries,
            prefix_cache_hits=self._hits,
            running_lora_adapters=tuple(sorted({r.lora for r in self._running if r.lora is not None})),
            waiting_lora_adapters=tuple(sorted({r.lora for r in self._waiting if r.lora is not None})),
            max_lora=p.max_loras,
            block_size=p.block_size,
            num_gpu_blocks=p.num_gpu_blocks,
            num_preemptions=self._preemptions,
            prompt_tokens=self._prompt_tokens,
            generation_tokens=self._generation_tokens,
            lora_loads=self._lora_loads,
            loaded_lora_adapters=tuple(self._loaded),
            evicted_blocks=self._evictions,
        )

    def reset_prefix_cache(self) -> bool:
        """vLLM's ``reset_prefix_cache``: forgets every cached block, only when no request holds blocks
        (False, nothing done, otherwise)."""
        if self._running:
            return False
        for block in self._cache.values():
            block.hash = None
        self._cache.clear()
        free = list(self._free.values())
        self._free.clear()
        for block in free:
            self._anon_keys -= 1
            self._free[self._anon_keys] = block
        if self.kv_listener is not None:
            self.kv_listener.all_cleared()
        return True

    def cached_prefix_tokens(self, token_ids: Sequence[int], lora: str | None = None) -> int:
        """How many leading tokens of ``token_ids`` are in the prefix cache now (whole blocks; test aid)."""
        n = 0
        for h in block_hashes(token_ids, self._bs, lora):
            if h not in self._cache:
                break
            n += self._bs
        return n

    # ---------------------------------------------------------------- blocks

    def _available(self) -> int:
        return self._never_used + len(self._free)

    def _allocate(self, r: _Req, total_tokens: int) -> bool:
        need = -(-total_tokens // self._bs) - len(r.blocks)
        if need <= 0:
            return True
        if need > self._never_used + len(self._free):
            return False
        blocks = r.blocks
        for _ in range(need):
            if self._never_used > 0:
                self._never_used -= 1
            else:
                _key, reused = self._free.popitem(last=False)
                if reused.hash is not None:
                    del self._cache[reused.hash]
                    self._evictions += 1
                    if self.kv_listener is not None:
                        self.kv_listener.block_removed(reused.hash)
            blocks.append(_Block(None))
        return True

    def _release(self, r: _Req) -> None:
        for b in reversed(r.blocks):
            b.ref -= 1
            if b.ref == 0:
                if b.hash is not None:
                    self._free[b.hash] = b
                else:
                    self._anon_keys -= 1
                    self._free[self._anon_keys] = b
        r.blocks = []
        r.num_computed = 0
        r.num_hashed = 0

    def _extend_hashes(self, r: _Req, num_blocks: int) -> None:
        """Make the ids of ``r``'s first ``num_blocks`` full blocks known (their tokens must exist)."""
        hashes = r.hashes
        first_generated = r.num_prompt // self._bs
        while len(hashes) < num_blocks:
            i = len(hashes)
            parent = hashes[-1] if hashes else _root_hash(r.lora)
            content = _GENERATED.pack(parent, r.salt, i)
            if i == first_generated:
                content += r.tail
            hashes.append(xxhash.xxh3_64_intdigest(content))

    def _preempt(self, r: _Req) -> None:
        self._release(r)
        r.preemptions += 1
        self._preemptions += 1
        self._waiting.appendleft(r)

    # ---------------------------------------------------------------- LoRA

    def _lora_ready(self, lora: str) -> bool:
        """True if ``lora`` is resident or can be loaded now."""
        if lora in self._loaded or len(self._loaded) < self.profile.max_loras:
            return True
        busy = {r.lora for r in self._running}
        return any(name not in busy for name in self._loaded)

    def _load_lora(self, lora: str) -> bool:
        """Make ``lora`` resident (most recently used); True if it had to be loaded."""
        if lora in self._loaded:
            self._loaded.move_to_end(lora)
            return False
        if len(self._loaded) >= self.profile.max_loras:
            busy = {r.lora for r in self._running}
            victim = next(name for name in self._loaded if name not in busy)
            del self._loaded[victim]
        self._loaded[lora] = None
        self._lora_loads += 1
        return True

    # ---------------------------------------------------------------- steps

    def _plan(self) -> None:
        start = self._step_start
        assert start is not None and self._step is None
        p = self.profile
        bs = self._bs
        budget = p.max_num_batched_tokens
        scheduled: list[tuple[_Req, int]] = []
        running = self._running
        preempted = False
        loads = 0

        i = 0
        while i < len(running) and budget > 0:
            r = running[i]
            n = r.num_tokens - r.num_computed
            if n > budget:
                n = budget
            if -(-(r.num_computed + n) // bs) > len(r.blocks):  # a new block is needed (most decode steps: none)
                ok = True
                while not self._allocate(r, r.num_computed + n):
                    victim = running.pop()
                    self._preempt(victim)
                    preempted = True
                    if victim is r:
                        ok = False
                        break
                if not ok:
                    break
            scheduled.append((r, n))
            budget -= n
            i += 1

        if not preempted:
            waiting = self._waiting
            skipped: list[_Req] = []
            while waiting and len(running) < p.max_num_seqs and budget > 0:
                r = waiting[0]
                if r.lora is not None and not self._lora_ready(r.lora):
                    skipped.append(waiting.popleft())
                    continue
                # Longest cached run of full blocks, leaving at least one token to compute.
                hits: list[_Block] = []
                max_blocks = (r.num_tokens - 1) // bs
                if len(r.hashes) < max_blocks:
                    self._extend_hashes(r, max_blocks)
                cache = self._cache
                for k in range(max_blocks):
                    b = cache.get(r.hashes[k])
                    if b is None:
                        break
                    hits.append(b)
                hit_tokens = len(hits) * bs
                computed = hit_tokens
                if r.external > 0 and r.cached_tokens < 0:  # transferred KV: first admission only
                    computed = max(hit_tokens, min(r.external, r.num_tokens - 1))
                n = min(r.num_tokens - computed, budget)
                need = -(-(computed + n) // bs) - len(hits)
                unpinned_hits = sum(1 for b in hits if b.ref == 0)
                if need > self._available() - unpinned_hits:
                    break  # head-of-line: wait for KV room
                for b in hits:
                    if b.ref == 0:
                        assert b.hash is not None
                        del self._free[b.hash]
                    b.ref += 1
                r.blocks = hits
                r.num_computed = computed
                r.num_hashed = len(hits)
                allocated = self._allocate(r, computed + n)
                assert allocated
                if r.lora is not None and self._load_lora(r.lora):
                    loads += 1
                waiting.popleft()
                running.append(r)
                scheduled.append((r, n))
                budget -= n
                if r.preemptions == 0:  # vLLM keeps resumed requests' lookups out of these counters
                    self._queries += r.num_tokens
                    self._hits += hit_tokens
                if r.cached_tokens < 0:
                    r.cached_tokens = hit_tokens
            waiting.extendleft(reversed(skipped))

        self._step_start = None
        if not scheduled:  # cannot happen with a valid profile; stay idle rather than spin
            return
        prefill = 0
        decoding = 0
        kv = 0
        for r, n in scheduled:
            if n == 1 and r.num_output > 0 and r.num_computed == r.num_tokens - 1:
                decoding += 1
            else:
                prefill += n
            kv += r.num_computed + n
        duration = (
            p.step_base
            + p.prefill_cost_per_token * prefill
            + p.decode_cost_per_seq * decoding
            + p.kv_read_cost_per_token * kv
            + p.lora_load_time * loads
        )
        self._step = _Step(start + duration, scheduled)
        if self.step_observer is not None:
            self.step_observer(StepInfo(start, duration, decoding, prefill, kv))

    def _finish_step(self, events: list[RequestEvent]) -> None:
        step = self._step
        assert step is not None
        self._step = None
        t = step.end
        bs = self._bs
        cache = self._cache
        token_events = self._token_events
        finished = False
        listener = self.kv_listener
        for r, n in step.scheduled:
            if r.aborted:
                finished = True
                self._active_ids.discard(r.rid)
                self._release(r)
                continue
            r.num_computed += n
            full = r.num_computed // bs
            if len(r.hashes) < full:
                self._extend_hashes(r, full)
            if listener is not None and r.num_hashed < full:
                first = r.num_hashed
                parent = r.hashes[first - 1] if first else None
                listener.blocks_stored(r.hashes[first:full], parent, first, r.lora, r.tokens)
            while r.num_hashed < full:
                b = r.blocks[r.num_hashed]
                h = r.hashes[r.num_hashed]
                if b.hash is None and h not in cache:
                    b.hash = h
                    cache[h] = b
                r.num_hashed += 1
            if r.num_computed < r.num_tokens:
                continue  # still prefilling
            index = r.num_output
            r.num_output += 1
            r.num_tokens += 1
            self._generation_tokens += 1
            if index == 0:
                events.append(RequestEvent(EventKind.FIRST_TOKEN, r.rid, t, 0, r.num_prompt, r.cached_tokens, 0, 0))
            elif token_events:
                events.append(RequestEvent(EventKind.TOKEN, r.rid, t, index))
            if r.num_output >= r.max_tokens:
                finished = True
                self._prompt_tokens += r.num_prompt
                self._active_ids.discard(r.rid)
                self._release(r)
                events.append(
                    RequestEvent(
                        EventKind.FINISHED, r.rid, t, index, r.num_prompt, r.cached_tokens, r.num_output, r.preemptions
                    )
                )
        if finished:
            self._running = [r for r in self._running if r.num_output < r.max_tokens and not r.aborted]
        if self._running or self._waiting:
            self._step_start = t

"""Constants of the simulated model server (:class:`llm_epp.sim.engine.Engine`).

A :class:`Profile` fixes one pod's capacity (KV blocks, seats, token budget, LoRA slots) and its cost
model.  The duration of one engine step (one forward pass of the continuous batch) is::

    step_base
    + prefill_cost_per_token * prefill_tokens_this_step
    + decode_cost_per_seq    * decoding_seqs_this_step
    + kv_read_cost_per_token * kv_tokens_of_scheduled_seqs
    + lora_load_time         * adapters_loaded_this_step

Two profiles ship: ``qwen3-32b-h100-tp2`` (the benchmark anchor's pod; its constants are a first
estimate, to be calibrated by the benchmark against the published round-robin baseline, see
``docs/simulator.md``) and ``tiny`` (small and fast, for tests and the demo).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["PROFILES", "QWEN3_32B_H100_TP2", "TINY", "Profile", "get_profile", "itl_floor"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Profile:
    """Capacity and cost constants of one simulated vLLM-like pod (times in seconds)."""

    name: str
    num_gpu_blocks: int
    """KV-cache capacity in blocks (capacity in tokens = ``num_gpu_blocks * block_size``)."""
    block_size: int = 16
    max_num_seqs: int = 256
    """Seats in the running batch (vLLM ``--max-num-seqs``)."""
    max_num_batched_tokens: int = 8192
    """Token budget of one step, prefill chunks and decodes together (chunked prefill)."""
    max_model_len: int = 40960
    """Longest prompt + completion accepted."""
    max_loras: int = 1
    """LoRA adapters resident at once (vLLM ``--max-loras``); 0 rejects LoRA requests."""
    lora_load_time: float = 0.0
    """Added to the step in which an adapter is loaded."""
    step_base: float
    prefill_cost_per_token: float
    decode_cost_per_seq: float
    kv_read_cost_per_token: float
    kv_bytes_per_token: int = 0
    """KV-cache bytes of one token over the whole pod (every layer, K and V): what a prefill/decode
    transfer moves per prompt token."""

    def __post_init__(self) -> None:
        for field_name in ("num_gpu_blocks", "block_size", "max_num_seqs", "max_num_batched_tokens", "max_model_len"):
            if getattr(self, field_name) < 1:
                raise ValueError(f"{field_name} must be >= 1")
        if self.max_loras < 0:
            raise ValueError("max_loras must be >= 0")
        if self.step_base <= 0:
            raise ValueError("step_base must be > 0")
        for field_name in ("lora_load_time", "prefill_cost_per_token", "decode_cost_per_seq", "kv_read_cost_per_token",
                           "kv_bytes_per_token"):  # fmt: skip
            if getattr(self, field_name) < 0:
                raise ValueError(f"{field_name} must be >= 0")

    @property
    def kv_capacity_tokens(self) -> int:
        return self.num_gpu_blocks * self.block_size


QWEN3_32B_H100_TP2 = Profile(
    name="qwen3-32b-h100-tp2",
    num_gpu_blocks=307_328 // 16,
    block_size=16,
    max_num_seqs=1024,
    max_num_batched_tokens=8192,
    max_model_len=40_960,
    max_loras=1,
    lora_load_time=0.1,
    step_base=0.016,
    prefill_cost_per_token=6.0e-5,
    decode_cost_per_seq=1.0e-4,
    kv_read_cost_per_token=6.5e-8,
    kv_bytes_per_token=64 * 8 * 128 * 2 * 2,
)
"""Qwen3-32B (bf16) on 2 x H100 80GB, tensor parallel 2: the pod of the benchmark anchor.

The constants are estimates from hardware figures (below), checked against the published round-robin
baseline by ``python -m benchmarks.calibrate`` (method, result and the +-30% sensitivity table in
``benchmarks/README.md``): round-robin on the anchor workload gives 0.96x the published requests/s and
0.80x its ITL (seeds 1-5), both within the +-25% rule, and were therefore left as estimated; its mean TTFT
is 2.7x the published one, which no constant within reach moves (the README explains why).  The llm-epp
side of the anchor is a prediction and falls short of the published one (0.67x requests/s, 1.6x ITL): the
published llm-d ITL needs a decode step near the H100's bandwidth roofline, faster than ``step_base`` and
``kv_read_cost_per_token`` below assume; the README shows the arithmetic and does not tune them to it.

* ``num_gpu_blocks`` = 307,328 tokens / 16: the KV capacity per pod published with the anchor, and what the
  anchor's flags give.  The pods ran ``--gpu-memory-utilization=0.95``, tensor parallel 2, the default bf16
  KV cache, 16-token blocks and the model's 40,960-token context.  Qwen3-32B keeps K and V for 64 layers x
  8 KV heads x 128 dims x 2 bytes = 256 KiB per token, 128 KiB on each GPU; 307,328 tokens are 37.5 GiB per
  GPU.  An H100 80GB has 79.6 GiB; 95% is 75.7 GiB, the weights (32.8B parameters, bf16, halved) take
  30.5 GiB, which leaves 45.2 GiB, of which 7.6 GiB go to the profiled activation peak and non-torch
  memory.  (Everything for the KV cache would be ~370k tokens: an upper bound.)
* ``max_num_seqs`` 1024, ``max_num_batched_tokens`` 8192: vLLM V1's defaults for an OpenAI server on a GPU
  with 70 GiB or more that is not an A100 (H100, as in the anchor).
* ``max_model_len`` 40,960: Qwen3-32B's native context (the anchor sets none).
* ``step_base`` 16 ms: a small-batch decode step is bound by reading the weights, ~32.8B params x
  2 bytes = 65.6 GB over 2 GPUs at ~3.35 TB/s each with ~60% efficiency, plus launch and all-reduce.
* ``prefill_cost_per_token`` 60 us: 2 x 32.8 GFLOP per token over 2 x 989 dense bf16 TFLOP/s at
  ~55% MFU, i.e. ~16.7k prefill tokens/s per pod (a full 8192-token chunk costs ~0.5 s).
* ``decode_cost_per_seq`` 0.1 ms: per-sequence matmul rows, sampling and bookkeeping.
* ``kv_read_cost_per_token`` 65 ns: Qwen3-32B keeps 64 layers x 8 KV heads x 128 dims x (K, V) x
  2 bytes = 256 KiB per token; attention reads it at ~4 TB/s over the pod, so a full KV cache
  (307k tokens) adds ~20 ms to a step.
* ``max_loras`` 1 (vLLM's default), ``lora_load_time`` 0.1 s: the anchor uses no adapters.
* ``kv_bytes_per_token`` 256 KiB: the figure above (64 layers x 8 KV heads x 128 dims x K and V x 2 bytes),
  what a P/D transfer moves per prompt token.
"""

TINY = Profile(
    name="tiny",
    num_gpu_blocks=256,
    block_size=16,
    max_num_seqs=16,
    max_num_batched_tokens=512,
    max_model_len=4096,
    max_loras=2,
    lora_load_time=0.05,
    step_base=0.002,
    prefill_cost_per_token=1.0e-5,
    decode_cost_per_seq=1.0e-4,
    kv_read_cost_per_token=1.0e-7,
    kv_bytes_per_token=16 * 1024,
)
"""Small and fast, for tests and the demo: 4,096 KV tokens, 16 seats, a 512-token step budget, two LoRA
slots; a decode step takes a few milliseconds of virtual time; 16 KiB of KV per token.  Not calibrated
against anything."""

PROFILES: dict[str, Profile] = {p.name: p for p in (QWEN3_32B_H100_TP2, TINY)}


def get_profile(name: str) -> Profile:
    """The profile called ``name``; ``KeyError`` listing the known names otherwise."""
    try:
        return PROFILES[name]
    except KeyError:
        raise KeyError(f"unknown simulator profile {name!r}; known: {', '.join(sorted(PROFILES))}") from None


def itl_floor(profile: Profile, prompt_tokens: int, output_tokens: int, decode_tokens_per_s: float) -> float:
    """The lowest mean inter-token latency (seconds) at which one pod of ``profile`` can emit
    ``decode_tokens_per_s`` output tokens per second (tokens after each request's first) for requests of
    ``prompt_tokens`` -> ``output_tokens``, whatever decides which requests it runs; ``math.inf`` past what the
    pod can emit at all.

    It follows from the step formula above. The decode step that emits a request's token ``j`` (1 ..
    ``output_tokens - 1``) reads that request's ``prompt_tokens + j`` tokens of context, so each decode token
    costs ``c = decode_cost_per_seq + kv_read_cost_per_token * (prompt_tokens + output_tokens / 2)`` on
    average and at least ``c_min`` (context ``prompt_tokens + 1``). Emitting ``r`` tokens per second leaves at
    most ``(1 - c * r) / step_base`` steps per second, so the steps decode ``b >= r * step_base / (1 - c * r)``
    sequences on average, and a token-weighted mean step lasts at least ``step_base + c_min * b`` (a batch
    that varies only raises it). Prefill, preemption and LoRA loads add to every term, so the floor holds for
    any router; a pod running a steady batch of cached prompts comes close to it."""
    if decode_tokens_per_s <= 0:
        return profile.step_base
    per_token = profile.decode_cost_per_seq + profile.kv_read_cost_per_token * (prompt_tokens + output_tokens / 2)
    busy = per_token * decode_tokens_per_s
    if busy >= 1.0:
        return math.inf
    batch = decode_tokens_per_s * profile.step_base / (1.0 - busy)
    least = profile.decode_cost_per_seq + profile.kv_read_cost_per_token * (prompt_tokens + 1)
    return profile.step_base + least * batch

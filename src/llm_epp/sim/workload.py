"""Workloads for the virtual-time cluster: inference-perf's ``shared_prefix`` prompts and staged Poisson runs.

``shared_prefix`` (as inference-perf generates it): ``num_groups`` system prompts of ``system_prompt_len``
tokens, each followed by ``prompts_per_group`` different questions of ``question_len`` tokens; every request
asks for ``output_len`` tokens (``ignore_eos``).  The prompts are sent by cycling ONE fixed shuffle of all
``num_groups * prompts_per_group`` prompts (seeded), not drawn at random.

Text and tokens agree with :mod:`llm_epp.sim.tokenizer` (4 characters per token): each text part is random
hexadecimal of exactly ``4 * length`` characters, so a prompt's ``token_ids`` equal ``encode(text)`` and two
prompts of one group share exactly their first ``system_prompt_len`` tokens.  The text is what the EPP
hashes for its prefix index; the token ids are what the simulated engines cache.

Staged runs (inference-perf's stage protocol): a stage sends ``round(rate * duration)`` requests with
Poisson arrivals (exponential gaps, the first at the stage's start); the next stage starts when every
request of the previous one has finished; a stage's throughput is ``N / (last end - first start)``.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from llm_epp.sim.tokenizer import CHARS_PER_TOKEN, encode

__all__ = ["Prompt", "SharedPrefixWorkload", "Stage", "poisson_offsets", "stage_offsets"]


@dataclass(frozen=True, slots=True)
class Prompt:
    """One prompt of a workload: its text (for the EPP) and the same text's token ids (for the engine)."""

    group: int
    index: int
    """Index within the group."""
    text: str
    token_ids: tuple[int, ...]
    max_tokens: int


@dataclass(frozen=True, slots=True)
class Stage:
    """``round(rate * duration)`` requests with Poisson arrivals at ``rate`` requests/s."""

    rate: float
    duration: float

    @property
    def num_requests(self) -> int:
        return max(round(self.rate * self.duration), 0)


def _random_text(rng: random.Random, tokens: int) -> str:
    chars = tokens * CHARS_PER_TOKEN
    return rng.randbytes(chars // 2 + 1).hex()[:chars]


class SharedPrefixWorkload:
    """inference-perf's ``shared_prefix`` data set, seeded; :meth:`next_prompt` cycles a fixed shuffle."""

    def __init__(
        self,
        *,
        num_groups: int,
        prompts_per_group: int,
        system_prompt_len: int,
        question_len: int,
        output_len: int,
        seed: int = 0,
    ) -> None:
        if num_groups < 1 or prompts_per_group < 1:
            raise ValueError("num_groups and prompts_per_group must be >= 1")
        if system_prompt_len < 0 or question_len < 0 or system_prompt_len + question_len < 1:
            raise ValueError("the prompt must have at least one token")
        if output_len < 1:
            raise ValueError("output_len must be >= 1")
        self.num_groups = num_groups
        self.prompts_per_group = prompts_per_group
        self.system_prompt_len = system_prompt_len
        self.question_len = question_len
        self.output_len = output_len
        self.seed = seed
        rng = random.Random(seed)
        prompts: list[Prompt] = []
        for g in range(num_groups):
            system = _random_text(rng, system_prompt_len)
            system_ids = encode(system)
            for i in range(prompts_per_group):
                question = _random_text(rng, question_len)
                prompts.append(Prompt(g, i, system + question, system_ids + encode(question), output_len))
        self.prompts: tuple[Prompt, ...] = tuple(prompts)
        order = list(range(len(prompts)))
        rng.shuffle(order)
        self.order: tuple[int, ...] = tuple(order)
        self._next = 0

    def __len__(self) -> int:
        return len(self.prompts)

    def next_prompt(self) -> Prompt:
        """The next prompt of the fixed shuffle, wrapping around at the end."""
        prompt = self.prompts[self.order[self._next % len(self.order)]]
        self._next += 1
        return prompt

    def reset(self) -> None:
        """Start the cycle again from its first prompt."""
        self._next = 0


def poisson_offsets(rate: float, n: int, rng: random.Random) -> list[float]:
    """``n`` arrival times (seconds from the stage start) of a Poisson process at ``rate``; the first is 0."""
    if rate <= 0:
        raise ValueError("rate must be > 0")
    out: list[float] = []
    t = 0.0
    for k in range(n):
        if k:
            t += rng.expovariate(rate)
        out.append(t)
    return out


def stage_offsets(stages: Sequence[Stage], seed: int) -> list[list[float]]:
    """The arrival offsets of every stage (one seeded stream, so a run is reproducible)."""
    rng = random.Random(seed)
    return [poisson_offsets(s.rate, s.num_requests, rng) for s in stages]

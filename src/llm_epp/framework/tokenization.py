"""The tokenized prompt, as a data producer (`token-producer`) leaves it for other plugins."""

from __future__ import annotations

from dataclasses import dataclass

from llm_epp.framework.state import StateKey


@dataclass(frozen=True, slots=True)
class MultiModalFeature:
    """One multimodal item of a prompt, as the model server's render endpoint reports it: its modality
    (`image`, `video`, `audio`), the content hash the engine keys its encoder and prefix caches by, and
    where its placeholder tokens sit in the token ids."""

    modality: str
    hash: str
    offset: int = 0
    length: int = 0


@dataclass(frozen=True, slots=True)
class TokenizedPrompt:
    """Token ids of a request's prompt (the first prompt of a batch) and its cache_salt.

    `exact` is True when the ids are the model's own tokens (a tokenizer or the model server's render
    endpoint, or ids the client sent); False for the byte-packing estimate, whose ids never match an
    engine's and only serve as stable per-prompt values. `mm_features` lists the prompt's multimodal
    items in token order (only the render backend knows them)."""

    token_ids: tuple[int, ...]
    cache_salt: str = ""
    exact: bool = True
    mm_features: tuple[MultiModalFeature, ...] = ()


TOKENIZED_PROMPT_KEY: StateKey[TokenizedPrompt] = StateKey("tokenized-prompt")
"""Where `token-producer` writes the request's `TokenizedPrompt` in the CycleState (llm-d's
`TokenizedPromptDataKey`)."""

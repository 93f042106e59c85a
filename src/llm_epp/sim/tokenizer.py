"""A deterministic, cheap stand-in tokenizer for the simulator.

Rule: the text is cut into consecutive chunks of :data:`CHARS_PER_TOKEN` (4) characters (Python ``str``
characters, i.e. code points; the last chunk may be shorter); each chunk is one token whose id is
``xxh32(chunk as UTF-8, seed 0) % VOCAB_SIZE``.  So the same text always gives the same tokens, in every
process and on every machine, and two texts sharing a prefix of ``4k`` characters share their first ``k``
tokens (which is what the prefix cache needs).  It is not a real model's vocabulary: counts approximate
English BPE (~4 characters per token) and ids cannot be decoded back.

Chat requests (``/v1/chat/completions``) are flattened with :func:`render_chat` before tokenizing: one
``"{role}: {content}\\n"`` line per message, then the generation prompt ``"assistant: "``.  Content may be a
string or a list of OpenAI content parts, of which the ``"text"`` parts are joined.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import xxhash

__all__ = ["CHARS_PER_TOKEN", "VOCAB_SIZE", "count_tokens", "encode", "encode_chat", "render_chat"]

CHARS_PER_TOKEN = 4
VOCAB_SIZE = 151_936  # Qwen3's vocabulary size; only bounds the ids


def encode(text: str) -> tuple[int, ...]:
    """Token ids of ``text`` (one per 4 characters)."""
    step = CHARS_PER_TOKEN
    digest = xxhash.xxh32_intdigest
    return tuple(digest(text[i : i + step].encode("utf-8")) % VOCAB_SIZE for i in range(0, len(text), step))


def count_tokens(text: str) -> int:
    """``len(encode(text))`` without hashing."""
    return -(-len(text) // CHARS_PER_TOKEN)


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for part in content:
            if isinstance(part, Mapping) and part.get("type") == "text" and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, str):
                parts.append(part)
        return "".join(parts)
    return str(content)


def render_chat(messages: Iterable[Mapping[str, Any]], add_generation_prompt: bool = True) -> str:
    """The flat prompt text of a chat: ``"role: content\\n"`` per message, then ``"assistant: "``."""
    lines = [f"{message.get('role', 'user')}: {_content_text(message.get('content'))}\n" for message in messages]
    if add_generation_prompt:
        lines.append("assistant: ")
    return "".join(lines)


def encode_chat(messages: Iterable[Mapping[str, Any]], add_generation_prompt: bool = True) -> tuple[int, ...]:
    """``encode(render_chat(messages))``."""
    return encode(render_chat(messages, add_generation_prompt))

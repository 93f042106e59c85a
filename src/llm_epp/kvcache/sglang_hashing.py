"""SGLang's page hashes, as its radix cache publishes them in KV events.

SGLang hashes its KV cache page by page (`--page-size` tokens, default 1). Page i's digest is SHA-256 of
page i-1's 32-byte digest (nothing for the first page of a sequence) followed by each token id of the page
as 4 bytes little-endian. There is no seed: two servers with the same tokens publish the same hashes.

An event carries a hash as a signed 64-bit int: the first 8 bytes of the digest read big-endian, in two's
complement (`event_hash`). That differs from vLLM in three ways: a different hash of different input, no
PYTHONHASHSEED root, and the first 8 bytes rather than the last."""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

__all__ = ["event_hash", "page_digest", "page_digests"]


def page_digest(tokens: Sequence[int], prior: bytes | None = None) -> bytes:
    """The SHA-256 digest of one page chained after `prior` (None for a sequence's first page)."""
    h = hashlib.sha256()
    if prior is not None:
        h.update(prior)
    if tokens:
        h.update(struct.pack(f"<{len(tokens)}I", *tokens))
    return h.digest()


def page_digests(tokens: Sequence[int], page_size: int, prior: bytes | None = None) -> list[bytes]:
    """The digests of the full pages of `tokens`, chained from `prior`."""
    if page_size <= 0:
        raise ValueError(f"page size must be greater than 0, got {page_size}")
    out: list[bytes] = []
    for i in range(len(tokens) // page_size):
        prior = page_digest(tokens[i * page_size : (i + 1) * page_size], prior)
        out.append(prior)
    return out


def event_hash(digest: bytes) -> int:
    """The value SGLang puts in an event for `digest`: its first 8 bytes as a signed big-endian int."""
    return int.from_bytes(digest[:8], "big", signed=True)

"""The EPP's own block keys ("request keys"), computed from token ids alone.

Keys are chained like the engine's, but with a fixed, documented hash so every EPP replica computes the
same keys from the same tokens, whatever hash the engine uses (llm-d-kv-cache's token processor):

- root = H(fnv64a(hashSeed), None, model) — the model (or LoRA adapter name) seeds the chain;
- block key = H(parent key, block tokens, extra) where extra is None or a list of strings (cache_salt on
  block 0, multimodal identifiers);
- H = FNV-64a of the canonical CBOR encoding of `[parent, tokens, extra]` (`cbor-fnv`, the default) or
  XXH64 of parent (8 bytes little-endian), tokens (4 bytes little-endian each) and each extra string
  (8-byte little-endian length, then its bytes) (`xxh64`).

Only full blocks get keys; a partial tail is dropped."""

from __future__ import annotations

import functools
import struct
from collections.abc import Sequence

import cbor2
import xxhash

ALGORITHMS = ("cbor-fnv", "xxh64")
DEFAULT_BLOCK_SIZE = 16

_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_U64 = (1 << 64) - 1


def fnv64a(data: bytes) -> int:
    h = _FNV_OFFSET
    prime = _FNV_PRIME
    mask = _U64
    for b in data:
        h = ((h ^ b) * prime) & mask
    return h


MEMO_SIZE = 1 << 16


@functools.lru_cache(maxsize=MEMO_SIZE)
def _cbor_fnv_block(parent: int, tokens: tuple[int, ...], extra: tuple[str, ...] | None) -> int:
    """One block key; memoized, since shared prefixes (the point of prefix caching) hash the same blocks
    again and again, on the lookup path and when their BlockStored events arrive (lru_cache is
    thread-safe)."""
    return fnv64a(cbor2.dumps([parent, list(tokens), list(extra) if extra else None], canonical=True))


class RequestKeyHasher:
    """Computes request keys for one block size, seed and algorithm. Immutable and thread-safe."""

    __slots__ = ("_xxh", "algorithm", "block_size", "hash_seed", "init_hash")

    def __init__(self, block_size: int = DEFAULT_BLOCK_SIZE, hash_seed: str = "", algorithm: str = "") -> None:
        if block_size <= 0:
            raise ValueError(f"blockSizeTokens must be greater than 0, got {block_size}")
        algorithm = algorithm or "cbor-fnv"
        if algorithm not in ALGORITHMS:
            raise ValueError(f"unsupported hashAlgorithm {algorithm!r}: accepted values are {ALGORITHMS}")
        self.block_size = block_size
        self.hash_seed = hash_seed
        self.algorithm = algorithm
        self._xxh = algorithm == "xxh64"
        self.init_hash = xxhash.xxh64_intdigest(hash_seed.encode()) if self._xxh else fnv64a(hash_seed.encode())

    def _hash(self, parent: int, tokens: Sequence[int], extra: Sequence[str] | None) -> int:
        if self._xxh:
            h = xxhash.xxh64()
            h.update(struct.pack("<Q", parent))
            if tokens:
                h.update(struct.pack(f"<{len(tokens)}I", *tokens))
            for s in extra or ():
                data = s.encode()
                h.update(struct.pack("<Q", len(data)))
                h.update(data)
            return h.intdigest()
        return _cbor_fnv_block(parent, tuple(tokens), tuple(extra) if extra else None)

    def root(self, model: str) -> int:
        """The chain's start for a model (or LoRA adapter) name."""
        if self._xxh:
            return self._hash(self.init_hash, (), (model,))
        return fnv64a(cbor2.dumps([self.init_hash, None, model], canonical=True))

    def keys(
        self,
        tokens: Sequence[int],
        model: str,
        *,
        parent: int | None = None,
        extra: Sequence[Sequence[str] | None] | None = None,
        cache_salt: str = "",
    ) -> list[int]:
        """Keys of the full blocks of `tokens`, chained from `parent` (or the model's root).

        `extra` gives per-block extra strings (one entry per full block, or None); `cache_salt` is added to
        block 0's extras when the chain starts at the root."""
        bs = self.block_size
        n = len(tokens) // bs
        if n == 0:
            return []
        prev = self.root(model) if parent is None else parent
        out: list[int] = []
        for i in range(n):
            block_extra: list[str] = list(extra[i] or ()) if extra is not None and i < len(extra) else []
            if i == 0 and cache_salt and parent is None:
                block_extra.append(cache_salt)
            prev = self._hash(prev, tokens[i * bs : (i + 1) * bs], block_extra or None)
            out.append(prev)
        return out

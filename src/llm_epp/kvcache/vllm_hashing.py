"""vLLM's own prefix-cache block hashes, for matching an engine's keys directly.

vLLM hashes only full blocks. Block i's hash is H((parent, tuple(block tokens), extra_keys)) where parent
is block i-1's hash, or NONE_HASH for block 0, and extra_keys is a tuple or None. H is chosen with
`--prefix-caching-hash-algo`:

- `sha256` (default): SHA-256 of the pickled tuple (protocol 5, Python-specific);
- `sha256_cbor`: SHA-256 of the canonical CBOR encoding (reproducible in any language);
- `xxhash`: 128-bit XXH3 of the pickled tuple;
- `xxhash_cbor`: 128-bit XXH3 of the canonical CBOR encoding.

NONE_HASH is H(PYTHONHASHSEED string) when the engine runs with PYTHONHASHSEED set; without it the engine
draws 32 random bytes per process, and its hashes cannot be reproduced elsewhere.

Extra keys per block, in vLLM's order: the LoRA adapter name, multimodal identifiers of inputs overlapping
the block, the request's cache_salt (block 0 only), prompt-embedding hashes. KV events publish a hash as
its low 64 bits read big-endian (`external_hash`)."""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Callable, Sequence
from typing import Any

import cbor2
import xxhash

ALGORITHMS = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")

HashFn = Callable[[Any], bytes]


def _sha256(value: Any) -> bytes:
    return hashlib.sha256(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def _sha256_cbor(value: Any) -> bytes:
    return hashlib.sha256(cbor2.dumps(value, canonical=True)).digest()


def _xxhash(value: Any) -> bytes:
    return xxhash.xxh3_128_digest(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))


def _xxhash_cbor(value: Any) -> bytes:
    return xxhash.xxh3_128_digest(cbor2.dumps(value, canonical=True))


_FUNCTIONS: dict[str, HashFn] = {
    "sha256": _sha256,
    "sha256_cbor": _sha256_cbor,
    "xxhash": _xxhash,
    "xxhash_cbor": _xxhash_cbor,
}


def hash_function(algorithm: str) -> HashFn:
    try:
        return _FUNCTIONS[algorithm]
    except KeyError:
        raise ValueError(
            f"unknown prefix caching hash algorithm {algorithm!r}; use one of {', '.join(ALGORITHMS)} "
            "(vLLM's --prefix-caching-hash-algo)"
        ) from None


def none_hash(algorithm: str, python_hash_seed: str) -> bytes:
    """The parent of block 0 for an engine started with PYTHONHASHSEED=`python_hash_seed`."""
    return hash_function(algorithm)(python_hash_seed)


def block_extra_keys(
    block_index: int, *, lora_name: str | None = None, cache_salt: str | None = None
) -> tuple[Any, ...] | None:
    """vLLM's extra keys of a text-only block: LoRA name, then cache_salt on block 0; None when empty."""
    keys: list[Any] = []
    if lora_name:
        keys.append(lora_name)
    if cache_salt and block_index == 0:
        keys.append(cache_salt)
    return tuple(keys) if keys else None


def block_hashes(
    token_ids: Sequence[int],
    block_size: int,
    *,
    algorithm: str = "sha256",
    python_hash_seed: str,
    lora_name: str | None = None,
    cache_salt: str | None = None,
    parent: bytes | None = None,
) -> list[bytes]:
    """vLLM's hashes of the full blocks of `token_ids` (a partial tail is not hashed)."""
    if block_size <= 0:
        raise ValueError(f"block_size must be > 0, got {block_size}")
    fn = hash_function(algorithm)
    prev = parent if parent else fn(python_hash_seed)
    out: list[bytes] = []
    for i in range(len(token_ids) // block_size):
        chunk = tuple(token_ids[i * block_size : (i + 1) * block_size])
        extra = block_extra_keys(i, lora_name=lora_name, cache_salt=cache_salt) if parent is None else None
        prev = fn((prev, chunk, extra))
        out.append(prev)
    return out


def external_hash(block_hash: bytes) -> int:
    """A hash as KV events carry it (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1): low 64 bits, big-endian."""
    return int.from_bytes(block_hash, "big") & ((1 << 64) - 1)

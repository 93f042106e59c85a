"""Precise prefix-cache infrastructure: KV-event decoding, per-endpoint ZMQ subscribers, the block index,
and vLLM's block hashing. Plugins use it through `llm_epp.framework.kvindex` only."""

from llm_epp.kvcache.service import InMemoryKVIndex, InMemoryKVIndexService

__all__ = ["InMemoryKVIndex", "InMemoryKVIndexService"]

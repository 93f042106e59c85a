"""Request-body fields that make a model server exchange KV-cache blocks with another host, which only the
pool's own components may set: a client's copy is removed from the body the EPP forwards.

* `kv_transfer_params` (vLLM's KV connectors, NIXL among them): `do_remote_prefill` with `remote_host` /
  `remote_port` makes the decoding server pull KV blocks from that address; `do_remote_decode` makes a
  server hold a request's blocks for a remote reader for minutes.
* `bootstrap_host`, `bootstrap_port`, `bootstrap_room` (SGLang's disaggregation): the address and room
  a decode server connects to for its KV.

The decode pod's routing sidecar sets these itself on the two legs of a split request, and talks to the
prefill pods directly, not through the gateway; a request from a client never needs them. (The sidecar
cannot drop them on its pass-through path: another decode pod's sidecar sends its prefill legs, with
`kv_transfer_params`, to a pod serving both roles through that path.)"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

__all__ = ["TRANSFER_FIELDS", "strip_transfer_fields"]

TRANSFER_FIELDS = ("kv_transfer_params", "bootstrap_host", "bootstrap_port", "bootstrap_room")


def strip_transfer_fields(payload: Mapping[str, Any], body: bytes) -> tuple[bytes, tuple[str, ...]] | None:
    """`body` (a JSON object whose parsed form is `payload`) without its transfer fields, and the names
    removed; None when it has none (the common case costs a few dictionary lookups)."""
    found = tuple(name for name in TRANSFER_FIELDS if name in payload)
    if not found:
        return None
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(doc, dict):
        return None
    for name in found:
        doc.pop(name, None)
    return orjson.dumps(doc), found

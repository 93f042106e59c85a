"""Protobuf messages of model-server APIs read by the gRPC request parsers, generated from
`proto/llm_epp/parsers/v1/` by `scripts/gen_proto.py` (do not edit the generated modules)."""

from google.protobuf.message import DecodeError

__all__ = ["DecodeError"]

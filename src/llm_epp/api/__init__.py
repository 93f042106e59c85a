"""Generated modules of llm-epp's own gRPC API (sources in `proto/`; regenerate with
`python scripts/gen_proto.py`). Imported only by the adapters that serve it."""

"""Data-layer plugins: where to poll model servers and how to read their /metrics pages."""

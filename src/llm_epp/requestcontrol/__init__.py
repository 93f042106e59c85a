"""The director and per-request lifecycle: parsing, candidates, scheduling, response hooks."""

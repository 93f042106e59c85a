"""TLS material for the ext_proc server."""

"""Several ext_proc worker processes over one scheduling state (`llm-epp serve --workers N`).

The serving process keeps everything stateful: the datastore, scrapers, discovery, flow control and the
Director with its plugins (built by `llm_epp.composition`, as for one process). It spawns N front
processes; each terminates the ext_proc gRPC streams on its own port with the usual servicer and hands the
Director calls (`route`, `response_received`, `finish`) to the serving process over a Unix socket as
small, batched, length-prefixed frames. So there is one prefix index, one in-flight count per endpoint and
one set of queues however many fronts share the load.

Modules: `wire` (frames), `hub` (the serving process's end), `remote` (the fronts' end: a Director
stand-in and the servicer that uses it), `front` (a front process), `pool` (spawning, watching and
draining the fronts)."""

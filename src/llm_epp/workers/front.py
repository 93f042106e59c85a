"""A front process: serves ext_proc on its own port with `WorkerServicer`, forwarding Director calls to the
serving process. Started with the `spawn` method (gRPC does not survive a fork); it exits when the serving
process tells it to stop (after letting its streams finish) or when the serving process goes away."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from dataclasses import dataclass
from typing import Any

from llm_epp.options import Options

log = logging.getLogger("llm_epp.workers")


@dataclass(frozen=True)
class FrontSpec:
    """What a front needs: the options, its index, the port to listen on (0 = any), the serving process's
    socket and token, whether to wait for finish metadata and for response-header hooks, and its share of
    the held-bytes bound."""

    opts: Options
    index: int
    port: int
    socket_path: str
    token: bytes
    finish_metadata: bool
    response_hooks: bool
    max_held_request_bytes: int


def main(spec: FrontSpec) -> None:
    """Process entry point."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C reaches the whole group: the parent leads
    from llm_epp.observability import configure_logging
    from llm_epp.observability.logging import level_for_flags, stacktrace_level

    o = spec.opts
    configure_logging(
        o.verbosity,
        json=o.json_logs,
        level=level_for_flags(o.verbosity, o.zap_log_level),
        stack_level=stacktrace_level(o.zap_stacktrace_level),
        time_encoding=o.zap_time_encoding,
    )
    if o.secure_serving and o.tls_cipher_suites:
        from llm_epp.security.tls_policy import apply_cipher_suites

        apply_cipher_suites(o.tls_cipher_suites)
    try:
        import uvloop
    except ImportError:
        asyncio.run(_serve(spec))
    else:
        uvloop.run(_serve(spec))


async def _serve(spec: FrontSpec) -> None:
    import grpc

    from llm_epp.app import StartupError, _credentials, ext_proc_server, grpc_server_options
    from llm_epp.observability import HealthState, add_health_service
    from llm_epp.observability.tracing import build_tracer, shutdown_tracer
    from llm_epp.workers.remote import RemoteDirector, WorkerServicer

    o = spec.opts
    loop = asyncio.get_running_loop()
    health = HealthState(leader_election=o.ha_enable_leader_election)
    tracer = build_tracer(o.tracing)  # each request's span is made and exported by the front that serves it
    remote = RemoteDirector(health, tracer)
    await loop.create_unix_connection(lambda: remote.conn, spec.socket_path)
    remote.conn.send_raw(spec.token)
    servicer = WorkerServicer(
        remote,
        finish_metadata=spec.finish_metadata,
        response_hooks=spec.response_hooks,
        max_request_body_bytes=o.max_request_body_bytes,
        enable_explain=o.enable_explain,
        max_held_request_bytes=spec.max_held_request_bytes,
        emit_endpoint_scores=o.emit_endpoint_scores,
    )
    address = f"{o.bind_address}:{spec.port}"
    server: Any
    try:
        if o.ext_proc_transport() == "asyncio":
            server = ext_proc_server(
                o, servicer.process, health if o.health_checking else None, max_held=spec.max_held_request_bytes
            )
            port = server.bind(o.bind_address, spec.port)
        else:
            server = grpc.aio.server(options=grpc_server_options(o))
            server.add_generic_rpc_handlers((servicer.handler(),))
            if o.health_checking:
                add_health_service(server, health)
            creds = _credentials(o)
            port = server.add_secure_port(address, creds) if creds else server.add_insecure_port(address)
    except (OSError, RuntimeError, StartupError) as e:
        log.error("worker_start_failed worker=%d address=%s: %s", spec.index, address, e)
        remote.conn.close()
        shutdown_tracer(tracer)
        raise SystemExit(3) from None
    await server.start()
    stop_grace: asyncio.Future[float | None] = loop.create_future()

    def on_stop(grace: float | None) -> None:  # refuse new streams, give in-flight ones `grace` seconds
        if not stop_grace.done():
            stop_grace.set_result(grace)

    remote.on_stop = on_stop
    remote.conn.send(("p", spec.index, port))
    log.info("worker_serving worker=%d grpc_port=%d pid=%d", spec.index, port, os.getpid())
    lost = loop.create_task(remote.lost.wait())
    await asyncio.wait((stop_grace, lost), return_when=asyncio.FIRST_COMPLETED)
    if lost.done():
        log.error("worker_exiting worker=%d: the serving process went away", spec.index)
        await server.stop(None)
        shutdown_tracer(tracer)
        raise SystemExit(4)
    await server.stop(stop_grace.result())
    lost.cancel()
    remote.conn.close()
    await asyncio.sleep(0)  # let the last finish messages go out
    shutdown_tracer(tracer)  # exports the spans still buffered
    log.info("worker_stopped worker=%d", spec.index)

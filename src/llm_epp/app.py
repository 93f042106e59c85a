"""Composition root: builds the datastore, discovery, config, scheduler, director and servers, runs them
in one asyncio TaskGroup, and stops gracefully on SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from llm_epp.composition import build_request_path
from llm_epp.config import ConfigError, LoadedConfig
from llm_epp.datalayer import Datastore
from llm_epp.datalayer.objectives import ObjectivesFileWatcher, ObjectivesStore
from llm_epp.datalayer.runtime import MetricsRuntime
from llm_epp.datalayer.static import EndpointsFileWatcher, EndpointSourceError, parse_endpoint_list
from llm_epp.extproc.servicer import ExtProcServicer
from llm_epp.observability import (
    HealthState,
    MetricsServer,
    PrometheusRecorder,
    add_health_service,
    configure_logging,
    start_health_server,
)
from llm_epp.options import Options
from llm_epp.pickapi import LeaseTable, PickServicer
from llm_epp.requestcontrol.director import Director
from llm_epp.security.tls import CertificateError, load_cert_dir, self_signed

log = logging.getLogger("llm_epp")

GRPC_SERVER_OPTIONS = (
    ("grpc.so_reuseport", 0),
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.max_send_message_length", 64 << 20),
)


class StartupError(Exception):
    """A problem that stops the EPP from starting; the message says how to fix it."""


@dataclass
class Components:
    datastore: Datastore
    recorder: PrometheusRecorder
    config: LoadedConfig
    director: Director
    servicer: ExtProcServicer
    health: HealthState
    file_watcher: EndpointsFileWatcher | None
    pick: PickServicer
    objectives_watcher: ObjectivesFileWatcher | None
    metrics_runtime: MetricsRuntime | None
    objectives: ObjectivesStore


def build(opts: Options) -> Components:
    """Everything that does not listen on a port. Raises StartupError."""
    recorder = PrometheusRecorder()
    try:
        path = build_request_path(
            recorder=recorder,
            config_text=opts.config_text,
            config_file=opts.config_file,
            pool_name=opts.pool_name or ("standalone" if opts.endpoint_selector else "static"),
            disable_subset_filter=opts.disable_endpoint_subset_filter,
        )
    except ConfigError as e:
        raise StartupError(str(e)) from None
    datastore, config, director, objectives = path.datastore, path.config, path.director, path.objectives
    watcher: EndpointsFileWatcher | None = None
    try:
        if opts.endpoints:
            datastore.replace_all(parse_endpoint_list(opts.endpoints))
        elif opts.endpoints_file:
            watcher = EndpointsFileWatcher(opts.endpoints_file, datastore)
            watcher.load()
    except EndpointSourceError as e:
        raise StartupError(str(e)) from None
    objectives_watcher: ObjectivesFileWatcher | None = None
    if opts.objectives_file:
        objectives_watcher = ObjectivesFileWatcher(opts.objectives_file, objectives)
        try:
            objectives_watcher.load()
        except ValueError as e:
            raise StartupError(str(e)) from None
    servicer = ExtProcServicer(director, opts.max_request_body_bytes, enable_explain=opts.enable_explain)
    health = HealthState(synced=datastore.synced, leader_election=opts.ha_enable_leader_election)
    pick = PickServicer(
        director,
        datastore.snapshot,
        plugins=config.plugins.values(),
        leases=LeaseTable(director),
        max_request_body_bytes=opts.max_request_body_bytes,
    )
    runtime = None
    if config.data_source is not None and config.extractor is not None:
        runtime = MetricsRuntime(
            datastore,
            config.data_source,
            config.extractor,
            interval=opts.refresh_metrics_interval,
            staleness=opts.metrics_staleness_threshold,
            recorder=recorder,
            refresh_prometheus_interval=opts.refresh_prometheus_metrics_interval,
        )
    return Components(
        datastore, recorder, config, director, servicer, health, watcher, pick, objectives_watcher, runtime, objectives
    )


def _credentials(opts: Options) -> grpc.ServerCredentials | None:
    if not opts.secure_serving:
        return None
    try:
        cert, key = load_cert_dir(opts.cert_path) if opts.cert_path else self_signed()
    except CertificateError as e:
        raise StartupError(str(e)) from None
    return grpc.ssl_server_credentials([(key, cert)])


def _kubernetes_client(opts: Options) -> Any:
    if not opts.pool_name and not opts.endpoint_selector:
        return None
    from llm_epp.k8s import api_client_from_environment

    try:
        return api_client_from_environment()
    except Exception as e:  # any credentials problem is a startup error with its reason
        flag = "--pool-name" if opts.pool_name else "--endpoint-selector"
        raise StartupError(f"{flag} needs Kubernetes credentials (in-cluster or kubeconfig): {e}") from None


async def serve(opts: Options, stop: asyncio.Event | None = None) -> None:
    c = build(opts)
    api = _kubernetes_client(opts)  # before any listener starts, so a credentials error leaks nothing
    stop = stop or asyncio.Event()
    server = grpc.aio.server(options=GRPC_SERVER_OPTIONS)
    server.add_generic_rpc_handlers((c.servicer.handler(), c.pick.handler()))
    if opts.health_checking:
        add_health_service(server, c.health)
    address = f"{opts.bind_address}:{opts.grpc_port}"
    creds = _credentials(opts)
    try:
        port = server.add_secure_port(address, creds) if creds else server.add_insecure_port(address)
    except RuntimeError as e:
        raise StartupError(f"cannot listen on {address} for ext_proc: {e}") from None
    try:
        health_server, health_port = await start_health_server(opts.bind_address, opts.grpc_health_port, c.health)
    except RuntimeError as e:
        raise StartupError(f"cannot listen on port {opts.grpc_health_port} for health: {e}") from None
    try:
        metrics = MetricsServer(c.recorder.registry, opts.bind_address, opts.metrics_port).start()
    except OSError as e:
        await health_server.stop(None)
        raise StartupError(f"cannot listen on port {opts.metrics_port} for metrics: {e.strerror}") from None
    await server.start()
    c.health.synced = c.datastore.synced
    log.info(
        "serving grpc_port=%d health_port=%d metrics_port=%d tls=%s endpoints=%d",
        port,
        health_port,
        metrics.port,
        creds is not None,
        len(c.datastore),
    )
    if opts.ports_file:
        ports = {"grpc": port, "health": health_port, "metrics": metrics.port}
        await asyncio.to_thread(_write_ports, opts.ports_file, ports)
    loop = asyncio.get_running_loop()
    discovery = _KubernetesDiscovery(api, opts, c, loop) if api is not None else None
    if discovery is not None:
        discovery.start()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    try:
        async with asyncio.TaskGroup() as tg:
            background = [tg.create_task(c.pick.leases.run())]
            if c.file_watcher is not None:
                background.append(tg.create_task(c.file_watcher.run()))
            if c.metrics_runtime is not None:
                background.append(tg.create_task(c.metrics_runtime.run()))
            if c.objectives_watcher is not None:
                background.append(tg.create_task(c.objectives_watcher.run()))
            if discovery is not None and discovery.elector is not None:
                background.append(tg.create_task(discovery.follow_leadership()))
            await stop.wait()
            log.info("stopping")
            c.health.synced = False
            await server.stop(grace=5)  # Release calls during the grace period still land
            await health_server.stop(None)
            for task in background:  # cancelling the lease sweeper releases every outstanding lease
                task.cancel()
    finally:
        if discovery is not None:
            await discovery.stop()
        if api is not None:
            api.close()
        metrics.stop()


class _KubernetesDiscovery:
    """Watches the InferencePool and its pods; with leader election, only while this replica leads (the
    reference's active-passive HA: followers stay unsynced, so not ready, and the Service routes to the
    leader). The watches run in worker threads and post their changes to the loop."""

    def __init__(self, api: Any, opts: Options, c: Components, loop: asyncio.AbstractEventLoop) -> None:
        from llm_epp.k8s import LeaderElector, default_lease_name

        self._api, self._opts, self._c, self._loop = api, opts, c, loop
        self._changed = asyncio.Event()
        self.watcher: Any = None
        self.objectives: Any = None
        self.elector: LeaderElector | None = None
        if opts.ha_enable_leader_election:
            lease = default_lease_name(opts.pool_namespace, opts.pool_name)
            self.elector = LeaderElector(
                api, opts.pool_namespace, lease, None, loop, self._started_leading, self._stopped_leading
            )

    def _new_watcher(self) -> Any:
        from llm_epp.k8s import PoolWatcher

        def on_sync(synced: bool) -> None:
            self._c.health.synced = synced

        o = self._opts
        if o.endpoint_selector:
            from llm_epp.k8s.selector import SelectorWatcher, standalone_pool_spec

            spec = standalone_pool_spec(o.pool_namespace, o.endpoint_selector, o.endpoint_target_ports)
            return SelectorWatcher(self._api, spec, self._c.datastore, self._loop, on_sync=on_sync)
        return PoolWatcher(
            self._api, o.pool_namespace, o.pool_name, o.pool_group, self._c.datastore, self._loop, on_sync=on_sync
        )

    def start(self) -> None:
        o = self._opts
        if o.pool_name and not o.objectives_file:  # InferenceObjectives / rewrites, when their CRDs exist
            from llm_epp.k8s.objectives import ObjectivesWatcher

            self.objectives = ObjectivesWatcher(
                self._api, o.pool_namespace, o.pool_name, o.pool_group, self._c.objectives, self._loop
            )
            try:
                self.objectives.start()
            except Exception as e:  # API discovery failed for another reason than absent CRDs
                log.warning("k8s_objectives_unavailable reason=%r", e)
                self.objectives = None
        if self.elector is not None:
            self.elector.start()
        else:
            self.watcher = self._new_watcher()
            self.watcher.start()

    def _started_leading(self) -> None:
        self._c.health.is_leader = True
        log.info("leader_election_won")
        self._changed.set()

    def _stopped_leading(self) -> None:
        self._c.health.is_leader = False
        log.info("leader_election_lost")
        self._changed.set()

    async def follow_leadership(self) -> None:
        """Starts the watches when leadership is gained and stops them (emptying the pool) when it is lost.
        A stopped watcher cannot restart, so each term gets a new one."""
        c = self._c
        while True:
            await self._changed.wait()
            self._changed.clear()
            if c.health.is_leader and self.watcher is None:
                self.watcher = self._new_watcher()
                self.watcher.start()
            elif not c.health.is_leader and self.watcher is not None:
                watcher, self.watcher = self.watcher, None
                await asyncio.to_thread(watcher.stop)
                c.datastore.clear()
                c.datastore.synced = False  # clear() marks the store synced; a follower is not
                c.health.synced = False

    async def stop(self) -> None:
        if self.objectives is not None:
            await asyncio.to_thread(self.objectives.stop)
        if self.watcher is not None:
            watcher, self.watcher = self.watcher, None
            await asyncio.to_thread(watcher.stop)
        if self.elector is not None:
            await asyncio.to_thread(self.elector.stop)  # releases the lease for a follower to take at once


def _write_ports(path: str, ports: dict[str, int]) -> None:
    tmp = Path(path + ".tmp")
    tmp.write_text(json.dumps(ports))
    tmp.replace(path)


def run(opts: Options) -> None:
    configure_logging(opts.verbosity, json=opts.json_logs)
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(opts))
    else:
        uvloop.run(serve(opts))

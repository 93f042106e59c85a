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

from llm_epp.config import ConfigError, LoadedConfig, load_config, load_config_text
from llm_epp.datalayer import Datastore
from llm_epp.datalayer.objectives import ObjectivesFileWatcher, ObjectivesStore
from llm_epp.datalayer.runtime import MetricsRuntime
from llm_epp.datalayer.static import EndpointsFileWatcher, EndpointSourceError, parse_endpoint_list
from llm_epp.extproc.servicer import ExtProcServicer
from llm_epp.flowcontrol import FlowController
from llm_epp.framework.parsing import Parser
from llm_epp.framework.tracing import NULL_TRACER, Tracer
from llm_epp.legacy_flags import apply_legacy_metrics_flags
from llm_epp.observability import (
    HealthState,
    PrometheusRecorder,
    add_health_service,
    configure_logging,
    start_health_server,
)
from llm_epp.observability.flowcontrol_metrics import FlowControlMetrics
from llm_epp.observability.logging import level_for_flags, stacktrace_level
from llm_epp.observability.metrics_auth import KubernetesAuthorizer
from llm_epp.observability.metrics_http import CertDirWatch, MetricsHttpServer, server_tls_context
from llm_epp.observability.stream_metrics import StreamMetrics
from llm_epp.observability.tracing import build_tracer, shutdown_tracer, with_plugin_spans
from llm_epp.options import DEFAULT_GRPC_MAX_MSG_BYTES, Options
from llm_epp.pickapi import PickServicer
from llm_epp.plugins import builtin_registry
from llm_epp.plugins.parsers import default_parsers
from llm_epp.requestcontrol.director import Director, DirectorOptions, RequestPlugins
from llm_epp.security.cert_reload import CertReloader, check_pair
from llm_epp.security.tls import CertificateError, load_cert_dir, self_signed
from llm_epp.security.tls_policy import cipher_suites_in_effect
from llm_epp.stability import experimental_plugin_problem

log = logging.getLogger("llm_epp")

GRPC_SERVER_OPTIONS = (
    ("grpc.so_reuseport", 0),
    ("grpc.max_receive_message_length", DEFAULT_GRPC_MAX_MSG_BYTES),
    ("grpc.max_send_message_length", DEFAULT_GRPC_MAX_MSG_BYTES),
)


def grpc_server_options(opts: Options) -> tuple[tuple[str, int], ...]:
    """`GRPC_SERVER_OPTIONS` with `--grpc-max-recv-msg-size` / `--grpc-max-send-msg-size` when given."""
    given = {
        "grpc.max_receive_message_length": opts.grpc_max_recv_msg_size,
        "grpc.max_send_message_length": opts.grpc_max_send_msg_size,
    }
    return tuple((name, given.get(name) or value) for name, value in GRPC_SERVER_OPTIONS)


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
    tracer: Tracer = NULL_TRACER


def configured_parsers(config: LoadedConfig) -> list[Parser]:
    """The parsers named by `requestHandler.parsers` (or GIE's `parser`), in their order; llm-d-router's default
    list (openai-parser, then passthrough-parser as the fallback) when the configuration names none."""
    return list(config.parsers) or default_parsers()


def build(opts: Options) -> Components:
    """Everything that does not listen on a port. Raises StartupError."""
    datastore = Datastore(pool_name=opts.pool_name or ("standalone" if opts.endpoint_selector else "static"))
    watcher: EndpointsFileWatcher | None = None
    try:
        if opts.endpoints:
            datastore.replace_all(parse_endpoint_list(opts.endpoints))
        elif opts.endpoints_file:
            watcher = EndpointsFileWatcher(opts.endpoints_file, datastore)
            watcher.load()
    except EndpointSourceError as e:
        raise StartupError(str(e)) from None
    objectives = ObjectivesStore()
    objectives_watcher: ObjectivesFileWatcher | None = None
    if opts.objectives_file:
        objectives_watcher = ObjectivesFileWatcher(opts.objectives_file, objectives)
        try:
            objectives_watcher.load()
        except ValueError as e:
            raise StartupError(str(e)) from None
    recorder = PrometheusRecorder()
    tracer = build_tracer(opts.tracing)
    plugin_recorder = with_plugin_spans(recorder, tracer)  # plugin timings also as spans when tracing
    registry = builtin_registry()
    try:
        if opts.config_file:
            config = load_config(opts.config_file, registry, plugin_recorder, datastore.snapshot)
        else:
            config = load_config_text(opts.config_text or None, registry, plugin_recorder, datastore.snapshot)
    except ConfigError as e:
        raise StartupError(str(e)) from None
    if problem := experimental_plugin_problem(config.plugin_types, opts.allow_experimental_plugins):
        raise StartupError(problem)
    apply_legacy_metrics_flags(config, opts)
    flow_control = None
    if config.flow_control is not None and config.saturation is not None:
        flow_control = FlowController(
            config.flow_control,
            config.saturation,
            datastore.snapshot,
            FlowControlMetrics(recorder.registry, opts.pool_name),
        )
    director = Director(
        datastore.snapshot,
        config.scheduler,
        RequestPlugins(
            prepare_data=config.prepare_data,
            admission=config.admission,
            pre_request=config.pre_request,
            response_received=config.response_received,
            response_complete=config.response_complete,
        ),
        plugin_recorder,
        DirectorOptions(disable_subset_filter=opts.disable_endpoint_subset_filter, objectives=objectives),
        saturation=config.saturation,
        parsers=configured_parsers(config),
        tracer=tracer,
        flow_control=flow_control,
    )
    servicer = ExtProcServicer(
        director,
        opts.max_request_body_bytes,
        enable_explain=opts.enable_explain,
        max_held_request_bytes=opts.max_held_request_bytes,
        emit_endpoint_scores=opts.emit_endpoint_scores,
    )
    health = HealthState(synced=datastore.synced, leader_election=opts.ha_enable_leader_election)
    pick = PickServicer(
        director,
        datastore.snapshot,
        plugins=config.plugins.values(),
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
        datastore,
        recorder,
        config,
        director,
        servicer,
        health,
        watcher,
        pick,
        objectives_watcher,
        runtime,
        objectives,
        tracer,
    )


def _credentials(opts: Options) -> grpc.ServerCredentials | None:
    if not opts.secure_serving:
        for flag, given in (
            ("--enable-cert-reload", opts.enable_cert_reload),
            ("--tls-min-version", opts.tls_min_version),
            ("--tls-cipher-suites", opts.tls_cipher_suites),
        ):
            if given:
                log.warning("%s has no effect: ext_proc is served without TLS (--secure-serving=false)", flag)
        return None
    if not cipher_suites_in_effect(opts.tls_cipher_suites):
        raise StartupError(
            "--tls-cipher-suites must be exported (GRPC_SSL_CIPHER_SUITES) before grpc is imported; start the EPP "
            "with the llm-epp command, or call llm_epp.security.tls_policy.apply_cipher_suites first"
        )
    if opts.tls_cipher_suites:
        log.info("ext_proc_tls_cipher_suites %s", ",".join(opts.tls_cipher_suites))
    try:
        if opts.cert_path and opts.enable_cert_reload:
            return CertReloader(opts.cert_path).credentials()
        cert, key = load_cert_dir(opts.cert_path) if opts.cert_path else self_signed()
        if opts.cert_path:
            check_pair(cert, key)
    except CertificateError as e:
        raise StartupError(str(e)) from None
    if opts.enable_cert_reload:
        log.warning("--enable-cert-reload has no effect without --cert-path: the certificate is self-signed")
    return grpc.ssl_server_credentials([(key, cert)])


def _in_cluster_client() -> Any:
    """An ApiClient from the pod's service account, None outside a cluster (the process-wide kubernetes
    configuration is left alone)."""
    from kubernetes import client, config

    cfg = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    except config.ConfigException:
        return None
    return client.ApiClient(cfg)


def _metrics_server(opts: Options, c: Components, api: Any) -> tuple[MetricsHttpServer, Any]:
    """The metrics port as the flags say (not started), and the ApiClient it made for itself (None if it
    uses discovery's or none). Without a cluster to ask, `--metrics-endpoint-auth` cannot be enforced: the
    port is served unauthenticated with a warning, as the reference does when it runs without Kubernetes."""
    authorizer, own = None, None
    if opts.metrics_endpoint_auth:
        client = api
        if client is None:
            client = own = _in_cluster_client()
        if client is None:
            log.warning(
                "metrics_endpoint_unauthenticated: no Kubernetes API to review tokens with (not in a cluster and "
                "no --pool-name/--endpoint-selector), so /metrics%s is served to anyone who can reach port %d; "
                "pass --metrics-endpoint-auth=false to silence this",
                " and /debug/pprof" if opts.enable_pprof else "",
                opts.metrics_port,
            )
        else:
            authorizer = KubernetesAuthorizer(client)
    tls, watch = None, None
    if opts.metrics_cert_dir:
        try:
            tls = server_tls_context(opts.metrics_cert_dir, opts.metrics_client_ca_file)
        except (OSError, ValueError) as e:
            raise StartupError(f"--metrics-cert-dir {opts.metrics_cert_dir}: cannot use its key pair: {e}") from None
        watch = CertDirWatch(tls, opts.metrics_cert_dir)
    server = MetricsHttpServer(
        c.recorder.registry,
        opts.bind_address,
        opts.metrics_port,
        authorizer=authorizer,
        enable_pprof=opts.enable_pprof,
        tls=tls,
        cert_watch=watch,
    )
    return server, own


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
    metrics, metrics_api = _metrics_server(opts, c, api)  # may refuse to start: before any listener too
    stop = stop or asyncio.Event()
    interceptors = [StreamMetrics(c.recorder.registry).interceptor()] if opts.enable_grpc_stream_metrics else []
    server = grpc.aio.server(options=grpc_server_options(opts), interceptors=interceptors)
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
        metrics.start()
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
        metrics.stop()
        if metrics_api is not None:
            metrics_api.close()
        shutdown_tracer(c.tracer)  # exports the spans still buffered
        if discovery is not None:
            await discovery.stop()
        if api is not None:
            api.close()


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
    configure_logging(
        opts.verbosity,
        json=opts.json_logs,
        level=level_for_flags(opts.verbosity, opts.zap_log_level),
        stack_level=stacktrace_level(opts.zap_stacktrace_level),
        time_encoding=opts.zap_time_encoding,
    )
    for flag, given in (
        ("--model-server-metrics-scheme", opts.model_server_metrics_scheme is not None),
        ("--model-server-metrics-path", opts.model_server_metrics_path is not None),
        ("--model-server-metrics-port", opts.model_server_metrics_port != 0),
        (
            "--model-server-metrics-https-insecure-skip-verify",
            opts.model_server_metrics_https_insecure_skip_verify is not None,
        ),
    ):
        if given:
            log.warning(
                "flag %s is deprecated: set the metrics-data-source plugin's parameters in the "
                "EndpointPickerConfig instead",
                flag,
            )
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(opts))
    else:
        uvloop.run(serve(opts))

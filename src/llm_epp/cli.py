"""`llm-epp`: serve (the EPP), envoy-config (an Envoy bootstrap for it), config check (validate a config).

For drop-in use in place of the reference EPP, flags given without a subcommand mean `serve`."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from llm_epp import __version__
from llm_epp.options import Options

_TRUE = {"true", "1", "yes", "on"}
# Rejected by the reference too: metric names are configured per engine in core-metrics-extractor.
_LEGACY_METRIC_FLAGS = (
    "--total-queued-requests-metric",
    "--total-running-requests-metric",
    "--kv-cache-usage-percentage-metric",
    "--lora-info-metric",
    "--cache-info-metric",
)
_FALSE = {"false", "0", "no", "off"}


def _go_bool(value: str) -> bool:
    v = value.lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")


def _size(value: str) -> int:
    units = {"k": 1 << 10, "ki": 1 << 10, "m": 1 << 20, "mi": 1 << 20, "g": 1 << 30, "gi": 1 << 30}
    v = value.strip().lower()
    for suffix in sorted(units, key=len, reverse=True):
        if v.endswith(suffix):
            num = v[: -len(suffix)]
            if num.isdigit():
                return int(num) * units[suffix]
    if v.isdigit():
        return int(v)
    raise argparse.ArgumentTypeError(f"expected a byte size such as 16777216 or 16Mi, got {value!r}")


def _duration(value: str) -> float:
    from llm_epp.framework.durations import parse_go_duration

    try:
        seconds = parse_go_duration(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive duration such as 50ms or 2s, got {value!r}")
    return seconds


def _bool_flag(p: argparse.ArgumentParser, name: str, default: bool, help: str) -> None:
    p.add_argument(name, type=_go_bool, nargs="?", const=True, default=default, metavar="true|false", help=help)


def _serve_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--grpc-port", type=int, default=9002, help="ext_proc gRPC port (default 9002)")
    p.add_argument("--grpc-health-port", type=int, default=9003, help="gRPC health port (default 9003)")
    p.add_argument("--metrics-port", type=int, default=9090, help="Prometheus /metrics port (default 9090)")
    p.add_argument("--bind-address", default="0.0.0.0", help="address to listen on (default all interfaces)")
    _bool_flag(p, "--secure-serving", True, "serve ext_proc over TLS (default true; self-signed unless --cert-path)")
    p.add_argument("--cert-path", default="", help="directory with tls.crt and tls.key for ext_proc TLS")
    _bool_flag(p, "--health-checking", False, "also serve gRPC health on the ext_proc port")
    src = p.add_argument_group("configuration")
    src.add_argument("--config-file", default="", help="EndpointPickerConfig YAML file")
    src.add_argument("--config-text", default="", help="EndpointPickerConfig YAML text")
    disc = p.add_argument_group("endpoint discovery (exactly one)")
    disc.add_argument("--endpoints", default="", help="static endpoints, e.g. 10.0.0.5:8000,10.0.0.6:8000")
    disc.add_argument("--endpoints-file", default="", help="YAML file listing endpoints; reloaded on change")
    disc.add_argument("--pool-name", default="", help="InferencePool to watch (Kubernetes)")
    disc.add_argument("--pool-namespace", default="", help="namespace of the pool (default $NAMESPACE or default)")
    disc.add_argument("--pool-group", default="inference.networking.k8s.io", help="API group of the InferencePool")
    disc.add_argument(
        "--endpoint-selector", default="", help="standalone Kubernetes mode: pods matching k=v[,k=v] are the pool"
    )
    disc.add_argument(
        "--endpoint-target-ports", default="", help="with --endpoint-selector: the model-server ports (1-8, comma list)"
    )
    _bool_flag(
        disc,  # type: ignore[arg-type]
        "--ha-enable-leader-election",
        False,
        "active-passive HA: only the replica holding the pool's Lease watches the pool and reports ready",
    )
    p.add_argument(
        "--max-request-body-bytes", type=_size, default=16 << 20, help="larger bodies get 413 (default 16Mi)"
    )
    _bool_flag(p, "--disable-endpoint-subset-filter", False, "ignore the gateway's endpoint subset hint")
    p.add_argument("-v", "--v", dest="verbosity", type=int, default=2, help="log verbosity: 2 info, 4 debug, 5 trace")
    p.add_argument("--zap-encoder", choices=("json", "console"), default="console", help="log format")
    data = p.add_argument_group("model-server metrics")
    data.add_argument(
        "--refresh-metrics-interval", type=_duration, default=0.05, help="scrape interval per endpoint (default 50ms)"
    )
    data.add_argument(
        "--refresh-prometheus-metrics-interval",
        type=_duration,
        default=5.0,
        help="how often the inference_pool_* gauges are updated (default 5s)",
    )
    data.add_argument(
        "--metrics-staleness-threshold",
        type=_duration,
        default=2.0,
        help="metrics older than this are stale and left out of pool gauges (default 2s)",
    )
    for legacy in _LEGACY_METRIC_FLAGS:
        data.add_argument(legacy, dest=legacy.lstrip("-").replace("-", "_"), default=None, help=argparse.SUPPRESS)
    p.add_argument("--ports-file", default="", help="write the bound ports as JSON here once serving")
    _bool_flag(
        p,
        "--enable-explain",
        False,
        "answer requests carrying x-llm-epp-explain: 1 with each candidate's scores in the response header "
        "x-gateway-destination-endpoint-scores",
    )
    p.add_argument(
        "--objectives-file",
        default="",
        help="YAML with InferenceObjective priorities and model rewrite rules (without Kubernetes); reloaded on change",
    )


def _options(args: argparse.Namespace) -> Options:
    return Options(
        grpc_port=args.grpc_port,
        grpc_health_port=args.grpc_health_port,
        metrics_port=args.metrics_port,
        bind_address=args.bind_address,
        secure_serving=args.secure_serving,
        cert_path=args.cert_path,
        health_checking=args.health_checking,
        config_file=args.config_file,
        config_text=args.config_text,
        endpoints=args.endpoints,
        endpoints_file=args.endpoints_file,
        pool_name=args.pool_name,
        pool_namespace=args.pool_namespace or os.environ.get("NAMESPACE", "") or "default",
        pool_group=args.pool_group,
        ha_enable_leader_election=args.ha_enable_leader_election,
        endpoint_selector=args.endpoint_selector,
        endpoint_target_ports=args.endpoint_target_ports,
        max_request_body_bytes=args.max_request_body_bytes,
        disable_endpoint_subset_filter=args.disable_endpoint_subset_filter,
        verbosity=args.verbosity,
        json_logs=args.zap_encoder == "json",
        ports_file=args.ports_file,
        enable_explain=args.enable_explain,
        refresh_metrics_interval=args.refresh_metrics_interval,
        refresh_prometheus_metrics_interval=args.refresh_prometheus_metrics_interval,
        metrics_staleness_threshold=args.metrics_staleness_threshold,
        objectives_file=args.objectives_file,
    )


def _selector_problems(opts: Options) -> list[str]:
    if not opts.endpoint_selector:
        return ["--endpoint-target-ports is only used with --endpoint-selector"] if opts.endpoint_target_ports else []
    from llm_epp.k8s.selector import EndpointSelectorError, parse_endpoint_selector, parse_target_ports

    problems = []
    try:
        parse_endpoint_selector(opts.endpoint_selector)
    except EndpointSelectorError as e:
        problems.append(str(e))
    if not opts.endpoint_target_ports:
        problems.append("--endpoint-selector needs --endpoint-target-ports, e.g. --endpoint-target-ports 8000")
    else:
        try:
            parse_target_ports(opts.endpoint_target_ports)
        except EndpointSelectorError as e:
            problems.append(str(e))
    if opts.ha_enable_leader_election:
        problems.append(
            "--ha-enable-leader-election needs --pool-name; standalone --endpoint-selector runs one replica"
        )
    return problems


def check_options(opts: Options) -> list[str]:
    """Problems with a flag combination, each saying how to fix it."""
    problems = []
    if opts.config_file and opts.config_text:
        problems.append("--config-file and --config-text are mutually exclusive; give one")
    sources = [
        n
        for n, v in (
            ("--endpoints", opts.endpoints),
            ("--endpoints-file", opts.endpoints_file),
            ("--pool-name", opts.pool_name),
            ("--endpoint-selector", opts.endpoint_selector),
        )
        if v
    ]
    if len(sources) > 1:
        problems.append(f"give exactly one endpoint source, not {' and '.join(sources)}")
    if not sources:
        problems.append(
            "no endpoint source: give --pool-name NAME or --endpoint-selector k=v (Kubernetes), "
            "--endpoints host:port,... or --endpoints-file FILE"
        )
    problems.extend(_selector_problems(opts))
    if opts.ha_enable_leader_election and not opts.pool_name:
        problems.append(
            "--ha-enable-leader-election needs --pool-name (the Lease coordinates replicas serving one InferencePool)"
        )
    if opts.max_request_body_bytes <= 0:
        problems.append("--max-request-body-bytes must be positive")
    for name, port in (
        ("--grpc-port", opts.grpc_port),
        ("--grpc-health-port", opts.grpc_health_port),
        ("--metrics-port", opts.metrics_port),
    ):
        if not 0 <= port <= 65535:
            problems.append(f"{name} must be between 0 and 65535")
    return problems


def _config_check(args: argparse.Namespace) -> int:
    from llm_epp.config import ConfigError, load_config
    from llm_epp.framework import NullRecorder
    from llm_epp.plugins import builtin_registry

    try:
        loaded = load_config(args.file, builtin_registry(), NullRecorder())
    except ConfigError as e:
        print(e, file=sys.stderr)
        return 1
    print(f"{args.file}: valid")
    print(loaded.describe())
    return 0


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The `llm-epp` parser. Only the subcommand named by `command` gets its arguments when it is `envoy-config`
    or `sim`: their modules (the Envoy config builder, the simulator) are imported just for them, so
    `llm-epp serve` loads only what serving needs."""
    parser = argparse.ArgumentParser(prog="llm-epp", description="Endpoint Picker for LLM inference pools")
    parser.add_argument("--version", action="version", version=f"llm-epp {__version__}")
    sub = parser.add_subparsers(dest="command")
    _serve_parser(sub.add_parser("serve", help="run the endpoint picker"))
    envoy = sub.add_parser("envoy-config", help="print an Envoy bootstrap for the EPP")
    if command == "envoy-config":
        from llm_epp.gateway import envoy_config

        envoy_config.add_arguments(envoy)
    sim = sub.add_parser("sim", help="run simulated vLLM or SGLang pods on loopback")
    if command == "sim":
        from llm_epp.sim import cli as sim_cli

        sim_cli.add_arguments(sim)
    cfg = sub.add_parser("config", help="work with EndpointPickerConfig files")
    cfg_sub = cfg.add_subparsers(dest="config_command", required=True)
    check = cfg_sub.add_parser("check", help="validate a config file and print the resolved profiles")
    check.add_argument("file")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list and args_list[0].startswith("-") and args_list[0] not in ("-h", "--help", "--version"):
        args_list.insert(0, "serve")
    parser = build_parser(args_list[0] if args_list else None)
    args = parser.parse_args(args_list)
    if args.command == "serve":
        opts = _options(args)
        problems = check_options(opts)
        for legacy in _LEGACY_METRIC_FLAGS:
            if getattr(args, legacy.lstrip("-").replace("-", "_")) is not None:
                problems.append(
                    f"{legacy} is no longer supported: set metric names per engine in the core-metrics-extractor "
                    "plugin's engineConfigs"
                )
        if problems:
            for p in problems:
                print(f"llm-epp: {p}", file=sys.stderr)
            return 2
        from llm_epp.app import StartupError, run

        try:
            run(opts)
        except StartupError as e:
            print(f"llm-epp: {e}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            return 130
        return 0
    if args.command == "envoy-config":
        from llm_epp.gateway import envoy_config

        return envoy_config.run(args)
    if args.command == "config":
        return _config_check(args)
    if args.command == "sim":
        from llm_epp.sim import cli as sim_cli

        return sim_cli.run(args)
    parser.print_help()
    return 2

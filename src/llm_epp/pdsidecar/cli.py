"""``llm-epp pd-sidecar``: the decode-side P/D routing proxy, in front of the local model server."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import TYPE_CHECKING

from llm_epp.framework.durations import parse_go_duration
from llm_epp.pdsidecar.allowlist import Allowlist, AllowlistError
from llm_epp.pdsidecar.protocol import DEFAULT_SGLANG_BOOTSTRAP_PORT, KV_CONNECTORS

if TYPE_CHECKING:
    from llm_epp.pdsidecar.proxy import SidecarConfig

__all__ = ["add_arguments", "config_from_args", "run"]

log = logging.getLogger(__name__)

# llm-d-router sidecar flags llm-epp does not implement yet: flag -> the value that means "off".
_UNSUPPORTED: dict[str, object] = {
    "decode_chunk_size": 0,
    "data_parallel_size": 1,
    "enable_tls": None,
    "inference_pool": None,
    "secure_serving": False,
    "ec_connector": None,
}
_OTHER_CONNECTORS = ("shared-storage", "mooncake", "offloading")


def _bool(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("1", "t", "true", "yes", "on"):
        return True
    if lowered in ("0", "f", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    env_sampling = os.environ.get("ENABLE_PREFILLER_SAMPLING", "")
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    parser.add_argument("--port", type=int, default=8000, help="port the sidecar listens on (default 8000)")
    parser.add_argument("--model-server-port", type=int, default=None,
                        help="port of the local model server (default 8200)")  # fmt: skip
    parser.add_argument("--vllm-port", type=int, default=None, help="deprecated name of --model-server-port")
    parser.add_argument("--model-server-host", default="127.0.0.1",
                        help="address of the local model server (default 127.0.0.1)")  # fmt: skip
    parser.add_argument("--kv-connector", default="nixlv2",
                        help=f"KV transfer protocol: {', '.join(KV_CONNECTORS)} (default nixlv2)")  # fmt: skip
    parser.add_argument("--enable-prefiller-sampling", type=_bool, nargs="?", const=True,
                        default=_bool(env_sampling) if env_sampling else False,
                        help="pick the prefill pod at random when the header lists several (default: the first; "
                             "env ENABLE_PREFILLER_SAMPLING)")  # fmt: skip
    parser.add_argument("--enable-ssrf-protection", type=_bool, nargs="?", const=True, default=False,
                        help="only contact prefill pods on the allow-list (needs --allowed-prefill-targets "
                             "and/or --endpoints-file)")  # fmt: skip
    parser.add_argument("--allowed-prefill-targets", default="",
                        help="comma-separated host or host:port entries prefill requests may go to")  # fmt: skip
    parser.add_argument("--endpoints-file", default="",
                        help="endpoints file of the pool (allowed targets); re-read on change")  # fmt: skip
    parser.add_argument("--sglang-bootstrap-port", type=int,
                        default=int(os.environ.get("SGLANG_BOOTSTRAP_PORT", DEFAULT_SGLANG_BOOTSTRAP_PORT)),
                        help="SGLang prefill bootstrap port (default 8998, env SGLANG_BOOTSTRAP_PORT)")  # fmt: skip
    parser.add_argument("--prefill-timeout", type=float, default=600.0,
                        help="seconds the prefill leg may take before decoding locally (default 600)")  # fmt: skip
    parser.add_argument("--prefill-max-retries", type=int, default=0,
                        help="retries of a prefill leg answered 502/503/504 or not reached (default 0)")  # fmt: skip
    parser.add_argument("--prefill-retry-backoff", default="200ms",
                        help="pause between prefill retries, a Go duration (default 200ms)")  # fmt: skip
    # accepted so that upstream command lines give a clear answer; only their "off" values work
    parser.add_argument("--decode-chunk-size", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--data-parallel-size", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--enable-tls", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--inference-pool", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--secure-serving", "--secure-proxy", type=_bool, nargs="?", const=True, default=False,
                        help=argparse.SUPPRESS)  # fmt: skip
    parser.add_argument("--ec-connector", default=None, help=argparse.SUPPRESS)


def config_from_args(args: argparse.Namespace) -> tuple[SidecarConfig, list[str]]:
    """The sidecar configuration, and the problems that prevent starting (empty when none)."""
    from llm_epp.pdsidecar.proxy import SidecarConfig

    problems: list[str] = []
    for name, off in _UNSUPPORTED.items():
        if getattr(args, name) != off:
            flag = "--" + name.replace("_", "-")
            hint = "; use --endpoints-file for the allow-list" if name == "inference_pool" else ""
            problems.append(f"{flag} is not supported yet by llm-epp pd-sidecar{hint}")
    if args.kv_connector in _OTHER_CONNECTORS:
        problems.append(f"--kv-connector {args.kv_connector} is not supported yet; use {' or '.join(KV_CONNECTORS)}")
    elif args.kv_connector not in KV_CONNECTORS:
        problems.append(f"--kv-connector {args.kv_connector!r} is unknown; use {' or '.join(KV_CONNECTORS)}")
    if args.model_server_port is not None and args.vllm_port is not None and args.model_server_port != args.vllm_port:
        problems.append("--vllm-port and --model-server-port disagree; give only --model-server-port")
    port = args.model_server_port or args.vllm_port or 8200
    for flag, value in (
        ("--port", args.port),
        ("--model-server-port", port),
        ("--sglang-bootstrap-port", args.sglang_bootstrap_port),
    ):
        if not 1 <= value <= 65535:
            problems.append(f"{flag} {value}: must be 1-65535")
    targets = [t for t in args.allowed_prefill_targets.split(",") if t.strip()]
    allowlist = Allowlist()
    if args.enable_ssrf_protection and not targets and not args.endpoints_file:
        problems.append("--enable-ssrf-protection needs --allowed-prefill-targets and/or --endpoints-file")
    elif (targets or args.endpoints_file) and not args.enable_ssrf_protection:
        problems.append("--allowed-prefill-targets/--endpoints-file take effect only with --enable-ssrf-protection")
    elif args.enable_ssrf_protection:
        try:
            allowlist = Allowlist(targets, args.endpoints_file or None)
        except AllowlistError as e:
            problems.append(f"allow-list: {e}")
    if args.prefill_timeout <= 0:
        problems.append("--prefill-timeout must be > 0 seconds")
    if args.prefill_max_retries < 0:
        problems.append("--prefill-max-retries must be >= 0")
    try:
        backoff = parse_go_duration(args.prefill_retry_backoff)
    except ValueError as e:
        problems.append(f"--prefill-retry-backoff: {e}")
        backoff = 0.0
    host = args.model_server_host
    decoder = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
    config = SidecarConfig(
        decoder_url=decoder,
        kv_connector=args.kv_connector,
        enable_prefiller_sampling=args.enable_prefiller_sampling,
        allowlist=allowlist,
        sglang_bootstrap_port=args.sglang_bootstrap_port,
        prefill_timeout_s=args.prefill_timeout,
        prefill_max_retries=max(args.prefill_max_retries, 0),
        prefill_retry_backoff_s=max(backoff, 0.0),
    )
    return config, problems


def run(args: argparse.Namespace) -> int:
    from aiohttp import web

    from llm_epp.pdsidecar.proxy import Sidecar

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    if args.vllm_port is not None:
        log.warning("flag_deprecated flag=--vllm-port replacement=--model-server-port")
    config, problems = config_from_args(args)
    if problems:
        for problem in problems:
            print(f"llm-epp pd-sidecar: {problem}", file=sys.stderr)
        return 2
    if not config.allowlist.enabled:
        log.warning("pd_sidecar_ssrf_protection_off: any x-prefiller-host-port target is contacted; "
                    "enable --enable-ssrf-protection")  # fmt: skip
    log.info(
        "pd_sidecar_start listen=%s:%d decoder=%s kv_connector=%s allowlist=%s",
        args.host,
        args.port,
        config.decoder_url,
        config.kv_connector,
        config.allowlist.describe(),
    )
    web.run_app(Sidecar(config).app(), host=args.host, port=args.port, print=None)
    return 0

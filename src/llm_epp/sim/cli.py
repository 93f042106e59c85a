"""``llm-epp sim``: N live simulated vLLM or SGLang pods in one process, on 127.0.0.1, until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from pathlib import Path

import yaml

from llm_epp.kvcache.vllm_hashing import ALGORITHMS
from llm_epp.sim.disagg import DEFAULT_BANDWIDTH, DEFAULT_SETUP_LATENCY, ROLES, KvTransfer, role_labels
from llm_epp.sim.kv_events import ENCODINGS, KVEventsOptions, PublisherConfig
from llm_epp.sim.live import ENGINES, LivePod
from llm_epp.sim.profiles import PROFILES, get_profile
from llm_epp.sim.server import SimServer

__all__ = ["add_arguments", "endpoints_yaml", "pod_roles", "run", "start_pods"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pods", type=int, default=1, help="number of simulated pods (default 1)")
    parser.add_argument("--engine", choices=ENGINES, default="vllm",
                        help="model server to imitate on /metrics, /get_load, /server_info, /model_info")  # fmt: skip
    parser.add_argument("--profile", default="tiny", help=f"engine profile: {', '.join(sorted(PROFILES))}")
    parser.add_argument("--time-scale", type=float, default=1.0, help="wall seconds per modelled second")
    parser.add_argument("--base-port", type=int, default=0, help="first port (pod i gets P+i); 0 = free ports")
    parser.add_argument("--model", default="sim-model", help="served model name")
    parser.add_argument("--lora", default="", help="comma-separated LoRA adapter names served by every pod")
    parser.add_argument("--endpoints-file", help="write the pods to this llm-epp endpoints file")
    parser.add_argument("--get-load-format", choices=("vllm-router", "sglang"), default=None,
                        help="shape of GET /get_load (default: the engine's; vllm-router for vllm)")  # fmt: skip
    parser.add_argument("--role", default="",
                        help="prefill/decode role of the pods: prefill, decode or both, or one per pod, comma-"
                             "separated (labelled llm-d.ai/role in the endpoints file); default: no role")  # fmt: skip
    parser.add_argument("--kv-transfer-bandwidth", type=float, default=DEFAULT_BANDWIDTH / 1e9,
                        help="GB/s of a decode pod's KV pull from a prefill pod (default %(default)g)")  # fmt: skip
    parser.add_argument("--kv-transfer-latency", type=float, default=DEFAULT_SETUP_LATENCY,
                        help="seconds each KV pull costs before the first byte (default %(default)g)")  # fmt: skip

    parser.add_argument("--kv-events-port", type=int, default=0,
                        help="publish KV-cache events over ZMQ as the --engine does (vLLM's or SGLang's "
                             "events): pod i binds a PUB socket on "
                             "127.0.0.1:P+i (its data-parallel rank offset; the endpoints file names pod i "
                             "sim-rank-i so llm-epp's podDiscoveryConfig.socketPort P finds it); 0 = off")  # fmt: skip
    parser.add_argument(
        "--kv-events-replay-port",
        type=int,
        default=0,
        help="with --kv-events-port: pod i serves replays on 127.0.0.1:R+i (replaySocketPort R)",
    )
    parser.add_argument(
        "--kv-events-endpoint",
        default="",
        help="instead of binding, connect every pod's PUB socket here (llm-epp's zmqEndpoint)",
    )
    parser.add_argument(
        "--kv-events-encoding",
        choices=ENCODINGS,
        default="array",
        help="msgpack shape of vLLM's events: array (tagged structs) or map (SGLang's are always arrays)",
    )
    parser.add_argument(
        "--prefix-caching-hash-algo",
        choices=ALGORITHMS,
        default="sha256",
        help="vLLM's block hash for the published hashes (SGLang's is fixed: a SHA-256 page chain)",
    )
    parser.add_argument("--python-hash-seed", default="0",
                        help="vLLM's PYTHONHASHSEED (root of its hashes; SGLang's hashes have no seed)")  # fmt: skip


def pod_roles(spec: str, pods: int) -> list[str | None]:
    """The role of each of ``pods`` pods from ``--role`` (one for all, or one per pod); ``ValueError``."""
    names = [r.strip() for r in spec.split(",")] if spec.strip() else []
    if not names:
        return [None] * pods
    for name in names:
        if name not in ROLES:
            raise ValueError(f"--role {name!r}: use prefill, decode or both")
    if len(names) == 1:
        return [names[0]] * pods
    if len(names) != pods:
        raise ValueError(f"--role names {len(names)} roles for {pods} pods: give one role, or one per pod")
    return list(names)


def kv_events_config(args: argparse.Namespace, pod: int) -> PublisherConfig | None:
    """Pod ``pod``'s KV-event publisher from the ``--kv-events-*`` flags; None when off."""
    port = getattr(args, "kv_events_port", 0)
    central = getattr(args, "kv_events_endpoint", "")
    if not port and not central:
        return None
    options = KVEventsOptions(
        engine=getattr(args, "engine", "vllm"),
        encoding=args.kv_events_encoding,
        hash_algorithm=args.prefix_caching_hash_algo,
        python_hash_seed=args.python_hash_seed,
    )
    if central:
        return PublisherConfig(central, bind=False, options=options)
    replay = f"tcp://127.0.0.1:{args.kv_events_replay_port + pod}" if args.kv_events_replay_port else ""
    return PublisherConfig(f"tcp://127.0.0.1:{port + pod}", replay_endpoint=replay, bind=True, options=options)


def endpoints_yaml(servers: list[SimServer], engine: str = "vllm") -> str:
    """An llm-epp endpoints file listing ``servers`` as endpoints of ``engine`` (with their role labels)."""
    entries: list[dict[str, object]] = []
    for s in servers:
        entry: dict[str, object] = {"name": s.name, "address": s.host, "port": s.port, "engine": engine}
        if s.pod.role is not None:
            entry["labels"] = role_labels(s.pod.role)
        entries.append(entry)
    return yaml.safe_dump({"endpoints": entries}, sort_keys=False)


async def start_pods(args: argparse.Namespace) -> list[SimServer]:
    """Start ``args.pods`` pods with their HTTP servers; on failure stop the ones already started."""
    profile = get_profile(args.profile)
    loras = tuple(name for part in args.lora.split(",") if (name := part.strip()))
    roles = pod_roles(getattr(args, "role", ""), args.pods)
    transfer = KvTransfer(
        getattr(args, "kv_transfer_bandwidth", DEFAULT_BANDWIDTH / 1e9) * 1e9,
        getattr(args, "kv_transfer_latency", DEFAULT_SETUP_LATENCY),
    )
    servers: list[SimServer] = []
    try:
        for i in range(args.pods):
            kv = kv_events_config(args, i)
            name = f"sim-rank-{i}" if getattr(args, "kv_events_port", 0) else f"sim-{i}"
            pod = LivePod(
                name,
                profile,
                model=args.model,
                loras=loras,
                time_scale=args.time_scale,
                engine=args.engine,
                role=roles[i],
                kv_transfer=transfer,
            )
            port = args.base_port + i if args.base_port else 0
            server = SimServer(pod, port=port, load_format=args.get_load_format, kv_events=kv)
            servers.append(await server.start())
    except BaseException:
        await asyncio.gather(*(s.stop() for s in servers), return_exceptions=True)
        raise
    return servers


async def _main(args: argparse.Namespace) -> int:
    servers = await start_pods(args)
    try:
        for s in servers:
            print(f"{s.name} {s.url}", flush=True)
        if args.endpoints_file:
            text = endpoints_yaml(servers, args.engine)
            await asyncio.to_thread(Path(args.endpoints_file).write_text, text)
            print(f"endpoints file: {args.endpoints_file}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop.set)
        await stop.wait()
    finally:
        await asyncio.gather(*(s.stop() for s in servers), return_exceptions=True)
    return 0


def run(args: argparse.Namespace) -> int:
    if args.pods < 1 or args.time_scale <= 0 or not 0 <= args.base_port <= 65535:
        print("llm-epp sim: --pods must be >= 1, --time-scale > 0, --base-port 0-65535", file=sys.stderr)
        return 2
    for flag in ("kv_events_port", "kv_events_replay_port"):
        value = getattr(args, flag)
        if value and not 0 < value + args.pods - 1 <= 65535:
            print(
                f"llm-epp sim: --{flag.replace('_', '-')} {value}: ports P..P+pods-1 must be 1-65535", file=sys.stderr
            )
            return 2
    if getattr(args, "engine", "vllm") == "sglang" and (args.kv_events_port or args.kv_events_endpoint):
        vllm_only = [
            flag
            for flag, value, default in (
                ("--kv-events-encoding", args.kv_events_encoding, "array"),
                ("--prefix-caching-hash-algo", args.prefix_caching_hash_algo, "sha256"),
                ("--python-hash-seed", args.python_hash_seed, "0"),
            )
            if value != default
        ]
        if vllm_only:
            print(
                f"llm-epp sim: {', '.join(vllm_only)} shape vLLM's KV events; an --engine sglang pod publishes "
                "SGLang's (array-encoded, SHA-256 page hashes without a seed): leave them out",
                file=sys.stderr,
            )
            return 2
    try:
        get_profile(args.profile)
    except KeyError as exc:
        print(f"llm-epp sim: {exc.args[0]}", file=sys.stderr)
        return 2
    try:
        pod_roles(args.role, args.pods)
        KvTransfer(args.kv_transfer_bandwidth * 1e9, args.kv_transfer_latency)
    except ValueError as exc:
        print(f"llm-epp sim: {exc} (--kv-transfer-bandwidth in GB/s > 0, --kv-transfer-latency in s >= 0)",
              file=sys.stderr)  # fmt: skip
        return 2
    from collections.abc import Callable

    loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None
    with contextlib.suppress(ImportError):
        import uvloop

        loop_factory = uvloop.new_event_loop
    try:
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            return runner.run(_main(args))
    except OSError as exc:
        print(f"llm-epp sim: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130

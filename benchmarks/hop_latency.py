"""Added latency of the ext_proc hop at a low fixed rate, by Envoy processing mode, side by side.

Envoy ROUND_ROBIN (no EPP), the trivial picker (``benchmarks.trivial_picker``) on grpcio and on llm-epp's own
ext_proc server (the floor of llm-epp's transport), and ``llm-epp serve`` (default configuration, plaintext)
behind Envoy configurations that differ only in the request body mode (FULL_DUPLEX_STREAMED or BUFFERED) and
the response header mode (SEND or SKIP). The floor's two rows price the hop itself on llm-epp's server: the
request's round trip, and the response headers' round trip that SEND adds.
Backends are Envoy ``direct_response`` listeners. Targets alternate within each round; latency is pooled over
rounds; CPU is the picker process's user + system time over the measurement, per successful request.

    python -m benchmarks.hop_latency [--rate 100] [--duration 8] [--rounds 2] [--warmup 200] [--output FILE]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

from benchmarks.openloop import percentile, run_open_loop
from benchmarks.overhead import cpu_seconds, direct_response_backends, prompt_bodies, run_trivial_picker, settle
from benchmarks.report import command_line, machine
from llm_epp.gateway.envoy_config import EnvoyConfigOptions, build_bootstrap
from llm_epp.gateway.envoy_process import EnvoyProcess
from llm_epp.gateway.epp_process import EppProcess

RR = "Envoy ROUND_ROBIN (no EPP)"
TRIVIAL = "trivial picker"
FLOOR = "trivial picker on llm-epp's server"
# (picker, request body mode, response header mode); the trivial picker speaks FULL_DUPLEX_STREAMED request
# bodies only.
VARIANTS = (
    (TRIVIAL, "FULL_DUPLEX_STREAMED", "SEND"),
    (TRIVIAL, "FULL_DUPLEX_STREAMED", "SKIP"),
    (FLOOR, "FULL_DUPLEX_STREAMED", "SEND"),
    (FLOOR, "FULL_DUPLEX_STREAMED", "SKIP"),
    ("llm-epp", "FULL_DUPLEX_STREAMED", "SEND"),
    ("llm-epp", "BUFFERED", "SEND"),
    ("llm-epp", "FULL_DUPLEX_STREAMED", "SKIP"),
    ("llm-epp", "BUFFERED", "SKIP"),
)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", type=float, default=100.0, help="requests per second (default 100)")
    p.add_argument("--duration", type=float, default=8.0, help="seconds per measurement (default 8)")
    p.add_argument("--rounds", type=int, default=2, help="rounds, targets alternating in each (default 2)")
    p.add_argument("--warmup", type=int, default=200, help="requests per target before measuring (default 200)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--output", help="also write the Markdown report here")
    args = p.parse_args(argv)
    if args.rate <= 0 or args.duration <= 0 or args.rounds < 1 or args.warmup < 0:
        p.error("--rate and --duration must be above 0, --rounds at least 1, --warmup 0 or more")
    print(f"{command_line('benchmarks.hop_latency', argv)}; {machine()}", file=sys.stderr, flush=True)
    work = Path(tempfile.mkdtemp(prefix="hop-latency-"))
    latency: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}  # [seconds, requests]
    failed: dict[str, int] = {}
    with ExitStack() as stack:
        backends = stack.enter_context(EnvoyProcess(direct_response_backends(3)))
        addrs = [f"127.0.0.1:{port}" for port in backends.listener_ports.values()]
        epp = stack.enter_context(
            EppProcess(
                "--endpoints", ",".join(addrs), "-v", "1", "--secure-serving=false", log_path=work / "epp.log"
            )
        )  # fmt: skip
        pickers = {
            TRIVIAL: stack.enter_context(run_trivial_picker(addrs, work)),
            FLOOR: stack.enter_context(run_trivial_picker(addrs, work, "asyncio")),
            "llm-epp": (epp.grpc_port, epp.pid),
        }
        targets: dict[str, tuple[EnvoyProcess, int | None]] = {
            RR: (
                EnvoyProcess(
                    build_bootstrap(
                        EnvoyConfigOptions(listen_port=0, admin_port=0, no_epp=True, fallback_endpoints=tuple(addrs))
                    )
                ),
                None,
            )
        }
        for picker, body_mode, header_mode in VARIANTS:
            port, pid = pickers[picker]
            options = EnvoyConfigOptions(
                listen_port=0,
                admin_port=0,
                epp_port=port,
                epp_tls=False,
                request_body_mode=body_mode,
                response_header_mode=header_mode,
            )
            targets[f"{picker}, request body {body_mode}, response headers {header_mode}"] = (
                EnvoyProcess(build_bootstrap(options)),
                pid,
            )
        for gateway, picker_pid in targets.values():
            stack.enter_context(gateway)
            if picker_pid is not None:
                gateway.wait_cluster_healthy("epp", timeout=30)
        for i, (name, (gateway, _)) in enumerate(targets.items()):  # warm-up: connections, the first picks
            if args.warmup:
                bodies = prompt_bodies(args.seed, f"w{i}", args.warmup)
                warm = run_open_loop("127.0.0.1", gateway.listen_port, "/v1/completions", bodies, 200)
                print(f"  warm-up: {name}: {warm.ok} ok, {warm.failed} failed", file=sys.stderr, flush=True)
        for rnd in range(args.rounds):
            for i, (name, (gateway, measured)) in enumerate(targets.items()):
                assert gateway.proc is not None
                settle([gateway.proc.pid, *([measured] if measured is not None else [])])
                before = cpu_seconds(measured) if measured is not None else 0.0
                bodies = prompt_bodies(args.seed, f"r{rnd}-{i}", int(args.rate * args.duration))
                res = run_open_loop("127.0.0.1", gateway.listen_port, "/v1/completions", bodies, args.rate, drain_s=3)
                latency.setdefault(name, []).extend(res.latency_ms)
                failed[name] = failed.get(name, 0) + res.failed
                if measured is not None:
                    spent = cpu.setdefault(name, [0.0, 0.0])
                    spent[0] += cpu_seconds(measured) - before
                    spent[1] += res.ok
                shown = f"p50 {statistics.median(res.latency_ms):.2f} ms" if res.latency_ms else "no answer"
                print(
                    f"  round {rnd + 1}: {name}: {res.ok} ok, {res.failed} failed, {shown}",
                    file=sys.stderr,
                    flush=True,
                )
    base = latency[RR]
    if not base:
        raise SystemExit("Envoy ROUND_ROBIN answered no request: nothing to measure the others against")
    b50, b99 = statistics.median(base), percentile(base, 99)
    out = [
        "## Added latency of the ext_proc hop by processing mode",
        "",
        f"`{command_line('benchmarks.hop_latency', argv).strip()}`; {machine()}",
        "",
        f"{args.rate:g} req/s open loop, {args.duration:g} s x {args.rounds} rounds per target, targets alternating; "
        "response body mode NONE everywhere; latency from each request's intended send time (the load generator's "
        "lag, common to every target, included); added = the target's percentile minus ROUND_ROBIN's.",
        "",
        "| target | failed | p50 ms | p90 ms | p99 ms | added p50 / p99 ms | picker CPU ms per request |",
        "|---|---:|---:|---:|---:|---|---:|",
    ]
    for name, values in latency.items():
        if not values:
            out.append(f"| {name} | {failed[name]} | - | - | - | - | - |")
            continue
        p50, p90, p99 = statistics.median(values), percentile(values, 90), percentile(values, 99)
        used = cpu.get(name)
        per = f"{1000 * used[0] / used[1]:.3f}" if used and used[1] else "-"
        added = "-" if name == RR else f"{p50 - b50:+.2f} / {p99 - b99:+.2f}"
        out.append(f"| {name} | {failed[name]} | {p50:.2f} | {p90:.2f} | {p99:.2f} | {added} | {per} |")
    text = "\n".join(out) + "\n"
    print(text)
    if args.output:
        Path(args.output).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

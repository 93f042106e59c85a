"""`benchmarks.worker_ceiling`: the stream it sends is Envoy's request with two headers left out, a real
`llm-epp serve` answers it and ends the next one at once (what lets h2load count requests), its arithmetic, and,
where h2load is installed, the whole benchmark at a tiny size."""

from __future__ import annotations

import asyncio
import re
import shutil
import struct

import grpc
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from benchmarks.overhead import direct_response_backends
from benchmarks.worker_ceiling import PATH, parse_h2load, projection, request_stream, serve_args
from llm_epp.gateway.envoy_process import EnvoyProcess
from llm_epp.gateway.epp_process import EppProcess
from tests.support.benchmark import run_benchmark


def _frames(data: bytes) -> list[bytes]:
    out = []
    while data:
        assert data[0] == 0, "a compressed or malformed gRPC frame"
        (n,) = struct.unpack(">I", data[1:5])
        out.append(data[5 : 5 + n])
        data = data[5 + n :]
    return out


def _names(headers: pb.HttpHeaders) -> set[str]:
    return {hv.key for hv in headers.headers.headers}


@pytest.mark.parametrize(
    ("workload", "path", "field"),
    [("small", "/v1/completions", b'"prompt"'), ("chat", "/v1/chat/completions", b'"messages"')],
)
def test_the_stream_is_one_request_as_envoy_sends_it_without_the_two_named_headers(workload, path, field) -> None:
    messages = [pb.ProcessingRequest.FromString(f) for f in _frames(request_stream(workload))]
    assert [m.WhichOneof("request") for m in messages] == ["request_headers", "request_body", "response_headers"]
    request, body, response = messages
    assert request.HasField("protocol_config")
    assert {":path", ":method", "content-type"} <= _names(request.request_headers)
    paths = [hv.raw_value.decode() for hv in request.request_headers.headers.headers if hv.key == ":path"]
    assert paths == [path]
    assert "x-request-id" not in _names(request.request_headers)
    assert body.request_body.end_of_stream and field in body.request_body.body
    assert ":status" in _names(response.response_headers)
    assert "content-length" not in _names(response.response_headers)


async def _one_stream(
    port: int, deadline_s: float | None = None
) -> tuple[list[pb.ProcessingResponse], grpc.StatusCode]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.stream_stream(
            PATH, request_serializer=None, response_deserializer=pb.ProcessingResponse.FromString
        )(timeout=deadline_s)
        for frame in _frames(request_stream()):
            await call.write(frame)
        await call.done_writing()
        answers = [a async for a in call]
        return answers, await call.code()


def test_the_epp_answers_the_stream_and_once_it_knows_its_peer_half_closes_ends_the_next_at_once(tmp_path) -> None:
    with EnvoyProcess(direct_response_backends(3)) as backends:
        addrs = {f"127.0.0.1:{p}" for p in backends.listener_ports.values()}
        args = ("--endpoints", ",".join(sorted(addrs)), "--secure-serving=false", "--grpc-port", "0")
        with EppProcess(*args, log_path=tmp_path / "epp.log") as epp:
            answers, code = asyncio.run(_one_stream(epp.grpc_port))  # ends after the 10 s wait for a reset
            assert code == grpc.StatusCode.OK
            assert [a.WhichOneof("response") for a in answers] == [
                "request_headers",
                "request_body",
                "response_headers",
            ]
            mutation = answers[0].request_headers.response.header_mutation
            picked = {hv.header.key: hv.header.raw_value.decode() for hv in mutation.set_headers}
            assert picked["x-gateway-destination-endpoint"] in addrs
            # A port that waited for a reset again would hold this stream 10 s, past its deadline.
            answers, code = asyncio.run(_one_stream(epp.grpc_port, deadline_s=5))
            assert code == grpc.StatusCode.OK and len(answers) == 3
            assert epp.metric_value("inference_objective_request_total") == 2


H2LOAD = """finished in 2.01s, 4975.50 req/s, 2.04MB/s
requests: 10060 total, 10060 started, 10000 done, 9990 succeeded, 10 failed, 0 errored, 0 timeout
status codes: 9995 2xx, 0 3xx, 5 4xx, 0 5xx
"""


def test_h2load_totals_count_every_answer_that_is_not_a_2xx_as_failed() -> None:
    load = parse_h2load(H2LOAD)
    assert load.seconds == pytest.approx(2.01)
    assert load.done == 9995
    assert load.failed == 5 + 10  # done without a 2xx, and failed
    assert parse_h2load(H2LOAD.replace("2.01s", "850.5ms")).seconds == pytest.approx(0.8505)
    with pytest.raises(RuntimeError, match="no totals"):
        parse_h2load("connect to 127.0.0.1 failed")


def test_the_projection_is_bound_by_the_fronts_then_by_the_serving_process() -> None:
    rows = [line for line in projection(0.12, 0.08, 0.06) if re.match(r"\| \d", line)]
    # one process 8,333/s; a front 12,500/s; the serving process 16,667/s
    assert rows[0] == "| 1 | 2 | 12,500 | 1.50x | the fronts |"
    assert rows[1] == "| 2 | 3 | 16,667 | 2.00x | the serving process |"
    assert rows[3] == "| 4 | 5 | 16,667 | 2.00x | the serving process |"


def test_each_setup_serves_with_its_worker_count_and_the_extra_arguments_last() -> None:
    single = serve_args(1, ["127.0.0.1:1", "127.0.0.1:2"], ["--tracing=true"])
    assert "--workers" not in single and single[single.index("--endpoints") + 1] == "127.0.0.1:1,127.0.0.1:2"
    assert single[-1] == "--tracing=true"  # after the defaults, so it can override them
    two = serve_args(2, ["127.0.0.1:1"])
    assert two[two.index("--workers") + 1] == "2" and "--secure-serving=false" in two


@pytest.mark.skipif(shutil.which("h2load") is None, reason="h2load is not installed (apt-get install nghttp2-client)")
def test_the_benchmark_measures_every_setup_and_projects() -> None:
    done = run_benchmark("worker_ceiling", "--duration", "1", "--rounds", "1", "--streams", "16")
    assert done.returncode == 0, done.stdout + done.stderr
    rows = re.findall(r"^\| ([12] (?:process|workers)[^|]*) \| (\d+) \(\d+-\d+\) \|.*\| (\d+) \|$", done.stdout, re.M)
    assert len(rows) == 4 and all(int(rps) > 0 and failed == "0" for _, rps, failed in rows), done.stdout
    assert re.search(r"^\| 2 \| 3 \| [\d,]+ \| [\d.]+x \| the (fronts|serving process) \|$", done.stdout, re.M)

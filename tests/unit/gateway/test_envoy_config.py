"""Tests for llm_epp.gateway.envoy_config: structure, `envoy --mode validate` over every variant, the CLI,
and live routing through a real Envoy (round robin, FailOpen fallback, FailClose, and a minimal picker)."""

from __future__ import annotations

import argparse
import datetime
import hashlib
import itertools
import json
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec as crypto_ec
from cryptography.x509.oid import NameOID
from envoy.config.core.v3.base_pb2 import HeaderValue, HeaderValueOption
from envoy.extensions.filters.http.ext_proc.v3.processing_mode_pb2 import ProcessingMode
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pbg
from google.protobuf.struct_pb2 import Struct

from llm_epp.gateway import envoy_config as ec
from llm_epp.gateway.envoy_config import EnvoyConfigOptions, build_bootstrap, render, validate
from llm_epp.gateway.envoy_process import EnvoyProcess, validate_config_file
from llm_epp.sim.stub import BackendPool
from tests.support.ports import free_port

pytestmark = pytest.mark.envoy

# ------------------------------------------------------------------------------------------ helpers


def _hcm(doc: dict[str, Any]) -> dict[str, Any]:
    hcm: dict[str, Any] = doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    return hcm


def _filters(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f["name"]: f["typed_config"] for f in _hcm(doc)["http_filters"]}


def _clusters(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in doc["static_resources"]["clusters"]}


def _routes(doc: dict[str, Any]) -> list[dict[str, Any]]:
    routes: list[dict[str, Any]] = _hcm(doc)["route_config"]["virtual_hosts"][0]["routes"]
    return routes


def _client() -> httpx.Client:
    return httpx.Client(trust_env=False, timeout=15.0)


def _live_opts(**kw: Any) -> EnvoyConfigOptions:
    return EnvoyConfigOptions(listen_port=0, admin_port=0, **kw)


FALLBACK = ("127.0.0.1:18001", "127.0.0.1:18002")

# -------------------------------------------------------------------------- envoy --mode validate


def _variants() -> Iterator[Any]:
    for req, resp, routing, tls, failure, fallback in itertools.product(
        ec.REQUEST_BODY_MODES,
        ec.RESPONSE_BODY_MODES,
        ec.ROUTING_MODES,
        (True, False),
        ec.FAILURE_MODES,
        (True, False),
    ):
        opts = EnvoyConfigOptions(
            request_body_mode=req,
            response_body_mode=resp,
            routing=routing,
            epp_tls=tls,
            failure_mode=failure,
            fallback_endpoints=FALLBACK if fallback else (),
        )
        ident = "-".join(
            [
                "req_fds" if req == "FULL_DUPLEX_STREAMED" else "req_buffered",
                "resp_fds" if resp == "FULL_DUPLEX_STREAMED" else "resp_none",
                routing,
                "tls" if tls else "plain",
                failure,
                "fallback" if fallback else "nofallback",
            ]
        )
        yield pytest.param(opts, id=ident)
    yield pytest.param(EnvoyConfigOptions(no_epp=True, fallback_endpoints=FALLBACK), id="no_epp")
    yield pytest.param(
        EnvoyConfigOptions(epp_address="epp.example.internal", response_header_mode="SKIP", message_timeout_s=2.5),
        id="dns_epp-resp_headers_skip",
    )
    yield pytest.param(
        EnvoyConfigOptions(fallback_endpoints=("[::1]:8000", "model-0.example.internal:8000")),
        id="ipv6_and_dns_fallback",
    )
    yield pytest.param(
        EnvoyConfigOptions(pool_protocol="h2c", fallback_endpoints=("10.0.0.7:8000",)), id="h2c_pool_and_fallback"
    )


@pytest.mark.parametrize("opts", list(_variants()))
def test_envoy_accepts_variant(opts: EnvoyConfigOptions, tmp_path: Path) -> None:
    doc = build_bootstrap(opts)
    validate(doc)
    path = tmp_path / "envoy.yaml"
    path.write_text(render(doc, "yaml"))
    result = validate_config_file(path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_envoy_accepts_json_output(tmp_path: Path) -> None:
    doc = build_bootstrap(EnvoyConfigOptions(fallback_endpoints=FALLBACK))
    path = tmp_path / "envoy.json"
    path.write_text(render(doc, "json"))
    assert json.loads(path.read_text()) == doc
    result = validate_config_file(path)
    assert result.returncode == 0, result.stdout + result.stderr


# ------------------------------------------------------------------------------------ structure


def test_default_structure() -> None:
    doc = build_bootstrap(EnvoyConfigOptions())
    assert doc["admin"]["address"]["socket_address"] == {"address": "127.0.0.1", "port_value": 19000}
    listener = doc["static_resources"]["listeners"][0]
    assert listener["address"]["socket_address"]["port_value"] == 8081
    assert "per_connection_buffer_limit_bytes" not in listener
    filters = _hcm(doc)["http_filters"]
    names = [f["name"] for f in filters]
    # the response-header strip runs after ext_proc on responses (response filters run in reverse order)
    assert names == ["envoy.filters.http.header_mutation", "envoy.filters.http.ext_proc", "envoy.filters.http.router"]
    assert filters[0]["typed_config"]["mutations"] == {
        "response_mutations": [{"remove": "x-gateway-destination-endpoint-served"}]
    }
    (early,) = _hcm(doc)["early_header_mutation_extensions"]
    assert early["name"] == "envoy.http.early_header_mutation.header_mutation"
    assert [m["remove"] for m in early["typed_config"]["mutations"]] == [
        ec.DESTINATION_HEADER,
        ec.SERVED_HEADER,
    ]
    ext_proc = _filters(doc)["envoy.filters.http.ext_proc"]
    assert ext_proc["grpc_service"] == {"envoy_grpc": {"cluster_name": "epp"}, "timeout": "10s"}
    assert ext_proc["failure_mode_allow"] is True
    assert ext_proc["message_timeout"] == "1000s"
    assert ext_proc["processing_mode"] == {
        "request_header_mode": "SEND",
        "request_body_mode": "FULL_DUPLEX_STREAMED",
        "request_trailer_mode": "SEND",
        "response_header_mode": "SEND",
        "response_body_mode": "NONE",
        "response_trailer_mode": "SEND",
    }
    assert ext_proc["metadata_options"] == {
        "receiving_namespaces": {"untyped": ["envoy.lb"]},
        "forwarding_namespaces": {"untyped": ["envoy.lb", "envoy.lb.subset_hint"]},
    }
    clusters = _clusters(doc)
    assert set(clusters) == {"epp", "pool"}
    epp = clusters["epp"]
    assert epp["type"] == "STATIC"
    assert epp["transport_socket"]["typed_config"]["common_tls_context"] == {
        "alpn_protocols": ["h2"],
        "validation_context": {},
    }
    pool = clusters["pool"]
    assert (pool["type"], pool["lb_policy"]) == ("ORIGINAL_DST", "CLUSTER_PROVIDED")
    assert pool["original_dst_lb_config"] == {
        "metadata_key": {"key": "envoy.lb", "path": [{"key": "x-gateway-destination-endpoint"}]}
    }
    routes = _routes(doc)
    assert len(routes) == 1
    assert routes[0]["match"] == {"prefix": "/"}
    assert routes[0]["route"] == {"cluster": "pool", "timeout": "86400s", "idle_timeout": "86400s"}
    assert routes[0]["response_headers_to_add"] == [
        {
            "header": {"key": "x-gateway-destination-endpoint-served", "value": "%UPSTREAM_HOST%"},
            "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
        }
    ]


def test_any_type_comes_first_and_validate_does_not_mutate() -> None:
    doc = build_bootstrap(EnvoyConfigOptions(fallback_endpoints=FALLBACK))
    before = render(doc)
    validate(doc)
    assert render(doc) == before
    assert next(iter(_hcm(doc))) == "@type"
    assert "&id" not in before  # no YAML anchors for repeated blocks


def test_options_variants_structure() -> None:
    doc = build_bootstrap(
        EnvoyConfigOptions(
            request_body_mode="BUFFERED",
            response_body_mode="FULL_DUPLEX_STREAMED",
            response_header_mode="SKIP",
            routing="header",
            failure_mode="FailClose",
            epp_tls=False,
            epp_address="epp.ns.svc",
            fallback_endpoints=FALLBACK,
            max_request_bytes=1234,
        )
    )
    assert doc["static_resources"]["listeners"][0]["per_connection_buffer_limit_bytes"] == 1234
    ext_proc = _filters(doc)["envoy.filters.http.ext_proc"]
    assert ext_proc["failure_mode_allow"] is False
    mode = ext_proc["processing_mode"]
    assert mode["request_body_mode"] == "BUFFERED"
    assert mode["response_header_mode"] == "SKIP"
    assert (mode["response_body_mode"], mode["response_trailer_mode"]) == ("FULL_DUPLEX_STREAMED", "SEND")
    clusters = _clusters(doc)
    assert clusters["epp"]["type"] == "STRICT_DNS"
    assert "transport_socket" not in clusters["epp"]
    assert clusters["pool"]["original_dst_lb_config"] == {
        "use_http_header": True,
        "http_header_name": "x-gateway-destination-endpoint",
    }
    fallback = clusters["pool-fallback"]
    assert (fallback["type"], fallback["lb_policy"]) == ("STATIC", "ROUND_ROBIN")
    routes = _routes(doc)
    assert [r["route"]["cluster"] for r in routes] == ["pool", "pool-fallback"]
    assert routes[0]["match"]["headers"] == [{"name": "x-gateway-destination-endpoint", "present_match": True}]
    assert routes[1]["match"] == {"prefix": "/"}


def test_metadata_routing_with_fallback_matches_on_dynamic_metadata() -> None:
    routes = _routes(build_bootstrap(EnvoyConfigOptions(fallback_endpoints=FALLBACK)))
    assert routes[0]["match"]["dynamic_metadata"] == [
        {
            "filter": "envoy.lb",
            "path": [{"key": "x-gateway-destination-endpoint"}],
            "value": {"present_match": True},
        }
    ]


def test_no_epp_is_plain_round_robin() -> None:
    doc = build_bootstrap(EnvoyConfigOptions(no_epp=True, fallback_endpoints=FALLBACK, request_body_mode="BUFFERED"))
    assert [f["name"] for f in _hcm(doc)["http_filters"]] == [
        "envoy.filters.http.header_mutation",
        "envoy.filters.http.router",
    ]
    assert "per_connection_buffer_limit_bytes" not in doc["static_resources"]["listeners"][0]
    clusters = _clusters(doc)
    assert list(clusters) == ["pool"]
    assert clusters["pool"]["lb_policy"] == "ROUND_ROBIN"
    assert len(clusters["pool"]["load_assignment"]["endpoints"][0]["lb_endpoints"]) == 2


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"failure_mode": "FailSometimes"}, "failure_mode"),
        ({"request_body_mode": "STREAMED"}, "request_body_mode"),
        ({"routing": "dns"}, "routing"),
        ({"listen_port": 70000}, "listen_port"),
        ({"no_epp": True}, "--endpoints"),
        ({"fallback_endpoints": ("127.0.0.1",)}, "ip:port"),
        ({"fallback_endpoints": ("::1:80",)}, "IPv6"),
        ({"fallback_endpoints": ("127.0.0.1:0",)}, "port"),
        ({"message_timeout_s": 7200.0}, "message timeout"),
    ],
)
def test_options_reject_bad_values(kwargs: dict[str, Any], needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        EnvoyConfigOptions(**kwargs)


def test_durations() -> None:
    doc = build_bootstrap(EnvoyConfigOptions(message_timeout_s=0.25, grpc_timeout_s=2.0))
    ext_proc = _filters(doc)["envoy.filters.http.ext_proc"]
    assert ext_proc["message_timeout"] == "0.25s"
    assert ext_proc["grpc_service"]["timeout"] == "2s"


# ------------------------------------------------------------------------------------- validate()


def test_validate_names_misspelt_field() -> None:
    doc = build_bootstrap(EnvoyConfigOptions())
    _filters(doc)["envoy.filters.http.ext_proc"]["failure_mode_alow"] = True
    with pytest.raises(ValueError, match="failure_mode_alow") as info:
        validate(doc)
    assert "ExternalProcessor" in str(info.value)
    assert "Available Fields" not in str(info.value)


def test_validate_names_bad_enum() -> None:
    doc = build_bootstrap(EnvoyConfigOptions())
    _clusters(doc)["pool"]["type"] = "ORIGINAL_DSTT"
    with pytest.raises(ValueError, match="ORIGINAL_DSTT"):
        validate(doc)


def test_render_rejects_unknown_format() -> None:
    with pytest.raises(ValueError, match="format"):
        render({}, "toml")


# -------------------------------------------------------------------------------------------- CLI


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="llm-epp envoy-config")
    ec.add_arguments(parser)
    return parser.parse_args(argv)


def test_cli_writes_valid_yaml(tmp_path: Path) -> None:
    out = tmp_path / "envoy.yaml"
    args = _parse(
        [
            "--listen-port",
            "18080",
            "--admin-port",
            "19901",
            "--epp-address",
            "10.0.0.5",
            "--no-epp-tls",
            "--failure-mode",
            "FailClose",
            "--request-body-mode",
            "BUFFERED",
            "--response-body-mode",
            "FULL_DUPLEX_STREAMED",
            "--routing",
            "header",
            "--endpoints",
            "10.0.0.7:8000, 10.0.0.8:8000",
            "--message-timeout",
            "30",
            "--output",
            str(out),
        ]
    )
    assert ec.run(args) == 0
    text = out.read_text()
    assert text.startswith("# ")
    doc = yaml.safe_load(text)
    validate(doc)
    assert doc["static_resources"]["listeners"][0]["address"]["socket_address"]["port_value"] == 18080
    clusters = _clusters(doc)
    assert "transport_socket" not in clusters["epp"]
    assert clusters["epp"]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"] == {
        "socket_address": {"address": "10.0.0.5", "port_value": 9002}
    }
    ext_proc = _filters(doc)["envoy.filters.http.ext_proc"]
    assert ext_proc["failure_mode_allow"] is False
    assert ext_proc["message_timeout"] == "30s"
    assert len(clusters["pool-fallback"]["load_assignment"]["endpoints"][0]["lb_endpoints"]) == 2
    result = validate_config_file(out)
    assert result.returncode == 0, result.stdout + result.stderr


def test_cli_stdout_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert ec.run(_parse(["--format", "json", "--no-epp", "--endpoints", "127.0.0.1:8000"])) == 0
    doc = json.loads(capsys.readouterr().out)
    assert list(_clusters(doc)) == ["pool"]


def test_cli_defaults_match_options() -> None:
    assert ec.options_from_args(_parse([])) == EnvoyConfigOptions()


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--no-epp"], "--endpoints"),
        (["--endpoints", "10.0.0.1"], "ip:port"),
        (["--epp-port", "99999"], "epp_port"),
        (["--message-timeout", "0"], "message timeout"),
    ],
)
def test_cli_invalid_combination_exits_2(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "envoy.yaml"
    assert ec.run(_parse([*argv, "--output", str(out)])) == 2
    err = capsys.readouterr().err
    assert "error" in err
    assert needle in err
    assert not out.exists()


# ------------------------------------------------------------------------------------ live Envoy


@pytest.fixture
def pool() -> Iterator[BackendPool]:
    with BackendPool(names=["A", "B"]) as backends:
        yield backends


def _completion(client: httpx.Client, base: str, *, stream: bool = False, **headers: str) -> httpx.Response:
    body = {"model": "m", "prompt": "hello world", "max_tokens": 3}
    if stream:
        body.update(stream=True, stream_options={"include_usage": True})
    return client.post(f"{base}/v1/completions", json=body, headers=headers)


def test_live_no_epp_round_robin(pool: BackendPool) -> None:
    opts = _live_opts(no_epp=True, fallback_endpoints=tuple(pool.addresses))
    with EnvoyProcess(build_bootstrap(opts)) as envoy, _client() as client:
        seen = set()
        for _ in range(8):
            resp = _completion(client, envoy.url())
            assert resp.status_code == 200
            assert ec.SERVED_HEADER not in resp.headers  # pod addresses never reach clients
            seen.add(resp.headers["x-backend-name"])
    assert seen == {"A", "B"}
    counts = pool.served_counts()
    assert counts["A"] > 0 and counts["B"] > 0
    assert sum(counts.values()) == 8


@pytest.mark.parametrize("routing", ec.ROUTING_MODES)
def test_live_fail_open_without_epp_uses_fallback(pool: BackendPool, routing: str) -> None:
    opts = _live_opts(
        epp_port=free_port(),  # nothing listens there
        epp_tls=False,
        failure_mode="FailOpen",
        routing=routing,
        fallback_endpoints=(pool.addresses[0],),
    )
    with EnvoyProcess(build_bootstrap(opts)) as envoy, _client() as client:
        # A client-sent destination header is stripped and cannot steer the request to B.
        resp = _completion(client, envoy.url(), **{ec.DESTINATION_HEADER: pool.addresses[1]})
        assert resp.status_code == 200, resp.text
        assert resp.headers["x-backend-name"] == "A"
        assert ec.SERVED_HEADER not in resp.headers  # the EPP is down: Envoy itself keeps the pod address in
        resp = _completion(client, envoy.url(), stream=True)
        assert resp.status_code == 200
        assert resp.text.rstrip().endswith("data: [DONE]")
    assert pool.served_counts() == {"A": 2, "B": 0}
    assert ec.DESTINATION_HEADER not in pool[0].requests[0].headers


def test_live_fail_open_without_epp_or_fallback_cannot_be_steered(pool: BackendPool) -> None:
    opts = _live_opts(epp_port=free_port(), epp_tls=False, failure_mode="FailOpen", routing="header")
    with EnvoyProcess(build_bootstrap(opts)) as envoy, _client() as client:
        resp = _completion(client, envoy.url(), **{ec.DESTINATION_HEADER: pool.addresses[1]})
    assert resp.status_code == 503
    assert pool.served_counts() == {"A": 0, "B": 0}


def test_live_fail_close_without_epp_is_5xx(pool: BackendPool) -> None:
    opts = _live_opts(
        epp_port=free_port(),
        epp_tls=False,
        failure_mode="FailClose",
        fallback_endpoints=tuple(pool.addresses),
    )
    with EnvoyProcess(build_bootstrap(opts)) as envoy, _client() as client:
        resp = _completion(client, envoy.url())
    assert 500 <= resp.status_code < 600
    assert pool.served_counts() == {"A": 0, "B": 0}


# ---------------------------------------------------------------- live Envoy + a minimal picker

_FDS = ProcessingMode.FULL_DUPLEX_STREAMED


@dataclass
class _Picker(pbg.ExternalProcessorServicer):  # type: ignore[misc]
    """Sends every request to ``target`` (header mutation + envoy.lb metadata, clear_route_cache)."""

    target: str
    request_headers: list[dict[str, str]] = field(default_factory=list)
    response_headers: list[dict[str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def _route(self) -> tuple[pb.CommonResponse, Struct]:
        option = HeaderValueOption(header=HeaderValue(key=ec.DESTINATION_HEADER, raw_value=self.target.encode()))
        metadata = Struct()
        metadata.update({ec.LB_NAMESPACE: {ec.DESTINATION_HEADER: self.target}})
        common = pb.CommonResponse(header_mutation=pb.HeaderMutation(set_headers=[option]), clear_route_cache=True)
        return common, metadata

    @staticmethod
    def _headers(msg: Any) -> dict[str, str]:
        return {h.key: (h.raw_value.decode() or h.value) for h in msg.headers.headers}

    def Process(self, request_iterator: Any, context: Any) -> Iterator[pb.ProcessingResponse]:
        request_mode = response_mode = None
        body = b""
        for req in request_iterator:
            if req.HasField("protocol_config"):
                request_mode = req.protocol_config.request_body_mode
                response_mode = req.protocol_config.response_body_mode
            kind = req.WhichOneof("request")
            if kind == "request_headers":
                with self.lock:
                    self.request_headers.append(self._headers(req.request_headers))
                if req.request_headers.end_of_stream:
                    common, metadata = self._route()
                    yield pb.ProcessingResponse(
                        request_headers=pb.HeadersResponse(response=common), dynamic_metadata=metadata
                    )
                elif request_mode != _FDS:
                    yield pb.ProcessingResponse(request_headers=pb.HeadersResponse())
            elif kind == "request_body":
                body += req.request_body.body
                if not req.request_body.end_of_stream:
                    continue
                common, metadata = self._route()
                if request_mode == _FDS:
                    yield pb.ProcessingResponse(
                        request_headers=pb.HeadersResponse(response=common), dynamic_metadata=metadata
                    )
                    streamed = pb.StreamedBodyResponse(body=body, end_of_stream=True)
                    mutation = pb.BodyMutation(streamed_response=streamed)
                    yield pb.ProcessingResponse(
                        request_body=pb.BodyResponse(response=pb.CommonResponse(body_mutation=mutation))
                    )
                else:
                    yield pb.ProcessingResponse(
                        request_body=pb.BodyResponse(response=common), dynamic_metadata=metadata
                    )
            elif kind == "request_trailers":
                yield pb.ProcessingResponse(request_trailers=pb.TrailersResponse())
            elif kind == "response_headers":
                with self.lock:
                    self.response_headers.append(self._headers(req.response_headers))
                yield pb.ProcessingResponse(response_headers=pb.HeadersResponse())
            elif kind == "response_body":
                chunk = req.response_body
                if response_mode == _FDS:
                    streamed = pb.StreamedBodyResponse(body=chunk.body, end_of_stream=chunk.end_of_stream)
                    mutation = pb.BodyMutation(streamed_response=streamed)
                    yield pb.ProcessingResponse(
                        response_body=pb.BodyResponse(response=pb.CommonResponse(body_mutation=mutation))
                    )
                else:
                    yield pb.ProcessingResponse(response_body=pb.BodyResponse())
            elif kind == "response_trailers":
                yield pb.ProcessingResponse(response_trailers=pb.TrailersResponse())


def _self_signed() -> tuple[bytes, bytes]:
    private_key = crypto_ec.generate_private_key(crypto_ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "llm-epp-test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(private_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(private_key, hashes.SHA256())
    )
    key_pem = private_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return key_pem, cert.public_bytes(serialization.Encoding.PEM)


def _start_picker(picker: _Picker, *, tls: bool, port: int = 0) -> tuple[grpc.Server, int]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    pbg.add_ExternalProcessorServicer_to_server(picker, server)
    if tls:
        key_pem, cert_pem = _self_signed()
        bound = server.add_secure_port(f"127.0.0.1:{port}", grpc.ssl_server_credentials([(key_pem, cert_pem)]))
    else:
        bound = server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    return server, bound


@pytest.fixture
def picker_server(request: pytest.FixtureRequest, pool: BackendPool) -> Iterator[tuple[_Picker, int, bool]]:
    tls: bool = request.param
    picker = _Picker(target=pool.addresses[1])  # always B; the fallback cluster only knows A
    server, port = _start_picker(picker, tls=tls)
    try:
        yield picker, port, tls
    finally:
        server.stop(grace=None).wait()


@pytest.mark.parametrize(
    ("routing", "request_body_mode", "response_body_mode", "failure_mode", "picker_server"),
    [
        pytest.param("metadata", "FULL_DUPLEX_STREAMED", "NONE", "FailOpen", True, id="metadata-fds-none-tls"),
        pytest.param(
            "header",
            "FULL_DUPLEX_STREAMED",
            "FULL_DUPLEX_STREAMED",
            "FailOpen",
            False,
            id="header-fds-fds-plain",
        ),
        pytest.param(
            "metadata",
            "BUFFERED",
            "FULL_DUPLEX_STREAMED",
            "FailClose",
            False,
            id="metadata-buffered-fds-plain-close",
        ),
        pytest.param("header", "BUFFERED", "NONE", "FailOpen", True, id="header-buffered-none-tls"),
    ],
    indirect=["picker_server"],
)
def test_live_picker_decision_overrides_fallback_route(
    pool: BackendPool,
    picker_server: tuple[_Picker, int, bool],
    routing: str,
    request_body_mode: str,
    response_body_mode: str,
    failure_mode: str,
) -> None:
    picker, epp_port, tls = picker_server
    opts = _live_opts(
        epp_port=epp_port,
        epp_tls=tls,
        routing=routing,
        request_body_mode=request_body_mode,
        response_body_mode=response_body_mode,
        failure_mode=failure_mode,
        fallback_endpoints=(pool.addresses[0],),
    )
    b_address = pool.addresses[1]
    payload = json.dumps({"model": "m", "prompt": "x" * 100_000, "max_tokens": 4}).encode()
    with EnvoyProcess(build_bootstrap(opts)) as envoy, _client() as client:
        # Body-carrying request: routed when the EPP answers at end of body.
        resp = client.post(
            envoy.url("/v1/completions"),
            content=payload,
            headers={"content-type": "application/json", ec.DESTINATION_HEADER: pool.addresses[0]},
        )
        assert resp.status_code == 200, resp.text
        assert resp.headers["x-backend-name"] == "B"
        assert resp.json()["x_body_sha256"] == hashlib.sha256(payload).hexdigest()
        # Streaming response passes through (echoed chunk by chunk in FULL_DUPLEX_STREAMED).
        resp = _completion(client, envoy.url(), stream=True)
        assert resp.status_code == 200
        assert resp.headers["x-backend-name"] == "B"
        assert '"usage"' in resp.text and resp.text.rstrip().endswith("data: [DONE]")
        # Body-less request: routed on the request-headers answer.
        resp = client.get(envoy.url("/v1/models"))
        assert resp.status_code == 200
        assert resp.headers["x-backend-name"] == "B"
    assert pool.served_counts() == {"A": 0, "B": 3}
    # The client's destination header never reached the EPP (stripped by header_mutation) ...
    assert all(ec.DESTINATION_HEADER not in h for h in picker.request_headers)
    # ... and the EPP sees the served endpoint on response headers (route-level response_headers_to_add).
    assert [h.get(ec.SERVED_HEADER) for h in picker.response_headers] == [b_address] * 3


def _eventually_served_by(client: httpx.Client, envoy: EnvoyProcess, name: str, tries: int = 20) -> None:
    """Admin shows health as seen by Envoy's main thread; workers learn it a few ms later."""
    for _ in range(tries):
        resp = _completion(client, envoy.url())
        if resp.status_code == 200 and resp.headers["x-backend-name"] == name:
            return
        time.sleep(0.05)
    raise AssertionError(f"requests never reached {name}")


def test_live_fail_open_follows_epp_health(pool: BackendPool) -> None:
    """FailOpen + FULL_DUPLEX_STREAMED: a late EPP is used once healthy; a stopped one is bypassed."""
    epp_port = free_port()
    opts = _live_opts(epp_port=epp_port, epp_tls=False, fallback_endpoints=(pool.addresses[0],))
    picker = _Picker(target=pool.addresses[1])
    with EnvoyProcess(build_bootstrap(opts)) as envoy, _client() as client:
        # No EPP yet: the health check has marked it down before the listener opened.
        for _ in range(3):
            resp = _completion(client, envoy.url())
            assert (resp.status_code, resp.headers["x-backend-name"]) == (200, "A")
        server, _ = _start_picker(picker, tls=False, port=epp_port)
        try:
            envoy.wait_cluster_healthy("epp")
            _eventually_served_by(client, envoy, "B")
            for _ in range(3):
                resp = _completion(client, envoy.url())
                assert (resp.status_code, resp.headers["x-backend-name"]) == (200, "B")
        finally:
            server.stop(grace=None).wait()
        # EPP gone: the request racing the health check may get a 500 (the body was already handed to
        # the dead stream), after that every request fails open to the fallback cluster.
        envoy.wait_cluster_healthy("epp", healthy=False)
        _eventually_served_by(client, envoy, "A")
        for _ in range(3):
            resp = _completion(client, envoy.url())
            assert (resp.status_code, resp.headers["x-backend-name"]) == (200, "A")


def test_retries_and_outlier_detection_only_where_another_host_can_be_chosen() -> None:
    doc = build_bootstrap(EnvoyConfigOptions(fallback_endpoints=FALLBACK))
    routes = {r["name"]: r["route"] for r in _routes(doc)}
    # a retry does not run ext_proc again: on the EPP-picked route it would reach the same pod
    assert "retry_policy" not in routes["epp-picked"]
    policy = routes["fallback"]["retry_policy"]
    assert set(policy["retry_on"].split(",")) == {"connect-failure", "refused-stream", "reset-before-request"}
    assert policy["retry_host_predicate"][0]["name"] == "envoy.retry_host_predicates.previous_hosts"
    clusters = {c["name"]: c for c in doc["static_resources"]["clusters"]}
    assert clusters["pool-fallback"]["outlier_detection"]["consecutive_local_origin_failure"] == 1
    assert "outlier_detection" not in clusters["pool"]


def test_live_fallback_retries_a_dead_pod_on_another(pool: BackendPool) -> None:
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there
    opts = _live_opts(
        epp_port=free_port(), epp_tls=False, failure_mode="FailOpen", fallback_endpoints=(dead, *pool.addresses)
    )
    with EnvoyProcess(build_bootstrap(opts)) as envoy, _client() as client:
        statuses = [_completion(client, envoy.url()).status_code for _ in range(12)]
    assert statuses == [200] * 12  # each attempt on the dead pod was retried on a live one
    assert sum(pool.served_counts().values()) == 12


@pytest.mark.parametrize("no_epp", [False, True])
def test_pool_protocol_h2c_speaks_http2_to_the_model_servers(no_epp: bool) -> None:
    endpoints = ("10.0.0.7:8000",)
    args = _parse(["--pool-protocol", "h2c", "--endpoints", ",".join(endpoints), *(["--no-epp"] if no_epp else [])])
    doc = build_bootstrap(ec.options_from_args(args))
    validate(doc)
    clusters = {c["name"]: c for c in doc["static_resources"]["clusters"]}
    model_clusters = [n for n in clusters if n != ec.EPP_CLUSTER]
    assert model_clusters
    for name in model_clusters:
        options = clusters[name]["typed_extension_protocol_options"][ec._HTTP_OPTIONS_KEY]
        assert "http2_protocol_options" in options["explicit_http_config"], name
    plain = build_bootstrap(EnvoyConfigOptions(fallback_endpoints=endpoints))
    assert all(
        "typed_extension_protocol_options" not in c
        for c in plain["static_resources"]["clusters"]
        if c["name"] != ec.EPP_CLUSTER
    )
    with pytest.raises(ValueError, match="pool_protocol"):
        EnvoyConfigOptions(pool_protocol="h3")

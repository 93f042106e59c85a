"""A gRPC health check as a prober (kubelet, a load balancer) makes it, over grpcio."""

from __future__ import annotations

import grpc

from llm_epp.observability.health import decode_check_response, encode_check_request


def health(port: int, service: str = "") -> int:
    """The status `/grpc.health.v1.Health/Check` answers for `service` on a plaintext port of 127.0.0.1."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        check = channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=encode_check_request,
            response_deserializer=decode_check_response,
        )
        return int(check(service, timeout=5))

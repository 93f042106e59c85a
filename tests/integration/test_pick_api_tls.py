"""`llm-epp serve` with the direct-routing API on its own mTLS port and `--enable-cert-reload`: a renewed
server pair is served to new connections, and a client certificate of the CA stays required."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import pytest

from llm_epp.api.v1 import picker_pb2 as pb
from llm_epp.gateway.epp_process import EppProcess
from tests.support.pickapi import PickApiAccess
from tests.unit.security.tls_probe import der, served, write_pair


def test_a_renewed_pair_is_served_and_a_client_certificate_stays_required(tmp_path: Path) -> None:
    access = PickApiAccess(tmp_path)
    with EppProcess("--endpoints", "127.0.0.1:1", *access.args, "--enable-cert-reload"):
        with access.channel() as channel:
            access.stub(channel).ListEndpoints(pb.ListEndpointsRequest(), timeout=10)
        renewed = access.ca.issue("localhost", server=True)
        write_pair(access.cert_dir, (renewed.cert, renewed.key))
        for _ in range(100):  # the pair is looked at on each new handshake
            if served(access.port)[0] == der(renewed.cert):
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the renewed pair was not served")
        with access.channel() as channel:
            access.stub(channel).ListEndpoints(pb.ListEndpointsRequest(), timeout=10)
        anonymous = grpc.secure_channel(
            f"localhost:{access.port}", grpc.ssl_channel_credentials(root_certificates=access.ca.pem)
        )
        with anonymous, pytest.raises(grpc.RpcError) as info:
            access.stub(anonymous).ListEndpoints(pb.ListEndpointsRequest(), timeout=10)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE

"""Access to the direct-routing API of an `llm-epp serve` child process over mTLS on its own port."""

from __future__ import annotations

from pathlib import Path

import grpc

from llm_epp.api.v1 import picker_pb2_grpc
from tests.support.certs import TestCA
from tests.support.ports import free_port


class PickApiAccess:
    """`args` enable the API with mTLS (a fresh CA, a server certificate for localhost); `stub()` is a
    client holding a certificate that CA signed."""

    def __init__(self, tmp: Path, caller: str = "tester") -> None:
        self.ca = TestCA()
        self.ca_file = self.ca.write_ca(tmp / "pick-ca.pem")
        self.cert_dir = self.ca.write_server_dir(tmp / "pick-tls")
        self.client = self.ca.issue(caller)
        self.port = free_port()

    @property
    def args(self) -> tuple[str, ...]:
        return (
            "--enable-pick-api",
            "--pick-api-port",
            str(self.port),
            "--pick-api-client-ca-file",
            str(self.ca_file),
            "--cert-path",
            str(self.cert_dir),
        )

    def channel(self) -> grpc.Channel:
        creds = grpc.ssl_channel_credentials(
            root_certificates=self.ca.pem, private_key=self.client.key, certificate_chain=self.client.cert
        )
        return grpc.secure_channel(f"localhost:{self.port}", creds)

    def stub(self, channel: grpc.Channel) -> picker_pb2_grpc.EndpointPickerStub:
        return picker_pb2_grpc.EndpointPickerStub(channel)  # type: ignore[no-untyped-call]

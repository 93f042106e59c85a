"""The direct-routing gRPC API (`llm_epp.v1.EndpointPicker`): Pick, Release and ListEndpoints for
callers that are not Envoy. A protocol adapter like `extproc`; imported only by the app."""

from llm_epp.pickapi.leases import LeaseTable
from llm_epp.pickapi.servicer import PickServicer

__all__ = ["LeaseTable", "PickServicer"]

"""`llm_epp.v1`: the direct-routing EndpointPicker service (generated; do not edit the *_pb2* modules)."""

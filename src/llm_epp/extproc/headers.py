"""Wire names: headers and metadata keys of the Endpoint Picker Protocol."""

DESTINATION = "x-gateway-destination-endpoint"
DESTINATION_SERVED = "x-gateway-destination-endpoint-served"
DESTINATION_SUBSET = "x-gateway-destination-endpoint-subset"
LB_NAMESPACE = "envoy.lb"
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
REQUEST_ID = "x-request-id"
CONTENT_LENGTH = "content-length"
CONTENT_TYPE = "content-type"
CONFORMANCE_SERVED = "x-conformance-test-served-endpoint"
EXPLAIN_REQUEST = "x-llm-epp-explain"  # request header asking for the scores (needs --enable-explain)
SCORES = "x-gateway-destination-endpoint-scores"  # response header: each candidate's scores

# Control headers a client must never be able to set: removed from every request the EPP routes.
CLIENT_FORBIDDEN = (DESTINATION, DESTINATION_SERVED, DESTINATION_SUBSET)

# The largest streamed_response chunk the EPP sends (the reference keeps chunks below 64 KiB).
BODY_CHUNK_BYTES = 62_000

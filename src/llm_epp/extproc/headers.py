"""Wire names: headers and metadata keys of the Endpoint Picker Protocol."""

DESTINATION = "x-gateway-destination-endpoint"
DESTINATION_SERVED = "x-gateway-destination-endpoint-served"
DESTINATION_SUBSET = "x-gateway-destination-endpoint-subset"
SCORES = "x-gateway-destination-endpoint-scores"  # envoy.lb metadata key (--emit-endpoint-scores)
LB_NAMESPACE = "envoy.lb"
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
REQUEST_ID = "x-request-id"
CONTENT_LENGTH = "content-length"
CONTENT_TYPE = "content-type"
RETRY_AFTER = "retry-after"
WENT_INTO_RESP_HEADERS = "x-went-into-resp-headers"  # set on every response-headers answer (as the reference)
DROPPED_REASON = "x-llm-d-request-dropped-reason"  # on answers to requests dropped before any model server
EXPLAIN_REQUEST = "x-llm-epp-explain"  # request header asking for the scores (needs --enable-explain)
EXPLAIN_RESPONSE = "x-gateway-destination-endpoint-scores"  # response header: each candidate's scores

# Headers that control the EPP (llm-d-router names and their x-gateway-* aliases): read by the director,
# never forwarded to the model server.
INPUT_CONTROL = (
    "x-llm-d-inference-fairness-id",
    "x-gateway-inference-fairness-id",
    "x-llm-d-inference-objective",
    "x-gateway-inference-objective",
    "x-llm-d-model-name-rewrite",
    "x-gateway-model-name-rewrite",
    DESTINATION_SUBSET,
    "x-llm-d-slo-ttft-ms",
    "x-slo-ttft-ms",
    "x-llm-d-slo-tpot-ms",
    "x-slo-tpot-ms",
    "x-llm-d-video-fps",
    "x-llm-d-video-duration-seconds",
    "x-llm-d-video-resolution",
)
# Headers only the gateway or the EPP may set: a client's copy is dropped.
OUTPUT_INJECTION = (
    DESTINATION,
    DESTINATION_SERVED,
    DROPPED_REASON,
    # routing hints for the model-server side (P/D sidecar, data parallel, KV peer transfer): a client's copy
    # could point a sidecar at any host
    "x-prefiller-host-port",
    "x-encoder-hosts-ports",
    "x-data-parallel-host-port",
    "x-kv-cache-source-host-port",
)
# Every header removed from a request the EPP routes when the client sent it.
CLIENT_FORBIDDEN = INPUT_CONTROL + OUTPUT_INJECTION

# The largest streamed_response chunk the EPP sends (the reference keeps chunks below 64 KiB).
BODY_CHUNK_BYTES = 62_000

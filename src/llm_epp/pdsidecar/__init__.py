"""The decode-side P/D routing sidecar (`llm-epp pd-sidecar`): an HTTP proxy in front of the local model
server that runs the prefill leg on the pod named in `x-prefiller-host-port` before the local decode."""

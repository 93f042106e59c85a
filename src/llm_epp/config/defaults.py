"""Defaults: the configuration used when neither --config-file nor --config-text is given: the reference EPP's
default (queue 2, kv-cache 2, prefix 3, max-score picker, metrics scraped from every endpoint)."""

DEFAULT_CONFIG = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
- type: metrics-data-source
- type: core-metrics-extractor
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: kv-cache-utilization-scorer
    weight: 2
  - pluginRef: prefix-cache-scorer
    weight: 3
dataLayer:
  sources:
  - pluginRef: metrics-data-source
    extractors:
    - pluginRef: core-metrics-extractor
"""

DEFAULT_PRODUCERS: dict[str, str] = {
    "prefix-cache-match-info": "approx-prefix-cache-producer",
    "inflight-load": "inflight-load-producer",
    "latency-prediction-info": "predicted-latency-producer",
}
"""Data key -> the plugin type created when a configured plugin consumes the key and none produces it
(llm-d-router's default producers; see `config.graph`). Types not registered are skipped with an error
naming the key. A registry may add or override entries (`Registry.set_default_producer`)."""

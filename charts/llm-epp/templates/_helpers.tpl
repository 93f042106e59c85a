{{/* Name of the EPP Deployment, Service, ConfigMap and ServiceAccount. */}}
{{- define "llm-epp.name" -}}
{{- printf "%s-epp" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* InferencePool name: inferencePool.name or the release name. */}}
{{- define "llm-epp.poolName" -}}
{{- default .Release.Name .Values.inferencePool.name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "llm-epp.selectorLabels" -}}
app.kubernetes.io/name: llm-epp
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: endpoint-picker
{{- end -}}

{{- define "llm-epp.labels" -}}
{{ include "llm-epp.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* registry/repository:tag, or the llm-d spelling hub/name:tag when hub or name is set. */}}
{{- define "llm-epp.image" -}}
{{- $img := .Values.inferenceExtension.image -}}
{{- $tag := default .Chart.AppVersion $img.tag -}}
{{- $registry := $img.registry | default "" -}}
{{- $repository := $img.repository -}}
{{- if or $img.hub $img.name -}}
{{- $registry = $img.hub | default $registry -}}
{{- $repository = $img.name | default $repository -}}
{{- end -}}
{{- if $registry -}}
{{- printf "%s/%s:%s" $registry $repository $tag -}}
{{- else -}}
{{- printf "%s:%s" $repository $tag -}}
{{- end -}}
{{- end -}}

{{- define "llm-epp.ha" -}}
{{- if gt (int .Values.inferenceExtension.replicas) 1 }}true{{ end -}}
{{- end -}}

{{/* "true" in standalone mode: endpointsServer.createInferencePool=false, pods chosen by a label selector. */}}
{{- define "llm-epp.standalone" -}}
{{- $es := .Values.inferenceExtension.endpointsServer -}}
{{- if and $es (hasKey $es "createInferencePool") (not $es.createInferencePool) }}true{{ end -}}
{{- end -}}

{{/* Model server engine and protocol: from endpointsServer in standalone mode, else from inferencePool. */}}
{{- define "llm-epp.modelServerType" -}}
{{- if include "llm-epp.standalone" . -}}
{{- .Values.inferenceExtension.endpointsServer.modelServerType | default "vllm" | lower -}}
{{- else -}}
{{- .Values.inferencePool.modelServerType | default "vllm" | lower -}}
{{- end -}}
{{- end -}}

{{- define "llm-epp.modelServerProtocol" -}}
{{- if include "llm-epp.standalone" . -}}
{{- .Values.inferenceExtension.endpointsServer.modelServerProtocol | default "http" | lower -}}
{{- else -}}
{{- .Values.inferencePool.modelServerProtocol | default "http" | lower -}}
{{- end -}}
{{- end -}}

{{/* The request parser of the generated config, chosen as the reference chart does: vLLM over gRPC gets
vllmgrpc-parser, otherwise inferencePool.parser (empty: the EPP's default parser list). */}}
{{- define "llm-epp.parserType" -}}
{{- if and (eq (include "llm-epp.modelServerType" .) "vllm") (eq (include "llm-epp.modelServerProtocol" .) "grpc") -}}
vllmgrpc-parser
{{- else -}}
{{- .Values.inferencePool.parser | default "" -}}
{{- end -}}
{{- end -}}

{{/* Parsers the llm-epp EndpointPickerConfig loader accepts today (tests/deploy keeps this in step). */}}
{{- define "llm-epp.supportedParsers" -}}
openai-parser
passthrough-parser
anthropic-parser
vllmhttp-parser
sglanghttp-parser
vllmgrpc-parser
vertexai-parser
{{- end -}}

{{/* Model server ports: inferencePool.targetPorts, or the legacy single inferencePool.targetPortNumber. */}}
{{- define "llm-epp.targetPorts" -}}
{{- $ports := .Values.inferencePool.targetPorts | default list -}}
{{- if and (not $ports) .Values.inferencePool.targetPortNumber -}}
{{- $ports = list (dict "number" .Values.inferencePool.targetPortNumber) -}}
{{- end -}}
{{- toJson $ports -}}
{{- end -}}

{{/* The flags as a list of {name, value}: inferenceExtension.flags is a map (reference chart) or a list of
{name, value} (llm-d guides). */}}
{{- define "llm-epp.flagList" -}}
{{- $flags := .Values.inferenceExtension.flags | default dict -}}
{{- $out := list -}}
{{- if kindIs "map" $flags -}}
{{- range $k, $v := $flags -}}
{{- $out = append $out (dict "name" $k "value" $v) -}}
{{- end -}}
{{- else -}}
{{- range $flags -}}
{{- $out = append $out (dict "name" .name "value" .value) -}}
{{- end -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/* A value as the command line writes it: booleans true/false, whole numbers without a decimal point. */}}
{{- define "llm-epp.flagValue" -}}
{{- if kindIs "float64" . -}}
{{- if eq (float64 (int64 .)) . -}}{{ int64 . }}{{- else -}}{{ . }}{{- end -}}
{{- else -}}
{{- . -}}
{{- end -}}
{{- end -}}

{{/* One flag as one argument. A name that already carries "=value" with an empty value (a form the llm-d
guides use to override a boolean the chart sets) is passed as it is. */}}
{{- define "llm-epp.flagArg" -}}
{{- $value := include "llm-epp.flagValue" .value -}}
{{- if and (contains "=" .name) (eq $value "") -}}
--{{ .name }}
{{- else -}}
--{{ .name }}={{ $value }}
{{- end -}}
{{- end -}}

{{/* Seconds the EPP needs to stop: on SIGTERM it keeps serving for --drain-timeout (30s unless a flag sets it
in seconds or minutes), then gives running streams as long again, so twice the drain plus 10 s; never below
the reference chart's 130. */}}
{{- define "llm-epp.terminationGracePeriodSeconds" -}}
{{- $drain := 30 -}}
{{- range (include "llm-epp.flagList" . | fromJsonArray) -}}
{{- if eq .name "drain-timeout" -}}
{{- $v := include "llm-epp.flagValue" .value -}}
{{- if regexMatch "^[0-9]+s$" $v -}}{{- $drain = trimSuffix "s" $v | int -}}{{- end -}}
{{- if regexMatch "^[0-9]+m$" $v -}}{{- $drain = mul (trimSuffix "m" $v | int) 60 -}}{{- end -}}
{{- end -}}
{{- end -}}
{{- max 130 (add (mul $drain 2) 10) -}}
{{- end -}}

{{/* The engine-metric specs core-metrics-extractor has built in (kept in step by tests/deploy). */}}
{{- define "llm-epp.builtinEngines" -}}
vllm:
  queuedRequestsSpec: "vllm:num_requests_waiting"
  runningRequestsSpec: "vllm:num_requests_running"
  kvUsageSpec: "vllm:kv_cache_usage_perc"
  loraSpec: "vllm:lora_requests_info"
  cacheInfoSpec: "vllm:cache_config_info"
sglang:
  queuedRequestsSpec: "sglang:num_queue_reqs"
  runningRequestsSpec: "sglang:num_running_reqs"
  kvUsageSpec: "sglang:token_usage"
  cacheInfoSpec: "sglang:cache_config_info"
  cacheBlockSizeLabelName: page_size
  cacheNumBlocksLabelName: num_pages
trtllm-serve:
  queuedRequestsSpec: trtllm_num_requests_waiting
  runningRequestsSpec: trtllm_num_requests_running
  kvUsageSpec: trtllm_kv_cache_utilization
  cacheBlockSizeSpec: trtllm_kv_cache_tokens_per_block
  cacheNumBlocksSpec: trtllm_kv_cache_max_blocks
triton-tensorrt-llm:
  queuedRequestsSpec: "nv_trt_llm_request_metrics{request_type=waiting}"
  runningRequestsSpec: "nv_trt_llm_request_metrics{request_type=scheduled}"
  kvUsageSpec: "nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=fraction}"
  cacheBlockSizeSpec: "nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=tokens_per}"
  cacheNumBlocksSpec: "nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=max}"
{{- end -}}

{{/* The older EPP flags that named engine metrics, and the engineConfigs field each one sets. */}}
{{- define "llm-epp.legacyMetricFlags" -}}
total-queued-requests-metric: queuedRequestsSpec
total-running-requests-metric: runningRequestsSpec
kv-cache-usage-percentage-metric: kvUsageSpec
lora-info-metric: loraSpec
cache-info-metric: cacheInfoSpec
{{- end -}}

{{/* The engineConfigs fields the legacy metric flags set (a JSON object, empty without such flags). */}}
{{- define "llm-epp.legacyMetricOverrides" -}}
{{- $legacy := include "llm-epp.legacyMetricFlags" . | fromYaml -}}
{{- $out := dict -}}
{{- range (include "llm-epp.flagList" . | fromJsonArray) -}}
{{- if hasKey $legacy .name -}}
{{- $_ := set $out (get $legacy .name) (include "llm-epp.flagValue" .value | trimAll "\"") -}}
{{- end -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/* The generated EndpointPickerConfig: the reference default scorer set and weights. */}}
{{/* "true" when inferenceExtension.latencyPredictor.enabled */}}
{{- define "llm-epp.latencyPredictor" -}}
{{- $lp := .Values.inferenceExtension.latencyPredictor | default dict -}}
{{- if $lp.enabled }}true{{ end -}}
{{- end -}}

{{/* The reference chart's latency-predictor settings as EPP environment variables: the in-process predictor
reads the ones it has a counterpart for and logs the others as having no effect (charts/llm-epp/README.md). */}}
{{- define "llm-epp.latencyPredictorEnv" -}}
{{- $lp := .Values.inferenceExtension.latencyPredictor | default dict -}}
{{- $env := dict -}}
{{- range $k, $v := (($lp.trainingServer | default dict).config | default dict) }}{{ $_ := set $env $k $v }}{{ end -}}
{{- range $k, $v := ($lp.eppEnv | default dict) }}{{ $_ := set $env $k $v }}{{ end -}}
{{- range $k := keys $env | sortAlpha }}
- name: {{ $k }}
  value: {{ get $env $k | toString | quote }}
{{- end }}
{{- end -}}

{{- define "llm-epp.defaultPlugins" -}}
{{- $mds := .Values.inferenceExtension.metricsDataSource | default dict -}}
{{- $parser := include "llm-epp.parserType" . -}}
{{- $engine := include "llm-epp.modelServerType" . -}}
{{- $overrides := include "llm-epp.legacyMetricOverrides" . | fromJson -}}
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
- type: metrics-data-source
  parameters:
    scheme: {{ $mds.scheme | default "http" | quote }}
    path: {{ $mds.path | default "/metrics" | quote }}
    insecureSkipVerify: {{ if hasKey $mds "insecureSkipVerify" }}{{ $mds.insecureSkipVerify }}{{ else }}true{{ end }}
- type: core-metrics-extractor
  parameters:
    defaultEngine: {{ $engine }}
    {{- if $overrides }}
    # From the legacy engine-metric flags in inferenceExtension.flags.
    {{- $spec := get (include "llm-epp.builtinEngines" . | fromYaml) $engine }}
    {{- range $field, $value := $overrides }}{{ $_ := set $spec $field $value }}{{ end }}
    engineConfigs:
    - name: {{ $engine }}
      {{- $spec | toYaml | nindent 6 }}
    {{- end }}
{{- if include "llm-epp.latencyPredictor" . }}
# latencyPredictor.enabled: the reference chart's SLO-aware profile; the predictor runs inside the EPP.
- type: predicted-latency-producer
- name: strict-affinity-filter
  type: prefix-cache-affinity-filter
  parameters:
    affinityThreshold: 0.99
- name: loose-affinity-filter
  type: prefix-cache-affinity-filter
  parameters:
    affinityThreshold: 0.80
- type: latency-scorer
- type: weighted-random-picker
- type: slo-headroom-tier-filter
- type: latency-slo-admitter
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: predicted-latency-producer
  - pluginRef: strict-affinity-filter
  - pluginRef: slo-headroom-tier-filter
  - pluginRef: loose-affinity-filter
  - pluginRef: latency-scorer
  - pluginRef: weighted-random-picker
{{- else }}
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: kv-cache-utilization-scorer
    weight: 2
  - pluginRef: prefix-cache-scorer
    weight: 3
{{- end }}
{{- if $parser }}
parser:
  pluginRef: {{ $parser }}
{{- end }}
dataLayer:
  sources:
  - pluginRef: metrics-data-source
    extractors:
    - pluginRef: core-metrics-extractor
{{- end -}}

{{/* Render-time checks the JSON schema cannot express. Each failure names the value and says what to do. */}}
{{- define "llm-epp.validate" -}}
{{- $ie := .Values.inferenceExtension -}}
{{- $pool := .Values.inferencePool -}}
{{- if .Values.router -}}
{{- fail "router: the llm-d-router chart layout (router.epp, router.modelServers, ...) is not supported yet by this chart; write the values in the inferenceExtension / inferencePool layout of the reference inferencepool chart" -}}
{{- end -}}
{{- if and (not (include "llm-epp.standalone" .)) (not $pool.modelServers.matchLabels) -}}
{{- fail "inferencePool.modelServers.matchLabels is required: the labels of the model server pods (e.g. --set inferencePool.modelServers.matchLabels.app=vllm-llama3-8b)" -}}
{{- end -}}
{{- if include "llm-epp.standalone" . -}}
{{- if not $ie.endpointsServer.endpointSelector -}}
{{- fail "inferenceExtension.endpointsServer.endpointSelector is required when endpointsServer.createInferencePool is false (e.g. app=vllm-llama3-8b)" -}}
{{- end -}}
{{- end -}}
{{- if not (include "llm-epp.targetPorts" . | fromJsonArray) -}}
{{- fail "inferencePool.targetPorts: at least one model server port is needed (e.g. [{number: 8000}])" -}}
{{- end -}}
{{- if and $pool.apiVersion (ne $pool.apiVersion "inference.networking.k8s.io/v1") -}}
{{- fail (printf "inferencePool.apiVersion: %q is not supported yet; llm-epp serves InferencePools of inference.networking.k8s.io/v1" $pool.apiVersion) -}}
{{- end -}}
{{- if and $ie.apiVersion (ne $ie.apiVersion "inference.networking.k8s.io") -}}
{{- fail (printf "inferenceExtension.apiVersion: %q is not supported yet; the pool API group is inference.networking.k8s.io" $ie.apiVersion) -}}
{{- end -}}
{{- range $name, $server := ($ie.sidecars | default dict) -}}
{{- if and (kindIs "map" $server) $server.enabled -}}
{{- fail (printf "inferenceExtension.sidecars.%s.enabled: the latency-predictor sidecars are not supported yet by llm-epp; set it to false" $name) -}}
{{- end -}}
{{- end -}}
{{- if and $ie.monitoring.gke (or $ie.monitoring.gke.enabled $ie.monitoring.gke.enable) -}}
{{- fail "inferenceExtension.monitoring.gke.enabled: removed from the reference chart and not supported; set provider.name=gke and inferenceExtension.monitoring.prometheus.enabled=true for a PodMonitoring" -}}
{{- end -}}
{{- if and $ie.sidecar $ie.sidecar.enabled -}}
{{- if not (and $ie.sidecar.name $ie.sidecar.image) -}}
{{- fail "inferenceExtension.sidecar: name and image are required when sidecar.enabled is true" -}}
{{- end -}}
{{- end -}}
{{- $parser := include "llm-epp.parserType" . -}}
{{- if and $parser (not (has $parser (include "llm-epp.supportedParsers" . | splitList "\n"))) -}}
{{- fail (printf "inferencePool.parser: %q is not supported yet by llm-epp; supported: %s (or empty)" $parser (include "llm-epp.supportedParsers" . | splitList "\n" | join ", ")) -}}
{{- end -}}
{{- range (include "llm-epp.flagList" . | fromJsonArray) -}}
{{- if not .name -}}
{{- fail "inferenceExtension.flags: every list entry needs a name (a list of {name, value})" -}}
{{- end -}}
{{- $legacy := include "llm-epp.legacyMetricFlags" $ | fromYaml -}}
{{- if and (hasKey $legacy .name) (ne $ie.pluginsConfigFile "default-plugins.yaml") -}}
{{- /* Naming the metric the engine's built-in config reads anyway is fine; anything else cannot be applied. */ -}}
{{- $builtin := get (include "llm-epp.builtinEngines" $ | fromYaml) (include "llm-epp.modelServerType" $) | default dict -}}
{{- if ne (include "llm-epp.flagValue" .value | trimAll "\"") (get $builtin (get $legacy .name) | default "") -}}
{{- fail (printf "inferenceExtension.flags.%s: the legacy engine-metric flags only set core-metrics-extractor engineConfigs in the generated default-plugins.yaml; with pluginsConfigFile %q set engineConfigs in that file instead" .name $ie.pluginsConfigFile) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if and (ne $ie.pluginsConfigFile "default-plugins.yaml") (not (hasKey ($ie.pluginsCustomConfig | default dict) $ie.pluginsConfigFile)) -}}
{{- fail (printf "inferenceExtension.pluginsConfigFile: %q is neither default-plugins.yaml nor a key of inferenceExtension.pluginsCustomConfig" $ie.pluginsConfigFile) -}}
{{- end -}}
{{- end -}}

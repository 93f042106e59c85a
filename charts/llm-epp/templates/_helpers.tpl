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

{{- define "llm-epp.image" -}}
{{- $img := .Values.inferenceExtension.image -}}
{{- $tag := default .Chart.AppVersion $img.tag -}}
{{- if $img.registry -}}
{{- printf "%s/%s:%s" $img.registry $img.repository $tag -}}
{{- else -}}
{{- printf "%s:%s" $img.repository $tag -}}
{{- end -}}
{{- end -}}

{{- define "llm-epp.ha" -}}
{{- if gt (int .Values.inferenceExtension.replicas) 1 }}true{{ end -}}
{{- end -}}

{{/* The generated EndpointPickerConfig: the reference default scorer set and weights. */}}
{{- define "llm-epp.defaultPlugins" -}}
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
- type: metrics-data-source
- type: core-metrics-extractor
  parameters:
    defaultEngine: {{ .Values.inferencePool.modelServerType }}
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
{{- end -}}

{{/* Render-time checks the JSON schema cannot express. */}}
{{- define "llm-epp.validate" -}}
{{- $ie := .Values.inferenceExtension -}}
{{- if $ie.tracing.enabled -}}
{{- fail "inferenceExtension.tracing.enabled: tracing is not supported by llm-epp yet; set it to false" -}}
{{- end -}}
{{- if and (ne $ie.pluginsConfigFile "default-plugins.yaml") (not (hasKey $ie.pluginsCustomConfig $ie.pluginsConfigFile)) -}}
{{- fail (printf "inferenceExtension.pluginsConfigFile: %q is neither default-plugins.yaml nor a key of inferenceExtension.pluginsCustomConfig" $ie.pluginsConfigFile) -}}
{{- end -}}
{{- end -}}

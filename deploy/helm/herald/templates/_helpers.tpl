{{/* The chart's name, truncated to the 63 characters a label value may have. */}}
{{- define "herald.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's objects' name. */}}
{{- define "herald.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "herald.selectorLabels" -}}
app.kubernetes.io/name: {{ include "herald.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "herald.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "herald.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The Secret holding the API key, the token secret and broker credentials. */}}
{{- define "herald.secretName" -}}
{{- default (include "herald.fullname" .) .Values.secrets.existingSecret }}
{{- end }}

{{/* drain_ms as an integer. */}}
{{- define "herald.drainMs" -}}
{{- $d := int .Values.herald.drainMs }}
{{- if lt $d 0 }}{{ fail "herald.drainMs must be 0 or more (milliseconds)" }}{{ end }}
{{- $d }}
{{- end }}

{{/*
The pod's terminationGracePeriodSeconds: the preStop sleep, then drain_ms (clients told to come
back within it), the node's own 2 s past drain_ms for the last closes, and a margin. An explicit
value must leave at least that much (preStop + drain_ms + 2 s).
*/}}
{{- define "herald.gracePeriod" -}}
{{- $drain := int (include "herald.drainMs" .) }}
{{- $pre := int .Values.lifecycle.preStopSleepSeconds }}
{{- $need := add $pre (div (add $drain 999) 1000) 2 }}
{{- if .Values.terminationGracePeriodSeconds }}
{{- $tgps := int .Values.terminationGracePeriodSeconds }}
{{- if le $tgps $need }}
{{- fail (printf "terminationGracePeriodSeconds %d is too short: preStop %ds + drain_ms %dms + 2s needs more than %ds" $tgps $pre $drain $need) }}
{{- end }}
{{- $tgps }}
{{- else }}
{{- add $need 5 }}
{{- end }}
{{- end }}

{{/* broker_url from broker.type. */}}
{{- define "herald.brokerUrl" -}}
{{- $b := .Values.broker }}
{{- if eq $b.type "memory" }}memory
{{- else if eq $b.type "redis" }}{{ required "broker.redis.url is required with broker.type redis" $b.redis.url }}
{{- else if eq $b.type "redis-cluster" }}
{{- if not $b.redisCluster.nodes }}{{ fail "broker.redisCluster.nodes (host:port seeds) is required with broker.type redis-cluster" }}{{ end }}
{{- printf "%s://%s" (ternary "rediss+cluster" "redis+cluster" (default false $b.redisCluster.tls)) (join "," $b.redisCluster.nodes) }}
{{- else if eq $b.type "nats" }}
{{- if not $b.nats.urls }}{{ fail "broker.nats.urls is required with broker.type nats" }}{{ end }}
{{- join "," $b.nats.urls }}
{{- else }}
{{- fail (printf "broker.type %q: use memory, redis, redis-cluster or nats" $b.type) }}
{{- end }}
{{- end }}

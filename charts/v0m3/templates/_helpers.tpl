{{/* Names are "<release>-<component>", e.g. v0m3-registry, v0m3-redis. */}}
{{- define "v0m3.name" -}}{{ printf "%s-%s" .root.Release.Name .component | trunc 63 | trimSuffix "-" }}{{- end -}}

{{- define "v0m3.selectorLabels" -}}
app.kubernetes.io/name: v0m3
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "v0m3.labels" -}}
{{ include "v0m3.selectorLabels" . }}
app.kubernetes.io/part-of: v0m3
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "v0m3.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{/* The --store URL every service gets. */}}
{{- define "v0m3.storeURL" -}}
{{- if eq .Values.store "file" -}}
file://{{ .Values.dataDir }}
{{- else if eq .Values.store "redis" -}}
{{- $prefix := .Values.redisPrefix | default .Release.Name -}}
{{- if .Values.redis.enabled -}}
redis://{{ .Release.Name }}-redis:6379/0?prefix={{ $prefix }}
{{- else -}}
{{- $url := required "store=redis with redis.enabled=false needs redis.url" .Values.redis.url -}}
{{ $url }}{{ if contains "?" $url }}&{{ else }}?{{ end }}prefix={{ $prefix }}
{{- end -}}
{{- else -}}
{{- fail (printf "store must be file or redis, not %q" .Values.store) -}}
{{- end -}}
{{- end -}}

{{/* Whether a service's data volume is a PVC: the file store's data, and
evidence's assets with either store. */}}
{{- define "v0m3.persistent" -}}
{{- if and .root.Values.persistence.enabled (or (eq .root.Values.store "file") (eq .component "evidence")) -}}true{{- end -}}
{{- end -}}

{{/* Replicas: one with the file store or on a ReadWriteOnce PVC. */}}
{{- define "v0m3.replicas" -}}
{{- $svc := index .root.Values.services .component -}}
{{- if eq .root.Values.store "file" -}}1
{{- else if and (include "v0m3.persistent" .) (ne .root.Values.persistence.accessMode "ReadWriteMany") -}}1
{{- else -}}{{ $svc.replicas | int }}
{{- end -}}
{{- end -}}

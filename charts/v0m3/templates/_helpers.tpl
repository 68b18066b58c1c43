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

{{/* The store URL every service gets (env V0M3_STORE, see v0m3.storeEnv).
A Redis password is never written here: the URL names $(V0M3_REDIS_PASSWORD),
which the kubelet expands from the Secret (dependent environment variables),
so the password appears in no rendered manifest and in no process's argv. */}}
{{- define "v0m3.storeURL" -}}
{{- if eq .Values.store "file" -}}
file://{{ .Values.dataDir }}
{{- else if eq .Values.store "redis" -}}
{{- $prefix := .Values.redisPrefix | default .Release.Name -}}
{{- if .Values.redis.enabled -}}
redis://:$(V0M3_REDIS_PASSWORD)@{{ .Release.Name }}-redis:6379/0?prefix={{ $prefix }}
{{- else -}}
{{- $url := required "store=redis with redis.enabled=false needs redis.url" .Values.redis.url -}}
{{- if regexMatch "^[a-z]+://[^/@]*:[^/@]*@" $url -}}
{{- fail "redis.url carries a password: put the password in a Secret and name it in redis.auth.existingSecret (the chart never renders a password into a manifest)" -}}
{{- end -}}
{{- if .Values.redis.auth.existingSecret -}}
{{- if regexMatch "^[a-z]+://[^/]*@" $url -}}
{{- fail "redis.url names a user and redis.auth.existingSecret is set: give the user in redis.auth.username instead" -}}
{{- end -}}
{{- $scheme := regexFind "^[a-z]+://" $url -}}
{{- $url = printf "%s%s:$(V0M3_REDIS_PASSWORD)@%s" $scheme .Values.redis.auth.username (trimPrefix $scheme $url) -}}
{{- end -}}
{{ $url }}{{ if contains "?" $url }}&{{ else }}?{{ end }}prefix={{ $prefix }}
{{- end -}}
{{- else -}}
{{- fail (printf "store must be file or redis, not %q" .Values.store) -}}
{{- end -}}
{{- end -}}

{{/* The Secret and key holding the Redis password, "name/key", or empty
when the store needs none (file store, external Redis without auth). */}}
{{- define "v0m3.redisPasswordRef" -}}
{{- if eq .Values.store "redis" -}}
{{- $a := .Values.redis.auth -}}
{{- if $a.existingSecret -}}
{{ $a.existingSecret }}/{{ $a.existingSecretKey | default "password" }}
{{- else if .Values.redis.enabled -}}
{{ include "v0m3.name" (dict "root" . "component" "redis") }}-auth/password
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Environment of every service for its store: the password from its
Secret first (dependent variables must be defined before use), then the URL. */}}
{{- define "v0m3.storeEnv" -}}
{{- with include "v0m3.redisPasswordRef" . }}
- name: V0M3_REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ dir . }}
      key: {{ base . }}
{{- end }}
- name: V0M3_STORE
  value: {{ include "v0m3.storeURL" . | quote }}
{{- end -}}

{{/* The Secret holding a component's certificate (keys ca.crt, tls.crt,
tls.key): tls.existingSecrets.<component>, else the one cert-manager writes. */}}
{{- define "v0m3.tlsSecret" -}}
{{- $tls := .root.Values.tls -}}
{{- with index ($tls.existingSecrets | default dict) .component -}}
{{ . }}
{{- else -}}
{{- if not $tls.certManager.enabled -}}
{{- fail (printf "no certificate for %s: set tls.existingSecrets.%s, or tls.certManager.enabled=true, or (development only) tls.insecurePlaintext=true" .component .component) -}}
{{- end -}}
{{ include "v0m3.name" . }}-tls
{{- end -}}
{{- end -}}

{{/* TLS environment of a v0m3 container: the certificate files, or the
loud development-only plaintext flag. */}}
{{- define "v0m3.tlsEnv" -}}
{{- $tls := .root.Values.tls -}}
{{- if $tls.insecurePlaintext }}
- name: V0M3_INSECURE_PLAINTEXT
  value: "true"
{{- else }}
- name: V0M3_TLS_CA_FILE
  value: {{ $tls.mountPath }}/ca.crt
- name: V0M3_TLS_CERT_FILE
  value: {{ $tls.mountPath }}/tls.crt
- name: V0M3_TLS_KEY_FILE
  value: {{ $tls.mountPath }}/tls.key
{{- end }}
{{- end -}}

{{- define "v0m3.tlsVolumeMount" -}}
{{- if not .root.Values.tls.insecurePlaintext }}
- name: tls
  mountPath: {{ .root.Values.tls.mountPath }}
  readOnly: true
{{- end }}
{{- end -}}

{{/* No subPath: the kubelet then updates the files when the Secret
changes, and the services re-read them. */}}
{{- define "v0m3.tlsVolume" -}}
{{- if not .root.Values.tls.insecurePlaintext }}
- name: tls
  secret:
    secretName: {{ include "v0m3.tlsSecret" . }}
    defaultMode: 288 # 0440: the pod's group (fsGroup) reads, nobody else
{{- end }}
{{- end -}}

{{/* Whether a service verifies ServiceAccount tokens through TokenReview:
the product API (orchestrator) and the admin API (registry). Their pods
then mount a token to call the API server. */}}
{{- define "v0m3.tokenReview" -}}
{{- if and .root.Values.tokenReview.enabled (has .component (list "orchestrator" "registry")) -}}true{{- end -}}
{{- end -}}

{{/* Caller authentication of a service: bearer JWTs (OIDC) and, where
enabled, ServiceAccount tokens (TokenReview). */}}
{{- define "v0m3.authEnv" -}}
{{- $o := .root.Values.oidc -}}
{{- range $key, $env := dict "issuer" "V0M3_OIDC_ISSUER" "audience" "V0M3_OIDC_AUDIENCE" "jwksUrl" "V0M3_OIDC_JWKS_URL" "skew" "V0M3_OIDC_SKEW" "groupsClaim" "V0M3_OIDC_GROUPS_CLAIM" }}
{{- with index $o $key }}
- name: {{ $env }}
  value: {{ . | quote }}
{{- end }}
{{- end }}
{{- if include "v0m3.tokenReview" . }}
- name: V0M3_TOKEN_REVIEW
  value: "true"
{{- with .root.Values.tokenReview.audience }}
- name: V0M3_TOKEN_REVIEW_AUDIENCE
  value: {{ . | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{/* Who may open a connection to each component: the access table of the
identity plan (which peer may call which RPC) reduced to the network. peers
are this release's components; product and admin add networkPolicy.productFrom
and networkPolicy.adminFrom. The NetworkPolicies read this, and only this. */}}
{{- define "v0m3.callers" -}}
orchestrator: {peers: [], product: true, admin: true}
registry: {peers: [orchestrator, policy, adapter, operator, evidence], admin: true}
policy: {peers: [orchestrator, adapter, registry, evidence], admin: true}
evidence: {peers: [orchestrator, adapter, registry, policy], admin: true}
adapter: {peers: [orchestrator, policy, operator], admin: true}
operator: {peers: []}
redis: {peers: [orchestrator, registry, policy, evidence, adapter]}
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

{{/* OpenTelemetry settings: set only when an OTLP endpoint is configured,
so that without one no exporter runs. */}}
{{- define "v0m3.otelEnv" -}}
{{- with .Values.tracing.otlpEndpoint }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ . | quote }}
- name: OTEL_EXPORTER_OTLP_INSECURE
  value: {{ $.Values.tracing.insecure | quote }}
- name: OTEL_TRACES_SAMPLER
  value: {{ $.Values.tracing.sampler | quote }}
- name: OTEL_TRACES_SAMPLER_ARG
  value: {{ $.Values.tracing.samplerArg | quote }}
{{- end }}
{{- end -}}

{{/* Common labels. */}}
{{- define "ztunnel-go.labels" -}}
app.kubernetes.io/part-of: ztunnel-go
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{/* image "name": registry/name:tag. */}}
{{- define "ztunnel-go.image" -}}
{{- $ := index . 0 -}}
{{ printf "%s/%s:%s" $.Values.image.registry (index . 1) (default $.Chart.AppVersion $.Values.image.tag) }}
{{- end }}

{{/* The control plane's xDS and CA address. */}}
{{- define "ztunnel-go.cpAddress" -}}
{{ printf "ztunnel-cp.%s.svc:15012" .Release.Namespace }}
{{- end }}

{{- define "ztunnel-go.rootNamespace" -}}
{{ default .Release.Namespace .Values.rootNamespace }}
{{- end }}

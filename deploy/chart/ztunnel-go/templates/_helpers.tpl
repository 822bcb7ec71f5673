{{/* Common labels. */}}
{{- define "ztunnel-go.labels" -}}
app.kubernetes.io/part-of: ztunnel-go
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{/* image (list . "name" ["tag"]): registry/name:tag, where tag is the
component's own tag when given and set, else image.tag, else appVersion. */}}
{{- define "ztunnel-go.image" -}}
{{- $ := index . 0 -}}
{{- $tag := default $.Chart.AppVersion $.Values.image.tag -}}
{{- if and (gt (len .) 2) (index . 2) -}}
{{- $tag = index . 2 -}}
{{- end -}}
{{ printf "%s/%s:%s" $.Values.image.registry (index . 1) $tag }}
{{- end }}

{{/* The control plane's xDS and CA address. */}}
{{- define "ztunnel-go.cpAddress" -}}
{{ printf "ztunnel-cp.%s.svc:15012" .Release.Namespace }}
{{- end }}

{{/* The node proxy's xDS address: ztunnel.xdsAddress, else this chart's
control plane, else (node components only) istiod's, as Istio's ztunnel
chart defaults it. */}}
{{- define "ztunnel-go.xdsAddress" -}}
{{- if .Values.ztunnel.xdsAddress -}}
{{ .Values.ztunnel.xdsAddress }}
{{- else if .Values.controlPlane.enabled -}}
{{ include "ztunnel-go.cpAddress" . }}
{{- else -}}
istiod.istio-system.svc:15012
{{- end -}}
{{- end }}

{{/* The node proxy's CA address: ztunnel.caAddress, else the xDS one. */}}
{{- define "ztunnel-go.caAddress" -}}
{{ default (include "ztunnel-go.xdsAddress" .) .Values.ztunnel.caAddress }}
{{- end }}

{{- define "ztunnel-go.rootNamespace" -}}
{{ default .Release.Namespace .Values.rootNamespace }}
{{- end }}

{{/* DNS capture and the node proxy's DNS proxy: cni.dnsCapture when set,
else what compatibilityVersion's Istio release did (off before 1.25), else
on. compatibilityVersion must be a quoted "MAJOR.MINOR": as a YAML number
1.30 would read as 1.3. */}}
{{- define "ztunnel-go.dnsCapture" -}}
{{- $cv := .Values.compatibilityVersion -}}
{{- if and $cv (not (kindIs "string" $cv)) -}}
{{- fail (printf "compatibilityVersion %v: quote it (\"1.24\"): a YAML number loses trailing zeros (1.30 reads as 1.3); use --set-string" $cv) -}}
{{- end -}}
{{- if and $cv (not (regexMatch "^[0-9]+\\.[0-9]+$" $cv)) -}}
{{- fail (printf "compatibilityVersion %q: want an Istio release as MAJOR.MINOR, e.g. \"1.24\"" $cv) -}}
{{- end -}}
{{- if not (kindIs "invalid" .Values.cni.dnsCapture) -}}
{{ .Values.cni.dnsCapture }}
{{- else if $cv -}}
{{ semverCompare ">=1.25" (printf "%s.0" $cv) }}
{{- else -}}
true
{{- end -}}
{{- end }}

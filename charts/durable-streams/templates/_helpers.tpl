{{- define "ds.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "ds.labels" -}}
app.kubernetes.io/name: durable-streams-operator
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "ds.selector" -}}
app.kubernetes.io/name: durable-streams-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "ds.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "ds.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/*
An image reference: [registry/]repository:tag, with @digest when one is given.
global.imageRegistry (a parent chart's) wins over the image's own registry; an
empty tag is the chart's appVersion.
Call: include "ds.image" (dict "image" .Values.operator.image "root" .)
*/}}
{{- define "ds.image" -}}
{{- $registry := .image.registry | default "" -}}
{{- with .root.Values.global }}{{ with .imageRegistry }}{{ $registry = . }}{{ end }}{{ end -}}
{{- $ref := .image.repository -}}
{{- if $registry }}{{ $ref = printf "%s/%s" (trimSuffix "/" $registry) $ref }}{{ end -}}
{{- $ref = printf "%s:%s" $ref (.image.tag | default .root.Chart.AppVersion) -}}
{{- if .image.digest }}{{ $ref = printf "%s@%s" $ref .image.digest }}{{ end -}}
{{- $ref -}}
{{- end -}}

{{/*
The names of the image pull secrets: imagePullSecrets, then global.imagePullSecrets
(names or {name: ...}), each once, as a list of {name: ...}.
*/}}
{{- define "ds.imagePullSecretNames" -}}
{{- $names := list -}}
{{- range .Values.imagePullSecrets }}{{ $names = append $names .name }}{{ end -}}
{{- with .Values.global }}{{ range .imagePullSecrets -}}
{{- if kindIs "string" . }}{{ $names = append $names . }}{{ else }}{{ $names = append $names .name }}{{ end -}}
{{- end }}{{ end -}}
{{- $names | uniq | join "," -}}
{{- end -}}


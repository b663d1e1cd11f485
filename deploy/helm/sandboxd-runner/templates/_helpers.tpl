{{- define "sandboxd-runner.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "sandboxd-runner.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "sandboxd-runner.labels" -}}
{{ include "sandboxd-runner.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "sandboxd-runner.sandboxNamespace" -}}
{{- default .Release.Namespace .Values.sandboxNamespace -}}
{{- end -}}

{{- define "sandboxd-runner.secretName" -}}
{{- default (include "sandboxd-runner.fullname" .) .Values.controlPlane.existingSecret -}}
{{- end -}}

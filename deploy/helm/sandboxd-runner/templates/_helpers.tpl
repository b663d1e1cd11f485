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

{{- /* The egress Service (egress.enabled): a DNS-1035 label of at most 63. */ -}}
{{- define "sandboxd-runner.egressName" -}}
{{- printf "%s-egress" (include "sandboxd-runner.fullname" . | trunc 56 | trimSuffix "-") -}}
{{- end -}}

{{- /* Where sandbox Pods reach the egress proxy (443) and DNS (53): the pinned
ClusterIP, else the egress Service's, which the kubelet gives the runner's container as
<SERVICE>_SERVICE_HOST (a Service of the Pod's namespace that exists when the container
starts; $(VAR) in args expands it). */ -}}
{{- define "sandboxd-runner.egressAddr" -}}
{{- if .Values.egress.clusterIP -}}
{{- .Values.egress.clusterIP -}}
{{- else -}}
{{- printf "$(%s_SERVICE_HOST)" (include "sandboxd-runner.egressName" . | upper | replace "-" "_") -}}
{{- end -}}
{{- end -}}

{{- /* egress.*: refuses what the runner or the API server would refuse, naming the value. */ -}}
{{- define "sandboxd-runner.egressCheck" -}}
{{- $e := .Values.egress -}}
{{- if not (kindIs "map" $e) -}}
{{- fail (printf "egress: want a map (enabled, proxyPort, dnsPort, clusterIP, forbid, networkPolicy), got %v" $e) -}}
{{- end -}}
{{- if not (kindIs "bool" $e.enabled) -}}
{{- fail (printf "egress.enabled: want true or false, got %v" $e.enabled) -}}
{{- end -}}
{{- if $e.enabled -}}
{{- range $k := list "proxyPort" "dnsPort" -}}
{{- $v := index $e $k -}}
{{- if or (not (regexMatch "^[0-9]{1,5}$" (toString $v))) (lt (int $v) 1) (gt (int $v) 65535) -}}
{{- fail (printf "egress.%s: want a port 1-65535, got %v" $k $v) -}}
{{- end -}}
{{- end -}}
{{- $proxy := int $e.proxyPort -}}
{{- $dns := int $e.dnsPort -}}
{{- $tcp := dict "7443" "the runner API" (toString (int $.Values.metrics.port)) "metrics.port" -}}
{{- if .Values.edge.enabled -}}{{- $_ := set $tcp "8443" "the edge" -}}{{- end -}}
{{- if eq $proxy $dns -}}
{{- fail (printf "egress.proxyPort and egress.dnsPort: both %d (the DNS serves TCP too): want two ports" $proxy) -}}
{{- end -}}
{{- range $k, $p := dict "proxyPort" $proxy "dnsPort" $dns -}}
{{- with index $tcp (toString $p) -}}
{{- fail (printf "egress.%s: port %d is already %s's" $k $p .) -}}
{{- end -}}
{{- end -}}
{{- if and $.Values.hello.enabled (eq $dns (int $.Values.hello.port)) -}}
{{- fail (printf "egress.dnsPort: UDP port %d is already the gate hello's (hello.port)" $dns) -}}
{{- end -}}
{{- with $e.clusterIP -}}
{{- if not (kindIs "string" .) -}}
{{- fail (printf "egress.clusterIP: want an IP address or \"\", got %v" .) -}}
{{- end -}}
{{- if not (or (regexMatch "^((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\\.){3}(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])$" .) (regexMatch "^[0-9A-Fa-f]{0,4}(:[0-9A-Fa-f]{0,4}){2,7}$" .)) -}}
{{- fail (printf "egress.clusterIP %q: want an IP address of the cluster's Service range (or \"\": the API server picks one)" .) -}}
{{- end -}}
{{- if or (hasPrefix "0." .) (hasPrefix "127." .) (hasPrefix "169.254." .) (eq . "::") (eq . "::1") (hasPrefix "fe80:" (lower .)) -}}
{{- fail (printf "egress.clusterIP %q: not an address sandbox Pods can reach the runner at" .) -}}
{{- end -}}
{{- end -}}
{{- if not (kindIs "slice" $e.forbid) -}}
{{- fail (printf "egress.forbid: want a list of CIDRs, got %v" $e.forbid) -}}
{{- end -}}
{{- if gt (len $e.forbid) 64 -}}
{{- fail (printf "egress.forbid: %d CIDRs, want at most 64" (len $e.forbid)) -}}
{{- end -}}
{{- range $e.forbid -}}
{{- if not (and (kindIs "string" .) (or (regexMatch "^([0-9]{1,3}\\.){3}[0-9]{1,3}/[0-9]{1,2}$" .) (regexMatch "^[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*/[0-9]{1,3}$" .))) -}}
{{- fail (printf "egress.forbid: %q: want a CIDR (10.96.0.0/12, fd00::/108)" (toString .)) -}}
{{- end -}}
{{- end -}}
{{- if not (kindIs "bool" $e.networkPolicy.enabled) -}}
{{- fail (printf "egress.networkPolicy.enabled: want true or false, got %v" $e.networkPolicy.enabled) -}}
{{- end -}}
{{- end -}}
{{- end -}}

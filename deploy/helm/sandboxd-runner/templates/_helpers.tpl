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

{{- /* The node agent's Pods: not the runner's selector labels (the runner's Service,
NetworkPolicies and --runner-peer-pods select those). */ -}}
{{- /* nodeAgentIssue: "true" when the runner issues the node agents' certificates
(nodeAgent.serverSecret and nodeAgent.clientSecret both empty), else "". */ -}}
{{- define "sandboxd-runner.nodeAgentIssue" -}}
{{- include "sandboxd-runner.nodeAgentCheck" . -}}
{{- if and .Values.nodeAgent.enabled (not .Values.nodeAgent.serverSecret) (not .Values.nodeAgent.clientSecret) -}}true{{- end -}}
{{- end -}}
{{- /* nodeAgentIssuePrefix: the runner's --node-agent-issue-secrets; it keeps the CA in
<prefix>-ca and the agents' certificate in <prefix>-server. */ -}}
{{- define "sandboxd-runner.nodeAgentIssuePrefix" -}}
{{- include "sandboxd-runner.fullname" . | trunc 52 | trimSuffix "-" }}-node-agent
{{- end -}}
{{- /* nodeAgentServerSecret: the Secret the agents mount as their --tls-dir. */ -}}
{{- define "sandboxd-runner.nodeAgentServerSecret" -}}
{{- if include "sandboxd-runner.nodeAgentIssue" . -}}
{{- include "sandboxd-runner.nodeAgentIssuePrefix" . }}-server
{{- else -}}
{{- .Values.nodeAgent.serverSecret -}}
{{- end -}}
{{- end -}}
{{- define "sandboxd-runner.nodeAgentSelectorLabels" -}}
app.kubernetes.io/name: sandboxd-node-agent
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: node-agent
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

{{- /* The ConfigMap of egress.roots.pem and egress.upstreamCA.pem: a DNS subdomain. */ -}}
{{- define "sandboxd-runner.egressTrustName" -}}
{{- printf "%s-egress-trust" (include "sandboxd-runner.fullname" .) -}}
{{- end -}}

{{- /* An IPv4 address as netip.ParseAddr reads one (octets 0-255, no leading zeros). */ -}}
{{- define "sandboxd-runner.ipv4Pattern" -}}
((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])
{{- end -}}

{{- /* The eight groups of the IPv6 address . (lower-case, "::" expanded to zeros; an IPv4
tail as the two groups "v4") joined by ":", or "" if . is not one in netip.ParseAddr's
syntax (zones not taken). */ -}}
{{- define "sandboxd-runner.ipv6Groups" -}}
{{- $v4 := printf "^%s$" (include "sandboxd-runner.ipv4Pattern" .) -}}
{{- $halves := splitList "::" (toString .) -}}
{{- $ok := and (kindIs "string" .) (le (len $halves) 2) -}}
{{- $parts := list -}}
{{- range $i, $h := $halves -}}
{{- $g := list -}}
{{- if $h -}}
{{- $fields := splitList ":" $h -}}
{{- range $j, $f := $fields -}}
{{- if regexMatch "^[0-9A-Fa-f]{1,4}$" $f -}}
{{- $g = append $g (lower $f) -}}
{{- else if and (eq $i (sub (len $halves) 1)) (eq $j (sub (len $fields) 1)) (regexMatch $v4 $f) -}}
{{- $g = concat $g (list "v4" "v4") -}}
{{- else -}}
{{- $ok = false -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $parts = append $parts $g -}}
{{- end -}}
{{- if $ok -}}
{{- if eq (len $parts) 1 -}}
{{- if eq (len (index $parts 0)) 8 -}}
{{- join ":" (index $parts 0) -}}
{{- end -}}
{{- else -}}
{{- $n := add (len (index $parts 0)) (len (index $parts 1)) -}}
{{- if le $n 7 -}}
{{- $all := index $parts 0 -}}
{{- range until (int (sub 8 $n)) -}}
{{- $all = append $all "0" -}}
{{- end -}}
{{- join ":" (concat $all (index $parts 1)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- /* "mapped" if the IPv6 groups . (ipv6Groups) are an IPv4-mapped address (::ffff:0:0/96). */ -}}
{{- define "sandboxd-runner.ipv6Mapped" -}}
{{- $g := splitList ":" . -}}
{{- if and (eq (len $g) 8) (regexMatch "^0+$" (join "" (slice $g 0 5))) (eq (index $g 5) "ffff") -}}mapped{{- end -}}
{{- end -}}

{{- /* egress.*: refuses what the runner or the API server would refuse, naming the value. */ -}}
{{- define "sandboxd-runner.egressCheck" -}}
{{- $e := .Values.egress -}}
{{- if not (kindIs "map" $e) -}}
{{- fail (printf "egress: want a map (enabled, proxyPort, dnsPort, clusterIP, forbid, networkPolicy, roots, upstreamCA), got %v" $e) -}}
{{- end -}}
{{- if not (kindIs "bool" $e.enabled) -}}
{{- fail (printf "egress.enabled: want true or false, got %v" $e.enabled) -}}
{{- end -}}
{{- /* egress.roots and egress.upstreamCA: checked on or off (given while off fails). */ -}}
{{- $_ := include "sandboxd-runner.egressTrust" (dict "e" $e "k" "roots") -}}
{{- $_ := include "sandboxd-runner.egressTrust" (dict "e" $e "k" "upstreamCA") -}}
{{- $pems := add (len (toString (index $e.roots "pem" | default ""))) (len (toString (index $e.upstreamCA "pem" | default ""))) -}}
{{- if gt $pems 1024000 -}}
{{- fail (printf "egress.roots.pem and egress.upstreamCA.pem: %d bytes together, at most 1024000 (the ConfigMap %s holds both; a ConfigMap holds at most 1 MiB): give one of them from a ConfigMap or Secret of yours" $pems (include "sandboxd-runner.egressTrustName" .)) -}}
{{- end -}}
{{- if $e.enabled -}}
{{- range $k := list "proxyPort" "dnsPort" -}}
{{- $v := index $e $k -}}
{{- if or (not (regexMatch "^[0-9]{1,5}$" (toString $v))) (lt (int $v) 1) (gt (int $v) 65535) -}}
{{- fail (printf "egress.%s: want a port 1-65535, got %v" $k $v) -}}
{{- end -}}
{{- if lt (int $v) 1024 -}}
{{- fail (printf "egress.%s: port %v is below 1024: the runner (a non-root user, no capabilities) cannot bind it where the container runtime keeps net.ipv4.ip_unprivileged_port_start at 1024 (containerd 1.7's default); want 1024-65535 (the Service maps %s to it)" $k $v (ternary "443" "53" (eq $k "proxyPort"))) -}}
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
{{- $is4 := regexMatch (printf "^%s$" (include "sandboxd-runner.ipv4Pattern" .)) . -}}
{{- $g6 := include "sandboxd-runner.ipv6Groups" . -}}
{{- if not (or $is4 $g6) -}}
{{- fail (printf "egress.clusterIP %q: want an IP address of the cluster's Service range (or \"\": the API server picks one)" .) -}}
{{- end -}}
{{- if include "sandboxd-runner.ipv6Mapped" $g6 -}}
{{- fail (printf "egress.clusterIP %q: an IPv4-mapped address: give the IPv4 address" .) -}}
{{- end -}}
{{- /* What the runner refuses (checkEgressAddr): unspecified, loopback, link-local, multicast. */ -}}
{{- if or (and $is4 (regexMatch "^(0|127|22[4-9]|23[0-9])\\.|^169\\.254\\." .)) (and $g6 (or (regexMatch "^(0+:){7}0*1?$" $g6) (regexMatch "^(fe[89ab][0-9a-f]|ff[0-9a-f]{2}):" $g6))) -}}
{{- fail (printf "egress.clusterIP %q: not an address sandbox Pods can reach the runner at (unspecified, loopback, link-local or multicast)" .) -}}
{{- end -}}
{{- end -}}
{{- if not (kindIs "slice" $e.forbid) -}}
{{- fail (printf "egress.forbid: want a list of CIDRs, got %v" $e.forbid) -}}
{{- end -}}
{{- if gt (len $e.forbid) 64 -}}
{{- fail (printf "egress.forbid: %d CIDRs, want at most 64" (len $e.forbid)) -}}
{{- end -}}
{{- /* As the runner reads --egress-forbid (netip.ParsePrefix): an IPv4 address and
/0-32, or an IPv6 one and /0-128, the bits without leading zeros; an IPv4-mapped prefix
(::ffff:a.b.c.d) not shorter than /96. */ -}}
{{- range $e.forbid -}}
{{- $c := toString . -}}
{{- $ok := and (kindIs "string" .) (regexMatch "^[^/]+/(0|[1-9][0-9]{0,2})$" $c) -}}
{{- $g6 := "" -}}
{{- if $ok -}}
{{- $addr := first (splitList "/" $c) -}}
{{- $bits := atoi (last (splitList "/" $c)) -}}
{{- $g6 = include "sandboxd-runner.ipv6Groups" $addr -}}
{{- if regexMatch (printf "^%s$" (include "sandboxd-runner.ipv4Pattern" .)) $addr -}}
{{- $ok = le $bits 32 -}}
{{- else -}}
{{- $ok = and $g6 (le $bits 128) -}}
{{- if and $ok (include "sandboxd-runner.ipv6Mapped" $g6) (lt $bits 96) -}}
{{- fail (printf "egress.forbid: %q: an IPv4-mapped prefix shorter than /96 mixes families (the runner refuses it): give the IPv4 and IPv6 ranges apart" $c) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if not $ok -}}
{{- fail (printf "egress.forbid: %q: want a CIDR (10.96.0.0/12, fd00::/108)" $c) -}}
{{- end -}}
{{- end -}}
{{- if not (kindIs "map" $e.networkPolicy) -}}
{{- fail (printf "egress.networkPolicy: want a map (enabled), got %v" $e.networkPolicy) -}}
{{- end -}}
{{- if not (kindIs "bool" $e.networkPolicy.enabled) -}}
{{- fail (printf "egress.networkPolicy.enabled: want true or false, got %v" $e.networkPolicy.enabled) -}}
{{- end -}}
{{- /* The chart sets the runner's --egress-* flags itself: one in extraArgs too would
give the runner the flag twice (the last one wins), silently overriding the chart's. */ -}}
{{- if kindIs "slice" $.Values.extraArgs -}}
{{- range $a := $.Values.extraArgs -}}
{{- if regexMatch "^--?egress-" (toString $a) -}}
{{- fail (printf "extraArgs: %q: with egress.enabled the chart sets the runner's --egress-* flags itself (from egress.proxyPort, egress.dnsPort, egress.clusterIP, egress.forbid, egress.roots, egress.upstreamCA): set those values instead, or turn egress.enabled off to pass the flags yourself" (toString $a)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- /* egress.roots or egress.upstreamCA (.k of the egress values .e): the runner's
--egress-roots or --egress-upstream-ca from one source, pem (inline: the ConfigMap
egressTrustName the chart renders), configMap or secret (name and key, in the
release namespace). Refuses two sources, a source while egress is off, a name or key
missing or malformed, inline text with no PEM certificate or over the runner's 900 KiB
(kubernetes.MaxEgressRoots). Its output: the source ("pem", "configMap", "secret"), or
nothing. */ -}}
{{- define "sandboxd-runner.egressTrust" -}}
{{- $k := .k -}}
{{- $v := index .e $k -}}
{{- $flag := ternary "--egress-roots" "--egress-upstream-ca" (eq $k "roots") -}}
{{- if not (kindIs "map" $v) -}}
{{- fail (printf "egress.%s: want a map (pem, configMap, secret), got %v" $k $v) -}}
{{- end -}}
{{- $pem := index $v "pem" -}}
{{- if not (or (eq $pem nil) (kindIs "string" $pem)) -}}
{{- fail (printf "egress.%s.pem: want PEM text (--set-file egress.%s.pem=FILE), got %v" $k $k $pem) -}}
{{- end -}}
{{- $given := list -}}
{{- if $pem -}}{{- $given = append $given "pem" -}}{{- end -}}
{{- range $src := list "configMap" "secret" -}}
{{- $r := index $v $src -}}
{{- if not (or (eq $r nil) (kindIs "map" $r)) -}}
{{- fail (printf "egress.%s.%s: want a map (name, key), got %v" $k $src $r) -}}
{{- end -}}
{{- if $r -}}
{{- range $f := list "name" "key" -}}
{{- $x := index $r $f -}}
{{- if not (or (eq $x nil) (kindIs "string" $x)) -}}
{{- fail (printf "egress.%s.%s.%s: want a string (--set-string), got %v" $k $src $f $x) -}}
{{- end -}}
{{- end -}}
{{- if or (index $r "name") (index $r "key") -}}{{- $given = append $given $src -}}{{- end -}}
{{- end -}}
{{- end -}}
{{- if gt (len $given) 1 -}}
{{- fail (printf "egress.%s: %s given: want one source of %s (pem, configMap or secret)" $k (join " and " $given) $flag) -}}
{{- end -}}
{{- if and $given (not .e.enabled) -}}
{{- fail (printf "egress.%s.%s given while egress.enabled is false: the runner reads %s only with its egress proxy (egress secrets); turn egress.enabled on, or unset egress.%s" $k (first $given) $flag $k) -}}
{{- end -}}
{{- if $pem -}}
{{- if not (contains "-----BEGIN CERTIFICATE-----" $pem) -}}
{{- fail (printf "egress.%s.pem: holds no PEM certificate (-----BEGIN CERTIFICATE-----): want PEM CA certificates (--set-file egress.%s.pem=FILE)" $k $k) -}}
{{- end -}}
{{- if gt (len $pem) 921600 -}}
{{- fail (printf "egress.%s.pem: %d bytes, at most 921600 (900 KiB: %s): give a smaller bundle, or a ConfigMap or Secret of yours (egress.%s.configMap)" $k (len $pem) (ternary "the runner's limit for --egress-roots" "the chart's ConfigMap holds at most 1 MiB" (eq $k "roots")) $k) -}}
{{- end -}}
{{- end -}}
{{- range $src := list "configMap" "secret" -}}
{{- if has $src $given -}}
{{- $r := index $v $src -}}
{{- $kind := ternary "ConfigMap" "Secret" (eq $src "configMap") -}}
{{- $name := toString (index $r "name" | default "") -}}
{{- $key := toString (index $r "key" | default "") -}}
{{- if not $name -}}
{{- fail (printf "egress.%s.%s.name: want the name of a %s of the release namespace (key %q given)" $k $src $kind $key) -}}
{{- end -}}
{{- if or (gt (len $name) 253) (not (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$" $name)) -}}
{{- fail (printf "egress.%s.%s.name %q: want a %s name (a DNS subdomain)" $k $src $name $kind) -}}
{{- end -}}
{{- if not $key -}}
{{- fail (printf "egress.%s.%s.key: want the key of %s %q that holds the PEM bundle" $k $src $kind $name) -}}
{{- end -}}
{{- if or (gt (len $key) 253) (not (regexMatch "^[-._a-zA-Z0-9]+$" $key)) (eq $key ".") (eq $key "..") -}}
{{- fail (printf "egress.%s.%s.key %q: want a %s key (letters, digits, '-', '_', '.'; at most 253)" $k $src $key $kind) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if $given -}}{{- first $given -}}{{- end -}}
{{- end -}}

{{- /* The volume of egress.roots or egress.upstreamCA (.k; source .src, from
egressTrust) in the runner's Pod: item .file, from the chart's ConfigMap (its key .file)
or the operator's ConfigMap or Secret (its key). .root: the chart's context. */ -}}
{{- define "sandboxd-runner.egressTrustVolume" -}}
{{- $v := index .root.Values.egress .k -}}
- name: {{ .vol }}
  {{- if eq .src "pem" }}
  configMap:
    name: {{ include "sandboxd-runner.egressTrustName" .root }}
    items: [{key: {{ .file }}, path: {{ .file }}}]
  {{- else if eq .src "configMap" }}
  configMap:
    name: {{ $v.configMap.name | quote }}
    items: [{key: {{ $v.configMap.key | quote }}, path: {{ .file }}}]
  {{- else }}
  secret:
    secretName: {{ $v.secret.name | quote }}
    items: [{key: {{ $v.secret.key | quote }}, path: {{ .file }}}]
  {{- end }}
{{- end -}}

{{- /* nodeAgent.*: refuses what the runner, the agent or the API server would refuse,
naming the value. Off, only that it is a map with a boolean enabled. */ -}}
{{- define "sandboxd-runner.nodeAgentCheck" -}}
{{- $n := .Values.nodeAgent -}}
{{- if not (kindIs "map" $n) -}}
{{- fail (printf "nodeAgent: want a map (enabled, runnerID, port, serverSecret, clientSecret, nodeSelector, …), got %v" $n) -}}
{{- end -}}
{{- if not (kindIs "bool" $n.enabled) -}}
{{- fail (printf "nodeAgent.enabled: want true or false, got %v" $n.enabled) -}}
{{- end -}}
{{- if $n.enabled -}}
{{- if not (and (kindIs "string" $n.runnerID) (regexMatch "^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$" (toString $n.runnerID))) -}}
{{- fail (printf "nodeAgent.runnerID %q: want the runner's ID (its runner_id; a Kubernetes label value: letters, digits, '-', '_', '.', at most 63; --set-string for a numeric one)" (toString $n.runnerID)) -}}
{{- end -}}
{{- if or (not (regexMatch "^[0-9]{1,5}$" (toString $n.port))) (lt (int $n.port) 1) (gt (int $n.port) 65535) -}}
{{- fail (printf "nodeAgent.port: want a port 1-65535, got %v" $n.port) -}}
{{- end -}}
{{- range $k := list "serverSecret" "clientSecret" -}}
{{- $v := index $n $k -}}
{{- if not (kindIs "string" $v) -}}
{{- fail (printf "nodeAgent.%s: want the name of a kubernetes.io/tls Secret (with ca.crt) in the release namespace, or \"\" (the runner issues the certificates), got %v (deploy/README.md \"The node agent\")" $k $v) -}}
{{- end -}}
{{- end -}}
{{- if and (or $n.serverSecret $n.clientSecret) (not (and $n.serverSecret $n.clientSecret)) -}}
{{- fail (printf "nodeAgent.serverSecret %q and nodeAgent.clientSecret %q: name both (certificates you made) or neither (the runner issues them, deploy/README.md \"The node agent\")" $n.serverSecret $n.clientSecret) -}}
{{- end -}}
{{- range $k := list "serverSecret" "clientSecret" -}}
{{- $v := index $n $k -}}
{{- if $v -}}
{{- if or (gt (len $v) 253) (not (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$" $v)) -}}
{{- fail (printf "nodeAgent.%s %q: want a Secret name (a DNS subdomain)" $k $v) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if and $n.serverSecret (eq $n.serverSecret $n.clientSecret) -}}
{{- fail (printf "nodeAgent.serverSecret and nodeAgent.clientSecret: both %q: the agents' server certificate and the runner's client certificate are two Secrets" $n.serverSecret) -}}
{{- end -}}
{{- if not (and (kindIs "map" $n.nodeSelector) $n.nodeSelector) -}}
{{- fail (printf "nodeAgent.nodeSelector: want a non-empty map of node labels picking the gVisor nodes (default sandboxd.dev/gvisor: \"true\"), got %v" $n.nodeSelector) -}}
{{- end -}}
{{- range $k, $v := $n.nodeSelector -}}
{{- if not (kindIs "string" $v) -}}
{{- fail (printf "nodeAgent.nodeSelector.%s: want a string (quote it: \"true\"), got %v" $k $v) -}}
{{- end -}}
{{- end -}}
{{- if not (kindIs "slice" $n.tolerations) -}}
{{- fail (printf "nodeAgent.tolerations: want a list of tolerations, got %v" $n.tolerations) -}}
{{- end -}}
{{- $paths := dict -}}
{{- range $k := list "shimRoot" "checkpointRoot" "stateDir" "criSocket" -}}
{{- $v := index $n $k -}}
{{- if not (and (kindIs "string" $v) (regexMatch "^(/[A-Za-z0-9._+@-]+)+$" (toString $v)) (not (regexMatch "(^|/)\\.\\.?(/|$)" (toString $v)))) -}}
{{- fail (printf "nodeAgent.%s %q: want an absolute, clean host path" $k (toString $v)) -}}
{{- end -}}
{{- if hasPrefix "/etc/sandboxd/node-agent-tls" $v -}}
{{- fail (printf "nodeAgent.%s %q: the agent's TLS Secret is mounted there" $k $v) -}}
{{- end -}}
{{- range $other, $p := $paths -}}
{{- if or (eq $p $v) (hasPrefix (printf "%s/" $p) $v) (hasPrefix (printf "%s/" $v) $p) -}}
{{- fail (printf "nodeAgent.%s %q and nodeAgent.%s %q: want separate paths (neither inside the other)" $other $p $k $v) -}}
{{- end -}}
{{- end -}}
{{- $_ := set $paths $k $v -}}
{{- end -}}
{{- if not (and (kindIs "string" $n.runtimeHandler) (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$" (toString $n.runtimeHandler))) -}}
{{- fail (printf "nodeAgent.runtimeHandler %q: want a CRI runtime handler name (a DNS label, e.g. runsc)" (toString $n.runtimeHandler)) -}}
{{- end -}}
{{- with $n.nodeGoneAfter -}}
{{- if not (regexMatch "^([0-9]+(\\.[0-9]+)?(ns|us|ms|s|m|h))+$" (toString .)) -}}
{{- fail (printf "nodeAgent.nodeGoneAfter %q: want a duration (10m, 1h) or \"\"" (toString .)) -}}
{{- end -}}
{{- end -}}
{{- if not (kindIs "slice" $n.extraArgs) -}}
{{- fail (printf "nodeAgent.extraArgs: want a list of flags, got %v" $n.extraArgs) -}}
{{- end -}}
{{- if not (kindIs "map" $n.securityContext) -}}
{{- fail (printf "nodeAgent.securityContext: want a container securityContext, got %v" $n.securityContext) -}}
{{- end -}}
{{- if not (kindIs "map" $n.resources) -}}
{{- fail (printf "nodeAgent.resources: want container resources (requests, limits), got %v" $n.resources) -}}
{{- end -}}
{{- $a := $n.admissionPolicy -}}
{{- if not (and (kindIs "map" $a) (kindIs "bool" $a.enabled)) -}}
{{- fail (printf "nodeAgent.admissionPolicy: want a map with enabled true or false (and allowedUsers), got %v" $a) -}}
{{- end -}}
{{- if not (kindIs "slice" $a.allowedUsers) -}}
{{- fail (printf "nodeAgent.admissionPolicy.allowedUsers: want a list of user names, got %v" $a.allowedUsers) -}}
{{- end -}}
{{- if gt (len $a.allowedUsers) 16 -}}
{{- fail (printf "nodeAgent.admissionPolicy.allowedUsers: %d users, want at most 16" (len $a.allowedUsers)) -}}
{{- end -}}
{{- /* Rendered into CEL string literals: no quote, backslash, space or newline. */ -}}
{{- range $a.allowedUsers -}}
{{- if not (and (kindIs "string" .) (regexMatch "^[A-Za-z0-9][A-Za-z0-9._:@-]{0,252}$" (toString .))) -}}
{{- fail (printf "nodeAgent.admissionPolicy.allowedUsers: %q: want a Kubernetes user name (letters, digits, '.', '_', ':', '@', '-'; e.g. system:serviceaccount:NAMESPACE:NAME)" (toString .)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- /* The admission policy that keeps dev.sandboxd.* Pod annotations to the runner
(nodeAgent.admissionPolicy; templates/shim-admission.yaml) and its binding: cluster-scoped,
so named after the release's namespace too. */ -}}
{{- define "sandboxd-runner.shimPolicyName" -}}
{{- printf "%s-%s-shim-annotations" (include "sandboxd-runner.fullname" .) .Release.Namespace -}}
{{- end -}}

{{- /* The users the policy lets set them, as a JSON list: the runner's service account
first, then nodeAgent.admissionPolicy.allowedUsers. */ -}}
{{- define "sandboxd-runner.shimPolicyUsers" -}}
{{- $runner := printf "system:serviceaccount:%s:%s" .Release.Namespace (include "sandboxd-runner.fullname" .) -}}
{{- prepend (without .Values.nodeAgent.admissionPolicy.allowedUsers $runner) $runner | toJson -}}
{{- end -}}

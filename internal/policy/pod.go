package policy

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// Kubernetes name shapes (as the API server checks them), so that a policy the control
// plane accepts never makes every Pod of its runner fail.
var (
	labelName    = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$`)
	dnsSubdomain = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
)

// QualifiedNameError checks a Kubernetes label or annotation key: [prefix/]name, the
// prefix a DNS subdomain of at most 253 characters, the name 1-63 characters of
// [A-Za-z0-9-_.] starting and ending alphanumeric. It returns "" for a valid key.
func QualifiedNameError(k string) string { return qualifiedNameError(k) }

func qualifiedNameError(k string) string {
	prefix, name, ok := strings.Cut(k, "/")
	if !ok {
		name, prefix = prefix, ""
	}
	switch {
	case ok && (prefix == "" || len(prefix) > 253 || !dnsSubdomain.MatchString(prefix)):
		return fmt.Sprintf("key %q: the prefix must be a DNS subdomain such as example.com", k)
	case !labelName.MatchString(name):
		return fmt.Sprintf("key %q: the name must be 1-63 characters of [A-Za-z0-9-_.], starting and ending alphanumeric", k)
	}
	return ""
}

func validDNSSubdomain(s string) bool { return len(s) <= 253 && dnsSubdomain.MatchString(s) }

// validatePod checks base.pod, the Kubernetes Pod settings.
func validatePod(ps *runtime.PodSettings, add func(field, format string, args ...any)) {
	if ps == nil {
		return
	}
	const f = "policy.base.pod."
	for _, k := range slices.Sorted(maps.Keys(ps.NodeSelector)) {
		field := fmt.Sprintf(f+"node_selector[%s]", strconv.Quote(k))
		if e := qualifiedNameError(k); e != "" {
			add(field, "%s", e)
		}
		if v := ps.NodeSelector[k]; v != "" && !labelName.MatchString(v) {
			add(field, "value %q: a label value is at most 63 characters of [A-Za-z0-9-_.], starting and ending alphanumeric", v)
		}
	}
	for i, t := range ps.Tolerations {
		field := fmt.Sprintf(f+"tolerations[%d]", i)
		if t.Key != "" {
			if e := qualifiedNameError(t.Key); e != "" {
				add(field+".key", "%s", e)
			}
		}
		switch t.Operator {
		case "", "Equal":
			if t.Key == "" {
				add(field+".operator", "an empty key needs the operator Exists (it tolerates every taint)")
			}
			if t.Value != "" && !labelName.MatchString(t.Value) {
				add(field+".value", "%q is not a label value", t.Value)
			}
		case "Exists":
			if t.Value != "" {
				add(field+".value", "must be empty with the operator Exists")
			}
		default:
			add(field+".operator", "%q is not Exists or Equal", t.Operator)
		}
		switch t.Effect {
		case "", "NoSchedule", "PreferNoSchedule", "NoExecute":
		default:
			add(field+".effect", "%q is not NoSchedule, PreferNoSchedule, NoExecute or empty (all)", t.Effect)
		}
		if t.TolerationSeconds != nil && t.Effect != "NoExecute" {
			add(field+".toleration_seconds", "applies only to the effect NoExecute")
		}
	}
	for _, d := range []struct{ field, v string }{
		{"priority_class_name", ps.PriorityClassName},
		{"service_account_name", ps.ServiceAccountName},
	} {
		if d.v != "" && !validDNSSubdomain(d.v) {
			add(f+d.field, "%q is not a Kubernetes object name (a lowercase DNS subdomain)", d.v)
		}
	}
	for i, n := range ps.ImagePullSecrets {
		if !validDNSSubdomain(n) {
			add(fmt.Sprintf(f+"image_pull_secrets[%d]", i), "%q is not a Secret name (a lowercase DNS subdomain)", n)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(ps.Annotations)) {
		field := fmt.Sprintf(f+"annotations[%s]", strconv.Quote(k))
		if e := qualifiedNameError(k); e != "" {
			add(field, "%s", e)
		} else if p, ok := runtime.ReservedPodAnnotation(k); ok {
			add(field, "key %q: the prefix %q is reserved for sandboxd's own settings of the Pod", k, p)
		}
	}
}

package spec

import (
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/policy"
	"github.com/sandboxd/sandboxd/internal/textclip"
)

// Limits of a sandbox's wire-only fields (tags, annotations, container names; the
// request's request_id is the gateway's). The bounds of what reaches its processes
// (command, args, env, files) are the runtime package's (runtime.MaxArgs …), checked by
// the runner at create and by the Relay at exec.
const (
	// MaxTagLen and tagPattern: a tag as the target system's clients document it (at
	// most 59 characters of ^[A-Za-z0-9._-]*[A-Za-z0-9]$).
	MaxTagLen = 59
	// MaxTags: not documented; as many as runner pins and annotations (100).
	MaxTags = 100
	// MaxAnnotations: the target system's clients allow at most 100.
	MaxAnnotations = 100
	// Annotation keys are Kubernetes qualified names (policy.QualifiedNameError): an
	// optional DNS-subdomain prefix of at most 253 characters and '/', then a name of at
	// most 63 characters of [A-Za-z0-9-_.] beginning and ending alphanumeric.
	// MaxAnnotationsBytes: keys and values together, Kubernetes' total annotation size.
	MaxAnnotationsBytes = 256 << 10
)

var tagPattern = regexp.MustCompile(`^[A-Za-z0-9._-]*[A-Za-z0-9]$`)

// tagViolations checks a list of tags at field (create's spec.tags).
func tagViolations(field string, tags []string) []apierr.Violation {
	var vs []apierr.Violation
	if len(tags) > MaxTags {
		return []apierr.Violation{{Field: field, Description: fmt.Sprintf("has %d tags, at most %d allowed", len(tags), MaxTags)}}
	}
	for i, t := range tags {
		if err := checkTag(t); err != nil {
			vs = append(vs, apierr.Violation{Field: fmt.Sprintf("%s[%d]", field, i), Description: err.Error()})
		}
	}
	return vs
}

func checkTag(t string) error {
	if len(t) > MaxTagLen || !tagPattern.MatchString(t) {
		return fmt.Errorf("%q must be 1-%d characters of A-Z, a-z, 0-9, '.', '_' and '-', ending with a letter or digit", textclip.Clip(t, 64), MaxTagLen)
	}
	return nil
}

// annotationViolations checks annotations at field.
func annotationViolations(field string, ann map[string]string) []apierr.Violation {
	if len(ann) > MaxAnnotations {
		return []apierr.Violation{{Field: field, Description: fmt.Sprintf("has %d annotations, at most %d allowed", len(ann), MaxAnnotations)}}
	}
	var vs []apierr.Violation
	total := 0
	for _, k := range slices.Sorted(maps.Keys(ann)) {
		total += len(k) + len(ann[k])
		if err := checkAnnotationKey(k); err != nil {
			vs = append(vs, apierr.Violation{Field: field, Description: err.Error()})
		}
	}
	if total > MaxAnnotationsBytes {
		vs = append(vs, apierr.Violation{Field: field, Description: fmt.Sprintf("keys and values are %d bytes in all, at most %d allowed", total, MaxAnnotationsBytes)})
	}
	return vs
}

// checkAnnotationKey: annotations become Pod annotations, so their keys are Kubernetes
// qualified names (the policy's rule for the annotations it attaches).
func checkAnnotationKey(k string) error {
	if e := policy.QualifiedNameError(k); e != "" {
		return errors.New(textclip.Clip(e, 64))
	}
	return nil
}

// containerNameViolations: each container's name is a DNS-1123 label, unique, and not
// one the platform reserves for its own containers; only a lone container may leave it
// empty (it is then "main").
func containerNameViolations(field string, cs []*sandboxv1.Container) []apierr.Violation {
	var vs []apierr.Violation
	seen := map[string]bool{}
	for i, c := range cs {
		n := c.GetName()
		f := fmt.Sprintf("%s[%d].name", field, i)
		switch {
		case n == "" && len(cs) > 1:
			vs = append(vs, apierr.Violation{Field: f, Description: "is required when the sandbox has more than one container"})
		case n == "":
		case !dnsLabel.MatchString(n):
			vs = append(vs, apierr.Violation{Field: f, Description: fmt.Sprintf("%q must be a lowercase DNS label (a-z, 0-9 and '-', at most 63, starting and ending with a letter or digit)", textclip.Clip(n, 64))})
		case ReservedContainerName(n):
			vs = append(vs, apierr.Violation{Field: f, Description: fmt.Sprintf("%q is reserved for the platform's own containers", n)})
		case seen[n]:
			vs = append(vs, apierr.Violation{Field: f, Description: fmt.Sprintf("%q names another container too", n)})
		}
		seen[n] = true
	}
	return vs
}

// reservedContainerNames are the names the target system gives its own containers in a
// sandbox (the official client refuses them too), so a caller's container never takes
// one: the object-store agent and its restore containers (every name beginning
// cw-object-store-agent), the container engine of
// CONTROL_CONTAINER_ENGINE, and the DNS egress proxy and its probe.
var reservedContainerNames = []string{"cws-engine", "dns-egress", "dns-egress-probe"}

// ReservedContainerName reports whether name is reserved for the platform's containers:
// one of reservedContainerNames or any name beginning cw-object-store-agent.
func ReservedContainerName(name string) bool {
	return slices.Contains(reservedContainerNames, name) || strings.HasPrefix(name, "cw-object-store-agent")
}

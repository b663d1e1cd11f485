package policy

import (
	"fmt"
	"slices"

	"github.com/sandboxd/sandboxd/internal/apierr"
)

// Constraint names used for limits that are not the policy's own.
const (
	// ConstraintSpec marks a spec that is malformed where resolution needs to read it
	// (an unparseable quantity, a negative lifetime).
	ConstraintSpec = "spec"
	// Platform limits hold under every policy.
	ConstraintPlatformLifetime      = "platform.max_lifetime_seconds"
	ConstraintPlatformServices      = "platform.max_services"
	ConstraintPlatformRuntimeClass  = "platform.runtime_classes"
	ConstraintPlatformPrivileged    = "platform.privileged_allowed"
	ConstraintPlatformCapabilities  = "platform.allowed_capabilities"
	ConstraintPlatformEndpoints     = "platform.endpoints"
	ConstraintPlatformDNSEgress     = "platform.dns_egress"
	ConstraintPlatformEgressSecrets = "platform.egress_secrets"
	ConstraintPlatformShareTokens   = "platform.share_tokens"
)

// Violation is one reason a resolved spec is rejected: an API violation (Field is the
// wire path of the offending value, e.g.
// sandbox.spec.containers[0].resource_requirements.limits.cpu; Description a sentence
// saying what was asked and what to change) with the limit it breaks.
type Violation struct {
	apierr.Violation
	// Constraint names the limit, e.g. constraints.resources.max_cpu or
	// platform.max_lifetime_seconds.
	Constraint string
	// Limit is the limit's value as the policy states it, e.g. "2" or "ghcr.io, docker.io".
	Limit string
	// Ceiling marks sandbox-wide resource ceilings (CWSANDBOX_RESOURCE_CEILING_EXCEEDED).
	Ceiling bool
}

// ToAPI renders v as a google.rpc.BadRequest field violation whose description names
// the constraint and the limit.
func (v Violation) ToAPI() apierr.Violation {
	d := v.Description
	switch {
	case v.Constraint != "" && v.Limit != "":
		d = fmt.Sprintf("%s [constraint %s, limit %s]", d, v.Constraint, v.Limit)
	case v.Constraint != "":
		d = fmt.Sprintf("%s [constraint %s]", d, v.Constraint)
	}
	return apierr.Violation{Field: v.Field, Description: d}
}

// ToAPI converts every violation.
func ToAPI(vs []Violation) []apierr.Violation {
	out := make([]apierr.Violation, len(vs))
	for i, v := range vs {
		out[i] = v.ToAPI()
	}
	return out
}

// Reason is the ErrorInfo reason for a rejection with violations vs:
// CWSANDBOX_NO_SUITABLE_RUNNER when every violation is the runner's lack of a container
// engine or of snapshots (no policy change helps: another runner may), CWSANDBOX_RESOURCE_CEILING_EXCEEDED
// when every violation is a ceiling, else CWSANDBOX_PLACEMENT_REJECTED. It returns "" for
// no violations.
func Reason(vs []Violation) string {
	if len(vs) == 0 {
		return ""
	}
	if !slices.ContainsFunc(vs, func(v Violation) bool {
		return v.Constraint != ConstraintPlatformContainerEngine && v.Constraint != ConstraintPlatformSnapshots
	}) {
		return apierr.NoSuitableRunner
	}
	for _, v := range vs {
		if !v.Ceiling {
			return apierr.PlacementRejected
		}
	}
	return apierr.ResourceCeilingExceeded
}

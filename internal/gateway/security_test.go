package gateway

import (
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/policy"
)

func withSecurity(sc *sandboxv1.SecurityContext) *sandboxv1.SandboxSpec {
	return &sandboxv1.SandboxSpec{Containers: []*sandboxv1.Container{{Name: "main", Image: "busybox", SecurityContext: sc}}}
}

// TestSecurityContextPolicy: what the policy must consent to (privileged, added
// capabilities) is refused on this platform unless the policy allows it, with a field
// violation naming the constraint.
func TestSecurityContextPolicy(t *testing.T) {
	const f = "sandbox.spec.containers[0].security_context"
	for _, tc := range []struct {
		name       string
		policy     string
		sc         *sandboxv1.SecurityContext
		field      string
		constraint string // "" = accepted
	}{
		{"privileged never", `{}`, &sandboxv1.SecurityContext{Privileged: proto.Bool(true)}, f + ".privileged", policy.ConstraintPlatformPrivileged},
		{"added capability without consent", `{}`, &sandboxv1.SecurityContext{CapabilitiesAdd: []string{"NET_ADMIN"}}, f + ".capabilities_add[0]", policy.ConstraintPlatformCapabilities},
		{"added capability the policy lists", `{"constraints": {"security": {"allowed_capabilities": ["NET_ADMIN"]}}}`,
			&sandboxv1.SecurityContext{CapabilitiesAdd: []string{"CAP_NET_ADMIN"}}, "", ""},
		{"added capability the policy does not list", `{"constraints": {"security": {"allowed_capabilities": ["NET_ADMIN"]}}}`,
			&sandboxv1.SecurityContext{CapabilitiesAdd: []string{"SYS_ADMIN"}}, f + ".capabilities_add[0]", "constraints.security.allowed_capabilities"},
		{"drops need no consent", `{}`, &sandboxv1.SecurityContext{CapabilitiesDrop: []string{"ALL"}, ReadOnlyRootFilesystem: proto.Bool(true), RunAsUser: proto.Uint32(1000)}, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := policy.Parse([]byte(tc.policy))
			if err != nil {
				t.Fatal(err)
			}
			res := policy.ResolveRevision(p, "1", withSecurity(tc.sc), policy.RunnerPlatform(nil))
			if tc.constraint == "" {
				if !res.OK() {
					t.Fatalf("rejected: %+v", res.Violations)
				}
				if _, err := toCreateRequest(res.Spec, nil, nil, nil); err != nil {
					t.Fatal(err)
				}
				return
			}
			if len(res.Violations) != 1 || res.Violations[0].Field != tc.field || res.Violations[0].Constraint != tc.constraint {
				t.Fatalf("violations %+v, want one on %s (%s)", res.Violations, tc.field, tc.constraint)
			}
			err = apierr.Invalid(policy.Reason(res.Violations), "rejected", policy.ToAPI(res.Violations))
			if connect.CodeOf(err) != connect.CodeInvalidArgument {
				t.Errorf("code %v, want INVALID_ARGUMENT", connect.CodeOf(err))
			}
		})
	}
}

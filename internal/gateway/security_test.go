package gateway

import (
	"slices"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/policy"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

func withSecurity(sc *sandboxv1.SecurityContext) *sandboxv1.SandboxSpec {
	return &sandboxv1.SandboxSpec{Containers: []*sandboxv1.Container{{Name: "main", Image: "busybox", SecurityContext: sc}}}
}

// TestSecurityContextConversion: the wire security context reaches the runtime spec,
// malformed values are field violations (INVALID_ARGUMENT), and nothing is UNIMPLEMENTED.
func TestSecurityContextConversion(t *testing.T) {
	const f = "sandbox.spec.containers[0].security_context"
	for _, tc := range []struct {
		name      string
		sc        *sandboxv1.SecurityContext
		want      *runtime.Security
		violation string // field of the expected violation, "" = accepted
	}{
		{"none", nil, nil, ""},
		{"empty is the default", &sandboxv1.SecurityContext{}, nil, ""},
		{"explicit false flags are the default", &sandboxv1.SecurityContext{AllowPrivilegeEscalation: proto.Bool(false), Privileged: proto.Bool(false)}, nil, ""},
		{"user, group, read-only root", &sandboxv1.SecurityContext{RunAsUser: proto.Uint32(1000), RunAsGroup: proto.Uint32(100), ReadOnlyRootFilesystem: proto.Bool(true)},
			&runtime.Security{RunAsUser: proto.Uint32(1000), RunAsGroup: proto.Uint32(100), ReadOnlyRootFS: true}, ""},
		{"capabilities canonicalised", &sandboxv1.SecurityContext{CapabilitiesAdd: []string{"net_admin"}, CapabilitiesDrop: []string{"all", "CAP_NET_RAW"}},
			&runtime.Security{CapAdd: []string{"CAP_NET_ADMIN"}, CapDrop: []string{"ALL", "CAP_NET_RAW"}}, ""},
		{"RuntimeDefault seccomp", &sandboxv1.SecurityContext{SeccompProfile: "RuntimeDefault"}, &runtime.Security{SeccompProfile: "RuntimeDefault"}, ""},
		{"privilege escalation", &sandboxv1.SecurityContext{AllowPrivilegeEscalation: proto.Bool(true)}, &runtime.Security{AllowPrivilegeEscalation: true}, ""},
		{"other seccomp profiles refused", &sandboxv1.SecurityContext{SeccompProfile: "Unconfined"}, nil, f + ".seccomp_profile"},
		{"localhost profile refused", &sandboxv1.SecurityContext{SeccompProfile: "localhost/my.json"}, nil, f + ".seccomp_profile"},
		{"unknown capability", &sandboxv1.SecurityContext{CapabilitiesAdd: []string{"NET_ADMIN", "WARP_DRIVE"}}, nil, f + ".capabilities_add[1]"},
		{"unknown capability to drop", &sandboxv1.SecurityContext{CapabilitiesDrop: []string{"bogus"}}, nil, f + ".capabilities_drop[0]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := toCreateRequest(withSecurity(tc.sc))
			if tc.violation != "" {
				if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), tc.violation) {
					t.Fatalf("err = %v, want INVALID_ARGUMENT naming %s", err, tc.violation)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got, want := req.Spec.Security, tc.want
			if (got == nil) != (want == nil) || (got != nil && !sameSecurity(*got, *want)) {
				t.Errorf("Security = %+v, want %+v", got, want)
			}
		})
	}
}

func sameSecurity(a, b runtime.Security) bool {
	eq := func(x, y *uint32) bool { return (x == nil) == (y == nil) && (x == nil || *x == *y) }
	return eq(a.RunAsUser, b.RunAsUser) && eq(a.RunAsGroup, b.RunAsGroup) && a.ReadOnlyRootFS == b.ReadOnlyRootFS &&
		slices.Equal(a.CapAdd, b.CapAdd) && slices.Equal(a.CapDrop, b.CapDrop) &&
		a.AllowPrivilegeEscalation == b.AllowPrivilegeEscalation && a.SeccompProfile == b.SeccompProfile && a.Privileged == b.Privileged
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
				if _, err := toCreateRequest(res.Spec); err != nil {
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

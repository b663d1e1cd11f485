package spec

import (
	"slices"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
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
			req, err := ToCreateRequest(withSecurity(tc.sc))
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

package spec

import (
	"testing"

	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// The runner's own policy check sees the security context it is asked to run with.
func TestForPolicySecurity(t *testing.T) {
	uid, gid := uint32(1000), uint32(0)
	sec := &runtime.Security{RunAsUser: &uid, RunAsGroup: &gid, ReadOnlyRootFS: true, CapAdd: []string{"CAP_NET_ADMIN"},
		CapDrop: []string{"ALL"}, AllowPrivilegeEscalation: true, SeccompProfile: runtime.SeccompRuntimeDefault}
	req := runner.CreateRequest{Spec: runtime.Spec{Container: runtime.Container{Image: "busybox", Security: sec}}}
	if got := ForPolicy(req).GetContainers()[0].GetSecurityContext(); got.GetRunAsUser() != 1000 || !got.GetReadOnlyRootFilesystem() ||
		got.GetCapabilitiesAdd()[0] != "CAP_NET_ADMIN" || got.Privileged != nil {
		t.Errorf("the policy sees security context %v", got)
	}
}

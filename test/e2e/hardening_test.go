package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
)

// TestSecurityContextAndVolumes: a security context and scratch volumes sent through the
// public API reach the sandbox; what the platform or policy does not allow is
// INVALID_ARGUMENT naming the field.
func TestSecurityContextAndVolumes(t *testing.T) {
	g := startGateway(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	sp := sleeperSpec()
	sp.Containers[0].SecurityContext = &sandboxv1.SecurityContext{
		RunAsUser: proto.Uint32(1000), ReadOnlyRootFilesystem: proto.Bool(true),
		CapabilitiesDrop: []string{"ALL"}, AllowPrivilegeEscalation: proto.Bool(false), SeccompProfile: "RuntimeDefault",
	}
	sp.Volumes = []*sandboxv1.SandboxVolume{{Name: "cache", Source: &sandboxv1.SandboxVolume_Scratch{Scratch: &sandboxv1.ScratchVolume{
		Size: "32Mi", Medium: sandboxv1.StorageMedium_STORAGE_MEDIUM_MEMORY}}}}
	sp.Containers[0].VolumeMounts = []*sandboxv1.VolumeMount{{Volume: "cache", MountPath: "/cache"}}
	sb := g.create(t, sp, "")
	g.waitState(t, sb.SandboxId, sandboxv1.State_STATE_RUNNING)
	res, err := g.sandboxes.Exec(ctx, connect.NewRequest(&sandboxv1.ExecRequest{SandboxId: sb.SandboxId, Command: []string{"sh", "-c",
		"id -u; (touch /etc/x) 2>&1 | grep -o 'Read-only file system'; echo ok > /cache/f && cat /cache/f; grep CapEff /proc/self/status | cut -f2"}}))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.TrimSpace(string(res.Msg.GetStdout())), "1000\nRead-only file system\nok\n0000000000000000"; got != want {
		t.Errorf("inside: %q (stderr %q), want %q", got, res.Msg.GetStderr(), want)
	}

	const f = "sandbox.spec.containers[0].security_context"
	for _, tc := range []struct {
		name  string
		sc    *sandboxv1.SecurityContext
		field string
	}{
		{"privileged", &sandboxv1.SecurityContext{Privileged: proto.Bool(true)}, f + ".privileged"},
		{"capability not in the policy", &sandboxv1.SecurityContext{CapabilitiesAdd: []string{"NET_ADMIN"}}, f + ".capabilities_add[0]"},
		{"other seccomp profile", &sandboxv1.SecurityContext{SeccompProfile: "Unconfined"}, f + ".seccomp_profile"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sp := sleeperSpec()
			sp.Containers[0].SecurityContext = tc.sc
			_, err := g.sandboxes.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: sp}}))
			if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), tc.field) {
				t.Errorf("create: %v, want INVALID_ARGUMENT naming %s", err, tc.field)
			}
		})
	}
}

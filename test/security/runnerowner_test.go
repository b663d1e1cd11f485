package security

import (
	"bytes"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/structpb"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/controlplane"
	"github.com/sandboxd/sandboxd/internal/gateway"
	"github.com/sandboxd/sandboxd/internal/gateway/gatewaytest"
	"github.com/sandboxd/sandboxd/internal/runner"
)

// TestTenantRunnerGetsOnlyItsOrganization: organization org-b registers a runner of its
// own with the control plane (a bootstrap token of its admin; the certificate names
// org-b), and the operator gives it to the gateway beside a platform runner. org-b
// controls that runner: it must never receive anything of org-a — a sandbox (even the
// least loaded runner, even named in runner_ids), a template, an image reference, a
// platform-registry pull token — nor be listed to org-a. org-b's own templates and
// sandboxes do go there (so the test is not vacuous).
func TestTenantRunnerGetsOnlyItsOrganization(t *testing.T) {
	p, ctx := newTenantPlatform(t, 2*time.Minute, "runner owner test CA", "org-a", "org-b")
	p.ensureRunner("platform", "platform-1")
	p.ensureRunner("org-b", "b-runner")
	keyA, keyB := p.key("org-a", auth.RoleAdmin), p.key("org-b", auth.RoleAdmin)

	// org-b registers its runner: the control plane's record decides the certificate.
	p.startControlPlane(controlplane.Config{})
	id := p.mustRegister(keyB, "b-runner")
	if id.Org != "org-b" {
		t.Fatalf("registered as %s/%s, want org-b", id.Org, id.RunnerID)
	}

	// org-b's runner, serving what it registered with.
	tenant := &tenantRunner{}
	bClient := p.serveRunner("b-runner", tenant.handler(), id.Cert, id.CAs)
	// The platform's runner: busy, so that load alone would send everything to org-b's.
	platform := gatewaytest.NewStartingRunner("platform-1", runner.Capacity{MilliCPU: 4000, MemoryBytes: 8 << 30, UsedMilliCPU: 3000, UsedMemoryBytes: 6 << 30, Running: 3})
	t.Cleanup(platform.Release)

	p.startGateway(gateway.Config{
		Runners:   []runner.Handle{platform, bClient},
		Policies:  controlplane.NewPolicySource(p.St, "platform"),
		Templates: p.St.Templates(),
		// Every image under reg.test is the platform registry's: pull tokens per organization.
		RegistryCredentials: func(org, image string) (string, string, bool) {
			if !strings.HasPrefix(image, "reg.test/") {
				return "", "", false
			}
			return "sandboxd", "pull-token-of-" + org, true
		},
	})

	// Templates with warm pools, of platform-registry images (pull tokens minted).
	warm, err := structpb.NewStruct(map[string]any{"sandboxd.warmPool": map[string]any{"size": 1}})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ key, image string }{{keyA, "reg.test/org-a/secret-app:v1"}, {keyB, "reg.test/org-b/app:v1"}} {
		if _, err := p.templates(c.key).CreateSandboxTemplate(ctx, connect.NewRequest(&sandboxv1.CreateSandboxTemplateRequest{SandboxTemplate: &sandboxv1.SandboxTemplate{
			DisplayName: "app", Attachments: warm,
			Spec: &sandboxv1.PartialSandboxSpec{Containers: []*sandboxv1.PartialContainer{{Name: "main", Image: c.image}}},
		}})); err != nil {
			t.Fatal(err)
		}
	}
	// org-b's template reaches its runner (it is connected, ready and fed).
	for {
		_, warmKeys, _ := tenant.snapshot()
		if slices.ContainsFunc(warmKeys, func(k string) bool { return strings.HasPrefix(k, "org-b/") }) {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("org-b's runner never received org-b's template (warm keys %v)", warmKeys)
		case <-time.After(20 * time.Millisecond):
		}
	}

	// org-a creates: none on org-b's runner, though it is nearly idle.
	a := p.sandboxes(keyA)
	for i := range 20 {
		if _, err := a.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: &sandboxv1.SandboxSpec{
			Containers: []*sandboxv1.Container{{Name: "main", Image: "reg.test/org-a/secret-app:v1"}}}}})); err != nil {
			t.Fatalf("org-a create %d: %v", i, err)
		}
	}
	// org-a names org-b's runner: refused as an unknown runner, org-b not named.
	_, err = a.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: &sandboxv1.SandboxSpec{
		Containers: []*sandboxv1.Container{{Name: "main", Image: "busybox"}}, RunnerIds: []string{"b-runner"}}}}))
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || apierr.Reason(err) != apierr.NoSuitableRunner || strings.Contains(err.Error(), "org-b") {
		t.Errorf("org-a pinned to org-b's runner: %v, want FAILED_PRECONDITION %s without org-b", err, apierr.NoSuitableRunner)
	}
	// org-a does not see it.
	for _, key := range []string{keyA} {
		res, err := p.discovery(key).ListAvailableRunners(ctx, connect.NewRequest(&sandboxv1.ListAvailableRunnersRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range res.Msg.GetRunners() {
			if r.GetRunnerId() == "b-runner" {
				t.Errorf("org-a lists org-b's runner")
			}
		}
	}
	_, err = p.discovery(keyA).GetAvailableRunner(ctx, connect.NewRequest(&sandboxv1.GetAvailableRunnerRequest{OrganizationId: "org-a", RunnerId: "b-runner"}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("org-a gets org-b's runner: %v, want NOT_FOUND", err)
	}
	// org-b's own sandbox does go there.
	if _, err := p.sandboxes(keyB).CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: &sandboxv1.SandboxSpec{
		Containers: []*sandboxv1.Container{{Name: "main", Image: "reg.test/org-b/app:v1"}}, RunnerIds: []string{"b-runner"}}}})); err != nil {
		t.Fatalf("org-b create on its runner: %v", err)
	}
	// Another round of the warm loop after every write.
	if _, err := p.templates(keyA).CreateSandboxTemplate(ctx, connect.NewRequest(&sandboxv1.CreateSandboxTemplateRequest{SandboxTemplate: &sandboxv1.SandboxTemplate{
		DisplayName: "app2", Spec: &sandboxv1.PartialSandboxSpec{Containers: []*sandboxv1.PartialContainer{{Name: "main", Image: "reg.test/org-a/other:v2"}}},
	}})); err != nil {
		t.Fatal(err)
	}
	sent := func() int { r, _, _ := tenant.snapshot(); return len(r) }
	for n := sent(); sent() < n+2; { // two more requests (a warm set, a probe) at least
		select {
		case <-ctx.Done():
			t.Fatal("org-b's runner heard nothing more")
		case <-time.After(20 * time.Millisecond):
		}
	}

	received, warmKeys, creates := tenant.snapshot()
	if !slices.Equal(creates, []string{"org-b"}) {
		t.Errorf("creates on org-b's runner by organization: %v, want org-b's one only", creates)
	}
	for _, k := range warmKeys {
		if !strings.HasPrefix(k, "org-b/") {
			t.Errorf("org-b's runner was sent warm target %q", k)
		}
	}
	for i, body := range received {
		for _, secret := range []string{"org-a", "pull-token-of-org-a", "secret-app", "reg.test/org-a"} {
			if bytes.Contains(body, []byte(secret)) {
				t.Errorf("request %d to org-b's runner carries %q", i, secret)
			}
		}
	}
	if !slices.ContainsFunc(received, func(b []byte) bool { return bytes.Contains(b, []byte("pull-token-of-org-b")) }) {
		t.Error("org-b's runner never got org-b's pull token: the test proves nothing")
	}
}

package controlplane

import (
	"context"
	"testing"
	"time"

	controlplanev1 "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
	"github.com/sandboxd/sandboxd/internal/auth"
)

// TestPrepullHidesOtherOrganizations: a runner of the platform organization pre-pulls
// every organization's templates; a tenant's runner may too. The images of templates of
// another organization than the runner's (and the caller's) are shown to the platform
// organization's admins only; others see them counted in hidden.
func TestPrepullHidesOtherOrganizations(t *testing.T) {
	s := &Service{platform: "plat"}
	var vs violations
	stored := checkPrepull(&vs, &controlplanev1.PrepullStatus{Hidden: 7, Images: []*controlplanev1.ImagePrepull{
		{Image: "reg/tenant/app:1", OrganizationId: "tenant", TemplateId: "t1", State: controlplanev1.PrepullState_PREPULL_PRESENT},
		{Image: "reg/other/secret:1", OrganizationId: "other", TemplateId: "t2", State: controlplanev1.PrepullState_PREPULL_FAILED, LastError: "denied"},
		{Image: "busybox:1", State: controlplanev1.PrepullState_PREPULL_PENDING}, // no organization known
	}}, time.Now())
	if len(vs) != 0 || stored == nil {
		t.Fatalf("check: %v", vs)
	}
	as := func(org string, role auth.Role) context.Context {
		return auth.WithPrincipal(context.Background(), auth.Principal{KeyID: "k", Org: org, Role: role})
	}
	images := func(p *controlplanev1.PrepullStatus) (out []string) {
		for _, im := range p.GetImages() {
			out = append(out, im.GetImage())
		}
		return out
	}
	// The tenant's admin reading the tenant's runner.
	p := s.prepullProto(as("tenant", auth.RoleAdmin), "tenant", stored)
	if got := images(p); len(got) != 1 || got[0] != "reg/tenant/app:1" || p.GetHidden() != 2 {
		t.Fatalf("tenant admin sees %v (hidden %d), want its own image and 2 hidden (the stored hidden ignored)", got, p.GetHidden())
	}
	// The platform's admin reading a platform runner sees every organization's.
	if p := s.prepullProto(as("plat", auth.RoleAdmin), "plat", stored); len(p.GetImages()) != 3 || p.GetHidden() != 0 {
		t.Fatalf("platform admin sees %v (hidden %d)", images(p), p.GetHidden())
	}
	// A platform user (not an admin) is no platform admin.
	if p := s.prepullProto(as("plat", auth.RoleUser), "plat", stored); len(p.GetImages()) != 0 || p.GetHidden() != 3 {
		t.Fatalf("platform user sees %v (hidden %d)", images(p), p.GetHidden())
	}
	if s.prepullProto(as("tenant", auth.RoleAdmin), "tenant", nil) != nil {
		t.Fatal("a status where none was reported")
	}
}

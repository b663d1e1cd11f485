package enroll

import (
	"strings"
	"testing"
	"time"

	controlplanev1 "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
	"github.com/sandboxd/sandboxd/internal/controlplane"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// PrepullStatus sends what the control plane accepts: an image over its bounds is
// counted as left out (never a refused heartbeat), errors are clipped, the target is
// split into organization and template, zero times are absent.
func TestPrepullStatusWithinBounds(t *testing.T) {
	at := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	rep := runtime.PrepullReport{LeftOut: 1, Images: []runtime.PrepullImage{
		{Image: "busybox:1", Target: "org-a/t1", State: runtime.PrepullFailed, LastError: strings.Repeat("é", 600), LastAttempt: at},
		{Image: strings.Repeat("r", controlplane.MaxPrepullImageRef+1), Target: "org-a/t2", State: runtime.PrepullPending},
		{Image: "debian:12", Target: "org-a/" + strings.Repeat("t", controlplane.MaxPrepullID+1), State: runtime.PrepullPending},
	}}
	for range controlplane.MaxPrepullImages + 1 {
		rep.Images = append(rep.Images, runtime.PrepullImage{Image: "x:1", Target: "o/t", State: runtime.PrepullPresent})
	}
	p := PrepullStatus(rep)
	if len(p.GetImages()) != controlplane.MaxPrepullImages || p.GetLeftOut() != 1+2+2 {
		t.Fatalf("%d images, %d left out", len(p.GetImages()), p.GetLeftOut())
	}
	im := p.GetImages()[0]
	if im.GetOrganizationId() != "org-a" || im.GetTemplateId() != "t1" || im.GetState() != controlplanev1.PrepullState_PREPULL_FAILED ||
		len(im.GetLastError()) > controlplane.MaxPrepullError || !im.GetLastAttemptTime().AsTime().Equal(at) || im.GetNextAttemptTime() != nil {
		t.Fatalf("first image: %v", im)
	}
	if p.GetImages()[1].GetImage() != "x:1" {
		t.Fatalf("an image over the bounds was sent: %.40s", p.GetImages()[1].GetImage())
	}
}

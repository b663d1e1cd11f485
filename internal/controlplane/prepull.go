package controlplane

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	controlplanev1 "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
	"github.com/sandboxd/sandboxd/internal/auth"
)

// Image pre-pull status (issue 22): a runner's heartbeat reports how its pre-pull of the
// templates' images stands (HeartbeatRequest.prepull: per image its state, the nodes it
// is on for Kubernetes runners, the last error, the attempt times). The control plane
// checks it against these bounds (a heartbeat over them is refused, as one with a bad
// self-update failure), keeps it with the runner's status in the store (replaced by
// every heartbeat; a heartbeat without one clears it), stamped with the heartbeat's time,
// and shows it in ManagedRunnerStatus.prepull. A runner may serve templates of other
// organizations than its own (the platform's runners serve every organization): their
// images are shown to the platform organization's admins only, and counted in
// prepull.hidden for the runner's own admins.
const (
	MaxPrepullImages   = 64   // the runners' default pre-pull bound
	MaxPrepullError    = 512  // bytes of one last_error
	MaxPrepullImageRef = 4096 // bytes of one image reference
	MaxPrepullID       = 256  // bytes of an organization or template ID
)

// checkPrepull checks a heartbeat's pre-pull status (field violations into vs) and
// returns what the store keeps: nil for none, else its JSON, without the output-only
// fields, the errors shown as one line, stamped with at.
func checkPrepull(vs *violations, p *controlplanev1.PrepullStatus, at time.Time) json.RawMessage {
	if p == nil {
		return nil
	}
	n := len(*vs)
	if len(p.GetImages()) > MaxPrepullImages {
		vs.add("prepull.images", "at most %d images (got %d)", MaxPrepullImages, len(p.GetImages()))
	}
	if p.GetLeftOut() < 0 {
		vs.add("prepull.left_out", "must not be negative (got %d)", p.GetLeftOut())
	}
	for i, im := range p.GetImages() {
		if i >= MaxPrepullImages {
			break
		}
		f := func(name string) string { return fmt.Sprintf("prepull.images[%d].%s", i, name) }
		checkText(vs, f("image"), im.GetImage(), MaxPrepullImageRef, true)
		checkText(vs, f("organization_id"), im.GetOrganizationId(), MaxPrepullID, false)
		checkText(vs, f("template_id"), im.GetTemplateId(), MaxPrepullID, false)
		checkText(vs, f("last_error"), im.GetLastError(), MaxPrepullError, false)
		if _, ok := controlplanev1.PrepullState_name[int32(im.GetState())]; !ok || im.GetState() == controlplanev1.PrepullState_PREPULL_STATE_UNSPECIFIED {
			vs.add(f("state"), "must be PREPULL_PENDING, PREPULL_PULLING, PREPULL_PRESENT or PREPULL_FAILED (got %d)", int32(im.GetState()))
		}
		if im.GetNodesPresent() < 0 || im.GetNodesTotal() < 0 || im.GetNodesPresent() > im.GetNodesTotal() {
			vs.add(f("nodes_present"), "must be 0 to nodes_total (got %d of %d)", im.GetNodesPresent(), im.GetNodesTotal())
		}
	}
	if len(*vs) > n {
		return nil
	}
	out := proto.CloneOf(p)
	out.Hidden, out.ReportTime = 0, timestamppb.New(at)
	// Control and format characters (a bidi override would make one reference read as
	// another in sbx and the console) become spaces, never a refusal: an image a
	// template names reaches every runner's report, and one organization's template
	// must not stop a shared runner's heartbeats.
	for _, im := range out.Images {
		im.Image, im.OrganizationId, im.TemplateId = oneLine(im.Image), oneLine(im.OrganizationId), oneLine(im.TemplateId)
		im.LastError = oneLine(im.LastError)
	}
	b, err := protojson.Marshal(out)
	if err != nil {
		vs.add("prepull", "%v", err)
		return nil
	}
	return b
}

func checkText(vs *violations, field, s string, maxLen int, required bool) {
	switch {
	case required && s == "":
		vs.add(field, "is required")
	case len(s) > maxLen:
		vs.add(field, "must be at most %d bytes (got %d)", maxLen, len(s))
	case !utf8.ValidString(s):
		vs.add(field, "must be valid UTF-8")
	}
}

// prepullProto is the stored pre-pull status of runner r of organization org as the
// caller of ctx may see it: images of other organizations' templates only for the
// platform organization's admins.
func (s *Service) prepullProto(ctx context.Context, org string, b json.RawMessage) *controlplanev1.PrepullStatus {
	if b == nil {
		return nil
	}
	var p controlplanev1.PrepullStatus
	if (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(b, &p) != nil {
		return nil
	}
	if c := principal(ctx); c.Role == auth.RoleAdmin && c.Org == s.platform {
		return &p
	}
	kept := p.Images[:0]
	for _, im := range p.Images {
		if im.GetOrganizationId() != org {
			p.Hidden++
			continue
		}
		kept = append(kept, im)
	}
	p.Images = kept
	return &p
}

// prepullJSON is Beat's check of an in-process runner's pre-pull status.
func prepullJSON(p *controlplanev1.PrepullStatus, at time.Time) (json.RawMessage, error) {
	var vs violations
	b := checkPrepull(&vs, p, at)
	return b, vs.err("invalid pre-pull status")
}

package controlplane_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	controlplanev1 "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/controlplane"
	"github.com/sandboxd/sandboxd/internal/enroll"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// TestPrepullStatusOverRegistration: a registered runner's heartbeat (over mTLS, the
// runner's Heartbeater and its conversion of a backend's report) carries its pre-pull
// status; GetManagedRunner and ListManagedRunners show it as the last heartbeat reported
// it (an error on one line, the report time), replaced by the next heartbeat and cleared
// by one without; a heartbeat over the bounds is refused with the field named and records
// nothing.
func TestPrepullStatusOverRegistration(t *testing.T) {
	ctx := t.Context()
	b := newRegistrationBed(t, time.Minute)
	ident, cache := b.enroll(t, "ra", controlplanev1.ReleaseChannel_STABLE)
	var mu sync.Mutex
	var st *enroll.Status
	set := func(s *enroll.Status) { mu.Lock(); st = s; mu.Unlock() }
	hb, err := enroll.NewHeartbeater(enroll.HeartbeatConfig{Identity: ident, Cache: cache, Logger: slog.New(slog.DiscardHandler),
		Status: func(context.Context) (*enroll.Status, error) { mu.Lock(); defer mu.Unlock(); return st, nil }})
	if err != nil {
		t.Fatal(err)
	}
	get := func() *controlplanev1.PrepullStatus {
		t.Helper()
		r, err := b.admin.GetManagedRunner(ctx, connect.NewRequest(&controlplanev1.GetManagedRunnerRequest{RunnerId: "ra"}))
		if err != nil {
			t.Fatal(err)
		}
		return r.Msg.GetStatus().GetPrepull()
	}

	attempt := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	rep := runtime.PrepullReport{LeftOut: 3, Images: []runtime.PrepullImage{
		{Image: "registry.example/org-a/app:1", Target: "org-a/tmpl-1", State: runtime.PrepullFailed,
			LastError: "ErrImagePull: pull access denied\n\x1b[31mdenied", LastAttempt: attempt, NextAttempt: attempt.Add(time.Minute),
			NodesPresent: 1, NodesTotal: 2},
		{Image: "busybox:1", Target: "org-a/tmpl-2", State: runtime.PrepullPresent, LastAttempt: attempt, NextAttempt: attempt.Add(30 * time.Minute)},
		{Image: "debian:12", Target: "org-a/tmpl-2", State: runtime.PrepullPending},
	}}
	set(&enroll.Status{Version: "v1.0.0", Ready: true, Prepull: enroll.PrepullStatus(rep)})
	if err := hb.Beat(ctx); err != nil {
		t.Fatal(err)
	}
	p := get()
	if p.GetLeftOut() != 3 || len(p.GetImages()) != 3 || p.GetHidden() != 0 || p.GetReportTime() == nil {
		t.Fatalf("pre-pull status: %v", p)
	}
	im := p.GetImages()[0]
	if im.GetImage() != "registry.example/org-a/app:1" || im.GetOrganizationId() != "org-a" || im.GetTemplateId() != "tmpl-1" ||
		im.GetState() != controlplanev1.PrepullState_PREPULL_FAILED || im.GetNodesPresent() != 1 || im.GetNodesTotal() != 2 ||
		im.GetLastError() != "ErrImagePull: pull access denied  [31mdenied" ||
		!im.GetLastAttemptTime().AsTime().Equal(attempt) || !im.GetNextAttemptTime().AsTime().Equal(attempt.Add(time.Minute)) {
		t.Fatalf("failed image: %v", im)
	}
	if p.GetImages()[1].GetState() != controlplanev1.PrepullState_PREPULL_PRESENT ||
		p.GetImages()[2].GetState() != controlplanev1.PrepullState_PREPULL_PENDING || p.GetImages()[2].GetLastAttemptTime() != nil {
		t.Fatalf("other images: %v", p.GetImages())
	}
	ls, err := b.admin.ListManagedRunners(ctx, connect.NewRequest(&controlplanev1.ListManagedRunnersRequest{}))
	if err != nil || len(ls.Msg.GetManagedRunners()) != 1 || len(ls.Msg.GetManagedRunners()[0].GetStatus().GetPrepull().GetImages()) != 3 {
		t.Fatalf("list: %v %v", ls, err)
	}

	// The retry succeeded: the next heartbeat replaces the status.
	rep.Images[0].State, rep.Images[0].LastError, rep.Images[0].NodesPresent = runtime.PrepullPresent, "", 2
	set(&enroll.Status{Version: "v1.0.0", Ready: true, Prepull: enroll.PrepullStatus(rep)})
	if err := hb.Beat(ctx); err != nil {
		t.Fatal(err)
	}
	if im := get().GetImages()[0]; im.GetState() != controlplanev1.PrepullState_PREPULL_PRESENT || im.GetLastError() != "" || im.GetNodesPresent() != 2 {
		t.Fatalf("after the retry: %v", im)
	}

	// Over the bounds: refused, nothing recorded.
	many := &controlplanev1.PrepullStatus{}
	for i := range controlplane.MaxPrepullImages + 1 {
		many.Images = append(many.Images, &controlplanev1.ImagePrepull{Image: fmt.Sprintf("img/%d", i), State: controlplanev1.PrepullState_PREPULL_PENDING})
	}
	for _, tc := range []struct {
		name, field string
		p           *controlplanev1.PrepullStatus
	}{
		{"too many images", "prepull.images", many},
		{"error too long", "prepull.images[0].last_error", &controlplanev1.PrepullStatus{Images: []*controlplanev1.ImagePrepull{
			{Image: "a", State: controlplanev1.PrepullState_PREPULL_FAILED, LastError: strings.Repeat("x", controlplane.MaxPrepullError+1)}}}},
		{"no state", "prepull.images[0].state", &controlplanev1.PrepullStatus{Images: []*controlplanev1.ImagePrepull{{Image: "a"}}}},
		{"no image", "prepull.images[0].image", &controlplanev1.PrepullStatus{Images: []*controlplanev1.ImagePrepull{{State: controlplanev1.PrepullState_PREPULL_PENDING}}}},
		{"more present than nodes", "prepull.images[0].nodes_present", &controlplanev1.PrepullStatus{Images: []*controlplanev1.ImagePrepull{
			{Image: "a", State: controlplanev1.PrepullState_PREPULL_PRESENT, NodesPresent: 3, NodesTotal: 2}}}},
		{"template id too long", "prepull.images[0].template_id", &controlplanev1.PrepullStatus{Images: []*controlplanev1.ImagePrepull{
			{Image: "a", TemplateId: strings.Repeat("t", controlplane.MaxPrepullID+1), State: controlplanev1.PrepullState_PREPULL_PENDING}}}},
		{"negative left out", "prepull.left_out", &controlplanev1.PrepullStatus{LeftOut: -1}},
	} {
		set(&enroll.Status{Version: "v1.0.0", Ready: true, Prepull: tc.p})
		err := hb.Beat(ctx)
		wantReason(t, tc.name, err, connect.CodeInvalidArgument, apierr.InvalidRequest)
		if vs := apierr.Violations(err); len(vs) != 1 || vs[0].Field != tc.field {
			t.Fatalf("%s: violations %v, want one on %s", tc.name, vs, tc.field)
		}
	}
	if p := get(); len(p.GetImages()) != 3 || p.GetImages()[0].GetState() != controlplanev1.PrepullState_PREPULL_PRESENT {
		t.Fatalf("a refused heartbeat was recorded: %v", p)
	}

	// Control and format characters in a reference or an ID (a template's image may
	// hold them) become spaces: the heartbeat is accepted, never refused for them.
	set(&enroll.Status{Version: "v1.0.0", Ready: true, Prepull: &controlplanev1.PrepullStatus{Images: []*controlplanev1.ImagePrepull{
		{Image: "reg/a\u202egpj.exe", OrganizationId: "org\x1b", TemplateId: "t\u200b", State: controlplanev1.PrepullState_PREPULL_PENDING}}}})
	if err := hb.Beat(ctx); err != nil {
		t.Fatalf("a heartbeat with a bidi override in an image: %v, want accepted", err)
	}
	if im := get().GetImages(); len(im) != 1 || im[0].GetImage() != "reg/a gpj.exe" || im[0].GetTemplateId() != "t " {
		t.Fatalf("stored %v, want the characters replaced by spaces", im)
	}

	// A heartbeat without one clears it.
	set(&enroll.Status{Version: "v1.0.0", Ready: true})
	if err := hb.Beat(ctx); err != nil {
		t.Fatal(err)
	}
	if p := get(); p != nil {
		t.Fatalf("after a heartbeat without pre-pull status: %v", p)
	}
}

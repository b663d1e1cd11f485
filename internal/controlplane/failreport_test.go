package controlplane_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	controlplanev1 "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/enroll"
	"github.com/sandboxd/sandboxd/internal/store"
)

// refusingRunner is a registered runner heartbeating over mTLS that updates itself like a
// single-host runner: it refuses the bad version (as selfupdate.Updater does on a checksum
// mismatch) and reports the failure in its heartbeats until it is asked for another
// version.
type refusingRunner struct {
	id       string
	hb       *enroll.Heartbeater
	mu       sync.Mutex
	version  string
	bad      string
	failed   string
	why      string
	override *enroll.Status // sent as is when set
}

func (r *refusingRunner) status(context.Context) (*enroll.Status, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.override != nil {
		return r.override, nil
	}
	return &enroll.Status{Version: r.version, Ready: true, SelfUpdate: true, SelfUpdateFailedVersion: r.failed, SelfUpdateFailure: r.why}, nil
}

// beat heartbeats, then acts on the desired version the reply carries and heartbeats again.
func (r *refusingRunner) beat(t *testing.T) {
	t.Helper()
	if err := r.hb.Beat(t.Context()); err != nil {
		t.Fatalf("%s heartbeat: %v", r.id, err)
	}
	d := r.hb.DesiredVersion()
	r.mu.Lock()
	if d != r.failed && r.failed != "" {
		r.failed, r.why = "", "" // asked for something else: forgotten
	}
	switch {
	case d == "" || d == r.version || d == r.failed:
	case d == r.bad:
		r.failed, r.why = d, "release binaries refused: sandboxd: sha256 mismatch:\n\twant aaaa…, got bbbb…\x1b[31m"
	default:
		r.version = d
	}
	r.mu.Unlock()
	if err := r.hb.Beat(t.Context()); err != nil {
		t.Fatalf("%s heartbeat after acting: %v", r.id, err)
	}
}

// TestRunnerReportedUpdateFailureOverRegistration: a single-host runner refuses the
// version the automatic rollout sends it and says so in its heartbeats (over mTLS). The
// step ends at the controller's next tick, long before its 10-minute deadline, rolled back
// with the runner's reason, which the runner's status and ListReleases' halted RAPID
// rollout show; once sent back, the runner reports no failure and the status clears it.
// A heartbeat with a malformed report is refused with field violations.
func TestRunnerReportedUpdateFailureOverRegistration(t *testing.T) {
	ctx := t.Context()
	const deadline = 10 * time.Minute
	b := newRegistrationBed(t, deadline)
	admin, releases, ctl, clock, advance := b.admin, b.releases, b.ctl, b.clock, b.advance

	var runners []*refusingRunner
	for _, id := range []string{"ra", "rb"} {
		ident, cache := b.enroll(t, id, controlplanev1.ReleaseChannel_RAPID)
		rr := &refusingRunner{id: id, version: "v1.0.0", bad: "v1.1.0"}
		var err error
		rr.hb, err = enroll.NewHeartbeater(enroll.HeartbeatConfig{Identity: ident, Cache: cache, Logger: slog.New(slog.DiscardHandler), Status: rr.status})
		if err != nil {
			t.Fatal(err)
		}
		runners = append(runners, rr)
	}
	get := func(id string) *controlplanev1.ManagedRunnerStatus {
		t.Helper()
		r, err := admin.GetManagedRunner(ctx, connect.NewRequest(&controlplanev1.GetManagedRunnerRequest{RunnerId: id}))
		if err != nil {
			t.Fatal(err)
		}
		return r.Msg.GetStatus()
	}
	step := func() {
		t.Helper()
		advance(time.Second)
		for _, r := range runners {
			r.beat(t)
		}
		if err := ctl.Tick(ctx); err != nil {
			t.Fatal(err)
		}
	}
	step()

	// v1.1.0 on RAPID: ra is sent to it, refuses it, and reports why.
	if _, err := releases.PublishRelease(ctx, connect.NewRequest(&controlplanev1.PublishReleaseRequest{Release: releaseMsg("v1.1.0")})); err != nil {
		t.Fatal(err)
	}
	step() // ra's step starts
	started := clock()
	if s := get("ra"); s.GetLastUpdateResult().GetState() != controlplanev1.UpdateState_UPDATE_STATE_IN_PROGRESS || s.GetDesiredVersion() != "v1.1.0" {
		t.Fatalf("ra's step did not start: %v", s)
	}
	step() // ra refuses v1.1.0 and reports it; the controller ends the step
	wantWhy := "release binaries refused: sandboxd: sha256 mismatch:  want aaaa…, got bbbb… [31m"
	ra := get("ra")
	lu := ra.GetLastUpdateResult()
	if lu.GetState() != controlplanev1.UpdateState_UPDATE_STATE_ROLLED_BACK || lu.GetToVersion() != "v1.1.0" || lu.GetReason() != "runner reports: "+wantWhy {
		t.Fatalf("ra's step: %v", lu)
	}
	if took := lu.GetEndTime().AsTime().Sub(started); took > 2*time.Second {
		t.Fatalf("the step ended %s after it started; the runner's report should end it at the next tick", took)
	}
	if ra.GetDesiredVersion() != "v1.0.0" || ra.GetSelfUpdateFailedVersion() != "v1.1.0" || ra.GetSelfUpdateFailure() != wantWhy {
		t.Fatalf("ra's status: %v", ra)
	}
	wantHalt := "runner org-a/ra reports: " + wantWhy + "; rolled back to v1.0.0"
	ls, err := releases.ListReleases(ctx, connect.NewRequest(&controlplanev1.ListReleasesRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	ro := ls.Msg.GetRollouts()
	if len(ro) != 2 || ro[1].GetChannel() != controlplanev1.ReleaseChannel_RAPID || ro[1].GetState() != controlplanev1.RolloutState_ROLLOUT_STATE_HALTED ||
		ro[1].GetTargetVersion() != "v1.1.0" || ro[1].GetHaltedByRunner() != "org-a/ra" || ro[1].GetHaltReason() != wantHalt {
		t.Fatalf("ListReleases rollouts: %v", ro)
	}
	if h := get("rb").GetRolloutHaltReason(); !strings.Contains(h, wantHalt) {
		t.Fatalf("rb's halt reason %q", h)
	}

	// Sent back to v1.0.0, ra forgets the failure; its status clears and rb never moved.
	step()
	step()
	ra = get("ra")
	if ra.GetSelfUpdateFailedVersion() != "" || ra.GetSelfUpdateFailure() != "" || ra.GetDesiredVersion() != "" || ra.GetVersion() != "v1.0.0" {
		t.Fatalf("ra after the rollback: %v", ra)
	}
	if rb := get("rb"); rb.GetLastUpdateResult() != nil || rb.GetVersion() != "v1.0.0" {
		t.Fatalf("rb moved while RAPID was halted: %v", rb)
	}

	// Malformed reports are refused, each with its field violation.
	for _, tc := range []struct {
		name, field string
		st          *enroll.Status
	}{
		{"not a version", "self_update_failed_version", &enroll.Status{Version: "v1.0.0", SelfUpdateFailedVersion: "1.1.0; rm -rf", SelfUpdateFailure: "x"}},
		{"reason too long", "self_update_failure", &enroll.Status{Version: "v1.0.0", SelfUpdateFailedVersion: "v1.1.0", SelfUpdateFailure: strings.Repeat("x", store.MaxSelfUpdateFailureLen+1)}},
		{"reason without version", "self_update_failure", &enroll.Status{Version: "v1.0.0", SelfUpdateFailure: "x"}},
	} {
		rr := runners[1]
		rr.mu.Lock()
		rr.override = tc.st
		rr.mu.Unlock()
		err := rr.hb.Beat(ctx)
		wantReason(t, tc.name, err, connect.CodeInvalidArgument, apierr.InvalidRequest)
		if vs := apierr.Violations(err); len(vs) != 1 || vs[0].Field != tc.field {
			t.Fatalf("%s: violations %v, want one on %s", tc.name, vs, tc.field)
		}
	}
	if rb := get("rb"); rb.GetSelfUpdateFailure() != "" || rb.GetSelfUpdateFailedVersion() != "" {
		t.Fatalf("a refused heartbeat was recorded: %v", rb)
	}
}

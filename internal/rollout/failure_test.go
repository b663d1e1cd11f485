package rollout_test

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/sandboxd/sandboxd/internal/rollout"
	"github.com/sandboxd/sandboxd/internal/store"
)

// beatFailed records a heartbeat that reports a failed self-update of version failed.
func (b *bed) beatFailed(id, version string, selfUpdate bool, failed, why string) {
	b.t.Helper()
	now := b.clock()
	org, rid := orgOf(id)
	if err := b.st.Runners().RecordHeartbeat(b.t.Context(), org, rid, store.RunnerStatus{LastHeartbeatAt: &now, Version: version,
		Ready: true, SelfUpdate: selfUpdate, SelfUpdateFailedVersion: failed, SelfUpdateFailure: why}); err != nil {
		b.t.Fatal(err)
	}
}

func (b *bed) halts() []store.RolloutHalt {
	b.t.Helper()
	hs, err := b.st.Rollouts().Halts(b.t.Context(), "")
	if err != nil {
		b.t.Fatal(err)
	}
	return hs
}

// A runner that reports it refused the step's version ends the step at the next tick,
// long before the deadline: rolled back with the runner's reason, desired_version back to
// the version it ran, and the channel's rollout of that version halted with the reason.
// A new target ends the halt, and a failure of another version than the step's does not
// end the step.
func TestRunnerReportedFailureRollsBackAtOnceAndHalts(t *testing.T) {
	b := newBed(t)
	b.runner("a")
	b.runner("b")
	b.target(store.ChannelRapid, "v1.1.0")
	c := b.controller(b.st, "x", 0, 10*time.Minute)
	tick(t, c)
	wantMoving(t, b, "a", "a", "b")
	start := b.clock()

	b.advance(5 * time.Second)
	b.beat("b", "v1.0.0", true, true)
	b.beat("a", "v1.0.0", true, true) // still downloading: nothing to end yet
	tick(t, c)
	wantMoving(t, b, "a", "a", "b")

	b.advance(5 * time.Second)
	b.beat("b", "v1.0.0", true, true)
	b.beatFailed("a", "v1.0.0", true, "v1.1.0", "release binaries refused: checksum mismatch for sandboxd")
	tick(t, c)
	a := b.get("a")
	want := "runner reports: release binaries refused: checksum mismatch for sandboxd"
	if a.DesiredVersion != "v1.0.0" || a.LastUpdate.State != store.UpdateRolledBack || a.LastUpdate.Reason != want ||
		a.LastUpdate.EndedAt == nil || !a.LastUpdate.EndedAt.Equal(b.clock()) || !a.LastUpdate.Deadline.Equal(start.Add(10*time.Minute)) {
		t.Fatalf("a: desired %q, %+v", a.DesiredVersion, a.LastUpdate)
	}
	hs := b.halts()
	if len(hs) != 1 || hs[0].Channel != store.ChannelRapid || hs[0].Version != "v1.1.0" || hs[0].RunnerID != "a" ||
		hs[0].Reason != "runner o1/a reports: release binaries refused: checksum mismatch for sandboxd; rolled back to v1.0.0" {
		t.Fatalf("halts: %+v", hs)
	}
	// Halted: b does not start, though a's step is over.
	b.advance(5 * time.Second)
	b.beat("b", "v1.0.0", true, true)
	b.beatFailed("a", "v1.0.0", true, "v1.1.0", "release binaries refused: checksum mismatch for sandboxd")
	tick(t, c)
	wantMoving(t, b, "", "a", "b")

	// A new target ends the halt; a's stale failure of v1.1.0 does not end its step to v1.1.1.
	b.target(store.ChannelRapid, "v1.1.1")
	tick(t, c)
	if hs := b.halts(); len(hs) != 0 {
		t.Fatalf("halt outlived its target: %+v", hs)
	}
	wantMoving(t, b, "a", "a", "b")
	b.advance(5 * time.Second)
	b.beat("b", "v1.0.0", true, true)
	b.beatFailed("a", "v1.0.0", true, "v1.1.0", "release binaries refused: checksum mismatch for sandboxd")
	tick(t, c)
	wantMoving(t, b, "a", "a", "b")
	if a := b.get("a"); a.DesiredVersion != "v1.1.1" || a.LastUpdate.To != "v1.1.1" {
		t.Fatalf("a on the new target: %+v", a)
	}
}

// A failure report for the step of a runner that cannot update itself (an
// ApplyAvailableUpdate on a runner updated by hand) ends the step but halts nothing,
// exactly like a missed deadline; a report without a reason says so; a long reason is
// bounded on a character boundary.
func TestRunnerReportedFailureWithoutSelfUpdateDoesNotHalt(t *testing.T) {
	b := newBed(t)
	b.runner("a")
	b.runner("b", group("g2"))
	b.beat("a", "v1.0.0", true, false)
	b.target(store.ChannelRapid, "v1.1.0")
	// As ApplyAvailableUpdate does.
	r := b.get("a")
	att := rollout.Attempt("v1.0.0", "v1.1.0", b.clock(), 10*time.Minute)
	to := "v1.1.0"
	if _, err := b.st.Runners().Update(t.Context(), "o1", "a", r.Etag, store.RunnerUpdate{DesiredVersion: &to, LastUpdate: &att}); err != nil {
		t.Fatal(err)
	}
	c := b.controller(b.st, "x", 0, 10*time.Minute)
	b.advance(time.Second)
	b.beatFailed("a", "v1.0.0", false, "v1.1.0", "")
	b.beat("b", "v1.0.0", true, true)
	tick(t, c)
	a := b.get("a")
	if a.DesiredVersion != "v1.0.0" || a.LastUpdate.State != store.UpdateRolledBack || a.LastUpdate.Reason != "runner reports: no reason given" {
		t.Fatalf("a: desired %q, %+v", a.DesiredVersion, a.LastUpdate)
	}
	if hs := b.halts(); len(hs) != 0 {
		t.Fatalf("a runner that cannot update itself halted the channel: %+v", hs)
	}
	wantMoving(t, b, "b", "a", "b") // the channel still rolls

	// b reports the longest reason there is, in two-byte characters.
	long := strings.Repeat("é", store.MaxSelfUpdateFailureLen/2)
	b.advance(time.Second)
	b.beatFailed("b", "v1.0.0", true, "v1.1.0", long)
	tick(t, c)
	lu := b.get("b").LastUpdate
	if lu.State != store.UpdateRolledBack || len(lu.Reason) > rollout.MaxReason || !utf8.ValidString(lu.Reason) ||
		!strings.HasPrefix(lu.Reason, "runner reports: éé") || !strings.HasSuffix(lu.Reason, "é…") {
		t.Fatalf("b: %d bytes, valid %v: %+v", len(lu.Reason), utf8.ValidString(lu.Reason), lu)
	}
	hs := b.halts()
	if len(hs) != 1 || hs[0].RunnerID != "b" || !utf8.ValidString(hs[0].Reason) || !strings.HasSuffix(hs[0].Reason, "; rolled back to v1.0.0") {
		t.Fatalf("halts: %+v", hs)
	}
}

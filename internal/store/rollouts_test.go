package store_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/store"
)

func TestRunnerUpdateAttemptAndSelfUpdate(t *testing.T) {
	eachStore(t, func(t *testing.T, s store.Store) {
		ctx := t.Context()
		mustOrg(t, s, "o1")
		r := mustRunner(t, s, "o1", "r1", "c1")
		if r.LastUpdate != nil || r.Status.SelfUpdate {
			t.Fatalf("new runner: %+v", r)
		}
		if err := s.Runners().RecordHeartbeat(ctx, "o1", "r1", store.RunnerStatus{Version: "v1.0.0", Ready: true, SelfUpdate: true}); err != nil {
			t.Fatal(err)
		}
		start := time.Date(2026, 12, 2, 10, 0, 0, 123456789, time.UTC)
		att := store.UpdateAttempt{From: "v1.0.0", To: "v1.1.0", State: store.UpdateInProgress, StartedAt: start, Deadline: start.Add(time.Minute)}
		r2, err := s.Runners().Update(ctx, "o1", "r1", r.Etag, store.RunnerUpdate{DesiredVersion: ptr("v1.1.0"), LastUpdate: &att})
		if err != nil {
			t.Fatal(err)
		}
		if r2.Etag == r.Etag || r2.DesiredVersion != "v1.1.0" || !r2.Status.SelfUpdate {
			t.Fatalf("after start: %+v", r2)
		}
		got := r2.LastUpdate
		if got == nil || got.From != "v1.0.0" || got.To != "v1.1.0" || got.State != store.UpdateInProgress ||
			!got.StartedAt.Equal(start.Truncate(time.Microsecond)) || !got.Deadline.Equal(start.Add(time.Minute).Truncate(time.Microsecond)) || got.EndedAt != nil {
			t.Fatalf("attempt: %+v", got)
		}
		wantUTC(t, got.StartedAt, got.Deadline)
		// The old etag no longer writes: two controllers cannot both start the runner.
		if _, err := s.Runners().Update(ctx, "o1", "r1", r.Etag, store.RunnerUpdate{LastUpdate: &att}); err == nil {
			t.Fatal("stale etag accepted")
		} else {
			wantErr(t, err, store.ErrConflict)
		}
		// Other writes keep the attempt; an end replaces it; desired "" clears it.
		r3, err := s.Runners().Update(ctx, "o1", "r1", r2.Etag, store.RunnerUpdate{DisplayName: ptr("x")})
		if err != nil || r3.LastUpdate == nil || r3.LastUpdate.State != store.UpdateInProgress {
			t.Fatalf("display name write: %+v %v", r3, err)
		}
		end := start.Add(2 * time.Minute)
		att.State, att.Reason, att.EndedAt = store.UpdateRolledBack, "did not report ready", &end
		r4, err := s.Runners().Update(ctx, "o1", "r1", r3.Etag, store.RunnerUpdate{DesiredVersion: ptr(""), LastUpdate: &att})
		if err != nil || r4.DesiredVersion != "" || r4.LastUpdate.State != store.UpdateRolledBack ||
			r4.LastUpdate.Reason != "did not report ready" || r4.LastUpdate.EndedAt == nil || !r4.LastUpdate.EndedAt.Equal(end.Truncate(time.Microsecond)) {
			t.Fatalf("end: %+v %v", r4, err)
		}
		bad := store.UpdateAttempt{To: "v1", State: "DONE", StartedAt: start}
		_, err = s.Runners().Update(ctx, "o1", "r1", r4.Etag, store.RunnerUpdate{LastUpdate: &bad})
		wantErr(t, err, store.ErrInvalid)
		if err := s.Runners().RecordHeartbeat(ctx, "o1", "r1", store.RunnerStatus{Version: "v1.0.0"}); err != nil {
			t.Fatal(err)
		}
		if r5, _ := s.Runners().Get(ctx, "o1", "r1"); r5.Status.SelfUpdate || r5.Etag != r4.Etag {
			t.Fatalf("heartbeat without self_update: %+v", r5)
		}
	})
}

func TestRolloutRunnersAndHalts(t *testing.T) {
	eachStore(t, func(t *testing.T, s store.Store) {
		ctx := t.Context()
		mustOrg(t, s, "o1")
		mustOrg(t, s, "o2")
		mustRunner(t, s, "o2", "c", "c1")
		mustRunner(t, s, "o1", "b", "c1")
		mustRunner(t, s, "o1", "a", "c2")
		rs, err := s.Rollouts().Runners(ctx)
		if err != nil || len(rs) != 3 || rs[0].Org != "o1" || rs[0].RunnerID != "a" || rs[1].RunnerID != "b" || rs[2].Org != "o2" {
			t.Fatalf("all runners: %+v %v", rs, err)
		}
		if hs, err := s.Rollouts().Halts(ctx, ""); err != nil || len(hs) != 0 {
			t.Fatalf("no halts: %v %v", hs, err)
		}
		t0 := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
		h := store.RolloutHalt{Channel: store.ChannelRapid, Version: "v2.0.0", Reason: "first", Org: "o1", RunnerID: "a", HaltedAt: t0}
		if err := s.Rollouts().Halt(ctx, h); err != nil {
			t.Fatal(err)
		}
		// The same version keeps its first halt; another version replaces it.
		h2 := h
		h2.Reason, h2.HaltedAt = "second", t0.Add(time.Hour)
		if err := s.Rollouts().Halt(ctx, h2); err != nil {
			t.Fatal(err)
		}
		hs, err := s.Rollouts().Halts(ctx, "")
		if err != nil || len(hs) != 1 || hs[0].Reason != "first" || !hs[0].HaltedAt.Equal(t0) || hs[0].RunnerID != "a" || hs[0].Org != "o1" {
			t.Fatalf("halts: %+v %v", hs, err)
		}
		h2.Version = "v2.1.0"
		if err := s.Rollouts().Halt(ctx, h2); err != nil {
			t.Fatal(err)
		}
		if err := s.Rollouts().Halt(ctx, store.RolloutHalt{Channel: store.ChannelStable, Version: "v1.0.0", Reason: "x", Org: "o1", HaltedAt: t0}); err != nil {
			t.Fatal(err)
		}
		hs, _ = s.Rollouts().Halts(ctx, "")
		if len(hs) != 2 || hs[0].Channel != store.ChannelRapid || hs[0].Version != "v2.1.0" || hs[0].Reason != "second" || hs[1].Channel != store.ChannelStable {
			t.Fatalf("halts: %+v", hs)
		}
		// Halts are per organization: o2's halt of RAPID is its own row, beside o1's, and
		// neither replaces nor shows in the other's.
		if err := s.Rollouts().Halt(ctx, store.RolloutHalt{Channel: store.ChannelRapid, Version: "v2.1.0", Reason: "o2's", Org: "o2", RunnerID: "c", HaltedAt: t0}); err != nil {
			t.Fatal(err)
		}
		if hs, _ := s.Rollouts().Halts(ctx, "o2"); len(hs) != 1 || hs[0].Org != "o2" || hs[0].Reason != "o2's" {
			t.Fatalf("o2's halts: %+v", hs)
		}
		if hs, _ := s.Rollouts().Halts(ctx, "o1"); len(hs) != 2 || hs[0].Reason != "second" || hs[1].Org != "o1" {
			t.Fatalf("o1's halts: %+v", hs)
		}
		if hs, _ := s.Rollouts().Halts(ctx, "o3"); len(hs) != 0 {
			t.Fatalf("o3's halts: %+v", hs)
		}
		wantErr(t, s.Rollouts().Halt(ctx, store.RolloutHalt{Channel: "BETA", Version: "v1", Reason: "x", Org: "o1"}), store.ErrInvalid)
		wantErr(t, s.Rollouts().Halt(ctx, store.RolloutHalt{Channel: store.ChannelRapid, Version: "v1", Reason: "x"}), store.ErrInvalid)
		// Resume one organization's halt: the other's stays.
		if n, err := s.Rollouts().Resume(ctx, "o1", store.ChannelRapid); n != 1 || err != nil {
			t.Fatalf("resume o1: %v %v", n, err)
		}
		if n, err := s.Rollouts().Resume(ctx, "o1", store.ChannelRapid); n != 0 || err != nil {
			t.Fatalf("resume o1 again: %v %v", n, err)
		}
		if hs, _ := s.Rollouts().Halts(ctx, ""); len(hs) != 2 || hs[0].Org != "o1" || hs[0].Channel != store.ChannelStable || hs[1].Org != "o2" {
			t.Fatalf("after resume of o1: %+v", hs)
		}
		// Resume every organization's halt of a channel.
		if err := s.Rollouts().Halt(ctx, h2); err != nil {
			t.Fatal(err)
		}
		if n, err := s.Rollouts().Resume(ctx, "", store.ChannelRapid); n != 2 || err != nil {
			t.Fatalf("resume all: %v %v", n, err)
		}
		if hs, _ := s.Rollouts().Halts(ctx, ""); len(hs) != 1 || hs[0].Channel != store.ChannelStable {
			t.Fatalf("after resume: %+v", hs)
		}
		if _, err := s.Rollouts().Resume(ctx, "", "BETA"); !errors.Is(err, store.ErrInvalid) {
			t.Fatalf("resume BETA: %v", err)
		}
	})
}

func TestRolloutLease(t *testing.T) {
	eachStore(t, func(t *testing.T, s store.Store) {
		ctx := t.Context()
		t0 := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
		get := func(holder string, at time.Time) bool {
			t.Helper()
			ok, err := s.Rollouts().AcquireLease(ctx, "rollout", holder, at, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			return ok
		}
		if !get("a", t0) || get("b", t0.Add(30*time.Second)) || !get("a", t0.Add(50*time.Second)) {
			t.Fatal("a takes and renews the lease, b cannot take it meanwhile")
		}
		if get("b", t0.Add(109*time.Second)) || !get("b", t0.Add(110*time.Second)) || get("a", t0.Add(111*time.Second)) {
			t.Fatal("b takes the lease once a's renewal expired, and a then cannot")
		}
		// Concurrent takers of a free lease: exactly one wins.
		var wins atomic.Int32
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Go(func() {
				ok, err := s.Rollouts().AcquireLease(ctx, "race", string(rune('a'+i)), t0, time.Minute)
				if err != nil {
					t.Error(err)
				}
				if ok {
					wins.Add(1)
				}
			})
		}
		wg.Wait()
		if wins.Load() != 1 {
			t.Fatalf("%d concurrent winners", wins.Load())
		}
	})
}

// A heartbeat's self-update failure is kept with the status (Get, List and the rollout's
// Runners), without changing the etag, replaced by the next heartbeat and cleared by one
// that reports none; over-long or reason-without-version reports are refused.
func TestRunnerSelfUpdateFailure(t *testing.T) {
	eachStore(t, func(t *testing.T, s store.Store) {
		ctx := t.Context()
		mustOrg(t, s, "o1")
		r := mustRunner(t, s, "o1", "r1", "c1")
		if r.Status.SelfUpdateFailedVersion != "" || r.Status.SelfUpdateFailure != "" {
			t.Fatalf("new runner: %+v", r.Status)
		}
		reason := "checksum mismatch: want ab…, got cd… — ünïcode " + strings.Repeat("x", 900)
		hb := store.RunnerStatus{Version: "v0.0.2", SelfUpdate: true, SelfUpdateFailedVersion: "v0.0.3", SelfUpdateFailure: reason}
		if err := s.Runners().RecordHeartbeat(ctx, "o1", "r1", hb); err != nil {
			t.Fatal(err)
		}
		got, err := s.Runners().Get(ctx, "o1", "r1")
		if err != nil || got.Status.SelfUpdateFailedVersion != "v0.0.3" || got.Status.SelfUpdateFailure != reason || got.Etag != r.Etag {
			t.Fatalf("after failure report: %+v %v", got.Status, err)
		}
		all, err := s.Rollouts().Runners(ctx)
		if err != nil || len(all) != 1 || all[0].Status.SelfUpdateFailedVersion != "v0.0.3" || all[0].Status.SelfUpdateFailure != reason {
			t.Fatalf("rollout runners: %+v %v", all, err)
		}
		list, _, err := s.Runners().List(ctx, "o1", store.Page{})
		if err != nil || len(list) != 1 || list[0].Status.SelfUpdateFailure != reason {
			t.Fatalf("list: %+v %v", list, err)
		}
		// At the bounds exactly: accepted.
		atBounds := store.RunnerStatus{SelfUpdateFailedVersion: "v" + strings.Repeat("1", store.MaxSelfUpdateFailedVersionLen-1),
			SelfUpdateFailure: strings.Repeat("é", store.MaxSelfUpdateFailureLen/2)}
		if err := s.Runners().RecordHeartbeat(ctx, "o1", "r1", atBounds); err != nil {
			t.Fatalf("at the bounds: %v", err)
		}
		if got, _ := s.Runners().Get(ctx, "o1", "r1"); got.Status.SelfUpdateFailure != atBounds.SelfUpdateFailure {
			t.Fatalf("at the bounds: %+v", got.Status)
		}
		for name, bad := range map[string]store.RunnerStatus{
			"reason too long":        {SelfUpdateFailedVersion: "v1", SelfUpdateFailure: strings.Repeat("x", store.MaxSelfUpdateFailureLen+1)},
			"reason too long bytes":  {SelfUpdateFailedVersion: "v1", SelfUpdateFailure: strings.Repeat("é", store.MaxSelfUpdateFailureLen/2) + "x"},
			"version too long":       {SelfUpdateFailedVersion: strings.Repeat("1", store.MaxSelfUpdateFailedVersionLen+1)},
			"reason without version": {SelfUpdateFailure: "why"},
		} {
			if err := s.Runners().RecordHeartbeat(ctx, "o1", "r1", bad); !errors.Is(err, store.ErrInvalid) {
				t.Errorf("%s: %v, want ErrInvalid", name, err)
			}
		}
		// A version without a reason is kept (a runner may not say why).
		if err := s.Runners().RecordHeartbeat(ctx, "o1", "r1", store.RunnerStatus{SelfUpdateFailedVersion: "v0.0.4"}); err != nil {
			t.Fatal(err)
		}
		if got, _ := s.Runners().Get(ctx, "o1", "r1"); got.Status.SelfUpdateFailedVersion != "v0.0.4" || got.Status.SelfUpdateFailure != "" {
			t.Fatalf("version only: %+v", got.Status)
		}
		// A heartbeat that reports none clears it.
		if err := s.Runners().RecordHeartbeat(ctx, "o1", "r1", store.RunnerStatus{Version: "v0.0.2"}); err != nil {
			t.Fatal(err)
		}
		if got, _ := s.Runners().Get(ctx, "o1", "r1"); got.Status.SelfUpdateFailedVersion != "" || got.Status.SelfUpdateFailure != "" {
			t.Fatalf("after a heartbeat without failure: %+v", got.Status)
		}
	})
}

// TestMigrationKeepsAChannelWideHalt: migration 0008 keys halts by (organization, channel);
// a halt recorded before it (one per channel, for every organization) becomes the halt of
// the organization whose runner caused it.
func TestMigrationKeepsAChannelWideHalt(t *testing.T) {
	eachBackend(t, func(t *testing.T, dsn string) {
		s := openStore(t, dsn)
		s.Close()
		pg := strings.HasPrefix(dsn, "postgres://")
		// Back to the schema before 0008: the channel-wide table of 0005, with one halt.
		rawExec(t, dsn, `DROP TABLE rollout_halts`)
		rawExec(t, dsn, `DELETE FROM schema_migrations WHERE version >= 8`)
		rawExec(t, dsn, `DROP TABLE snapshots`) // of 0009, applied again (0010 is IF NOT EXISTS)
		rawExec(t, dsn, `DROP TABLE templates`) // of 0011, applied again
		rawExec(t, dsn, `ALTER TABLE sandboxes DROP COLUMN source_template_id`)
		rawExec(t, dsn, `ALTER TABLE sandboxes DROP COLUMN source_template_revision`)
		rawExec(t, dsn, `DROP TABLE build_events`) // of 0012, applied again
		rawExec(t, dsn, `DROP TABLE builds`)
		rawExec(t, dsn, `DROP TABLE org_quotas`) // of 0015, applied again
		rawExec(t, dsn, `DROP TABLE quota_reservations`)
		rawExec(t, dsn, `DROP TABLE quota_locks`)
		rawExec(t, dsn, `DROP INDEX sandboxes_org_live`)
		rawExec(t, dsn, `ALTER TABLE sandboxes DROP COLUMN cpu_millis`)
		rawExec(t, dsn, `ALTER TABLE sandboxes DROP COLUMN memory_bytes`)
		rawExec(t, dsn, `DROP TABLE sandbox_volumes`) // of 0016, applied again
		rawExec(t, dsn, `DROP TABLE volumes`)
		rawExec(t, dsn, `DROP TABLE audit_events`)                 // of 0021, applied again
		rawExec(t, dsn, `DROP TABLE secret_keys`)                  // of 0022, applied again (0023 alters audit_events: dropped above)
		rawExec(t, dsn, `ALTER TABLE runners DROP COLUMN prepull`) // of 0024, applied again
		rawExec(t, dsn, `DROP TABLE runner_id_holds`)              // of 0025, applied again
		rawExec(t, dsn, `DROP TABLE store_identity`)               // of 0026, applied again
		if pg {
			rawExec(t, dsn, `CREATE TABLE rollout_halts (channel text NOT NULL PRIMARY KEY, version text NOT NULL, reason text NOT NULL,
				org_id text NOT NULL, runner_id text NOT NULL, halted_at timestamptz NOT NULL)`)
			rawExec(t, dsn, `INSERT INTO rollout_halts VALUES ('RAPID', 'v2.0.0', 'old', 'o1', 'a', '2026-12-02T10:00:00Z')`)
		} else {
			rawExec(t, dsn, `CREATE TABLE rollout_halts (channel TEXT NOT NULL PRIMARY KEY, version TEXT NOT NULL, reason TEXT NOT NULL,
				org_id TEXT NOT NULL, runner_id TEXT NOT NULL, halted_at INTEGER NOT NULL) STRICT`)
			rawExec(t, dsn, fmt.Sprintf(`INSERT INTO rollout_halts VALUES ('RAPID', 'v2.0.0', 'old', 'o1', 'a', %d)`,
				time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC).UnixMicro()))
		}
		s = openStore(t, dsn)
		defer s.Close()
		hs, err := s.Rollouts().Halts(t.Context(), "o1")
		if err != nil || len(hs) != 1 || hs[0].Org != "o1" || hs[0].Channel != store.ChannelRapid || hs[0].Reason != "old" || hs[0].RunnerID != "a" ||
			!hs[0].HaltedAt.Equal(time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)) {
			t.Fatalf("o1's halts after 0008: %+v %v", hs, err)
		}
		// Keyed by (organization, channel) now: another organization's halt of RAPID is its own.
		if err := s.Rollouts().Halt(t.Context(), store.RolloutHalt{Channel: store.ChannelRapid, Version: "v2.0.0", Reason: "o2", Org: "o2"}); err != nil {
			t.Fatal(err)
		}
		if hs, _ := s.Rollouts().Halts(t.Context(), ""); len(hs) != 2 {
			t.Fatalf("halts: %+v", hs)
		}
	})
}

// TestRunnerPrepullStatus: a heartbeat's pre-pull status is kept with the runner (Get,
// List, the rollout's list), replaced by the next heartbeat (none clears it), bounded.
func TestRunnerPrepullStatus(t *testing.T) {
	eachStore(t, func(t *testing.T, s store.Store) {
		ctx := t.Context()
		mustOrg(t, s, "o1")
		r := mustRunner(t, s, "o1", "r1", "c1")
		if r.Status.Prepull != nil {
			t.Fatalf("new runner: %s", r.Status.Prepull)
		}
		pp := json.RawMessage(`{"images":[{"image":"busybox:1","state":"PREPULL_PRESENT"}]}`)
		if err := s.Runners().RecordHeartbeat(ctx, "o1", "r1", store.RunnerStatus{Version: "v1", Prepull: pp}); err != nil {
			t.Fatal(err)
		}
		got, err := s.Runners().Get(ctx, "o1", "r1")
		if err != nil || !jsonEqual(got.Status.Prepull, pp) || got.Etag != r.Etag {
			t.Fatalf("after a heartbeat: %s %v", got.Status.Prepull, err)
		}
		list, _, err := s.Runners().List(ctx, "o1", store.Page{})
		if err != nil || len(list) != 1 || !jsonEqual(list[0].Status.Prepull, pp) {
			t.Fatalf("list: %+v %v", list, err)
		}
		for _, bad := range []json.RawMessage{json.RawMessage(`{"images":`), json.RawMessage(`"` + strings.Repeat("x", store.MaxPrepullLen) + `"`)} {
			if err := s.Runners().RecordHeartbeat(ctx, "o1", "r1", store.RunnerStatus{Prepull: bad}); !errors.Is(err, store.ErrInvalid) {
				t.Fatalf("prepull of %d bytes: %v", len(bad), err)
			}
		}
		if err := s.Runners().RecordHeartbeat(ctx, "o1", "r1", store.RunnerStatus{Version: "v1"}); err != nil {
			t.Fatal(err)
		}
		if got, _ := s.Runners().Get(ctx, "o1", "r1"); got.Status.Prepull != nil {
			t.Fatalf("after a heartbeat without one: %s", got.Status.Prepull)
		}
	})
}

func jsonEqual(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	return reflect.DeepEqual(x, y)
}

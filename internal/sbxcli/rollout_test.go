package sbxcli

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/store"
)

func TestSbxAdminRunnerUpdateMaintenance(t *testing.T) {
	admin, _, st := controlPlaneStore(t)
	if _, err := st.Runners().Create(t.Context(), store.Runner{Org: "o1", RunnerID: "r1", ClusterID: "c1", Zone: "z"}); err != nil {
		t.Fatal(err)
	}
	sbx := func(args ...string) (string, string, int) {
		return runSbx(context.Background(), "", append(append([]string{}, admin...), args...)...)
	}
	out, errs, code := sbx("admin", "runner", "update", "r1", "--maintenance-window", "0 2 * * 6/2h", "--maintenance-window", "*/30 4 * * */1h",
		"--maintenance-exclusion", "2026-12-24T00:00:00Z/2026-12-27T00:00:00Z/holidays/family")
	if code != 0 {
		t.Fatalf("update: %d %s", code, errs)
	}
	for _, want := range []string{"0 2 * * 6 (UTC) for 2h0m0s", "*/30 4 * * * (UTC) for 1h0m0s",
		"2026-12-24T00:00:00Z to 2026-12-27T00:00:00Z (holidays/family)", "Maintenance now:"} {
		if !strings.Contains(out, want) {
			t.Errorf("update output lacks %q:\n%s", want, out)
		}
	}
	r, err := st.Runners().Get(t.Context(), "o1", "r1")
	if err != nil || !strings.Contains(string(r.MaintenancePolicy), `"duration_seconds":7200`) {
		t.Fatalf("stored policy %s %v", r.MaintenancePolicy, err)
	}
	// Bad values fail before any request, with the API's wording; the policy stays.
	for _, bad := range [][]string{
		{"--maintenance-window", "0 25 * * */1h"},
		{"--maintenance-window", "0 2 * * 6/30s"},
		{"--maintenance-window", "0 2 * * 6"},
		{"--maintenance-window", "0 2 * * 6/1.5s"},
		{"--maintenance-exclusion", "2026-12-27T00:00:00Z/2026-12-24T00:00:00Z"},
		{"--maintenance-exclusion", "tomorrow/later"},
		{"--clear-maintenance", "--maintenance-window", "0 2 * * 6/2h"},
		{},
	} {
		_, errs, code := sbx(append([]string{"admin", "runner", "update", "r1"}, bad...)...)
		if code == 0 || errs == "" {
			t.Errorf("update %q accepted", bad)
		}
	}
	if r2, _ := st.Runners().Get(t.Context(), "o1", "r1"); r2.Etag != r.Etag {
		t.Fatal("a refused update wrote")
	}
	out, errs, code = sbx("admin", "runner", "update", "r1", "--clear-maintenance", "--display-name", "edge one")
	if code != 0 || !strings.Contains(out, "any time (no maintenance policy)") || !strings.Contains(out, "edge one") {
		t.Fatalf("clear: %d %s %s", code, out, errs)
	}
}

func TestSbxAdminShowsRolloutState(t *testing.T) {
	admin, _, st := controlPlaneStore(t)
	ctx := t.Context()
	r, err := st.Runners().Create(ctx, store.Runner{Org: "o1", RunnerID: "r1", ClusterID: "c1", Zone: "z"})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	if err := st.Runners().RecordHeartbeat(ctx, "o1", "r1", store.RunnerStatus{LastHeartbeatAt: &now, Version: "v0.8.0", Ready: true, SelfUpdate: true}); err != nil {
		t.Fatal(err)
	}
	end := now.Add(time.Minute)
	att := store.UpdateAttempt{From: "v0.8.0", To: "v0.9.0", State: store.UpdateRolledBack, Reason: "did not report ready on v0.9.0 within 1m0s (reports v0.8.0)",
		StartedAt: now, Deadline: end, EndedAt: &end}
	if _, err := st.Runners().Update(ctx, "o1", "r1", r.Etag, store.RunnerUpdate{LastUpdate: &att}); err != nil {
		t.Fatal(err)
	}
	if err := st.Rollouts().Halt(ctx, store.RolloutHalt{Channel: store.ChannelStable, Version: "v0.9.0", Reason: "runner o1/r1 did not report ready", Org: "o1", RunnerID: "r1", HaltedAt: end}); err != nil {
		t.Fatal(err)
	}
	sbx := func(args ...string) string {
		t.Helper()
		out, errs, code := runSbx(context.Background(), "", append(append([]string{}, admin...), args...)...)
		if code != 0 {
			t.Fatalf("sbx %v: %d %s", args, code, errs)
		}
		return out
	}
	out := sbx("admin", "runner", "get", "r1")
	for _, want := range []string{"Self-update:", "yes (the automatic rollout moves it)", "Last update:", "ROLLED_BACK v0.8.0 -> v0.9.0",
		"Last update reason:", "within 1m0s (reports v0.8.0)", "Rollout halted:", "rollout of v0.9.0 on STABLE halted: runner o1/r1 did not report ready"} {
		if !strings.Contains(out, want) {
			t.Errorf("runner get lacks %q:\n%s", want, out)
		}
	}
	out = sbx("admin", "release", "ls")
	for _, want := range []string{"STABLE rollout: HALTED at v0.9.0 since", "runner o1/r1 did not report ready (sbx admin release resume STABLE)",
		"RAPID rollout: active, runners move to v0.9.0"} {
		if !strings.Contains(out, want) {
			t.Errorf("release ls lacks %q:\n%s", want, out)
		}
	}
	// Another organization's halt: the platform admin sees that it exists (a count), not
	// its reason; resume --org lifts it alone.
	if _, err := st.Orgs().Create(ctx, store.Org{ID: "o2"}); err != nil {
		t.Fatal(err)
	}
	if err := st.Rollouts().Halt(ctx, store.RolloutHalt{Channel: store.ChannelStable, Version: "v0.9.0", Reason: "o2's secret reason", Org: "o2", RunnerID: "r9", HaltedAt: end}); err != nil {
		t.Fatal(err)
	}
	out = sbx("admin", "release", "ls")
	if !strings.Contains(out, "STABLE rollout: halted for 2 organization(s)") || strings.Contains(out, "o2's secret") || strings.Contains(out, "r9") {
		t.Errorf("release ls with o2 halted:\n%s", out)
	}
	if out := sbx("admin", "release", "resume", "STABLE", "--org", "o2"); !strings.Contains(out, "STABLE rollout: HALTED") || !strings.Contains(out, "halted for 1 organization(s)") {
		t.Errorf("resume --org o2: %s", out)
	}
	if hs, _ := st.Rollouts().Halts(ctx, ""); len(hs) != 1 || hs[0].Org != "o1" {
		t.Errorf("after resume --org o2: %+v", hs)
	}
	if _, errs, code := runSbx(context.Background(), "", append(append([]string{}, admin...), "admin", "release", "resume", "STABLE", "--org", "nope")...); code == 0 || !strings.Contains(errs, "no organization") {
		t.Errorf("resume --org nope: %d %s", code, errs)
	}
	if out := sbx("admin", "release", "resume", "STABLE"); !strings.Contains(out, "STABLE rollout: active") {
		t.Errorf("resume: %s", out)
	}
	if out := sbx("admin", "release", "ls"); strings.Contains(out, "HALTED") {
		t.Errorf("still halted after resume:\n%s", out)
	}
	if out := sbx("admin", "runner", "get", "r1"); strings.Contains(out, "Rollout halted") {
		t.Errorf("runner still shows the halt:\n%s", out)
	}
}

func FuzzMaintenanceFlags(f *testing.F) {
	f.Add("0 2 * * 6/2h", "2026-12-24T00:00:00Z/2026-12-27T00:00:00Z/holidays")
	f.Add("*/15 * * * */1m", "2026-12-24T00:00:00Z/2026-12-24T00:00:00Z")
	f.Add("/", "//")
	f.Add("@daily/1h", "x/y/z")
	f.Fuzz(func(t *testing.T, w, e string) {
		p, err := maintenanceFlags([]string{w}, []string{e})
		if err != nil {
			return
		}
		// Accepted values are what the API accepts: whole-second windows of 1 min to 7 days.
		d := p.GetWindows()[0].GetDurationSeconds()
		if d < 60 || d > 7*24*3600 {
			t.Fatalf("window %q accepted with %d s", w, d)
		}
		x := p.GetExclusions()[0]
		if !x.GetEndTime().AsTime().After(x.GetStartTime().AsTime()) {
			t.Fatalf("exclusion %q accepted with end not after start", e)
		}
	})
}

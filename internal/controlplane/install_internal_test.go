package controlplane

import (
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/store"
)

func TestRunnerImage(t *testing.T) {
	hb := time.Now()
	updated := &store.UpdateAttempt{From: "v1", To: "v2", State: store.UpdateSucceeded}
	failed := &store.UpdateAttempt{From: "dev+dirty", To: "v2", State: store.UpdateRolledBack}
	for _, c := range []struct {
		name string
		r    store.Runner
		want string
	}{
		{"install", store.Runner{}, "reg.example:5000/runner:v1"},
		{"never updated: its version need not be a tag", store.Runner{Status: store.RunnerStatus{Version: "dev+dirty", LastHeartbeatAt: &hb}}, "reg.example:5000/runner:v1"},
		{"update being applied", store.Runner{DesiredVersion: "v2", Status: store.RunnerStatus{Version: "v1"}}, "reg.example:5000/runner:v2"},
		{"resumed after its step ended", store.Runner{LastUpdate: updated, Status: store.RunnerStatus{Version: "v2"}}, "reg.example:5000/runner:v2"},
		{"first update failed: its version need not be a tag", store.Runner{LastUpdate: failed, Status: store.RunnerStatus{Version: "dev+dirty"}}, "reg.example:5000/runner:v1"},
		{"succeeded to another version than it reports", store.Runner{LastUpdate: updated, Status: store.RunnerStatus{Version: "dev+dirty"}}, "reg.example:5000/runner:v1"},
	} {
		if got := runnerImage("reg.example:5000/runner:v1", runnerVersion(c.r)); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
	if got := runnerImage("runner@sha256:0123", runnerVersion(store.Runner{DesiredVersion: "v3"})); got != "runner:v3" {
		t.Errorf("digest: %q", got)
	}
}

func TestHeartbeatSince(t *testing.T) {
	applied := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	before, after := applied.Add(-time.Second), applied.Add(time.Second)
	for _, c := range []struct {
		name    string
		st      store.RunnerStatus
		version string
		want    bool
		updated bool // a re-apply without a version (its reported one is not a tag)
	}{
		{"never heartbeated", store.RunnerStatus{}, "", false, false},
		{"install: heartbeat after the apply", store.RunnerStatus{LastHeartbeatAt: &after, Version: "dev"}, "", true, false},
		{"install resumed: heartbeat before the apply", store.RunnerStatus{LastHeartbeatAt: &before, Version: "dev"}, "", true, false},
		{"re-apply: only the old Pod's heartbeat, before", store.RunnerStatus{LastHeartbeatAt: &before, Version: "v2"}, "v2", false, false},
		{"re-apply: the old Pod heartbeats on after the apply", store.RunnerStatus{LastHeartbeatAt: &after, Version: "v1"}, "v2", false, false},
		{"re-apply: the new Pod heartbeats", store.RunnerStatus{LastHeartbeatAt: &after, Version: "v2"}, "v2", true, false},
		{"re-apply, no version: heartbeat before", store.RunnerStatus{LastHeartbeatAt: &before, Version: "dev+dirty"}, "", false, true},
		{"re-apply, no version: heartbeat after", store.RunnerStatus{LastHeartbeatAt: &after, Version: "dev+dirty"}, "", true, true},
	} {
		r := store.Runner{Status: c.st}
		if c.version != "" || c.updated {
			r.LastUpdate = &store.UpdateAttempt{From: "v1", To: "v2", State: store.UpdateInProgress}
		}
		if got := heartbeatSince(r, applied, c.version); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

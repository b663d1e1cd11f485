package controlplane

import (
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/store"
)

func TestRunnerImage(t *testing.T) {
	hb := time.Now()
	updated := &store.UpdateAttempt{From: "v1", To: "v2", State: store.UpdateSucceeded}
	for _, c := range []struct {
		name string
		r    store.Runner
		want string
	}{
		{"install", store.Runner{}, "reg.example:5000/runner:v1"},
		{"never updated: its version need not be a tag", store.Runner{Status: store.RunnerStatus{Version: "dev+dirty", LastHeartbeatAt: &hb}}, "reg.example:5000/runner:v1"},
		{"update being applied", store.Runner{DesiredVersion: "v2", Status: store.RunnerStatus{Version: "v1"}}, "reg.example:5000/runner:v2"},
		{"resumed after its step ended", store.Runner{LastUpdate: updated, Status: store.RunnerStatus{Version: "v2"}}, "reg.example:5000/runner:v2"},
	} {
		if got := runnerImage("reg.example:5000/runner:v1", c.r); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
	if got := runnerImage("runner@sha256:0123", store.Runner{DesiredVersion: "v3"}); got != "runner:v3" {
		t.Errorf("digest: %q", got)
	}
}

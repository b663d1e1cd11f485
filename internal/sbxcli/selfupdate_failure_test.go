package sbxcli

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/store"
)

// runner get shows the self-update failure a runner's heartbeats report, and nothing once
// the runner reports none.
func TestSbxAdminRunnerGetShowsSelfUpdateFailure(t *testing.T) {
	admin, _, st := controlPlaneStore(t)
	ctx := t.Context()
	if _, err := st.Runners().Create(ctx, store.Runner{Org: "o1", RunnerID: "r1", ClusterID: "c1", Zone: "z"}); err != nil {
		t.Fatal(err)
	}
	get := func() string {
		t.Helper()
		out, errs, code := runSbx(context.Background(), "", append(append([]string{}, admin...), "admin", "runner", "get", "r1")...)
		if code != 0 {
			t.Fatalf("runner get: %d %s", code, errs)
		}
		return out
	}
	now := time.Now().UTC()
	hb := store.RunnerStatus{LastHeartbeatAt: &now, Version: "v0.0.2", Ready: true, SelfUpdate: true,
		SelfUpdateFailedVersion: "v0.0.3", SelfUpdateFailure: "checksum mismatch: want abc, got def"}
	if err := st.Runners().RecordHeartbeat(ctx, "o1", "r1", hb); err != nil {
		t.Fatal(err)
	}
	if out := get(); !strings.Contains(out, "Self-update failure:") || !strings.Contains(out, "v0.0.3: checksum mismatch: want abc, got def") {
		t.Fatalf("runner get lacks the failure:\n%s", out)
	}
	hb.SelfUpdateFailedVersion, hb.SelfUpdateFailure = "", ""
	if err := st.Runners().RecordHeartbeat(ctx, "o1", "r1", hb); err != nil {
		t.Fatal(err)
	}
	if out := get(); strings.Contains(out, "Self-update failure") || strings.Contains(out, "checksum mismatch") {
		t.Fatalf("runner get still shows a cleared failure:\n%s", out)
	}
}

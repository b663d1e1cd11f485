package sbxcli

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	controlplanev1 "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
	"github.com/sandboxd/sandboxd/internal/store"
)

func TestSbxAdminRunnerGetMaintenance(t *testing.T) {
	admin, _, st := controlPlaneStore(t)
	ctx := t.Context()
	mp := `{"windows":[{"cron":"0 2 * * 6","duration_seconds":7200}],"exclusions":[{"start_time":"2026-12-24T00:00:00Z","end_time":"2026-12-27T00:00:00Z","reason":"holidays"}]}`
	for _, r := range []store.Runner{
		{Org: "o1", RunnerID: "r1", ClusterID: "c1", Zone: "z", MaintenancePolicy: json.RawMessage(mp)},
		{Org: "o1", RunnerID: "r2", ClusterID: "c2", Zone: "z"},
	} {
		if _, err := st.Runners().Create(ctx, r); err != nil {
			t.Fatal(err)
		}
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
	for _, want := range []string{"Maintenance windows:", "0 2 * * 6 (UTC) for 2h0m0s", "Exclusions:",
		"2026-12-24T00:00:00Z to 2026-12-27T00:00:00Z (holidays)", "Maintenance now:", "the automatic rollout updates the runner only inside"} {
		if !strings.Contains(out, want) {
			t.Errorf("runner get lacks %q:\n%s", want, out)
		}
	}
	if out := sbx("admin", "runner", "get", "r2"); !strings.Contains(out, "any time (no maintenance policy)") {
		t.Errorf("runner get without a policy:\n%s", out)
	}
	if out := sbx("-o", "json", "admin", "runner", "get", "r1"); !strings.Contains(out, `"maintenancePolicy"`) || !strings.Contains(out, `"0 2 * * 6"`) {
		t.Errorf("json:\n%s", out)
	}

	// The REST example of docs/admin.md.
	req, _ := http.NewRequestWithContext(ctx, http.MethodPatch, admin[1]+"/v1/sandbox/managedRunners/r2?updateMask=maintenancePolicy",
		strings.NewReader(`{"maintenancePolicy":{"windows":[{"cron":"0 2 * * 6","durationSeconds":"7200"}]}}`))
	req.Header.Set("Authorization", "Bearer "+admin[3])
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"durationSeconds":"7200"`) {
		t.Fatalf("PATCH: %d %s", resp.StatusCode, body)
	}
	if out := sbx("admin", "runner", "get", "r2"); !strings.Contains(out, "0 2 * * 6 (UTC) for 2h0m0s") {
		t.Errorf("after PATCH:\n%s", out)
	}
}

func TestPrintMaintenanceNow(t *testing.T) {
	p := &controlplanev1.MaintenancePolicy{Windows: []*controlplanev1.MaintenanceWindow{{Cron: "0 2 * * *", DurationSeconds: 3600}}}
	var b bytes.Buffer
	printMaintenance(&b, p, time.Date(2026, 12, 2, 2, 30, 0, 0, time.UTC))
	if !strings.Contains(b.String(), "Maintenance now:\tinside a maintenance window") {
		t.Errorf("inside:\n%s", b.String())
	}
	b.Reset()
	printMaintenance(&b, p, time.Date(2026, 12, 2, 3, 0, 0, 0, time.UTC))
	if !strings.Contains(b.String(), "outside; next window at 2026-12-03T02:00:00Z") {
		t.Errorf("outside:\n%s", b.String())
	}
	b.Reset()
	p.Windows = nil
	p.Exclusions = []*controlplanev1.MaintenanceExclusion{{StartTime: timestamppb.New(time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)),
		EndTime: timestamppb.New(time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC))}}
	printMaintenance(&b, p, time.Date(2026, 12, 2, 3, 0, 0, 0, time.UTC))
	if !strings.Contains(b.String(), "Maintenance windows:\tany time") || !strings.Contains(b.String(), "next window at 2026-12-03T00:00:00Z") {
		t.Errorf("exclusion only:\n%s", b.String())
	}
}

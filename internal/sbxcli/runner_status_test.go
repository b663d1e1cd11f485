package sbxcli

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/store"
)

// TestSbxAdminRunnerRolloutStatus: runner get and ls show the install status, the active and
// target revisions and whether a rollout is in progress.
func TestSbxAdminRunnerRolloutStatus(t *testing.T) {
	admin, _, st := controlPlaneStore(t)
	sbx := func(args ...string) string {
		t.Helper()
		out, errs, code := runSbx(context.Background(), "", append(append([]string{}, admin...), args...)...)
		if code != 0 {
			t.Fatalf("sbx %v: exit %d: %s", args, code, errs)
		}
		return out
	}
	heartbeat := func(version string) {
		t.Helper()
		now := time.Now().UTC()
		if err := st.Runners().RecordHeartbeat(t.Context(), "o1", "r1", store.RunnerStatus{LastHeartbeatAt: &now, Version: version, Ready: true}); err != nil {
			t.Fatal(err)
		}
	}
	wantRows := func(what, out string, rows ...string) {
		t.Helper()
		for i := 0; i < len(rows); i += 2 {
			if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(rows[i]+":") + `\s+` + regexp.QuoteMeta(rows[i+1]) + `$`).MatchString(out) {
				t.Fatalf("%s: no row %q = %q in\n%s", what, rows[i], rows[i+1], out)
			}
		}
	}
	lsRow := func() []string {
		t.Helper()
		for _, l := range strings.Split(sbx("admin", "runner", "ls"), "\n") {
			if f := strings.Fields(l); len(f) > 0 && f[0] == "r1" {
				return f
			}
		}
		t.Fatal("r1 not listed")
		return nil
	}

	sbx("admin", "runner", "create", "r1", "--cluster-id", "c1", "--zone", "z1")
	heartbeat("v0.8.0")
	wantRows("before upgrade", sbx("admin", "runner", "get", "r1"), "Install status", "SELF_MANAGED",
		"Active revision", "v0.8.0", "Target revision", "v0.9.0", "Rollout in progress", "false")
	// RUNNER CLUSTER ZONE GROUP CHANNEL INSTALL CONNECTION VERSION TARGET ROLLOUT POLICY
	if f := lsRow(); strings.Join(f[5:], " ") != "SELF_MANAGED CONNECTED v0.8.0 v0.9.0 - rev 1" {
		t.Fatalf("ls before upgrade: %v", f)
	}

	sbx("admin", "runner", "upgrade", "r1")
	wantRows("upgrading", sbx("admin", "runner", "get", "r1"), "Active revision", "v0.8.0", "Target revision", "v0.9.0",
		"Rollout in progress", "true")
	if f := lsRow(); strings.Join(f[5:], " ") != "SELF_MANAGED CONNECTED v0.8.0 v0.9.0 to v0.9.0 rev 1" {
		t.Fatalf("ls while upgrading: %v", f)
	}
	// protojson varies its whitespace from build to build ("a":  "b"): compare on one spelling.
	js := strings.Join(strings.Fields(sbx("-o", "json", "admin", "runner", "get", "r1")), " ")
	for _, want := range []string{`"installStatus": "RUNNER_INSTALL_STATUS_SELF_MANAGED"`, `"activeRevision": "v0.8.0"`,
		`"targetRevision": "v0.9.0"`, `"rolloutInProgress": true`} {
		if !strings.Contains(js, want) {
			t.Fatalf("json lacks %s:\n%s", want, js)
		}
	}

	heartbeat("v0.9.0")
	wantRows("upgraded", sbx("admin", "runner", "get", "r1"), "Active revision", "v0.9.0", "Target revision", "v0.9.0",
		"Rollout in progress", "false")
	if f := lsRow(); strings.Join(f[5:], " ") != "SELF_MANAGED CONNECTED v0.9.0 v0.9.0 - rev 1" {
		t.Fatalf("ls after upgrade: %v", f)
	}
}

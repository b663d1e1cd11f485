package sbxcli

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1/sandboxv1connect"
	autorollout "github.com/sandboxd/sandboxd/internal/rollout"
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
	// RUNNER CLUSTER ZONE GROUP CHANNEL INSTALL CONNECTION VERSION TARGET ROLLOUT POLICY HEALTH
	if f := lsRow(); strings.Join(f[5:], " ") != "SELF_MANAGED CONNECTED v0.8.0 v0.9.0 - rev 1 -" {
		t.Fatalf("ls before upgrade: %v", f)
	}

	sbx("admin", "runner", "upgrade", "r1")
	wantRows("upgrading", sbx("admin", "runner", "get", "r1"), "Active revision", "v0.8.0", "Target revision", "v0.9.0",
		"Rollout in progress", "true")
	if f := lsRow(); strings.Join(f[5:], " ") != "SELF_MANAGED CONNECTED v0.8.0 v0.9.0 to v0.9.0 rev 1 -" {
		t.Fatalf("ls while upgrading: %v", f)
	}
	// Decoded, not matched as text: protojson varies its whitespace on purpose.
	js := sbx("-o", "json", "admin", "runner", "get", "r1")
	var got struct {
		Status struct {
			InstallStatus     string `json:"installStatus"`
			ActiveRevision    string `json:"activeRevision"`
			TargetRevision    string `json:"targetRevision"`
			RolloutInProgress bool   `json:"rolloutInProgress"`
		} `json:"status"`
	}
	if err := json.Unmarshal([]byte(js), &got); err != nil {
		t.Fatalf("json: %v\n%s", err, js)
	}
	if s := got.Status; s.InstallStatus != "RUNNER_INSTALL_STATUS_SELF_MANAGED" || s.ActiveRevision != "v0.8.0" ||
		s.TargetRevision != "v0.9.0" || !s.RolloutInProgress {
		t.Fatalf("json status = %+v:\n%s", s, js)
	}

	// Reported: in progress until the health gate (the automatic rollout's controller) ends
	// the step, which clears the desired version.
	heartbeat("v0.9.0")
	wantRows("reported", sbx("admin", "runner", "get", "r1"), "Active revision", "v0.9.0", "Target revision", "v0.9.0",
		"Rollout in progress", "true")
	ctl, err := autorollout.New(autorollout.Config{Store: autorollout.FromStore(st), Logger: slog.New(slog.DiscardHandler),
		Targets: func(context.Context) (map[string]string, error) {
			return map[string]string{store.ChannelStable: "v0.9.0", store.ChannelRapid: "v0.9.0"}, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	if err := ctl.Tick(t.Context()); err != nil {
		t.Fatal(err)
	}
	out := sbx("admin", "runner", "get", "r1")
	wantRows("upgraded", out, "Active revision", "v0.9.0", "Target revision", "v0.9.0", "Rollout in progress", "false")
	if !strings.Contains(out, "Last update:") || !strings.Contains(out, "SUCCEEDED v0.8.0 -> v0.9.0") || strings.Contains(out, "Desired version") {
		t.Fatalf("upgraded:\n%s", out)
	}
	if f := lsRow(); strings.Join(f[5:], " ") != "SELF_MANAGED CONNECTED v0.9.0 v0.9.0 - rev 1 -" {
		t.Fatalf("ls after upgrade: %v", f)
	}
}

// discoveryHealth is a gateway's DiscoveryService listing runners with health tags, in
// pages of one.
type discoveryHealth struct {
	sandboxv1connect.UnimplementedDiscoveryServiceHandler
	runners []*sandboxv1.AvailableRunner
}

func (d discoveryHealth) ListAvailableRunners(_ context.Context, req *connect.Request[sandboxv1.ListAvailableRunnersRequest]) (*connect.Response[sandboxv1.ListAvailableRunnersResponse], error) {
	i, _ := strconv.Atoi(req.Msg.GetPageToken())
	out := &sandboxv1.ListAvailableRunnersResponse{}
	if i < len(d.runners) {
		out.Runners = d.runners[i : i+1]
	}
	if i+1 < len(d.runners) {
		out.NextPageToken = strconv.Itoa(i + 1)
	}
	return connect.NewResponse(out), nil
}

// TestSbxAdminRunnerHealth: runner ls and get show each runner's health as the
// gateway's discovery tags say (a runner without tags is healthy; one the gateway does
// not list is unknown), every page read, a hostile reason escaped; without a discovery
// service, health is unknown and the commands still work.
func TestSbxAdminRunnerHealth(t *testing.T) {
	hostile := "quarantined until 01:00:00 (6 failures: INTERNAL)\x1b]52;c;Zm9v\x07\nforged"
	admin, _, _ := controlPlaneStoreWith(t, func(mux *http.ServeMux) {
		mux.Handle(sandboxv1connect.NewDiscoveryServiceHandler(discoveryHealth{runners: []*sandboxv1.AvailableRunner{
			{RunnerId: "r1", Tags: []string{"sandboxd.health=quarantined", "sandboxd.health.reason=" + hostile}},
			{RunnerId: "r2", Healthy: true},
			{RunnerId: "r4", Tags: []string{"sandboxd.health=degraded", "sandboxd.health.reason=3 failures in a row (last INTERNAL)"}},
		}}))
	})
	sbx := func(args ...string) string {
		t.Helper()
		out, errs, code := runSbx(context.Background(), "", append(append([]string{}, admin...), args...)...)
		if code != 0 {
			t.Fatalf("sbx %v: exit %d: %s", args, code, errs)
		}
		return out
	}
	for _, id := range []string{"r1", "r2", "r3", "r4"} {
		sbx("admin", "runner", "create", id, "--cluster-id", "c-"+id, "--zone", "z1")
	}
	ls := sbx("admin", "runner", "ls")
	health := map[string]string{}
	for _, l := range strings.Split(ls, "\n") {
		if f := strings.Fields(l); len(f) > 0 {
			health[f[0]] = f[len(f)-1]
		}
	}
	if health["RUNNER"] != "HEALTH" || health["r1"] != "quarantined" || health["r2"] != "healthy" || health["r3"] != "-" || health["r4"] != "degraded" {
		t.Fatalf("ls health column %v in\n%s", health, ls)
	}
	get := sbx("admin", "runner", "get", "r1")
	if !strings.Contains(get, "Health:") || !regexp.MustCompile(`(?m)^Health:\s+quarantined$`).MatchString(get) {
		t.Fatalf("get r1:\n%s", get)
	}
	if strings.ContainsAny(get, "\x1b\x07") || strings.Contains(get, "\nforged") || !strings.Contains(get, `Health reason:`) || !strings.Contains(get, `\x1b]52;c;Zm9v\a\nforged`) {
		t.Fatalf("get r1: the reason is not escaped:\n%q", get)
	}
	if get := sbx("admin", "runner", "get", "r3"); !regexp.MustCompile(`(?m)^Health:\s+unknown`).MatchString(get) {
		t.Fatalf("get r3:\n%s", get)
	}

	// A control plane alone: no discovery, health unknown.
	admin, _, _ = controlPlaneStore(t)
	sbx("admin", "runner", "create", "r1", "--cluster-id", "c1", "--zone", "z1")
	if f := strings.Fields(strings.Split(sbx("admin", "runner", "ls"), "\n")[1]); f[len(f)-1] != "-" {
		t.Fatalf("ls without discovery: %v", f)
	}
}

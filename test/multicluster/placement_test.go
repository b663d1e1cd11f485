package multicluster

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	sandbox "github.com/sandboxd/sandboxd/sdk/go"
)

// TestPlacementAcrossClusters: on the standard bed, sandboxes land only where a policy
// allows them, pins work, a request no policy accepts gets one error naming each
// runner's failed constraints, a full runner spills to the others and then answers
// CAPACITY_EXHAUSTED with RetryInfo, discovery shows live free resources, and both
// gateway replicas serve every sandbox.
func TestPlacementAcrossClusters(t *testing.T) {
	b := startBed(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	sdk, err := sandbox.New(b.GatewayURL(0), b.UserKey)
	if err != nil {
		t.Fatal(err)
	}
	raw := b.Sandboxes(0)
	create := func(spec sandbox.Spec) (*sandbox.Sandbox, error) {
		if spec.Image == "" {
			spec.Image = "busybox"
		}
		return sdk.Create(ctx, spec)
	}
	createRaw := func(spec sandbox.Spec) error {
		if spec.Image == "" {
			spec.Image = "busybox"
		}
		_, err := raw.CreateSandbox(ctx, connect.NewRequest(&sandboxv1.CreateSandboxRequest{Sandbox: &sandboxv1.Sandbox{Spec: spec.Proto()}}))
		return err
	}
	var live []*sandbox.Sandbox
	mustCreate := func(t *testing.T, what string, spec sandbox.Spec, wantRunner string) *sandbox.Sandbox {
		t.Helper()
		sb, err := create(spec)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		live = append(live, sb)
		if got := sb.Info().RunnerID; wantRunner != "" && got != wantRunner {
			t.Fatalf("%s: placed on %s, want %s", what, got, wantRunner)
		}
		return sb
	}

	t.Run("policy decides", func(t *testing.T) {
		// 2 CPUs: strict's policy caps 1 CPU, small has 1 CPU in all: only open takes it.
		sb := mustCreate(t, "2 CPUs", sandbox.Spec{CPU: "2", Memory: "256Mi"}, "open")
		if code, err := sb.Exec(ctx, []string{"true"}, sandbox.ExecOptions{}); err != nil || code != 0 {
			t.Fatalf("exec on open: %d %v", code, err)
		}
		// A two-hour lifetime: strict's policy caps 10 minutes.
		for range 3 {
			if got := mustCreate(t, "2 h lifetime", sandbox.Spec{CPU: "100m", Memory: "64Mi", Lifetime: 2 * time.Hour}, "").Info().RunnerID; got == "strict" {
				t.Errorf("2 h lifetime placed on strict")
			}
		}
	})

	t.Run("pins", func(t *testing.T) {
		mustCreate(t, "pinned to small", sandbox.Spec{CPU: "100m", Memory: "64Mi", RunnerIDs: []string{"small"}}, "small")
		err := createRaw(sandbox.Spec{CPU: "2", Memory: "64Mi", RunnerIDs: []string{"strict"}})
		if connect.CodeOf(err) != connect.CodeInvalidArgument || apierr.Reason(err) != apierr.PlacementRejected {
			t.Fatalf("2 CPUs pinned to strict: %v, want INVALID_ARGUMENT %s", err, apierr.PlacementRejected)
		}
		vs := apierr.Violations(err)
		if len(vs) == 0 {
			t.Errorf("pinned to strict: no violations")
		}
		for _, v := range vs { // the request and the limit, both 2 CPUs
			if !strings.Contains(v.Field, "cpu") || !strings.Contains(v.Description, "constraints.resources.max_cpu") {
				t.Errorf("pinned to strict: violation %v", v)
			}
		}
		if err := createRaw(sandbox.Spec{RunnerIDs: []string{"strict", "strict"}}); connect.CodeOf(err) != connect.CodeInvalidArgument {
			t.Errorf("duplicate pins: %v", err)
		}
	})

	t.Run("no policy accepts", func(t *testing.T) {
		// 30 days (the platform's maximum) is beyond every runner's lifetime cap, and 2Gi
		// beyond strict's and small's memory caps.
		err := createRaw(sandbox.Spec{CPU: "100m", Memory: "2Gi", Lifetime: 30 * 24 * time.Hour})
		if connect.CodeOf(err) != connect.CodeFailedPrecondition || apierr.Reason(err) != apierr.NoSuitableRunner {
			t.Fatalf("create no policy accepts: %v, want FAILED_PRECONDITION %s", err, apierr.NoSuitableRunner)
		}
		want := map[string][]string{
			"runner[strict].": {"constraints.lifetime.max_seconds", "constraints.resources.max_memory"},
			"runner[open].":   {"constraints.lifetime.max_seconds"},
			"runner[small].":  {"constraints.resources.max_memory"},
		}
		got := map[string]string{}
		for _, v := range apierr.Violations(err) {
			for prefix := range want {
				if strings.HasPrefix(v.Field, prefix) {
					got[prefix] += v.Description + "\n"
				}
			}
		}
		for prefix, constraints := range want {
			for _, c := range constraints {
				if !strings.Contains(got[prefix], c) {
					t.Errorf("no violation %s of %s in %v", c, prefix, apierr.Violations(err))
				}
			}
		}
	})

	// Clear the way: capacity below is counted from empty runners.
	for _, sb := range live {
		if err := sb.Stop(ctx, 0); err != nil {
			t.Fatal(err)
		}
	}
	live = nil

	t.Run("capacity spills then exhausts", func(t *testing.T) {
		pins := []string{"small", "strict"}
		// small has 1 CPU, strict 2: three 1-CPU sandboxes fill both.
		placed := map[string]int{}
		for i := range 3 {
			sb := mustCreate(t, "1 CPU pinned to small and strict", sandbox.Spec{CPU: "1", Memory: "128Mi", RunnerIDs: pins}, "")
			placed[sb.Info().RunnerID]++
			_ = i
		}
		if placed["small"] != 1 || placed["strict"] != 2 {
			t.Errorf("placed %v, want small 1 and strict 2", placed)
		}
		err := createRaw(sandbox.Spec{CPU: "1", Memory: "128Mi", RunnerIDs: pins})
		if connect.CodeOf(err) != connect.CodeResourceExhausted || apierr.Reason(err) != apierr.RunnerCapacityExhausted {
			t.Fatalf("fourth: %v, want RESOURCE_EXHAUSTED %s", err, apierr.RunnerCapacityExhausted)
		}
		if ri := apierr.RetryInfo(err); ri == nil || ri.GetRetryDelay().AsDuration() <= 0 {
			t.Errorf("capacity exhausted without RetryInfo: %v", err)
		}
		// Unpinned, it spills to open.
		mustCreate(t, "1 CPU unpinned", sandbox.Spec{CPU: "1", Memory: "128Mi"}, "open")

		// The other replica's discovery shows what is free now.
		d := b.Discovery(1)
		free := func(id string) *sandboxv1.RunnerResourceSummary {
			t.Helper()
			res, err := d.GetAvailableRunner(ctx, connect.NewRequest(&sandboxv1.GetAvailableRunnerRequest{
				RunnerId: id, OrganizationId: b.Org, View: sandboxv1.RunnerView_RUNNER_VIEW_FULL}))
			if err != nil {
				t.Fatalf("discovery of %s: %v", id, err)
			}
			return res.Msg.GetResources()
		}
		if r := free("small"); r.GetAvailableCpuMillicores() != 0 || r.GetRunningSandboxes() != 1 || r.GetAvailableMemoryBytes() != 1<<30-128<<20 {
			t.Errorf("small: %v, want 0 CPU, 896Mi free, 1 running", r)
		}
		if r := free("strict"); r.GetAvailableCpuMillicores() != 0 || r.GetRunningSandboxes() != 2 {
			t.Errorf("strict: %v, want 0 CPU free, 2 running", r)
		}
		list, err := d.ListAvailableRunners(ctx, connect.NewRequest(&sandboxv1.ListAvailableRunnersRequest{HealthyOnly: true, Architecture: "x86_64"}))
		if err != nil || len(list.Msg.GetRunners()) != 3 {
			t.Errorf("healthy amd64 runners: %v %v", list, err)
		}
		// A delete frees its runner at once for discovery.
		var onStrict *sandbox.Sandbox
		for _, sb := range live {
			if sb.Info().RunnerID == "strict" {
				onStrict = sb
			}
		}
		if err := onStrict.Stop(ctx, 0); err != nil {
			t.Fatal(err)
		}
		if r := free("strict"); r.GetAvailableCpuMillicores() != 1000 || r.GetRunningSandboxes() != 1 {
			t.Errorf("strict after a delete: %v, want 1000m free, 1 running", r)
		}
	})

	t.Run("both replicas serve every sandbox", func(t *testing.T) {
		other, err := sandbox.New(b.GatewayURL(1), b.UserKey)
		if err != nil {
			t.Fatal(err)
		}
		for _, sb := range live {
			if sb.State().Terminal() {
				continue
			}
			h, err := other.Get(ctx, sb.ID())
			if err != nil || h.Info().RunnerID != sb.Info().RunnerID {
				t.Fatalf("get %s through gateway 1: %v", sb.ID(), err)
			}
			if code, err := h.Exec(ctx, []string{"true"}, sandbox.ExecOptions{}); err != nil || code != 0 {
				t.Errorf("exec in %s (runner %s) through gateway 1: %d %v", sb.ID(), sb.Info().RunnerID, code, err)
			}
		}
	})
}

// TestOfficialClientAcrossClusters runs the official Python client against the second
// gateway replica of the bed.
func TestOfficialClientAcrossClusters(t *testing.T) {
	needOfficialClient(t)
	b := startBed(t)
	script := `
import json
from cwsandbox import Sandbox
from cwsandbox.exceptions import CWSandboxValidationError
out = {}
big = Sandbox.run(container_image="busybox", resources={"cpu": "2", "memory": "256Mi"})
big.wait()
out["big_runner"] = big.runner_id
out["big_exec"] = big.exec(["echo", "ok"]).result().stdout
big.stop().result()
pinned = Sandbox.run(container_image="busybox", runner_ids=["small"], resources={"cpu": "100m", "memory": "64Mi"})
pinned.wait()
out["pinned_runner"] = pinned.runner_id
pinned.stop().result()
try:
    Sandbox.run(container_image="busybox", runner_ids=["strict"], resources={"cpu": "2", "memory": "64Mi"}).wait()
except CWSandboxValidationError as e:
    out["rejected_reason"] = e.reason
    out["rejected_fields"] = [v.field for v in e.field_violations]
print(json.dumps(out))
`
	cmd := exec.Command("python3", "-c", script)
	cmd.Env = append(os.Environ(), "CWSANDBOX_BASE_URL="+b.GatewayURL(1), "CWSANDBOX_API_KEY="+b.UserKey)
	stdout, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
			stderr = ee.Stderr
		}
		t.Fatalf("official client: %v\n%s\n%s", err, stdout, stderr)
	}
	var got struct {
		BigRunner      string   `json:"big_runner"`
		BigExec        string   `json:"big_exec"`
		PinnedRunner   string   `json:"pinned_runner"`
		RejectedReason string   `json:"rejected_reason"`
		RejectedFields []string `json:"rejected_fields"`
	}
	lines := strings.Split(strings.TrimSpace(string(stdout)), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &got); err != nil {
		t.Fatalf("output %q: %v", stdout, err)
	}
	if got.BigRunner != "open" || got.BigExec != "ok\n" || got.PinnedRunner != "small" ||
		got.RejectedReason != apierr.PlacementRejected || len(got.RejectedFields) == 0 || !strings.Contains(got.RejectedFields[0], "cpu") {
		t.Errorf("official client saw %+v", got)
	}
}

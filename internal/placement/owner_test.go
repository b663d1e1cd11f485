package placement

import (
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/metrics/counters"
	"github.com/sandboxd/sandboxd/internal/policy"
)

func owned(r Runner, org string) Runner { r.Owner = org; return r }

// TestPlaceRunnerOwner: a runner that belongs to an organization (Runner.Owner) is a
// candidate for that organization's sandboxes only, even when it is the least loaded
// and when runner_ids names it; another organization never sees it named. A platform
// runner (no owner) serves everyone.
func TestPlaceRunnerOwner(t *testing.T) {
	platform := used(rn("platform", nil), 3000, 6*gi, 8) // busy: the tenant's runner would win on load
	tenantB := owned(rn("b-runner", nil), "org-b")
	all := []Runner{platform, tenantB}

	for range 20 { // ties and load must never send org-a's sandbox to org-b's runner
		cands, err := Place(Request{Spec: spec("1", "1Gi"), Org: "org-a", Runners: all, Platform: policy.RunnerPlatform(nil)})
		if err != nil {
			t.Fatal(err)
		}
		if got := ids(cands); len(got) != 1 || got[0] != "platform" {
			t.Fatalf("org-a's candidates %v, want only the platform runner", got)
		}
	}
	// The owner's sandboxes go to its runner (least loaded first) and to platform runners.
	cands, err := Place(Request{Spec: spec("1", "1Gi"), Org: "org-b", Runners: all, Platform: policy.RunnerPlatform(nil)})
	if err != nil || strings.Join(ids(cands), ",") != "b-runner,platform" {
		t.Fatalf("org-b's candidates %v, %v; want b-runner then platform", ids(cands), err)
	}
	// No organization (a caller bug) is served by platform runners only.
	cands, err = Place(Request{Spec: spec("1", "1Gi"), Runners: all, Platform: policy.RunnerPlatform(nil)})
	if err != nil || strings.Join(ids(cands), ",") != "platform" {
		t.Fatalf("no organization: %v, %v; want the platform runner only", ids(cands), err)
	}

	// runner_ids naming another organization's runner: as an unknown runner, and the
	// answer names only the runners the caller may use.
	before := counters.Values()
	_, err = Place(Request{Spec: spec("1", "1Gi", "b-runner"), Org: "org-a", Runners: all, Platform: policy.RunnerPlatform(nil)})
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || apierr.Reason(err) != apierr.NoSuitableRunner {
		t.Fatalf("pinned to another organization's runner: %v, want FAILED_PRECONDITION %s", err, apierr.NoSuitableRunner)
	}
	if msg := err.Error(); !strings.Contains(msg, "available runners are [platform]") {
		t.Errorf("message %q: want the caller's runners only", msg)
	}
	for _, v := range apierr.Violations(err) {
		if strings.Contains(v.Field+v.Description, "org-b") {
			t.Errorf("violation %+v names the other organization", v)
		}
	}
	after := counters.Values()
	key := `cwsandbox_placement_rejections_total{constraint="` + ConstraintRunnerOwner + `"}`
	if after[key]-before[key] != 1 {
		t.Errorf("%s went up by %v, want 1", key, after[key]-before[key])
	}

	// Only other organizations' runners: refused, naming the constraint, not the runners.
	_, err = Place(Request{Spec: spec("1", "1Gi"), Org: "org-a", Runners: []Runner{tenantB, owned(rn("c-runner", nil), "org-c")}, Platform: policy.RunnerPlatform(nil)})
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || apierr.Reason(err) != apierr.NoSuitableRunner {
		t.Fatalf("only other organizations' runners: %v, want FAILED_PRECONDITION %s", err, apierr.NoSuitableRunner)
	}
	if !hasField(err, "sandbox.spec.runner_ids", ConstraintRunnerOwner) {
		t.Errorf("violations %v, want one naming %s", apierr.Violations(err), ConstraintRunnerOwner)
	}
	if msg := err.Error(); strings.Contains(msg, "b-runner") || strings.Contains(msg, "c-runner") {
		t.Errorf("message %q names other organizations' runners", msg)
	}
}

// A runner whose owner is not verified yet (not connected yet) takes nothing and is not
// named; a sandbox no other runner takes is told to retry, not refused for good.
func TestPlaceRunnerOwnerUnknown(t *testing.T) {
	unverified := rn("fresh", nil)
	unverified.OwnerUnknown = true
	for _, pins := range [][]string{nil, {"fresh"}} {
		_, err := Place(Request{Spec: spec("1", "1Gi", pins...), Org: "org-a", Runners: []Runner{unverified, owned(rn("b-runner", nil), "org-b")}, Platform: policy.RunnerPlatform(nil)})
		if connect.CodeOf(err) != connect.CodeUnavailable || apierr.Reason(err) != apierr.RunnerUnavailable || apierr.RetryInfo(err) == nil {
			t.Fatalf("pins %v: %v, want UNAVAILABLE %s with RetryInfo", pins, err, apierr.RunnerUnavailable)
		}
		if msg := err.Error(); strings.Contains(msg, "b-runner") {
			t.Errorf("message %q names another organization's runner", msg)
		}
	}
	// Pinned to another organization's runner beside it: as an unknown runner still.
	_, err := Place(Request{Spec: spec("1", "1Gi", "b-runner"), Org: "org-a", Runners: []Runner{unverified, owned(rn("b-runner", nil), "org-b")}, Platform: policy.RunnerPlatform(nil)})
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || apierr.Reason(err) != apierr.NoSuitableRunner {
		t.Fatalf("pinned to another organization's runner: %v, want FAILED_PRECONDITION %s", err, apierr.NoSuitableRunner)
	}
	cands, err := Place(Request{Spec: spec("1", "1Gi"), Org: "org-a", Runners: []Runner{unverified, rn("platform", nil)}, Platform: policy.RunnerPlatform(nil)})
	if err != nil || strings.Join(ids(cands), ",") != "platform" {
		t.Fatalf("beside a platform runner: %v, %v; want the platform runner only", ids(cands), err)
	}
}

func TestServes(t *testing.T) {
	for _, c := range []struct {
		owner, org string
		want       bool
	}{
		{"", "org-a", true},
		{"", "", true},
		{"org-a", "org-a", true},
		{"org-b", "org-a", false},
		{"org-b", "", false},
	} {
		if got := Serves(c.owner, c.org); got != c.want {
			t.Errorf("Serves(%q, %q) = %v, want %v", c.owner, c.org, got, c.want)
		}
	}
}

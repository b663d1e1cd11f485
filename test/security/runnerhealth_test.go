package security

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"
)

// runnerView is GET /v1/organizations/{org}/availableRunners/local as key sees it.
func runnerView(t *testing.T, d *Dev, key, org string) (bool, []string) {
	t.Helper()
	code, body := d.rest(t, key, "GET", "/v1/organizations/"+org+"/availableRunners/local", nil)
	var ar struct {
		Healthy bool     `json:"healthy"`
		Tags    []string `json:"tags"`
	}
	if err := json.Unmarshal(body, &ar); code != http.StatusOK || err != nil {
		t.Fatalf("discovery as %s: HTTP %d %s", org, code, body)
	}
	return ar.Healthy, ar.Tags
}

// TestRunnerHealthOneTenantCannotQuarantine: a tenant whose creates fail in a way that
// once looked like the runner's fault (an image on a registry that does not answer: its
// DNS name does not resolve) cannot degrade or quarantine the shared runner, for another
// tenant or even for itself: image pulls (like start errors the agent reports) are the
// caller's, and only the runner's own failures count (internal/gateway sandboxOutcome).
// Both tenants still see the runner healthy and create on it.
func TestRunnerHealthOneTenantCannotQuarantine(t *testing.T) {
	d := needDev(t)
	attacker, err := d.NewKey("org-health-attacker", "user")
	if err != nil {
		t.Fatal(err)
	}
	const failures = 8 // beyond the default quarantine threshold (6)
	for i := range failures {
		code, body, id := d.create(t, attacker, "registry.invalid/attack/unreachable:latest", nil)
		if code != http.StatusOK || id == "" {
			t.Fatalf("attacker create %d: HTTP %d %s", i, code, body)
		}
		deadline := time.Now().Add(90 * time.Second)
		for {
			code, body := d.rest(t, attacker, "GET", "/v1/sandboxes/"+id, nil) // the gateway judges the create when it sees it
			var sb sandboxJSON
			_ = json.Unmarshal(body, &sb)
			if code != http.StatusOK {
				t.Fatalf("get %s: HTTP %d %s", id, code, body)
			}
			if sb.Status.State == "STATE_FAILED" {
				break
			}
			if sb.Status.State == "STATE_RUNNING" || time.Now().After(deadline) {
				t.Fatalf("attacker sandbox %d: %s", i, body)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}

	// The attacker's failures did not count: it sees the runner healthy and creates on it.
	healthy, tags := runnerView(t, d, attacker, "org-health-attacker")
	if !healthy || strings.Contains(strings.Join(tags, " "), "sandboxd.health") {
		t.Errorf("attacker's view: healthy=%v tags=%v, want healthy without health tags", healthy, tags)
	}
	code, body, _ := d.create(t, attacker, "busybox:latest", nil)
	if code != http.StatusOK {
		t.Errorf("attacker's create after its failing pulls: HTTP %d %s", code, body)
	}
	// The victim sees a healthy runner, with no health tag, and creates on it.
	healthy, tags = runnerView(t, d, d.KeyA, "org-a")
	if !healthy || strings.Contains(strings.Join(tags, " "), "sandboxd.health") {
		t.Errorf("victim's view: healthy=%v tags=%v, want healthy without health tags", healthy, tags)
	}
	code, body, id := d.create(t, d.KeyA, "busybox:latest", nil)
	if code != http.StatusOK || id == "" {
		t.Fatalf("victim's create on the runner the attacker failed on: HTTP %d %s", code, body)
	}
	if state, body := d.wait(t, d.KeyA, id); state != "STATE_RUNNING" {
		t.Errorf("victim's sandbox: %s %s", state, body)
	}
}

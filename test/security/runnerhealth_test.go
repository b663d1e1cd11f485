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

// TestRunnerHealthCancelledCreatesDoNotCount: a tenant whose creates give up at once
// (a 1 ms deadline: the gateway answers DEADLINE_EXCEEDED while the runner still
// creates, and keeps judging the runner's answer by its own bound) cannot degrade or
// quarantine the shared runner, for itself or another tenant: the runner answered, so
// nothing counts (the sandboxes it accepted after the caller left are deleted).
func TestRunnerHealthCancelledCreatesDoNotCount(t *testing.T) {
	d := needDev(t)
	attacker, err := d.NewKey("org-health-canceller", "user")
	if err != nil {
		t.Fatal(err)
	}
	body := `{"sandbox":{"spec":{"containers":[{"image":"busybox:latest","command":"sleep","args":["600"]}],"maxLifetimeSeconds":300}}}`
	for i := range 8 { // beyond the default quarantine threshold (6)
		req, _ := http.NewRequest("POST", d.API+"/coreweave.sandbox.v1.SandboxService/CreateSandbox", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+attacker)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Connect-Protocol-Version", "1")
		req.Header.Set("Connect-Timeout-Ms", "1")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("create %d: %v", i, err)
		}
		var out struct {
			SandboxID string `json:"sandboxId"`
		}
		_ = json.NewDecoder(res.Body).Decode(&out)
		res.Body.Close()
		if out.SandboxID != "" { // the runner was faster than the deadline: a sandbox
			id := out.SandboxID
			t.Cleanup(func() { d.rest(t, attacker, "DELETE", "/v1/sandboxes/"+id, nil) })
		}
	}
	time.Sleep(time.Second) // the abandoned creates' answers arrive (judged in the background)
	for _, v := range []struct{ key, org string }{{attacker, "org-health-canceller"}, {d.KeyA, "org-a"}} {
		healthy, tags := runnerView(t, d, v.key, v.org)
		if !healthy || strings.Contains(strings.Join(tags, " "), "sandboxd.health") {
			t.Errorf("%s's view after cancelled creates: healthy=%v tags=%v, want healthy without health tags", v.org, healthy, tags)
		}
	}
	code, b, id := d.create(t, d.KeyA, "busybox:latest", nil)
	if code != http.StatusOK || id == "" {
		t.Fatalf("victim's create: HTTP %d %s", code, b)
	}
	if state, b := d.wait(t, d.KeyA, id); state != "STATE_RUNNING" {
		t.Errorf("victim's sandbox: %s %s", state, b)
	}
}

package security

import (
	"encoding/json"
	"net/http"
	"testing"
)

// quotaUsage is GET /v1/quotaUsage (org "" is the key's own) as key sees it.
func quotaUsage(t *testing.T, d *Dev, key, org string) (int, map[string]any) {
	t.Helper()
	path := "/v1/quotaUsage"
	if org != "" {
		path += "?orgId=" + org
	}
	st, b := rest(t, d, "GET", path, "Bearer "+key, nil)
	var out map[string]any
	_ = json.Unmarshal(b, &out)
	return st, out
}

// TestQuotaTenantCannotSetOrReadOthers: quotas are the platform operator's. An
// organization's own admin may not set its quota (nor another's), over REST; a key
// reads only its own organization's quota and usage; and one organization's sandboxes
// never count against another's quota (org-b at a quota of 0 is refused while org-a
// runs).
func TestQuotaTenantCannotSetOrReadOthers(t *testing.T) {
	d := needDev(t)
	tenantAdmin, err := d.NewKey("org-a", "admin")
	if err != nil {
		t.Fatal(err)
	}
	denied := func(what string, st int, b []byte) {
		t.Helper()
		var e apiError
		_ = json.Unmarshal(b, &e)
		if st != http.StatusForbidden || e.reason() != "CWSANDBOX_PERMISSION_DENIED" {
			t.Errorf("%s: HTTP %d %s, want 403 CWSANDBOX_PERMISSION_DENIED", what, st, b)
		}
	}
	for _, org := range []string{"org-a", "org-b", "default"} {
		st, b := rest(t, d, "PUT", "/v1/quotas/"+org, "Bearer "+tenantAdmin, []byte(`{"limits":{"maxSandboxes":"100000"}}`))
		denied("tenant admin sets "+org+"'s quota", st, b)
	}
	st, b := rest(t, d, "PUT", "/v1/quotas/org-a", "Bearer "+d.KeyA, []byte(`{"limits":{"maxSandboxes":"-1"}}`))
	denied("tenant user sets its quota", st, b)
	st, b = rest(t, d, "GET", "/v1/quotas/org-b", "Bearer "+d.KeyA, nil)
	denied("org-a reads org-b's quota", st, b)
	if st, _ := quotaUsage(t, d, d.KeyA, "org-b"); st != http.StatusForbidden {
		t.Errorf("org-a reads org-b's usage: HTTP %d, want 403", st)
	}

	// The platform's admin sets org-b's quota to 0 sandboxes (reset afterwards).
	st, b = rest(t, d, "PUT", "/v1/quotas/org-b", "Bearer "+d.Admin, []byte(`{"limits":{"maxSandboxes":"0"}}`))
	if st != http.StatusOK {
		t.Fatalf("platform admin sets org-b's quota: HTTP %d %s", st, b)
	}
	t.Cleanup(func() { rest(t, d, "PUT", "/v1/quotas/org-b", "Bearer "+d.Admin, []byte(`{"limits":{}}`)) })

	// org-a is not held by org-b's quota: its create is admitted (it need not run).
	st, b = rest(t, d, "POST", "/v1/sandboxes", "Bearer "+d.KeyA, []byte(`{"spec":{"containers":[{"image":"busybox:latest"}]}}`))
	var created struct {
		SandboxID string `json:"sandboxId"`
	}
	if err := json.Unmarshal(b, &created); st != http.StatusOK || err != nil || created.SandboxID == "" {
		t.Fatalf("org-a create while org-b is at quota 0: HTTP %d %s", st, b)
	}
	t.Cleanup(func() { rest(t, d, "DELETE", "/v1/sandboxes/"+created.SandboxID, "Bearer "+d.KeyA, nil) })
	st, b = rest(t, d, "POST", "/v1/sandboxes", "Bearer "+d.KeyB, []byte(`{"spec":{"containers":[{"image":"busybox:latest"}]}}`))
	var e apiError
	_ = json.Unmarshal(b, &e)
	if st != http.StatusTooManyRequests || e.reason() != "CWSANDBOX_QUOTA_EXCEEDED" {
		t.Errorf("org-b create at quota 0: HTTP %d %s, want 429 CWSANDBOX_QUOTA_EXCEEDED", st, b)
	}
	// org-b's usage shows none of org-a's sandboxes.
	st, u := quotaUsage(t, d, d.KeyB, "")
	if st != http.StatusOK || u["orgId"] != "org-b" || (u["sandboxes"] != nil && u["sandboxes"] != "0") {
		t.Errorf("org-b's usage: HTTP %d %v", st, u)
	}
	if st, u := quotaUsage(t, d, d.KeyA, ""); st != http.StatusOK || u["orgId"] != "org-a" {
		t.Errorf("org-a's usage: HTTP %d %v", st, u)
	}
}

package security

import (
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"unicode"
)

type auditPage struct {
	Events []struct {
		OrgID         string `json:"orgId"`
		KeyID         string `json:"keyId"`
		SourceAddress string `json:"sourceAddress"`
		RequestID     string `json:"requestId"`
		Method        string `json:"method"`
		Result        string `json:"result"`
		TargetID      string `json:"targetId"`
	} `json:"events"`
}

// TestAuditLogIsAdminsAndOwnOrgOnly: the audit log is read by admins only, each of its
// own organization (the platform's admins any); a caller cannot forge its source address
// with X-Forwarded-For (no trusted proxy) nor store an unprintable or huge x-request-id;
// filters are bounded.
func TestAuditLogIsAdminsAndOwnOrgOnly(t *testing.T) {
	d := needDev(t)
	adminA, err := d.NewKey("org-a", "admin")
	if err != nil {
		t.Fatal(err)
	}
	// org-b's user makes a refused admin write with forged headers: recorded for org-b.
	req, _ := http.NewRequest("PUT", d.API+"/v1/quotas/org-b", strings.NewReader(`{"limits":{}}`))
	req.Header.Set("Authorization", "Bearer "+d.KeyB)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Forwarded-For", "203.0.113.66")
	req.Header.Set("X-Request-Id", "\u00e9vil\tid")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("org-b user sets a quota: HTTP %d", resp.StatusCode)
	}
	// A long one is not kept either.
	req, _ = http.NewRequest("PUT", d.API+"/v1/quotas/org-b", strings.NewReader(`{"limits":{}}`))
	req.Header.Set("Authorization", "Bearer "+d.KeyB)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Request-Id", strings.Repeat("x", 4000))
	if resp, err = http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()

	// org-a's admin deletes a sandbox whose ID carries a terminal escape sequence and
	// a forged table row: recorded for org-a, escaped.
	forged := "x\x1b]52;c;Zm9v\x07\n2026-01-01T00:00:00Z\torg-b"
	fb, _ := json.Marshal(map[string]string{"sandboxId": forged, "requestId": "r\x1b[2J"})
	if st, b := rest(t, d, "POST", "/coreweave.sandbox.v1.SandboxService/DeleteSandbox", "Bearer "+adminA, fb); st == http.StatusOK {
		t.Fatalf("delete of a made-up sandbox: HTTP %d %s", st, b)
	}

	list := func(key, query string) (int, auditPage, []byte) {
		st, b := rest(t, d, "GET", "/v1/auditEvents"+query, "Bearer "+key, nil)
		var p auditPage
		_ = json.Unmarshal(b, &p)
		return st, p, b
	}
	denied := func(what string, st int, b []byte) {
		t.Helper()
		var e apiError
		_ = json.Unmarshal(b, &e)
		if st != http.StatusForbidden || e.reason() != "CWSANDBOX_PERMISSION_DENIED" {
			t.Errorf("%s: HTTP %d %s, want 403 CWSANDBOX_PERMISSION_DENIED", what, st, b)
		}
	}
	for name, key := range map[string]string{"org-a user": d.KeyA, "org-b user": d.KeyB} {
		st, _, b := list(key, "")
		denied(name+" reads the audit log", st, b)
	}
	for _, q := range []string{"?orgId=org-b", "?orgId=*", "?orgId=default"} {
		st, _, b := list(adminA, q)
		denied("org-a's admin asks "+q, st, b)
	}
	st, p, b := list(adminA, "?pageSize=1000")
	if st != http.StatusOK {
		t.Fatalf("org-a's admin reads its log: HTTP %d %s", st, b)
	}
	sawForged := false
	for _, e := range p.Events {
		if e.OrgID != "org-a" {
			t.Errorf("org-a's admin sees an event of %s: %+v", e.OrgID, e)
		}
		if strings.ContainsFunc(e.TargetID+e.RequestID, func(r rune) bool { return !unicode.IsPrint(r) }) {
			t.Errorf("an event holds a non-printable rune: %q %q", e.TargetID, e.RequestID)
		}
		sawForged = sawForged || strings.HasPrefix(e.TargetID, `x\x1b]52`)
	}
	if !sawForged {
		t.Errorf("org-a's admin does not see its own DeleteSandbox of %q in %d events", forged, len(p.Events))
	}
	st, p, b = list(d.Admin, "?orgId=org-b&method=SetQuota&pageSize=10")
	if st != http.StatusOK || len(p.Events) == 0 {
		t.Fatalf("the platform's admin reads org-b's log: HTTP %d %s", st, b)
	}
	for _, e := range p.Events {
		if e.Result != "PERMISSION_DENIED" || e.SourceAddress == "203.0.113.66" || strings.ContainsAny(e.RequestID, "\t\u00e9") || len(e.RequestID) > 128 {
			t.Errorf("org-b's refused write recorded as %+v", e)
		}
	}

	// Filters are bounded and checked.
	for _, q := range []string{"?pageSize=100000", "?method=" + url.QueryEscape("%' OR 1=1 --"), "?result=" + strings.Repeat("A", 5000), "?pageToken=" + strings.Repeat("z", 600)} {
		if st, _, b := list(adminA, q); st != http.StatusBadRequest {
			t.Errorf("filter %.40s: HTTP %d %s, want 400", q, st, b)
		}
	}
}

package security

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/console"
)

// consoleSession is a browser signed in to the web console with a key.
type consoleSession struct {
	d    *Dev
	c    *http.Client
	csrf string
}

func (d *Dev) consoleSignIn(t *testing.T, key string) *consoleSession {
	t.Helper()
	jar, _ := cookiejar.New(nil)
	s := &consoleSession{d: d, c: &http.Client{Jar: jar}}
	code, body := s.do(t, "POST", "/console/api/session", `{"apiKey":"`+key+`"}`, nil)
	if code != 200 {
		t.Fatalf("console sign-in: %d %s", code, body)
	}
	if strings.Contains(string(body), key) {
		t.Fatal("the console echoes the key")
	}
	var who console.Who
	if err := json.Unmarshal(body, &who); err != nil {
		t.Fatal(err)
	}
	s.csrf = who.CSRFToken
	return s
}

func (s *consoleSession) do(t *testing.T, method, path, body string, hdr map[string]string) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest(method, s.d.API+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	res, err := s.c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(res.Body, 1<<20))
	return res.StatusCode, b
}

func restReason(b []byte) string {
	var st struct {
		Details []struct {
			Reason string `json:"reason"`
		} `json:"details"`
	}
	_ = json.Unmarshal(b, &st)
	for _, d := range st.Details {
		if d.Reason != "" {
			return d.Reason
		}
	}
	return ""
}

// terminal opens the console's terminal on sandbox id, types input and returns what it
// printed (up to the exit or error message, or want, or 20 s) and the control messages.
func (s *consoleSession) terminal(t *testing.T, id, input, want string) (out string, ctl []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	u, _ := url.Parse(s.d.API)
	h := http.Header{"Origin": {s.d.API}}
	for _, c := range s.c.Jar.Cookies(&url.URL{Scheme: "http", Host: u.Host, Path: "/console/"}) {
		h.Add("Cookie", c.Name+"="+c.Value)
	}
	ws, res, err := websocket.Dial(ctx, "ws://"+u.Host+"/console/api/sandboxes/"+id+"/terminal", &websocket.DialOptions{HTTPHeader: h}) //nolint:bodyclose // the upgraded connection is ws
	if err != nil {
		code := 0
		if res != nil {
			code = res.StatusCode
		}
		return "", []string{"dial: " + err.Error() + " " + http.StatusText(code)}
	}
	defer ws.CloseNow()
	if input != "" {
		if err := ws.Write(ctx, websocket.MessageBinary, []byte(input)); err != nil {
			t.Fatal(err)
		}
	}
	var b strings.Builder
	for {
		typ, m, err := ws.Read(ctx)
		if err != nil {
			return b.String(), ctl
		}
		if typ == websocket.MessageText {
			ctl = append(ctl, string(m))
			continue
		}
		b.Write(m)
		if want != "" && strings.Contains(b.String(), want) {
			return b.String(), ctl
		}
	}
}

// TestConsoleTenancy attacks the web console: a session of org A cannot see, delete,
// read the logs of or open a terminal in org B's sandbox; writes need the CSRF token;
// forged and signed-out sessions are refused; cross-origin terminals are refused.
func TestConsoleTenancy(t *testing.T) {
	d := needDev(t)
	idB := runningSandbox(t, d.sandboxes(d.KeyB), "", nil)
	a, b := d.consoleSignIn(t, d.KeyA), d.consoleSignIn(t, d.KeyB)

	// B sees and uses its own sandbox through the console (the control).
	if code, body := b.do(t, "GET", "/console/api/v1/sandboxes/"+idB, "", nil); code != 200 {
		t.Fatalf("B gets its sandbox: %d %s", code, body)
	}
	if out, ctl := b.terminal(t, idB, "echo hello-$((40+2))\n", "hello-42"); !strings.Contains(out, "hello-42") {
		t.Fatalf("B's terminal: output %q, control %v", out, ctl)
	}

	// A sees none of it.
	if code, body := a.do(t, "GET", "/console/api/v1/sandboxes/"+idB, "", nil); code != 404 || restReason(body) != apierr.SandboxNotFound {
		t.Fatalf("A gets B's sandbox: %d %s", code, body)
	}
	if code, body := a.do(t, "GET", "/console/api/v1/sandboxes", "", nil); code != 200 || strings.Contains(string(body), idB) {
		t.Fatalf("A lists: %d %s", code, body)
	}
	if code, body := a.do(t, "GET", "/console/api/sandboxes/"+idB+"/logs?follow=0", "", nil); code != 404 || strings.Contains(string(body), "tick") {
		t.Fatalf("A reads B's logs: %d %s", code, body)
	}
	if out, ctl := a.terminal(t, idB, "echo pwned\n", "pwned"); out != "" || len(ctl) != 1 || !strings.Contains(ctl[0], apierr.SandboxNotFound) {
		t.Fatalf("A's terminal in B's sandbox: output %q, control %v", out, ctl)
	}
	if code, body := a.do(t, "DELETE", "/console/api/v1/sandboxes/"+idB, "", map[string]string{console.CSRFHeader: a.csrf}); code != 404 {
		t.Fatalf("A deletes B's sandbox: %d %s", code, body)
	}

	// Writes need the session's own CSRF token, from this origin.
	for name, hdr := range map[string]map[string]string{
		"no token":      nil,
		"A's token":     {console.CSRFHeader: a.csrf},
		"cross origin":  {console.CSRFHeader: b.csrf, "Origin": "http://evil.example"},
		"cross-site fe": {console.CSRFHeader: b.csrf, "Sec-Fetch-Site": "cross-site"},
	} {
		if code, body := b.do(t, "DELETE", "/console/api/v1/sandboxes/"+idB, "", hdr); code != 403 || restReason(body) != apierr.PermissionDenied {
			t.Fatalf("B deletes %s: %d %s", name, code, body)
		}
	}
	if code, body := b.do(t, "GET", "/console/api/v1/sandboxes/"+idB, "", nil); code != 200 || !strings.Contains(string(body), "STATE_RUNNING") {
		t.Fatalf("B's sandbox after refused deletes: %d %s", code, body)
	}

	// A cross-origin WebSocket (a page elsewhere with B's cookie) is refused.
	{
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		u, _ := url.Parse(d.API)
		h := http.Header{"Origin": {"http://evil.example"}}
		for _, c := range b.c.Jar.Cookies(&url.URL{Scheme: "http", Host: u.Host, Path: "/console/"}) {
			h.Add("Cookie", c.Name+"="+c.Value)
		}
		ws, res, err := websocket.Dial(ctx, "ws://"+u.Host+"/console/api/sandboxes/"+idB+"/terminal", &websocket.DialOptions{HTTPHeader: h}) //nolint:bodyclose // refused: coder/websocket closes the body of a failed handshake
		cancel()
		if err == nil {
			ws.CloseNow()
			t.Fatal("a cross-origin terminal was accepted")
		}
		if res == nil || res.StatusCode != 403 {
			t.Fatalf("cross-origin terminal: %v %v", res, err)
		}
	}

	// Forged and signed-out sessions are refused.
	jar, _ := cookiejar.New(nil)
	u, _ := url.Parse(d.API + "/console/")
	jar.SetCookies(u, []*http.Cookie{{Name: console.CookieName, Value: "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", Path: "/console"}})
	forged := &consoleSession{d: d, c: &http.Client{Jar: jar}}
	if code, _ := forged.do(t, "GET", "/console/api/v1/sandboxes/"+idB, "", nil); code != 401 {
		t.Fatalf("forged session: %d", code)
	}
	if code, _ := b.do(t, "DELETE", "/console/api/session", "", map[string]string{console.CSRFHeader: b.csrf}); code != 204 {
		t.Fatalf("sign-out: %d", code)
	}
	// The jar dropped the cookie (Max-Age<0): replay the old one by hand.
	b2 := d.consoleSignIn(t, d.KeyB)
	old := b2.c.Jar.Cookies(u)
	_, _ = b2.do(t, "DELETE", "/console/api/session", "", map[string]string{console.CSRFHeader: b2.csrf})
	jar2, _ := cookiejar.New(nil)
	jar2.SetCookies(u, old)
	stale := &consoleSession{d: d, c: &http.Client{Jar: jar2}}
	if code, _ := stale.do(t, "GET", "/console/api/v1/sandboxes/"+idB, "", nil); code != 401 {
		t.Fatalf("signed-out session replayed: %d", code)
	}
}

// TestConsolePlantedSessionCookie attacks the console's session cookie: sandbox
// JavaScript on an endpoint subdomain plants the attacker's own console session in the
// victim's browser, with a longer Path so the browser sends it before the victim's
// (session fixation: the victim would then type into the attacker's sandboxes). A request
// with two session cookies is refused, picks neither and ends both; over TLS the cookie is a
// __Host- one, which a subdomain cannot set at all (internal/console tests that).
func TestConsolePlantedSessionCookie(t *testing.T) {
	d := needDev(t)
	attacker := d.consoleSignIn(t, d.KeyA)
	victim := d.consoleSignIn(t, d.KeyB)
	u, _ := url.Parse(d.API + "/console/")
	var planted *http.Cookie
	for _, c := range attacker.c.Jar.Cookies(u) {
		if c.Name == console.CookieName {
			planted = &http.Cookie{Name: c.Name, Value: c.Value, Path: "/console/api/"}
		}
	}
	if planted == nil {
		t.Fatal("the attacker has no session cookie")
	}
	victim.c.Jar.SetCookies(u, []*http.Cookie{planted})
	if n := len(victim.c.Jar.Cookies(&url.URL{Scheme: "http", Host: u.Host, Path: "/console/api/v1/sandboxes"})); n != 2 {
		t.Fatalf("the victim's browser sends %d session cookies, want both", n)
	}
	for _, p := range []string{"/console/api/session", "/console/api/v1/sandboxes"} {
		code, body := victim.do(t, "GET", p, "", nil)
		if code != 401 || restReason(body) != apierr.Unauthenticated || strings.Contains(string(body), "org") {
			t.Fatalf("GET %s with a planted session cookie: %d %s", p, code, body)
		}
	}
	if out, ctl := victim.terminal(t, "sb-any", "", ""); out != "" || len(ctl) != 1 || !strings.Contains(ctl[0], "Unauthorized") {
		t.Fatalf("terminal with a planted session cookie: output %q, control %v", out, ctl)
	}
	// The victim was told to forget its own cookie, and the planted session ended: left
	// alone in the victim's browser it is no session at all (the requests above after the
	// first carried it alone).
	for _, c := range victim.c.Jar.Cookies(u) {
		if c.Value != planted.Value {
			t.Fatalf("the victim's browser keeps its session cookie after the refusal: %v", c)
		}
	}
	if code, body := attacker.do(t, "GET", "/console/api/session", "", nil); code != 401 {
		t.Fatalf("the planted session lives on: %d %s", code, body)
	}
}

// TestConsolePagesTenancy attacks the calls the console's pages make (files, API keys,
// templates, audit, quotas, template and volume edits, snapshots), all through its proxy:
// an admin session of org A can neither read, write nor list the files of org B's
// sandbox, nor see, revoke or use org B's keys, templates or audit events, nor edit B's
// template or volume, snapshot B's sandbox, list, get, delete or restore B's snapshot,
// read B's quota or usage, or set any quota (B's or its own).
func TestConsolePagesTenancy(t *testing.T) {
	d := needDev(t)
	idB := runningSandbox(t, d.sandboxes(d.KeyB), "", nil)
	adminA, err := d.NewKey("org-a", "admin")
	if err != nil {
		t.Fatal(err)
	}
	adminB, err := d.NewKey("org-b", "admin")
	if err != nil {
		t.Fatal(err)
	}
	a, b := d.consoleSignIn(t, adminA), d.consoleSignIn(t, adminB)
	wa := map[string]string{console.CSRFHeader: a.csrf}
	wb := map[string]string{console.CSRFHeader: b.csrf}
	keyID := func(k string) string { return strings.Split(k, "_")[1] }

	// B's own: a file in its sandbox, a template (the controls).
	if code, body := b.do(t, "POST", "/console/api/v1/sandboxes/"+idB+":writeFile", `{"path":"/tmp/secret-b","content":"c2VjcmV0LW9mLWI="}`, wb); code != 200 {
		t.Fatalf("B writes its file: %d %s", code, body)
	}
	code, body := b.do(t, "POST", "/console/api/v1/sandboxTemplates", `{"displayName":"tmpl-b","spec":{"containers":[{"name":"main","image":"busybox"}]}}`, wb)
	if code != 200 {
		t.Fatalf("B creates a template: %d %s", code, body)
	}
	var tmpl struct {
		ID string `json:"sandboxTemplateId"`
	}
	_ = json.Unmarshal(body, &tmpl)
	if code, body := b.do(t, "GET", "/console/api/v1/sandbox/apiKeys", "", nil); code != 200 || !strings.Contains(string(body), keyID(d.KeyB)) {
		t.Fatalf("B lists its keys: %d %s", code, body)
	}

	// Files: the file browser's exec (listing), ReadFile (download), WriteFile (upload).
	for name, c := range map[string]struct{ method, path, body string }{
		"list":     {"POST", ":exec", `{"command":["find","/tmp/","-mindepth","1","-maxdepth","1"]}`},
		"download": {"GET", ":readFile?path=/tmp/secret-b", ""},
		"upload":   {"POST", ":writeFile", `{"path":"/tmp/secret-b","content":"cHduZWQ="}`},
	} {
		code, body := a.do(t, c.method, "/console/api/v1/sandboxes/"+idB+c.path, c.body, wa)
		if code != 404 || restReason(body) != apierr.SandboxNotFound || strings.Contains(string(body), "secret") {
			t.Fatalf("A's %s in B's sandbox: %d %s", name, code, body)
		}
	}
	if code, body := b.do(t, "GET", "/console/api/v1/sandboxes/"+idB+":readFile?path=/tmp/secret-b", "", nil); code != 200 || !strings.Contains(string(body), "c2VjcmV0LW9mLWI=") {
		t.Fatalf("B's file after A's upload: %d %s", code, body)
	}

	// API keys: A lists its own only, and cannot revoke B's.
	if code, body := a.do(t, "GET", "/console/api/v1/sandbox/apiKeys?pageSize=1000", "", nil); code != 200 ||
		strings.Contains(string(body), keyID(d.KeyB)) || strings.Contains(string(body), keyID(adminB)) || !strings.Contains(string(body), keyID(adminA)) {
		t.Fatalf("A lists keys: %d %s", code, body)
	}
	if code, body := a.do(t, "POST", "/console/api/v1/sandbox/apiKeys/"+keyID(d.KeyB)+":revoke", `{}`, wa); code != 404 || restReason(body) != apierr.APIKeyNotFound {
		t.Fatalf("A revokes B's key: %d %s", code, body)
	}
	if code, body := d.rest(t, d.KeyB, "GET", "/v1/sandboxes/"+idB, nil); code != 200 {
		t.Fatalf("B's key after A's revoke: %d %s", code, body)
	}

	// Templates: A sees none of B's and cannot delete it.
	if code, body := a.do(t, "GET", "/console/api/v1/sandboxTemplates", "", nil); code != 200 || strings.Contains(string(body), tmpl.ID) {
		t.Fatalf("A lists templates: %d %s", code, body)
	}
	if code, body := a.do(t, "DELETE", "/console/api/v1/sandboxTemplates/"+tmpl.ID, "", wa); code != 404 || restReason(body) != apierr.TemplateNotFound {
		t.Fatalf("A deletes B's template: %d %s", code, body)
	}

	// Template edits: A's update of B's template (by ID and by name) is NOT_FOUND and
	// changes nothing.
	for _, ref := range []string{tmpl.ID, "tmpl-b"} {
		code, body := a.do(t, "PATCH", "/console/api/v1/sandboxTemplates/"+ref+"?updateMask=displayName,spec",
			`{"displayName":"pwned","spec":{"containers":[{"name":"main","image":"evil"}]},"revision":"1"}`, wa)
		if code != 404 || restReason(body) != apierr.TemplateNotFound {
			t.Fatalf("A edits B's template %s: %d %s", ref, code, body)
		}
	}
	if code, body := b.do(t, "GET", "/console/api/v1/sandboxTemplates/"+tmpl.ID, "", nil); code != 200 ||
		!strings.Contains(string(body), `"tmpl-b"`) || strings.Contains(string(body), "evil") || !strings.Contains(string(body), `"revision":"1"`) {
		t.Fatalf("B's template after A's edit: %d %s", code, body)
	}

	// Volume edits: A cannot see, describe or grow B's volume.
	code, body = b.do(t, "GET", "/console/api/v1/availableRunners", "", nil)
	var runners struct {
		Runners []struct {
			RunnerID string `json:"runnerId"`
		} `json:"runners"`
	}
	if err := json.Unmarshal(body, &runners); code != 200 || err != nil || len(runners.Runners) == 0 {
		t.Fatalf("B's runners: %d %s", code, body)
	}
	code, body = b.do(t, "POST", "/console/api/v1/volumes", `{"volumeId":"console-b","spec":{"pvc":{"runnerId":"`+runners.Runners[0].RunnerID+
		`","namespace":"default","claimName":"console-b"},"size":"16Mi","description":"b's own"}}`, wb)
	var vol struct {
		ID string `json:"volumeId"`
	}
	if err := json.Unmarshal(body, &vol); code != 200 || err != nil || vol.ID == "" {
		t.Fatalf("B creates a volume: %d %s", code, body)
	}
	t.Cleanup(func() { d.rest(t, adminB, "DELETE", "/v1/volumes/"+vol.ID+"?force=true", nil) })
	if code, body := a.do(t, "GET", "/console/api/v1/volumes", "", nil); code != 200 || strings.Contains(string(body), vol.ID) {
		t.Fatalf("A lists volumes: %d %s", code, body)
	}
	for _, mask := range []string{"spec.description", "spec.size", "spec.description,spec.size"} {
		code, body := a.do(t, "PATCH", "/console/api/v1/volumes/"+vol.ID+"?updateMask="+mask, `{"spec":{"description":"pwned","size":"1Gi"}}`, wa)
		if code != 404 || restReason(body) != apierr.VolumeNotFound {
			t.Fatalf("A edits B's volume (%s): %d %s", mask, code, body)
		}
	}
	if code, body := b.do(t, "GET", "/console/api/v1/volumes/"+vol.ID, "", nil); code != 200 ||
		strings.Contains(string(body), "pwned") || strings.Contains(string(body), `"1Gi"`) {
		t.Fatalf("B's volume after A's edits: %d %s", code, body)
	}

	// Snapshots: A cannot snapshot B's sandbox, nor list its snapshots by its ID.
	code, body = a.do(t, "POST", "/console/api/v1/sandboxes/"+idB+":snapshot", `{"scratchVolumeName":"workspace"}`, wa)
	if code != 404 || restReason(body) != apierr.SandboxNotFound {
		t.Fatalf("A snapshots B's sandbox: %d %s", code, body)
	}
	if code, body := a.do(t, "GET", "/console/api/v1/fileSystemSnapshots?sourceSandboxId="+idB, "", nil); code == 200 && strings.Contains(string(body), idB) {
		t.Fatalf("A lists B's sandbox's snapshots: %d %s", code, body)
	}

	// B takes a real snapshot through its own session and waits for it READY; A's session
	// does not list it (in full or by B's sandbox), and gets NOT_FOUND getting, deleting or
	// restoring it (a new sandbox of A's whose scratch volume restores it) by its ID. B's
	// snapshot is still there, READY, after it all.
	bCall := func(t *testing.T, method, path, body string) (int, []byte) {
		t.Helper()
		return b.do(t, method, "/console/api"+path, body, wb)
	}
	sbSnap, snapB := readySnapshot(t, bCall)
	for _, q := range []string{"?pageSize=1000", "?pageSize=1000&sourceSandboxId=" + sbSnap} {
		if code, body := a.do(t, "GET", "/console/api/v1/fileSystemSnapshots"+q, "", nil); code != 200 ||
			strings.Contains(string(body), snapB) || strings.Contains(string(body), sbSnap) {
			t.Fatalf("A lists snapshots (%s): %d %s", q, code, body)
		}
	}
	if code, body := a.do(t, "GET", "/console/api/v1/fileSystemSnapshots/"+snapB, "", nil); code != 404 || restReason(body) != apierr.FSSNotFound {
		t.Fatalf("A gets B's snapshot: %d %s", code, body)
	}
	if code, body := a.do(t, "DELETE", "/console/api/v1/fileSystemSnapshots/"+snapB, "", wa); code != 404 || restReason(body) != apierr.FSSNotFound {
		t.Fatalf("A deletes B's snapshot: %d %s", code, body)
	}
	if code, body := a.do(t, "POST", "/console/api/v1/sandboxes", restoreSpec(snapB), wa); code != 404 || restReason(body) != apierr.FSSNotFound {
		t.Fatalf("A restores B's snapshot: %d %s", code, body)
	}
	if code, body := bCall(t, "GET", "/v1/fileSystemSnapshots/"+snapB, ""); code != 200 || !strings.Contains(string(body), `"SNAPSHOT_STATE_READY"`) {
		t.Fatalf("B's snapshot after A's attempts: %d %s", code, body)
	}

	// Audit: B's events (its template create) are not in A's log, even asked by B's key ID.
	if code, body := b.do(t, "GET", "/console/api/v1/auditEvents?method=CreateSandboxTemplate", "", nil); code != 200 || !strings.Contains(string(body), tmpl.ID) {
		t.Fatalf("B's audit log: %d %s", code, body)
	}
	for _, q := range []string{"", "?keyId=" + keyID(adminB), "?orgId=org-b"} {
		code, body := a.do(t, "GET", "/console/api/v1/auditEvents"+q, "", nil)
		// (A's own refused delete of B's template is in A's log: its own call.)
		if strings.Contains(string(body), "template.create") || strings.Contains(string(body), keyID(adminB)) ||
			strings.Contains(string(body), `"org-b"`) || (code != 200 && restReason(body) != apierr.PermissionDenied) {
			t.Fatalf("A's audit log%s: %d %s", q, code, body)
		}
	}

	// Quotas (after the audit checks: A's own refused attempts name org-b in A's log):
	// A reads its own usage only; it sets no quota, B's or its own.
	if code, body := a.do(t, "GET", "/console/api/v1/quotaUsage", "", nil); code != 200 || !strings.Contains(string(body), `"org-a"`) {
		t.Fatalf("A's usage: %d %s", code, body)
	}
	quotaOf := func(org string) string {
		code, body := d.rest(t, d.Admin, "GET", "/v1/quotas/"+org, nil)
		if code != 200 {
			t.Fatalf("%s's quota: %d %s", org, code, body)
		}
		return string(body)
	}
	beforeA, beforeB := quotaOf("org-a"), quotaOf("org-b")
	for name, c := range map[string]struct{ method, path, body string }{
		"B's quota":     {"GET", "/console/api/v1/quotas/org-b", ""},
		"B's usage":     {"GET", "/console/api/v1/quotaUsage?orgId=org-b", ""},
		"set B's quota": {"PUT", "/console/api/v1/quotas/org-b", `{"limits":{"maxSandboxes":"0"}}`},
		"set its own":   {"PUT", "/console/api/v1/quotas/org-a", `{"limits":{"maxSandboxes":"-1"}}`},
	} {
		code, body := a.do(t, c.method, c.path, c.body, wa)
		if code != 403 || restReason(body) != apierr.PermissionDenied {
			t.Fatalf("A's %s: %d %s", name, code, body)
		}
	}
	if a, b := quotaOf("org-a"), quotaOf("org-b"); a != beforeA || b != beforeB {
		t.Fatalf("the quotas after A's attempts: org-a %s (was %s), org-b %s (was %s)", a, beforeA, b, beforeB)
	}
}

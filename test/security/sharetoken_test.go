package security

import (
	"encoding/json"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/sandboxd/sandboxd/internal/edge"
)

// Endpoint share tokens (issue 16 §3): the token of an HTTPS SHARE_TOKEN endpoint opens
// that sandbox's endpoints only, never reaches its workload, is in the create response
// only (a replay of the request_id gives it again, nothing else does), and is kept
// nowhere: not in the store, the runner's state, nor the log.

// shareGet sends one HTTP/1.1 GET for target on host through the edge with the extra
// header lines, and returns the status and the body.
func shareGet(t *testing.T, d *Dev, host, target, header string) (int, string) {
	t.Helper()
	c := dialEdge(t, d, host)
	defer c.c.Close()
	c.send("GET " + target + " HTTP/1.1\r\nHost: " + host + "\r\n" + header + "\r\n")
	res, body := c.read(http.MethodGet) //nolint:bodyclose // read closes the body
	return res.StatusCode, body
}

func TestShareTokenOfAnotherSandboxRefused(t *testing.T) {
	d := needDev(t)
	a, a2 := echoSandbox(t, d, d.KeyA, ""), echoSandbox(t, d, d.KeyA, "")
	b := echoSandbox(t, d, d.KeyB, "") // another organization's
	for _, box := range []echoBox{a, a2, b} {
		if len(box.Token) < 22 {
			t.Fatalf("sandbox %s: share token %q, want at least 128 bits", box.ID, box.Token)
		}
		if code, body := shareGet(t, d, box.Host, "/own", edge.ShareTokenHeader+": "+box.Token+"\r\n"); code != http.StatusOK {
			t.Fatalf("sandbox %s with its own token: %d %q", box.ID, code, body)
		}
	}
	for _, tc := range []struct {
		name      string
		host, tok string
	}{
		{"a sandbox of the same organization's token", a.Host, a2.Token},
		{"another organization's sandbox's token", a.Host, b.Token},
		{"org A's token on org B's sandbox", b.Host, a.Token},
		{"a token with a byte changed", a.Host, a.Token[:len(a.Token)-1] + flip(a.Token[len(a.Token)-1])},
		{"the token's hash", a.Host, edge.ShareTokenHash(a.Token)},
	} {
		if code, body := shareGet(t, d, tc.host, "/x", edge.ShareTokenHeader+": "+tc.tok+"\r\n"); code != http.StatusUnauthorized {
			t.Errorf("%s in the header: %d %q, want 401", tc.name, code, body)
		}
		q := url.Values{edge.ShareTokenParam: {tc.tok}}.Encode()
		if code, body := shareGet(t, d, tc.host, "/x?"+q, ""); code != http.StatusUnauthorized {
			t.Errorf("%s in the query: %d %q, want 401", tc.name, code, body)
		}
	}
	// A valid API key does not make a wrong token pass.
	if code, _ := shareGet(t, d, a.Host, "/x", "Authorization: Bearer "+d.KeyA+"\r\n"+edge.ShareTokenHeader+": "+b.Token+"\r\n"); code != http.StatusUnauthorized {
		t.Errorf("org A's key with org B's token: %d, want 401", code)
	}
}

// filledToken is a JSON endpointShareToken with a value (the REST API writes empty fields).
var filledToken = regexp.MustCompile(`"endpointShareToken":\s*"[^"]`)

func flip(c byte) string {
	if c == 'A' {
		return "B"
	}
	return "A"
}

func TestShareTokenNeverReachesTheWorkload(t *testing.T) {
	d := needDev(t)
	box := echoSandbox(t, d, d.KeyA, "")
	tok := box.Token
	q := url.QueryEscape(tok)
	for _, tc := range []struct {
		name, target, header, wantPath string
	}{
		{"header", "/h?keep=1", edge.ShareTokenHeader + ": " + tok + "\r\n", "/h?keep=1"},
		{"header in lower case", "/h", "x-sandbox-share-token: " + tok + "\r\n", "/h"},
		{"query parameter", "/q?a=1&" + edge.ShareTokenParam + "=" + q + "&b=2", "", "/q?a=1&b=2"},
		{"query parameter, name escaped", "/q?sandbox%5Fshare%5Ftoken=" + q, "", "/q"},
		{"query parameter twice", "/q?" + edge.ShareTokenParam + "=" + q + "&" + edge.ShareTokenParam + "=" + q, "", "/q"},
		{"header and query parameter", "/q?" + edge.ShareTokenParam + "=" + q, edge.ShareTokenHeader + ": " + tok + "\r\n", "/q"},
		{"an API key, with the token in the query as well", "/k?" + edge.ShareTokenParam + "=" + q + "&z",
			"Authorization: Bearer " + d.KeyA + "\r\n" + edge.ShareTokenHeader + ": " + tok + "\r\n", "/k?z"},
	} {
		code, body := shareGet(t, d, box.Host, tc.target, tc.header)
		if code != http.StatusOK {
			t.Errorf("%s: %d %q", tc.name, code, body)
			continue
		}
		var e echoed
		if err := json.Unmarshal([]byte(body), &e); err != nil {
			t.Fatalf("%s: %q: %v", tc.name, body, err)
		}
		if e.Path != tc.wantPath {
			t.Errorf("%s: the workload got %q, want %q", tc.name, e.Path, tc.wantPath)
		}
		if strings.Contains(body, tok) || strings.Contains(body, q) || strings.Contains(strings.ToLower(body), "share-token") ||
			strings.Contains(body, "share_token") || strings.Contains(body, d.KeyA) {
			t.Errorf("%s: a credential reached the workload: %s", tc.name, body)
		}
	}
	// A browser gets a session and a redirect to the URL without the token.
	code, body := shareGet(t, d, box.Host, "/page?x=1&"+edge.ShareTokenParam+"="+q, "Accept: text/html\r\n")
	if code != http.StatusSeeOther || strings.Contains(body, tok) {
		t.Errorf("a page with the token in its query: %d %q, want 303 without the token", code, body)
	}
}

func TestShareTokenOnlyInTheCreateResponse(t *testing.T) {
	d := needDev(t)
	const rid = "6f1c2a9e-16a3-4c3b-9d1e-5a0b7c2d3e4f"
	first := createEcho(t, d, d.KeyA, rid)
	if first.Token == "" || !strings.Contains(string(first.Create), "endpointShareToken") {
		t.Fatalf("the create response has no share token: %s", first.Create)
	}
	replay := createEcho(t, d, d.KeyA, rid)
	if replay.ID != first.ID || replay.Token != first.Token {
		t.Errorf("a replay of request_id %s got sandbox %s (token equal: %v), want %s and the same token", rid, replay.ID, replay.Token == first.Token, first.ID)
	}
	other := createEcho(t, d, d.KeyA, "6f1c2a9e-16a3-4c3b-9d1e-5a0b7c2d3e50")
	if other.ID == first.ID || other.Token == "" || other.Token == first.Token {
		t.Errorf("another request_id got sandbox %s with token equal: %v; want a new sandbox with its own token", other.ID, other.Token == first.Token)
	}
	// Another organization replaying the request_id gets a sandbox of its own.
	if b := createEcho(t, d, d.KeyB, rid); b.ID == first.ID || b.Token == first.Token {
		t.Errorf("org B's create with org A's request_id got org A's sandbox or token")
	}
	tokens := []string{first.Token, other.Token}
	leaks := func(what string, b []byte) {
		t.Helper()
		for _, tok := range tokens {
			if strings.Contains(string(b), tok) || strings.Contains(string(b), url.QueryEscape(tok)) {
				t.Errorf("%s carries a share token", what)
			}
		}
	}
	for _, p := range []string{"/v1/sandboxes/" + first.ID, "/v1/sandboxes", "/v1/sandboxes?show_terminated=true"} {
		code, b := d.rest(t, d.KeyA, http.MethodGet, p, nil)
		if code != http.StatusOK {
			t.Fatalf("GET %s: %d %s", p, code, b)
		}
		leaks("GET "+p, b)
		if m := filledToken.Find(b); m != nil {
			t.Errorf("GET %s fills endpointShareToken: %s", p, m)
		}
	}
	code, b := d.rest(t, d.KeyA, http.MethodDelete, "/v1/sandboxes/"+first.ID, nil)
	if code != http.StatusOK {
		t.Fatalf("delete: %d %s", code, b)
	}
	leaks("the delete response", b)
	// Errors about the sandbox do not echo it either.
	_, b = d.rest(t, d.KeyB, http.MethodGet, "/v1/sandboxes/"+first.ID, nil)
	leaks("another organization's GET", b)

	// Nothing kept on disk has it: the store, the runner's state, the edge's keys, the log.
	log, _ := os.ReadFile(d.Log)
	leaks("the sandboxd log", log)
	var root syscall.Stat_t
	if err := syscall.Stat(d.DataDir, &root); err != nil {
		t.Fatal(err)
	}
	files := 0
	_ = filepath.WalkDir(d.DataDir, func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			return nil //nolint:nilerr // a file that went away meanwhile
		}
		if e.IsDir() {
			// Image layers and sandboxes' root filesystems and disks are the workloads'
			// files, and mounts are other filesystems: the platform's state is elsewhere.
			var st syscall.Stat_t
			if n := e.Name(); n == "images" || n == "bundle" || n == "upper" || n == "work" || strings.HasPrefix(n, ".") && path != d.DataDir ||
				syscall.Stat(path, &st) != nil || st.Dev != root.Dev {
				return filepath.SkipDir
			}
			return nil
		}
		if info, err := e.Info(); err != nil || !info.Mode().IsRegular() || info.Size() > 64<<20 {
			return nil
		}
		if b, err := os.ReadFile(path); err == nil {
			files++
			leaks(path, b)
		}
		return nil
	})
	if files < 3 {
		t.Errorf("read only %d files of the data dir", files)
	}
}

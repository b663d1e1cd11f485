package security

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestBuildAPI attacks BuildService over REST on a running `sandboxd dev`: a user key
// cannot start or cancel a build, a repository outside the organization's namespace and a
// context over the bound are refused naming the field, and another organization's admin
// can neither read, follow, list nor cancel a build.
func TestBuildAPI(t *testing.T) {
	d := needDev(t)
	adminA, err := d.NewKey("org-a", "admin")
	if err != nil {
		t.Fatal(err)
	}
	adminB, err := d.NewKey("org-b", "admin")
	if err != nil {
		t.Fatal(err)
	}
	start := func(key string, body map[string]any) (int, map[string]any) {
		t.Helper()
		code, b := d.rest(t, key, "POST", "/v1/builds", body)
		var out map[string]any
		_ = json.Unmarshal(b, &out)
		return code, out
	}
	small := []byte("not an archive, refused by the builder's agent at the latest")
	if code, out := start(d.KeyA, map[string]any{"repository": "x", "context": small}); code != http.StatusForbidden {
		t.Fatalf("user key starts a build: %d %v", code, out)
	}
	for _, repo := range []string{"../org-b/x", "org-b/../../x", "/x", "X:../y"} {
		code, out := start(adminA, map[string]any{"repository": repo, "context": small})
		if code != http.StatusBadRequest || !strings.Contains(string(mustJSON(out)), `"field":"repository"`) {
			t.Errorf("repository %q: %d %v", repo, code, out)
		}
	}
	big := make([]byte, 64<<20+1)
	if code, out := start(adminA, map[string]any{"repository": "x", "context": big}); code != http.StatusBadRequest || !strings.Contains(string(mustJSON(out)), `"field":"context"`) {
		t.Errorf("context over 64 MiB: %d %.300v", code, out)
	}

	code, out := start(adminA, map[string]any{"repository": "x", "context": small})
	b, _ := out["build"].(map[string]any)
	if code != http.StatusOK || b["buildId"] == nil {
		t.Fatalf("start: %d %v", code, out)
	}
	id := b["buildId"].(string)
	for _, c := range []struct{ method, path string }{
		{"GET", "/v1/builds/" + id}, {"GET", "/v1/builds/" + id + "/logs"}, {"POST", "/v1/builds/" + id + ":cancel"},
	} {
		var body any
		if c.method == "POST" {
			body = map[string]any{}
		}
		if code, b := d.rest(t, adminB, c.method, c.path, body); code != http.StatusNotFound || !strings.Contains(string(b), "CWSANDBOX_BUILD_NOT_FOUND") {
			t.Errorf("org-b %s %s: %d %s", c.method, c.path, code, b)
		}
	}
	if code, b := d.rest(t, adminB, "GET", "/v1/builds", nil); code != http.StatusOK || strings.Contains(string(b), id) {
		t.Errorf("org-b lists: %d %s", code, b)
	}
	if code, b := d.rest(t, d.KeyA, "POST", "/v1/builds/"+id+":cancel", map[string]any{}); code != http.StatusForbidden {
		t.Errorf("user key cancels: %d %s", code, b)
	}
	// The build ends (it fails in the builder, or no runner builds here): org-a reads it.
	deadline := time.Now().Add(2 * time.Minute)
	for {
		code, b := d.rest(t, d.KeyA, "GET", "/v1/builds/"+id, nil)
		if code != http.StatusOK {
			t.Fatalf("org-a reads its build: %d %s", code, b)
		}
		if !strings.Contains(string(b), "BUILD_STATE_QUEUED") && !strings.Contains(string(b), "BUILD_STATE_RUNNING") {
			if strings.Contains(string(b), "BUILD_STATE_SUCCEEDED") {
				t.Fatalf("a garbage context built: %s", b)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("build still unfinished: %s", b)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func mustJSON(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}

package security

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestBuildContextTraversal (issue 22): a Compose build context sent in
// CreateSandboxFromFile.build_contexts whose tar tries to leave the context — a "../"
// entry, an absolute name, a file written through a symlink to a host directory, a hard
// link to a host file — is refused before anything is built, naming
// build_contexts[<service>] and the entry; no file appears on the host and the
// organization has no build.
func TestBuildContextTraversal(t *testing.T) {
	d := needDev(t)
	org := fmt.Sprintf("org-ctx-%d", os.Getpid())
	user, err := d.NewKey(org, "user")
	if err != nil {
		t.Fatal(err)
	}
	admin, err := d.NewKey(org, "admin")
	if err != nil {
		t.Fatal(err)
	}
	hostDir := t.TempDir()
	escape := filepath.Join(hostDir, "escaped")
	up := strings.Repeat("../", 16)
	type entry struct {
		typ        byte
		name, link string
	}
	for _, tc := range []struct {
		name  string
		entry entry
		also  []entry
		gz    bool
	}{
		{"dot-dot", entry{tar.TypeReg, up + strings.TrimPrefix(escape, "/"), ""}, nil, false},
		{"dot-dot gzip", entry{tar.TypeReg, "a/" + up + strings.TrimPrefix(escape, "/"), ""}, nil, true},
		{"absolute", entry{tar.TypeReg, escape, ""}, nil, false},
		{"through a symlink", entry{tar.TypeReg, "l/escaped", ""}, []entry{{tar.TypeSymlink, "l", hostDir}}, false},
		{"hard link", entry{tar.TypeLink, "hardlink", "/etc/shadow"}, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			tw := tar.NewWriter(&buf)
			write := func(e entry, data string) {
				h := &tar.Header{Typeflag: e.typ, Name: e.name, Linkname: e.link, Mode: 0o644, Format: tar.FormatPAX}
				if e.typ == tar.TypeReg {
					h.Size = int64(len(data))
				}
				if err := tw.WriteHeader(h); err != nil {
					t.Fatal(err)
				}
				if h.Size > 0 {
					_, _ = tw.Write([]byte(data))
				}
			}
			write(entry{tar.TypeReg, "Dockerfile", ""}, "FROM busybox\nCOPY . /ctx\n")
			for _, e := range tc.also {
				write(e, "")
			}
			write(tc.entry, "escaped from the build context\n")
			if err := tw.Close(); err != nil {
				t.Fatal(err)
			}
			ctxBytes := buf.Bytes()
			if tc.gz {
				var z bytes.Buffer
				zw := gzip.NewWriter(&z)
				_, _ = zw.Write(ctxBytes)
				_ = zw.Close()
				ctxBytes = z.Bytes()
			}
			code, body := d.rest(t, user, "POST", "/v1/sandboxes:createFromFile", map[string]any{
				"type":          "SANDBOX_FILE_TYPE_COMPOSE",
				"contents":      []byte("services: {app: {build: ., command: [sleep, '1']}}"),
				"buildContexts": map[string][]byte{"app": ctxBytes},
			})
			if code != http.StatusBadRequest || !strings.Contains(string(body), "CWSANDBOX_INVALID_REQUEST") ||
				!strings.Contains(string(body), `build_contexts[app]`) || !strings.Contains(string(body), filepath.Base(tc.entry.name)) {
				t.Fatalf("a context with %s: %d %.600s", tc.name, code, body)
			}
			if _, err := os.Lstat(escape); !os.IsNotExist(err) {
				t.Fatalf("%s exists on the host: %v", escape, err)
			}
		})
	}
	if code, b := d.rest(t, admin, "GET", "/v1/builds", nil); code != http.StatusOK || strings.Contains(string(b), "buildId") {
		t.Errorf("the organization's builds after refused contexts: %d %s", code, b)
	}
}

// TestBuildContextUploadFlood (issue 22): one organization's key cannot fill the blob store
// with build contexts: past 256 uploaded contexts a new name is RESOURCE_EXHAUSTED
// CWSANDBOX_BUILD_CONTEXT_LIMIT_EXCEEDED and nothing is stored, while replacing one of its
// own still works and another organization is not affected.
func TestBuildContextUploadFlood(t *testing.T) {
	d := needDev(t)
	org := fmt.Sprintf("org-ctxflood-%d", os.Getpid())
	user, err := d.NewKey(org, "user")
	if err != nil {
		t.Fatal(err)
	}
	other, err := d.NewKey(org+"-b", "user")
	if err != nil {
		t.Fatal(err)
	}
	put := func(key, name string) (int, string) {
		req, _ := http.NewRequest(http.MethodPut, d.API+"/v1/buildContexts/"+name, bytes.NewReader([]byte("not even a tar")))
		req.Header.Set("Authorization", "Bearer "+key)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	for i := range 256 {
		if code, body := put(user, fmt.Sprintf("ctx-%d", i)); code != http.StatusOK {
			t.Fatalf("upload %d: %d %.300s", i, code, body)
		}
	}
	if code, body := put(user, "one-more"); code != http.StatusTooManyRequests || !strings.Contains(body, "CWSANDBOX_BUILD_CONTEXT_LIMIT_EXCEEDED") {
		t.Fatalf("the 257th context: %d %.300s", code, body)
	}
	if code, body := put(user, "ctx-0"); code != http.StatusOK {
		t.Fatalf("replacing one: %d %.300s", code, body)
	}
	if code, body := put(other, "one-more"); code != http.StatusOK {
		t.Fatalf("another organization: %d %.300s", code, body)
	}
}

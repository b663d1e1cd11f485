package security

import (
	"encoding/base64"
	"net/http"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/image"
	"github.com/sandboxd/sandboxd/internal/testimage"
)

// regRequest calls the platform registry (/v2/ of the API port) with an Authorization
// header value (none when empty) and returns the status and the WWW-Authenticate header.
func (d *Dev) regRequest(t *testing.T, method, path, authz string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, d.API+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if authz != "" {
		req.Header.Set("Authorization", authz)
	}
	// Distribution answers a manifest only in a media type the client accepts.
	req.Header.Set("Accept", "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = res.Body.Close()
	return res.StatusCode, res.Header.Get("WWW-Authenticate")
}

func basicAuth(secret string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte("x:"+secret))
}

// TestRegistry pushes the busybox test image to the platform registry with an admin key
// of org-a and runs a sandbox of it (the runner pulls with a token the gateway mints for
// the sandbox's organization), then attacks the registry: another organization's pull,
// its sandbox of the image, pushes with pull-only credentials, forged tokens and path
// traversal in names.
func TestRegistry(t *testing.T) {
	d := needDev(t)
	host := strings.TrimPrefix(d.API, "http://")
	adminA, err := d.NewKey("org-a", "admin")
	if err != nil {
		t.Fatal(err)
	}
	adminB, err := d.NewKey("org-b", "admin")
	if err != nil {
		t.Fatal(err)
	}
	imgs, err := testimage.StandardImages()
	if err != nil {
		t.Fatal(err)
	}
	digest, err := testimage.PushAuth(host, "org-a/bb:v1", imgs.Busybox, &image.Credentials{Username: "x", Password: adminA})
	if err != nil {
		t.Fatalf("push with an admin key: %v", err)
	}
	ref := host + "/org-a/bb:v1"

	code, body, id := d.create(t, d.KeyA, ref, nil)
	if code != http.StatusOK {
		t.Fatalf("create from the registry's image: HTTP %d %s", code, body)
	}
	if st, body := d.wait(t, d.KeyA, id); st != "STATE_RUNNING" {
		t.Fatalf("sandbox of the registry's image is %s: %s", st, body)
	}
	if out := d.exec(t, d.KeyA, id, "echo from-registry"); strings.TrimSpace(out) != "from-registry" {
		t.Fatalf("exec: %q", out)
	}

	// Another organization's sandbox of the image: the runner pulls with org-b's token,
	// which does not read org-a's repository.
	code, _, idB := d.create(t, d.KeyB, ref, nil)
	if code == http.StatusOK {
		if st, body := d.wait(t, d.KeyB, idB); st == "STATE_RUNNING" {
			t.Fatalf("org-b ran org-a's registry image: %s", body)
		}
	}

	// The same by digest, now that org-a's sandbox left the image in the runner's cache:
	// a cached digest is served only after the registry confirms the caller's access (an
	// image pinned by digest skipped that check, and org-b's sandbox ran).
	code, _, idB = d.create(t, d.KeyB, host+"/org-a/bb@"+digest, nil)
	if code == http.StatusOK {
		if st, body := d.wait(t, d.KeyB, idB); st == "STATE_RUNNING" {
			t.Fatalf("org-b ran org-a's registry image by digest from the runner's cache: %s", body)
		}
	}

	for _, c := range []struct {
		name, method, path, authz string
		want                      int
	}{
		{"no credentials", "GET", "/v2/org-a/bb/manifests/v1", "", http.StatusUnauthorized},
		{"no credentials, base", "GET", "/v2/", "", http.StatusUnauthorized},
		{"wrong key", "GET", "/v2/org-a/bb/manifests/v1", basicAuth("sbx_0000000000000000_nope"), http.StatusUnauthorized},
		{"forged token", "GET", "/v2/org-a/bb/manifests/v1", basicAuth("sbxreg.djF8b3JnLWF8cHVsbHw5OTk5OTk5OTk5.AAAA"), http.StatusUnauthorized},
		{"other org's user key", "GET", "/v2/org-a/bb/manifests/v1", basicAuth(d.KeyB), http.StatusNotFound},
		{"other org's admin key", "HEAD", "/v2/org-a/bb/manifests/v1", "Bearer " + adminB, http.StatusNotFound},
		{"other org's push", "POST", "/v2/org-a/bb/blobs/uploads/", "Bearer " + adminB, http.StatusNotFound},
		{"mount from another org", "POST", "/v2/org-b/bb/blobs/uploads/?mount=sha256:" + strings.Repeat("0", 64) + "&from=org-a/bb", "Bearer " + adminB, http.StatusNotFound},
		{"user key push", "POST", "/v2/org-a/bb/blobs/uploads/", "Bearer " + d.KeyA, http.StatusForbidden},
		{"traversal", "GET", "/v2/org-b/../org-a/bb/manifests/v1", "Bearer " + adminB, 0},
		{"encoded traversal", "GET", "/v2/org-b/%2e%2e/org-a/bb/manifests/v1", "Bearer " + adminB, 0},
		{"catalog", "GET", "/v2/_catalog", "Bearer " + adminB, 0},
		{"own pull", "GET", "/v2/org-a/bb/manifests/v1", basicAuth(d.KeyA), -1},
	} {
		got, challenge := d.regRequest(t, c.method, c.path, c.authz)
		switch {
		case c.want == -1:
			if got != http.StatusOK {
				t.Errorf("%s: HTTP %d, want 200", c.name, got)
			}
		case c.want == 0:
			if got < 400 || got == http.StatusUnauthorized {
				t.Errorf("%s: HTTP %d, want a refusal", c.name, got)
			}
		case got != c.want:
			t.Errorf("%s: HTTP %d, want %d", c.name, got, c.want)
		case got == http.StatusUnauthorized && !strings.HasPrefix(challenge, "Basic "):
			t.Errorf("%s: 401 without a Basic challenge (%q)", c.name, challenge)
		}
	}
}

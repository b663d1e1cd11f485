package sbxcli

import (
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/controlplane"
	"github.com/sandboxd/sandboxd/internal/store"
)

// controlPlane serves the real admin services over a fresh SQLite store (h2c, as the API
// port) and returns sbx arguments that reach it with an admin key and with a user key.
func controlPlane(t *testing.T) (admin, user []string) {
	t.Helper()
	admin, user, _ = controlPlaneStore(t)
	return admin, user
}

// controlPlaneStore is controlPlane that also returns its store (organization "o1").
func controlPlaneStore(t *testing.T) (admin, user []string, st store.Store) {
	t.Helper()
	return controlPlaneStoreWith(t, nil)
}

// controlPlaneStoreWith is controlPlaneStore with more handlers (extra, when set, adds
// them to the mux that serves the control plane at "/").
func controlPlaneStoreWith(t *testing.T, extra func(*http.ServeMux)) (admin, user []string, st store.Store) {
	t.Helper()
	ctx := t.Context()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "cp.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	if err := controlplane.EnsureOrg(ctx, st, "o1"); err != nil {
		t.Fatal(err)
	}
	adminKey, _, err := auth.IssueKey(ctx, st, "o1", auth.RoleAdmin, "admin")
	if err != nil {
		t.Fatal(err)
	}
	userKey, _, err := auth.IssueKey(ctx, st, "o1", auth.RoleUser, "user")
	if err != nil {
		t.Fatal(err)
	}
	keys := auth.NewStoreAuthenticator(st, nil)
	t.Cleanup(keys.Wait)
	svc, err := controlplane.New(controlplane.Config{Store: st, Auth: keys, PlatformOrg: "o1", Logger: slog.New(slog.DiscardHandler),
		ClusterKey: make([]byte, 32), TargetVersions: map[string]string{store.ChannelStable: "v0.9.0", store.ChannelRapid: "v0.9.0"}})
	if err != nil {
		t.Fatal(err)
	}
	p := new(http.Protocols)
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	h := svc.Handler()
	if extra != nil {
		mux := http.NewServeMux()
		mux.Handle("/", h)
		extra(mux)
		h = mux
	}
	srv := &http.Server{Handler: h, Protocols: p}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	url := "http://" + ln.Addr().String()
	return []string{"--base-url", url, "--api-key", adminKey}, []string{"--base-url", url, "--api-key", userKey}, st
}

func TestSbxAdminRelease(t *testing.T) {
	admin, user := controlPlane(t)
	sbx := func(base []string, args ...string) (string, string, int) {
		return runSbx(context.Background(), "", append(append([]string{}, base...), args...)...)
	}
	a, b := strings.Repeat("a1", 32), strings.Repeat("b2", 32)

	out, errs, code := sbx(admin, "admin", "release", "ls")
	if code != 0 || !strings.Contains(out, "STABLE offers v0.9.0, RAPID offers v0.9.0") || !strings.Contains(out, "no releases recorded") {
		t.Fatalf("ls without releases: %d %q %q", code, out, errs)
	}
	out, errs, code = sbx(admin, "admin", "release", "publish", "v1.0.0", "--runner-image-digest", "sha256:"+a,
		"--agent-image-digest", "sha256:"+b, "--checksum", "amd64="+a, "--checksum", "arm64="+b)
	if code != 0 || !strings.Contains(out, "Channels:") || !strings.Contains(out, "RAPID") || !strings.Contains(out, "Binary arm64:") {
		t.Fatalf("publish: %d %q %q", code, out, errs)
	}
	// Refused by the server: field violations reach the user.
	_, errs, code = sbx(admin, "admin", "release", "publish", "v1.1", "--runner-image-digest", a, "--agent-image-digest", "sha256:"+b)
	if code == 0 || !strings.Contains(errs, "release.version") || !strings.Contains(errs, "release.runner_image_digest") {
		t.Fatalf("publish invalid: %d %q", code, errs)
	}
	// Refused here: a malformed --checksum.
	_, errs, code = sbx(admin, "admin", "release", "publish", "v1.1.0", "--runner-image-digest", "sha256:"+a,
		"--agent-image-digest", "sha256:"+b, "--checksum", "amd64")
	if code == 0 || !strings.Contains(errs, "ARCH=SHA256") {
		t.Fatalf("bad --checksum: %d %q", code, errs)
	}
	out, errs, code = sbx(admin, "admin", "release", "promote", "v1.0.0")
	if code != 0 || !strings.Contains(out, "STABLE,RAPID") || !strings.Contains(out, "On STABLE since:") {
		t.Fatalf("promote: %d %q %q", code, out, errs)
	}
	_, errs, code = sbx(admin, "admin", "release", "promote", "v2.0.0")
	if code == 0 || !strings.Contains(errs, "not found") {
		t.Fatalf("promote unknown: %d %q", code, errs)
	}
	out, errs, code = sbx(admin, "admin", "release", "ls")
	if code != 0 || !strings.Contains(out, "STABLE offers v1.0.0, RAPID offers v1.0.0") || !strings.Contains(out, "amd64,arm64") {
		t.Fatalf("ls: %d %q %q", code, out, errs)
	}
	out, _, code = sbx(admin, "-o", "json", "admin", "release", "ls")
	var list struct {
		Releases []struct {
			Version  string   `json:"version"`
			Channels []string `json:"channels"`
		} `json:"releases"`
		StableVersion string `json:"stableVersion"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &list) != nil || len(list.Releases) != 1 || list.StableVersion != "v1.0.0" {
		t.Fatalf("ls -o json: %d %q", code, out)
	}
	// A user key may not.
	if _, errs, code := sbx(user, "admin", "release", "ls"); code == 0 || !strings.Contains(strings.ToLower(errs), "permission") {
		t.Fatalf("user key: %d %q", code, errs)
	}
}

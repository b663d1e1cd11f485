package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/controlplane"
	"github.com/sandboxd/sandboxd/internal/release"
	"github.com/sandboxd/sandboxd/internal/sbxcli"
	"github.com/sandboxd/sandboxd/internal/store"
)

func runRelease(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	err := releaseCmd(args, &out)
	return out.String(), err
}

// trustingControlPlane serves the admin API of a control plane that trusts the release
// keys in pubPath (loaded as --release-keys does) and returns sbx's arguments for it.
func trustingControlPlane(t *testing.T, pubPath string) []string {
	t.Helper()
	keys, err := loadReleaseKeys(pubPath)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "cp.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	if err := controlplane.EnsureOrg(ctx, st, defaultOrg); err != nil {
		t.Fatal(err)
	}
	adminKey, _, err := auth.IssueKey(ctx, st, defaultOrg, auth.RoleAdmin, "admin")
	if err != nil {
		t.Fatal(err)
	}
	ka := auth.NewStoreAuthenticator(st, nil)
	t.Cleanup(ka.Wait)
	svc, err := controlplane.New(controlplane.Config{Store: st, Auth: ka, PlatformOrg: defaultOrg,
		Logger: slog.New(slog.DiscardHandler), ReleaseKeys: keys})
	if err != nil {
		t.Fatal(err)
	}
	p := new(http.Protocols)
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	srv := &http.Server{Handler: svc.Handler(), Protocols: p}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return []string{"--base-url", "http://" + ln.Addr().String(), "--api-key", adminKey}
}

func sbx(base []string, args ...string) (string, string, int) {
	var out, errb strings.Builder
	code := sbxcli.ExecuteContext(context.Background(), append(append([]string{}, base...), args...), strings.NewReader(""), &out, &errb)
	return out.String(), errb.String(), code
}

// TestReleaseSigningEndToEnd: the operator's whole path — keygen, manifest from the
// binaries, sign, verify, publish with sbx to a control plane trusting the key, and
// `sbx admin release ls` marks the release signed. A tampered manifest is refused.
func TestReleaseSigningEndToEnd(t *testing.T) {
	dir := t.TempDir()
	keyDir := filepath.Join(dir, "keys")
	if _, err := runRelease(t, "keygen", "--out", keyDir); err != nil {
		t.Fatal(err)
	}
	keyPath, pubPath := filepath.Join(keyDir, releaseKeyFile), filepath.Join(keyDir, releasePubFile)
	if fi, err := os.Stat(keyPath); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("signing key: %v %v, want mode 0600", fi, err)
	}
	if _, err := runRelease(t, "keygen", "--out", keyDir); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Fatalf("keygen over an existing key: %v", err)
	}

	bin, agent := filepath.Join(dir, "sandboxd"), filepath.Join(dir, "sandbox-agent")
	if err := os.WriteFile(bin, []byte("sandboxd binary"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(agent, []byte("agent binary"), 0o755); err != nil {
		t.Fatal(err)
	}
	digest := "sha256:" + strings.Repeat("ab", 32)
	manifest, err := runRelease(t, "manifest", "--version", "v1.5.0", "--runner-image-digest", digest, "--agent-image-digest", digest,
		"--binary", "amd64="+bin, "--agent", "amd64="+agent)
	if err != nil {
		t.Fatal(err)
	}
	m, err := release.ParseManifest([]byte(manifest))
	if err != nil || m.Binaries["amd64"].Sandboxd != sha256hex("sandboxd binary") ||
		m.Binaries["amd64"].Agent != sha256hex("agent binary") {
		t.Fatalf("manifest %s: %+v %v", manifest, m, err)
	}
	if _, err := runRelease(t, "manifest", "--version", "v1.5.0", "--runner-image-digest", digest, "--agent-image-digest", digest,
		"--agent", "arm64="+agent); err == nil {
		t.Fatal("an agent without its sandboxd binary")
	}
	manifestPath := filepath.Join(dir, "v1.5.0.json")
	if err := os.WriteFile(manifestPath, []byte(manifest), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := runRelease(t, "sign", "--key", keyPath, "--manifest", manifestPath); err != nil {
		t.Fatal(err)
	}
	if out, err := runRelease(t, "verify", "--keys", pubPath, "--manifest", manifestPath); err != nil || !strings.Contains(out, "good signature: release v1.5.0") {
		t.Fatalf("verify: %q %v", out, err)
	}
	// Signing refuses what is not a manifest.
	junk := filepath.Join(dir, "junk.json")
	if err := os.WriteFile(junk, []byte(`{"version":"v1"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := runRelease(t, "sign", "--key", keyPath, "--manifest", junk); err == nil {
		t.Fatal("signed an invalid manifest")
	}

	admin := trustingControlPlane(t, pubPath)
	// A tampered copy (the signature of the original) is refused and not recorded.
	tampered := filepath.Join(dir, "tampered.json")
	if err := os.WriteFile(tampered, []byte(strings.Replace(manifest, "v1.5.0", "v1.5.1", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, errs, code := sbx(admin, "admin", "release", "publish", "--manifest", tampered, "--signature", manifestPath+".sig"); code == 0 ||
		!strings.Contains(errs, "signature does not verify") {
		t.Fatalf("tampered manifest: %d %q", code, errs)
	}
	// A record is refused: the control plane trusts keys.
	if _, errs, code := sbx(admin, "admin", "release", "publish", "v1.6.0", "--runner-image-digest", digest, "--agent-image-digest", digest); code == 0 ||
		!strings.Contains(errs, "only signed release manifests") {
		t.Fatalf("unsigned record: %d %q", code, errs)
	}
	out, errs, code := sbx(admin, "admin", "release", "publish", "--manifest", manifestPath)
	if code != 0 || !strings.Contains(out, "v1.5.0") || !strings.Contains(out, "Signed:") || !strings.Contains(out, "Agent binary amd64:") {
		t.Fatalf("publish: %d %q %q", code, out, errs)
	}
	out, errs, code = sbx(admin, "admin", "release", "ls")
	if code != 0 || !strings.Contains(out, "SIGNED") || !strings.Contains(out, "signed") || strings.Contains(out, "v1.5.1") || strings.Contains(out, "v1.6.0") {
		t.Fatalf("ls: %d %q %q", code, out, errs)
	}
	// What ls -o json returns verifies with the public key alone.
	out, _, code = sbx(admin, "-o", "json", "admin", "release", "ls")
	var list struct {
		Releases []struct {
			Version           string
			Manifest          []byte
			ManifestSignature []byte
		}
	}
	if err := json.Unmarshal([]byte(out), &list); code != 0 || err != nil || len(list.Releases) != 1 {
		t.Fatalf("ls -o json: %d %v %s", code, err, out)
	}
	keys, _ := loadReleaseKeys(pubPath)
	if vm, err := release.Verify(keys, list.Releases[0].Manifest, list.Releases[0].ManifestSignature); err != nil || vm.Version != "v1.5.0" ||
		!bytes.Equal(list.Releases[0].Manifest, []byte(manifest)) {
		t.Fatalf("re-verify the listed release: %v", err)
	}
}

func TestLoadReleaseKeysRefusesPrivateKey(t *testing.T) {
	dir := t.TempDir()
	if _, err := runRelease(t, "keygen", "--out", dir); err != nil {
		t.Fatal(err)
	}
	if _, err := loadReleaseKeys(filepath.Join(dir, releaseKeyFile)); err == nil {
		t.Fatal("a private key accepted as trusted release keys")
	}
	if _, err := loadReleaseKeys(filepath.Join(dir, "missing.pub")); err == nil {
		t.Fatal("a missing file accepted")
	}
}

func sha256hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

package security

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	controlplanev1 "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1/controlplanev1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/controlplane"
	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/store"
)

// artifactBed is an in-process control plane serving a release directory over TLS, with
// one published release (v1.0.0) and one runner (o/r1).
type artifactBed struct {
	url, dir, secret string
	ca               *pki.CA
	st               store.Store
	body             []byte // v1.0.0/amd64/sandboxd
}

// serveDir false: the control plane runs without --release-dir.
func newArtifactBed(t *testing.T, serveDir bool) *artifactBed {
	t.Helper()
	ctx := t.Context()
	tmp := t.TempDir()
	ca, err := pki.LoadOrCreateCA(filepath.Join(tmp, "pki"), "artifact test CA")
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(ctx, filepath.Join(tmp, "cp.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	if err := controlplane.EnsureOrg(ctx, st, "o"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := controlplane.EnsureRunner(ctx, st, store.Runner{Org: "o", RunnerID: "r1", ClusterID: "c1", Zone: "z"}); err != nil {
		t.Fatal(err)
	}
	b := &artifactBed{dir: filepath.Join(tmp, "releases"), secret: filepath.Join(tmp, "secret"), ca: ca, st: st}
	// More than one chunk, so the stream is reassembled.
	b.body = bytes.Repeat([]byte("sandboxd binary "), 40<<10)
	write := func(p string, data []byte) {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(b.dir, "v1.0.0", "amd64", "sandboxd"), b.body)
	write(b.secret, []byte("SECRET outside the release dir"))
	write(filepath.Join(b.dir, "v2.0.0", "amd64", "sandboxd"), []byte("no release record")) // unpublished
	// Links leading out of the directory, under a published version.
	if err := os.MkdirAll(filepath.Join(b.dir, "v1.0.0", "arm64"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../../../secret", filepath.Join(b.dir, "v1.0.0", "arm64", "sandboxd")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(b.secret, filepath.Join(b.dir, "v1.0.0", "amd64", "sandbox-agent")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(tmp, filepath.Join(b.dir, "v1.0.0", "riscv64")); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b.body)
	if _, err := st.Releases().Publish(ctx, store.Release{Version: "v1.0.0",
		RunnerImageDigest: "sha256:" + strings.Repeat("a", 64), AgentImageDigest: "sha256:" + strings.Repeat("b", 64),
		BinaryChecksums: map[string]string{"amd64": hex.EncodeToString(sum[:])}}); err != nil {
		t.Fatal(err)
	}
	cfg := controlplane.Config{Store: st, Auth: auth.NewStoreAuthenticator(st, nil), PlatformOrg: "o", CA: ca}
	if serveDir {
		cfg.ReleaseDir = b.dir
	}
	cp, err := controlplane.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	tlsCfg, err := controlplane.TLSConfig(ca, []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(cp.TLSHandler())
	srv.TLS = tlsCfg
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	b.url = srv.URL
	return b
}

// client calls the control plane with cert (nil: none). By name (SNI), so the server
// answers with the control plane's certificate rather than httptest's.
func (b *artifactBed) client(cert *tls.Certificate) *http.Client {
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		TLSClientConfig: pki.ClientTLSConfig(cert, b.ca.Pool(), "localhost"), ForceAttemptHTTP2: true}}
}

func (b *artifactBed) runnerCert(t *testing.T, org, id string) *tls.Certificate {
	t.Helper()
	c, err := b.ca.IssueClient("runner "+id, []*url.URL{controlplane.RunnerURI(org, id)}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return &c
}

func (b *artifactBed) download(cert *tls.Certificate, version, arch, name string) ([]byte, error) {
	c := controlplanev1connect.NewRunnerReleaseServiceClient(b.client(cert), b.url)
	s, err := c.DownloadArtifact(context.Background(), connect.NewRequest(&controlplanev1.DownloadArtifactRequest{Version: version, Arch: arch, Name: name}))
	if err != nil {
		return nil, err
	}
	defer s.Close()
	var out []byte
	for s.Receive() {
		out = append(out, s.Msg().GetChunk()...)
	}
	return out, s.Err()
}

// TestReleaseArtifactDownload: a registered runner's certificate reads a published
// release's binary, byte for byte; its heartbeat, once the runner is asked to update,
// carries the binary's checksum for the runner's architecture.
func TestReleaseArtifactDownload(t *testing.T) {
	b := newArtifactBed(t, true)
	cert := b.runnerCert(t, "o", "r1")
	got, err := b.download(cert, "v1.0.0", "amd64", "sandboxd")
	if err != nil || !bytes.Equal(got, b.body) {
		t.Fatalf("download: %d bytes (want %d), %v", len(got), len(b.body), err)
	}
	r, err := b.st.Runners().Get(t.Context(), "o", "r1")
	if err != nil {
		t.Fatal(err)
	}
	desired := "v1.0.0"
	if _, err := b.st.Runners().Update(t.Context(), "o", "r1", r.Etag, store.RunnerUpdate{DesiredVersion: &desired}); err != nil {
		t.Fatal(err)
	}
	reg := controlplanev1connect.NewRunnerRegistrationServiceClient(b.client(cert), b.url)
	sum := sha256.Sum256(b.body)
	for arch, want := range map[string]string{"amd64": hex.EncodeToString(sum[:]), "arm64": "", "": "", "../x": ""} {
		res, err := reg.Heartbeat(t.Context(), connect.NewRequest(&controlplanev1.HeartbeatRequest{RunnerId: "r1", Version: "v0.9.0", Arch: arch}))
		if err != nil {
			t.Fatal(err)
		}
		if res.Msg.GetDesiredVersion() != desired || res.Msg.GetDesiredSandboxdSha256() != want {
			t.Errorf("heartbeat (arch %q): desired %q sha256 %q, want %q %q", arch, res.Msg.GetDesiredVersion(), res.Msg.GetDesiredSandboxdSha256(), desired, want)
		}
	}
}

// TestReleaseArtifactAttacks: only a registered runner downloads, and only files inside
// the release directory under a published version: crafted versions, architectures and
// names, and symbolic links planted in the directory, read nothing outside it.
func TestReleaseArtifactAttacks(t *testing.T) {
	b := newArtifactBed(t, true)
	secret, _ := os.ReadFile(b.secret)
	check := func(name string, data []byte, err error, code connect.Code, reason string) {
		t.Helper()
		if bytes.Contains(data, secret) || bytes.Contains(data, []byte("no release record")) {
			t.Fatalf("%s: served a file it must not: %q", name, data)
		}
		if err == nil || connect.CodeOf(err) != code || apierr.Reason(err) != reason {
			t.Errorf("%s: err %v (reason %q), want %v %s", name, err, apierr.Reason(err), code, reason)
		}
	}

	// Identity: no certificate, a certificate naming no runner, a runner the control
	// plane does not know (deleted, or of another organization).
	data, err := b.download(nil, "v1.0.0", "amd64", "sandboxd")
	check("no client certificate", data, err, connect.CodeUnauthenticated, apierr.Unauthenticated)
	gw, err := b.ca.IssueClient("gateway", nil, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	data, err = b.download(&gw, "v1.0.0", "amd64", "sandboxd")
	check("non-runner certificate", data, err, connect.CodePermissionDenied, apierr.RunnerIdentityMismatch)
	data, err = b.download(b.runnerCert(t, "other", "r1"), "v1.0.0", "amd64", "sandboxd")
	check("unknown runner", data, err, connect.CodeNotFound, apierr.RunnerNotFound)
	// A certificate of another CA is refused by the TLS handshake itself.
	other, err := pki.LoadOrCreateCA(filepath.Join(t.TempDir(), "pki"), "other CA")
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := other.IssueClient("runner r1", []*url.URL{controlplane.RunnerURI("o", "r1")}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if data, err = b.download(&foreign, "v1.0.0", "amd64", "sandboxd"); err == nil || len(data) > 0 {
		t.Errorf("certificate of another CA: %d bytes, %v", len(data), err)
	}

	cert := b.runnerCert(t, "o", "r1")
	for _, tc := range []struct{ version, arch, name string }{
		{"../../secret", "amd64", "sandboxd"},
		{"v1.0.0/../..", "amd64", "sandboxd"},
		{"..", "amd64", "sandboxd"},
		{"/etc", "amd64", "sandboxd"},
		{"v1.0.0", "../..", "secret"},
		{"v1.0.0", "amd64/../..", "sandboxd"},
		{"v1.0.0", "amd64", "../../../secret"},
		{"v1.0.0", "amd64", "sandboxd/../../../../secret"},
		{"v1.0.0", "amd64", "/etc/passwd"},
		{"v1.0.0", "amd64", ""},
		{"v1.0.0", "amd64", "sandboxd\x00"},
		{"", "", ""},
	} {
		data, err := b.download(cert, tc.version, tc.arch, tc.name)
		check(strings.Join([]string{tc.version, tc.arch, tc.name}, "|"), data, err, connect.CodeInvalidArgument, apierr.InvalidRequest)
	}
	// Valid names whose file is a link out of the directory (to a file, through a
	// directory link), or absent.
	for _, tc := range []struct{ version, arch, name string }{
		{"v1.0.0", "arm64", "sandboxd"},
		{"v1.0.0", "amd64", "sandbox-agent"},
		{"v1.0.0", "riscv64", "sandboxd"},
		{"v1.0.0", "s390x", "sandboxd"},
	} {
		data, err := b.download(cert, tc.version, tc.arch, tc.name)
		check(tc.arch+"/"+tc.name, data, err, connect.CodeNotFound, apierr.ReleaseArtifactNotFound)
	}
	// Files of a version without a release record are not served.
	data, err = b.download(cert, "v2.0.0", "amd64", "sandboxd")
	check("unpublished version", data, err, connect.CodeNotFound, apierr.ReleaseNotFound)

	// A control plane without --release-dir serves nothing.
	off := newArtifactBed(t, false)
	data, err = off.download(off.runnerCert(t, "o", "r1"), "v1.0.0", "amd64", "sandboxd")
	check("no --release-dir", data, err, connect.CodeFailedPrecondition, apierr.ReleaseArtifactsDisabled)
}

package security

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	controlplanev1 "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1/controlplanev1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/connecttest"
	"github.com/sandboxd/sandboxd/internal/controlplane"
	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/release"
	"github.com/sandboxd/sandboxd/internal/store"
)

// TestSignedReleasesCannotBeForged: a control plane that trusts a release key publishes
// only what that key signed. Whoever holds an admin key — a tenant's, or even the
// platform's (a stolen one) — cannot make it record a release from a tampered manifest,
// one signed by another key, a bare record, or a signed manifest with a record that says
// otherwise, over Connect or REST; ListReleases is unchanged after every attempt, and a
// runner reading the release gets the genuine manifest and signature. The control plane
// runs in this process (its TLS handler, as `sandboxd controlplane` serves it), so the
// test needs no root.
func TestSignedReleasesCannotBeForged(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	trusted, signer, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	_, attacker, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	st, err := store.Open(ctx, filepath.Join(dir, "cp.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for _, org := range []string{"platform", "tenant"} {
		if err := controlplane.EnsureOrg(ctx, st, org); err != nil {
			t.Fatal(err)
		}
	}
	platformKey, err := controlplane.EnsureAdminKey(ctx, st, "platform")
	if err != nil {
		t.Fatal(err)
	}
	tenantKey, err := controlplane.EnsureAdminKey(ctx, st, "tenant")
	if err != nil {
		t.Fatal(err)
	}
	ca, err := pki.LoadOrCreateCA(filepath.Join(dir, "pki"), "security CA")
	if err != nil {
		t.Fatal(err)
	}
	keys := auth.NewStoreAuthenticator(st, nil)
	defer keys.Wait()
	svc, err := controlplane.New(controlplane.Config{Store: st, Auth: keys, PlatformOrg: "platform", CA: ca,
		Logger: slog.New(slog.DiscardHandler), ReleaseKeys: []ed25519.PublicKey{trusted}})
	if err != nil {
		t.Fatal(err)
	}
	tlsCfg, err := controlplane.TLSConfig(ca, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(svc.TLSHandler())
	srv.TLS = tlsCfg
	srv.StartTLS()
	defer srv.Close()
	base := strings.Replace(srv.URL, "127.0.0.1", "localhost", 1)
	httpClient := func(cert *tls.Certificate) *http.Client {
		return &http.Client{Transport: &http.Transport{TLSClientConfig: pki.ClientTLSConfig(cert, ca.Pool(), "localhost"), ForceAttemptHTTP2: true}}
	}
	releases := func(key string) controlplanev1connect.ReleaseServiceClient {
		return controlplanev1connect.NewReleaseServiceClient(httpClient(nil), base, connect.WithInterceptors(connecttest.Bearer(key)))
	}
	platform, tenant := releases(platformKey), releases(tenantKey)

	manifest := func(version string) []byte {
		return []byte(`{"version":"` + version + `","runner_image_digest":"sha256:` + strings.Repeat("ab", 32) +
			`","agent_image_digest":"sha256:` + strings.Repeat("cd", 32) + `"}`)
	}
	genuine := manifest("v1.0.0")
	genuineSig := release.Sign(signer, genuine)
	if _, err := platform.PublishRelease(ctx, connect.NewRequest(&controlplanev1.PublishReleaseRequest{Manifest: genuine, Signature: genuineSig})); err != nil {
		t.Fatalf("the platform publishes the genuine release: %v", err)
	}
	before, err := platform.ListReleases(ctx, connect.NewRequest(&controlplanev1.ListReleasesRequest{}))
	if err != nil {
		t.Fatal(err)
	}

	// A tampered manifest: the genuine one's signature on other bytes (other digests).
	tampered := bytes.Replace(manifest("v9.0.0"), []byte("ab"), []byte("ee"), 4)
	forgedByAttacker := manifest("v9.0.1")
	for _, tc := range []struct {
		name   string
		c      controlplanev1connect.ReleaseServiceClient
		req    *controlplanev1.PublishReleaseRequest
		code   connect.Code
		reason string
	}{
		{"tenant admin, validly signed", tenant, &controlplanev1.PublishReleaseRequest{Manifest: manifest("v9.0.2"),
			Signature: release.Sign(signer, manifest("v9.0.2"))}, connect.CodePermissionDenied, apierr.PermissionDenied},
		{"tampered manifest", platform, &controlplanev1.PublishReleaseRequest{Manifest: tampered, Signature: genuineSig},
			connect.CodeInvalidArgument, apierr.ReleaseSignatureInvalid},
		{"genuine signature, other version", platform, &controlplanev1.PublishReleaseRequest{Manifest: manifest("v9.0.3"), Signature: genuineSig},
			connect.CodeInvalidArgument, apierr.ReleaseSignatureInvalid},
		{"signed by an untrusted key", platform, &controlplanev1.PublishReleaseRequest{Manifest: forgedByAttacker,
			Signature: release.Sign(attacker, forgedByAttacker)}, connect.CodeInvalidArgument, apierr.ReleaseSignatureInvalid},
		{"bare record", platform, &controlplanev1.PublishReleaseRequest{Release: &controlplanev1.Release{Version: "v9.0.4",
			RunnerImageDigest: "sha256:" + strings.Repeat("ee", 32), AgentImageDigest: "sha256:" + strings.Repeat("ee", 32)}},
			connect.CodeFailedPrecondition, apierr.ReleaseSignatureRequired},
		{"genuine manifest, record that says otherwise", platform, &controlplanev1.PublishReleaseRequest{Manifest: genuine, Signature: genuineSig,
			Release: &controlplanev1.Release{Version: "v9.0.5", RunnerImageDigest: "sha256:" + strings.Repeat("ee", 32)}},
			connect.CodeInvalidArgument, apierr.InvalidRequest},
	} {
		_, err := tc.c.PublishRelease(ctx, connect.NewRequest(tc.req))
		if connect.CodeOf(err) != tc.code || apierr.Reason(err) != tc.reason {
			t.Errorf("%s: %v (reason %q), want %v %s", tc.name, err, apierr.Reason(err), tc.code, tc.reason)
		}
	}
	// REST carries only records (body: release): refused too.
	body, _ := json.Marshal(map[string]string{"version": "v9.0.6", "runnerImageDigest": "sha256:" + strings.Repeat("ee", 32),
		"agentImageDigest": "sha256:" + strings.Repeat("ee", 32)})
	req, _ := http.NewRequestWithContext(ctx, "POST", base+"/v1/sandbox/releases", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+platformKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := httpClient(nil).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	rb, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var e apiError
	_ = json.Unmarshal(rb, &e)
	if resp.StatusCode != http.StatusBadRequest || e.reason() != apierr.ReleaseSignatureRequired {
		t.Errorf("record over REST: HTTP %d %s", resp.StatusCode, rb)
	}

	after, err := platform.ListReleases(ctx, connect.NewRequest(&controlplanev1.ListReleasesRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(before.Msg, after.Msg) {
		t.Errorf("ListReleases changed by refused attempts:\nbefore %v\nafter  %v", before.Msg, after.Msg)
	}

	// A runner gets the genuine manifest and signature; the refused versions do not exist.
	if _, err := st.Runners().Create(ctx, store.Runner{Org: "tenant", RunnerID: "r1", ClusterID: "c1", Zone: "z"}); err != nil {
		t.Fatal(err)
	}
	runnerCert, err := ca.IssueClient("", []*url.URL{controlplane.RunnerURI("tenant", "r1")}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	reg := controlplanev1connect.NewRunnerRegistrationServiceClient(httpClient(&runnerCert), base)
	r, err := reg.GetRelease(ctx, connect.NewRequest(&controlplanev1.GetReleaseRequest{Version: "v1.0.0"}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := release.Verify([]ed25519.PublicKey{trusted}, r.Msg.GetManifest(), r.Msg.GetManifestSignature()); err != nil ||
		!bytes.Equal(r.Msg.GetManifest(), genuine) {
		t.Errorf("the runner's copy does not verify: %v", err)
	}
	for _, v := range []string{"v9.0.0", "v9.0.1", "v9.0.4", "v9.0.5"} {
		if _, err := reg.GetRelease(ctx, connect.NewRequest(&controlplanev1.GetReleaseRequest{Version: v})); connect.CodeOf(err) != connect.CodeNotFound {
			t.Errorf("refused release %s: %v, want NOT_FOUND", v, err)
		}
	}
	// An admin key is no runner identity: GetRelease wants the runner's certificate.
	byKey := controlplanev1connect.NewRunnerRegistrationServiceClient(httpClient(nil), base, connect.WithInterceptors(connecttest.Bearer(platformKey)))
	if _, err := byKey.GetRelease(ctx, connect.NewRequest(&controlplanev1.GetReleaseRequest{Version: "v1.0.0"})); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Errorf("GetRelease with an admin key and no certificate: %v, want UNAUTHENTICATED", err)
	}
}

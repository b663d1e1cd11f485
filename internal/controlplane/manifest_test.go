package controlplane_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"slices"
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
	"github.com/sandboxd/sandboxd/internal/release"
	"github.com/sandboxd/sandboxd/internal/store"
)

// manifestJSON is a valid release manifest of version for amd64 (sandboxd and agent).
func manifestJSON(version string) []byte {
	return []byte(`{"version":"` + version + `","runner_image_digest":"sha256:` + hexA +
		`","agent_image_digest":"sha256:` + hexB + `","binaries":{"amd64":{"sandboxd":"` + hexA +
		`","sandbox_agent":"` + hexB + `"}}}`)
}

func genKey(t testing.TB) (ed25519.PublicKey, ed25519.PrivateKey) {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return pub, priv
}

func TestValidatePublish(t *testing.T) {
	pub, priv := genKey(t)
	otherPub, otherPriv := genKey(t)
	keys := []ed25519.PublicKey{otherPub, pub}
	m := manifestJSON("v2.0.0")
	sig := release.Sign(priv, m)
	signed := func() *controlplanev1.PublishReleaseRequest {
		return &controlplanev1.PublishReleaseRequest{Manifest: slices.Clone(m), Signature: slices.Clone(sig)}
	}

	rec, err := controlplane.ValidatePublish(keys, signed())
	if err != nil {
		t.Fatalf("signed manifest: %v", err)
	}
	if rec.Version != "v2.0.0" || rec.RunnerImageDigest != "sha256:"+hexA || rec.AgentImageDigest != "sha256:"+hexB ||
		rec.BinaryChecksums["amd64"] != hexA || rec.AgentBinaryChecksums["amd64"] != hexB || len(rec.BinaryChecksums) != 1 ||
		!bytes.Equal(rec.Manifest, m) || !bytes.Equal(rec.ManifestSignature, sig) {
		t.Fatalf("record derived from the manifest: %+v", rec)
	}
	if err := store.CheckRelease(rec); err != nil {
		t.Fatalf("the derived record is not storable: %v", err)
	}
	// The record may come along when it says what the manifest says.
	same := signed()
	same.Release = &controlplanev1.Release{Version: "v2.0.0", RunnerImageDigest: "sha256:" + hexA,
		BinaryChecksums: map[string]string{"amd64": hexA}, AgentBinaryChecksums: map[string]string{"amd64": hexB}}
	if _, err := controlplane.ValidatePublish(keys, same); err != nil {
		t.Fatalf("record agreeing with the manifest: %v", err)
	}

	tampered := bytes.Replace(m, []byte(hexA[:8]), []byte("deadbeef"), 1)
	for _, tc := range []struct {
		name   string
		keys   []ed25519.PublicKey
		req    func() *controlplanev1.PublishReleaseRequest
		code   connect.Code
		reason string
		fields []string
	}{
		{"tampered manifest", keys, func() *controlplanev1.PublishReleaseRequest {
			r := signed()
			r.Manifest = slices.Clone(tampered)
			return r
		}, connect.CodeInvalidArgument, apierr.ReleaseSignatureInvalid, nil},
		{"signed with an untrusted key", keys, func() *controlplanev1.PublishReleaseRequest {
			r := signed()
			r.Signature = release.Sign(otherPriv, []byte("not the manifest"))
			return r
		}, connect.CodeInvalidArgument, apierr.ReleaseSignatureInvalid, nil},
		{"trusted keys do not include the signer", []ed25519.PublicKey{otherPub}, signed,
			connect.CodeInvalidArgument, apierr.ReleaseSignatureInvalid, nil},
		{"unsigned record while keys are configured", keys, func() *controlplanev1.PublishReleaseRequest {
			return &controlplanev1.PublishReleaseRequest{Release: releaseMsg("v2.0.0")}
		}, connect.CodeFailedPrecondition, apierr.ReleaseSignatureRequired, nil},
		{"empty request while keys are configured", keys, func() *controlplanev1.PublishReleaseRequest {
			return &controlplanev1.PublishReleaseRequest{}
		}, connect.CodeFailedPrecondition, apierr.ReleaseSignatureRequired, nil},
		{"signed manifest without keys", nil, signed, connect.CodeFailedPrecondition, apierr.ReleaseKeysNotConfigured, nil},
		{"signature without manifest", keys, func() *controlplanev1.PublishReleaseRequest {
			return &controlplanev1.PublishReleaseRequest{Signature: sig}
		}, connect.CodeInvalidArgument, apierr.InvalidRequest, []string{"manifest"}},
		{"manifest without signature", keys, func() *controlplanev1.PublishReleaseRequest {
			return &controlplanev1.PublishReleaseRequest{Manifest: m}
		}, connect.CodeInvalidArgument, apierr.InvalidRequest, []string{"signature"}},
		{"signature of the wrong size", keys, func() *controlplanev1.PublishReleaseRequest {
			r := signed()
			r.Signature = append(r.Signature, 0)
			return r
		}, connect.CodeInvalidArgument, apierr.InvalidRequest, []string{"signature"}},
		{"manifest too large", keys, func() *controlplanev1.PublishReleaseRequest {
			r := signed()
			r.Manifest = append(r.Manifest, bytes.Repeat([]byte(" "), release.MaxManifestBytes)...)
			return r
		}, connect.CodeInvalidArgument, apierr.InvalidRequest, []string{"manifest"}},
		{"validly signed but invalid manifest", keys, func() *controlplanev1.PublishReleaseRequest {
			bad := bytes.Replace(m, []byte(`"v2.0.0"`), []byte(`"latest"`), 1)
			return &controlplanev1.PublishReleaseRequest{Manifest: bad, Signature: release.Sign(priv, bad)}
		}, connect.CodeInvalidArgument, apierr.InvalidRequest, []string{"manifest.version"}},
		{"validly signed, not JSON", keys, func() *controlplanev1.PublishReleaseRequest {
			bad := []byte("version: v2.0.0")
			return &controlplanev1.PublishReleaseRequest{Manifest: bad, Signature: release.Sign(priv, bad)}
		}, connect.CodeInvalidArgument, apierr.InvalidRequest, []string{"manifest"}},
		{"conflicting record fields", keys, func() *controlplanev1.PublishReleaseRequest {
			r := signed()
			r.Release = &controlplanev1.Release{Version: "v9.0.0", RunnerImageDigest: "sha256:" + hexB, AgentImageDigest: "sha256:" + hexA,
				BinaryChecksums: map[string]string{"amd64": hexB}, AgentBinaryChecksums: map[string]string{"arm64": hexB},
				Channels: []controlplanev1.ReleaseChannel{controlplanev1.ReleaseChannel_STABLE}, Manifest: []byte("{}")}
			return r
		}, connect.CodeInvalidArgument, apierr.InvalidRequest, []string{"release.agent_binary_checksums", "release.agent_image_digest",
			"release.binary_checksums", "release.channels", "release.manifest", "release.runner_image_digest", "release.version"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec, err := controlplane.ValidatePublish(tc.keys, tc.req())
			if err == nil {
				t.Fatalf("accepted: %+v", rec)
			}
			wantReason(t, tc.name, err, tc.code, tc.reason)
			if got := fields(err); !slices.Equal(got, tc.fields) {
				t.Fatalf("violations on %v, want %v (%v)", got, tc.fields, err)
			}
		})
	}

	// Without keys, records are published as before, now with agent checksums too.
	r := releaseMsg("v2.0.0")
	r.AgentBinaryChecksums = map[string]string{"arm64": hexA}
	rec, err = controlplane.ValidatePublish(nil, &controlplanev1.PublishReleaseRequest{Release: r})
	if err != nil || rec.AgentBinaryChecksums["arm64"] != hexA || rec.Manifest != nil {
		t.Fatalf("unsigned record without keys: %+v %v", rec, err)
	}
	r.AgentBinaryChecksums = map[string]string{"arm64": "ABC"}
	_, err = controlplane.ValidatePublish(nil, &controlplanev1.PublishReleaseRequest{Release: r})
	if got := fields(err); !slices.Equal(got, []string{`release.agent_binary_checksums["arm64"]`}) {
		t.Fatalf("bad agent checksum: %v", err)
	}
}

// FuzzValidatePublish: whatever a platform admin sends, ValidatePublish does not panic,
// and what it accepts is signed by the trusted key, verifies again from the record's own
// bytes, and is storable.
func FuzzValidatePublish(f *testing.F) {
	seed := ed25519.NewKeyFromSeed(bytes.Repeat([]byte{7}, ed25519.SeedSize))
	keys := []ed25519.PublicKey{seed.Public().(ed25519.PublicKey)}
	m := manifestJSON("v1.0.0")
	f.Add(m, release.Sign(seed, m), "")
	f.Add(m, release.Sign(seed, m), "v1.0.0")
	f.Add(m, release.Sign(seed, m), "v1.0.1")
	f.Add([]byte("{}"), release.Sign(seed, []byte("{}")), "")
	f.Add([]byte(nil), []byte(nil), "v1.0.0")
	f.Add(m, bytes.Repeat([]byte{1}, 64), "")
	f.Fuzz(func(t *testing.T, manifest, sig []byte, version string) {
		req := &controlplanev1.PublishReleaseRequest{Manifest: manifest, Signature: sig}
		if version != "" {
			req.Release = &controlplanev1.Release{Version: version}
		}
		rec, err := controlplane.ValidatePublish(keys, req)
		if err != nil {
			if apierr.Reason(err) == "" {
				t.Fatalf("an error without a reason: %v", err)
			}
			return
		}
		if _, err := release.Verify(keys, rec.Manifest, rec.ManifestSignature); err != nil {
			t.Fatalf("accepted a record whose manifest does not verify: %v", err)
		}
		if err := store.CheckRelease(rec); err != nil {
			t.Fatalf("accepted an unstorable record: %v", err)
		}
		if version != "" && version != rec.Version {
			t.Fatalf("accepted release.version %q with a manifest of %q", version, rec.Version)
		}
	})
}

// signedBed is a control plane trusting pub, with its registration service on TLS.
type signedBed struct {
	svc  *controlplane.Service
	st   store.Store
	actx context.Context
	ca   *pki.CA
	url  string
	srv  *httptest.Server
}

func newSignedBed(t *testing.T, keys ...ed25519.PublicKey) *signedBed {
	t.Helper()
	ctx := t.Context()
	dir := t.TempDir()
	st, err := store.Open(ctx, filepath.Join(dir, "cp.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	if err := controlplane.EnsureOrg(ctx, st, "o1"); err != nil {
		t.Fatal(err)
	}
	ca, err := pki.LoadOrCreateCA(filepath.Join(dir, "pki"), "test CA")
	if err != nil {
		t.Fatal(err)
	}
	svc, err := controlplane.New(controlplane.Config{Store: st, Auth: auth.NewStoreAuthenticator(st, nil), PlatformOrg: "o1",
		Logger: slog.New(slog.DiscardHandler), CA: ca, ReleaseKeys: keys})
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
	t.Cleanup(srv.Close)
	return &signedBed{svc: svc, st: st, ca: ca, url: srv.URL, srv: srv,
		actx: auth.WithPrincipal(ctx, auth.Principal{KeyID: "k", Org: "o1", Role: auth.RoleAdmin})}
}

// registration is RunnerRegistrationService as the holder of cert (nil: none) sees it.
func (b *signedBed) registration(cert *tls.Certificate) controlplanev1connect.RunnerRegistrationServiceClient {
	cfg := pki.ClientTLSConfig(cert, b.ca.Pool(), "localhost")
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: cfg, ForceAttemptHTTP2: true}, Timeout: 10 * time.Second}
	return controlplanev1connect.NewRunnerRegistrationServiceClient(hc, strings.Replace(b.url, "127.0.0.1", "localhost", 1))
}

func TestPublishSignedManifestAndRunnerGetRelease(t *testing.T) {
	pub, priv := genKey(t)
	b := newSignedBed(t, pub)
	m := manifestJSON("v2.0.0")
	sig := release.Sign(priv, m)
	out, err := b.svc.PublishRelease(b.actx, connect.NewRequest(&controlplanev1.PublishReleaseRequest{Manifest: m, Signature: sig}))
	if err != nil {
		t.Fatal(err)
	}
	if out.Msg.GetVersion() != "v2.0.0" || !bytes.Equal(out.Msg.GetManifest(), m) || out.Msg.GetAgentBinaryChecksums()["amd64"] != hexB {
		t.Fatalf("published: %v", out.Msg)
	}
	// A record is refused now, and changes nothing.
	_, err = b.svc.PublishRelease(b.actx, connect.NewRequest(&controlplanev1.PublishReleaseRequest{Release: releaseMsg("v3.0.0")}))
	wantReason(t, "unsigned", err, connect.CodeFailedPrecondition, apierr.ReleaseSignatureRequired)
	list, err := b.svc.ListReleases(b.actx, connect.NewRequest(&controlplanev1.ListReleasesRequest{}))
	if err != nil || len(list.Msg.GetReleases()) != 1 || list.Msg.GetRapidVersion() != "v2.0.0" {
		t.Fatalf("list: %v %v", list, err)
	}
	// Anyone can verify what ListReleases returns, with the public key alone.
	got := list.Msg.GetReleases()[0]
	if vm, err := release.Verify([]ed25519.PublicKey{pub}, got.GetManifest(), got.GetManifestSignature()); err != nil || vm.Version != got.GetVersion() {
		t.Fatalf("re-verify the listed release: %+v %v", vm, err)
	}

	// A runner reads it with its certificate, and can verify it too.
	if err := controlplane.EnsureOrg(t.Context(), b.st, "o2"); err != nil {
		t.Fatal(err)
	}
	for _, r := range []store.Runner{{Org: "o1", RunnerID: "r1", ClusterID: "c1", Zone: "z"}, {Org: "o2", RunnerID: "r9", ClusterID: "c9", Zone: "z"}} {
		if _, err := b.st.Runners().Create(t.Context(), r); err != nil {
			t.Fatal(err)
		}
	}
	runnerCert, err := b.ca.IssueClient("", []*url.URL{controlplane.RunnerURI("o1", "r1")}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	runner := b.registration(&runnerCert)
	r, err := runner.GetRelease(t.Context(), connect.NewRequest(&controlplanev1.GetReleaseRequest{Version: "v2.0.0"}))
	if err != nil {
		t.Fatalf("runner GetRelease: %v", err)
	}
	if _, err := release.Verify([]ed25519.PublicKey{pub}, r.Msg.GetManifest(), r.Msg.GetManifestSignature()); err != nil ||
		r.Msg.GetBinaryChecksums()["amd64"] != hexA || len(r.Msg.GetChannels()) != 1 {
		t.Fatalf("runner's release: %v %v", r.Msg, err)
	}
	// A runner of another organization too: releases are platform-wide.
	otherCert, err := b.ca.IssueClient("", []*url.URL{controlplane.RunnerURI("o2", "r9")}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.registration(&otherCert).GetRelease(t.Context(), connect.NewRequest(&controlplanev1.GetReleaseRequest{Version: "v2.0.0"})); err != nil {
		t.Fatalf("another organization's runner: %v", err)
	}
	_, err = runner.GetRelease(t.Context(), connect.NewRequest(&controlplanev1.GetReleaseRequest{Version: "v9.9.9"}))
	wantReason(t, "unknown version", err, connect.CodeNotFound, apierr.ReleaseNotFound)
	_, err = runner.GetRelease(t.Context(), connect.NewRequest(&controlplanev1.GetReleaseRequest{Version: "latest"}))
	wantReason(t, "invalid version", err, connect.CodeInvalidArgument, apierr.InvalidRequest)

	// A deleted runner's certificate (still unexpired) reads nothing more.
	if err := b.st.Runners().Delete(t.Context(), "o2", "r9", ""); err != nil {
		t.Fatal(err)
	}
	_, err = b.registration(&otherCert).GetRelease(t.Context(), connect.NewRequest(&controlplanev1.GetReleaseRequest{Version: "v2.0.0"}))
	wantReason(t, "deleted runner", err, connect.CodeNotFound, apierr.RunnerNotFound)

	// Not a runner: no certificate, or one of the CA that names no runner (a gateway's).
	_, err = b.registration(nil).GetRelease(t.Context(), connect.NewRequest(&controlplanev1.GetReleaseRequest{Version: "v2.0.0"}))
	wantReason(t, "no certificate", err, connect.CodeUnauthenticated, apierr.Unauthenticated)
	gw, err := b.ca.IssueClient("", []*url.URL{{Scheme: "spiffe", Host: "sandboxd", Path: "/gateway/g1"}}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.registration(&gw).GetRelease(t.Context(), connect.NewRequest(&controlplanev1.GetReleaseRequest{Version: "v2.0.0"}))
	wantReason(t, "gateway certificate", err, connect.CodePermissionDenied, apierr.RunnerIdentityMismatch)
}

func TestNewRefusesMalformedReleaseKey(t *testing.T) {
	st, err := store.Open(t.Context(), filepath.Join(t.TempDir(), "cp.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	_, err = controlplane.New(controlplane.Config{Store: st, Auth: auth.NewStoreAuthenticator(st, nil), PlatformOrg: "o1",
		ReleaseKeys: []ed25519.PublicKey{make(ed25519.PublicKey, 10)}})
	if err == nil || !strings.Contains(err.Error(), "release key") {
		t.Fatalf("New with a 10-byte key: %v", err)
	}
}

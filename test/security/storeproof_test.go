package security

import (
	"errors"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/controlplane"
	"github.com/sandboxd/sandboxd/internal/pki"
)

// TestStoreProofImpostor: something at a gateway's --control-plane address that holds a
// certificate of the platform CA but not the store's identity (a stale control plane, a
// host given the PKI dir) must not pass the gateway's store check by answering anything
// but a proof: only the exact answer of a control plane older than the check ("missing
// API key" UNAUTHENTICATED from its admin front) counts as "cannot tell", and no redirect
// is followed to a control plane that can prove the store (the review's M1 and L3: an
// answer without the proof's marker used to count as "too old" and let admin calls
// through, and a redirect's proof would have been the other connection's).
func TestStoreProofImpostor(t *testing.T) {
	ca, err := pki.LoadOrCreateCA(filepath.Join(t.TempDir(), "pki"), "security test CA")
	if err != nil {
		t.Fatal(err)
	}
	tlsCfg, err := controlplane.TLSConfig(ca, []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	var answer http.HandlerFunc
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { answer(w, r) }), TLSConfig: tlsCfg}
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	defer srv.Close()
	base := "https://" + ln.Addr().String()
	// The gateway's client: the platform CA, no redirects.
	hc := &http.Client{Timeout: 10 * time.Second,
		Transport:     &http.Transport{TLSClientConfig: pki.ClientTLSConfig(nil, ca.Pool(), "127.0.0.1"), ForceAttemptHTTP2: true},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	id := "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	// The one answer that counts as "too old" (and shows the impostor is reached).
	answer = func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		_, _ = io.WriteString(w, `{"code":16,"message":"missing API key: send `+"`authorization: Bearer <key>`"+` (CWSANDBOX_API_KEY)"}`)
	}
	if err := controlplane.CheckStore(t.Context(), hc, base, id); !errors.Is(err, controlplane.ErrStoreProofUnsupported) {
		t.Fatalf("an older control plane's answer: %v, want ErrStoreProofUnsupported", err)
	}
	for name, h := range map[string]http.HandlerFunc{
		"200, a made-up proof, no marker": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"proof":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"}`)
		},
		"404": http.NotFound,
		"500": func(w http.ResponseWriter, r *http.Request) { http.Error(w, "oops", http.StatusInternalServerError) },
		"401, another message": func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, `{"code":16,"message":"invalid API key"}`, http.StatusUnauthorized)
		},
		"redirect to another URL": func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, base+"/x", http.StatusTemporaryRedirect)
		},
	} {
		answer = h
		err := controlplane.CheckStore(t.Context(), hc, base, id)
		if err == nil || errors.Is(err, controlplane.ErrStoreProofUnsupported) {
			t.Errorf("impostor answering %s: %v, want a failed check (not verified, not \"too old\")", name, err)
		}
	}
}

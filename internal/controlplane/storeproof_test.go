package controlplane_test

import (
	"encoding/base64"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/controlplane"
	"github.com/sandboxd/sandboxd/internal/pki"
	"github.com/sandboxd/sandboxd/internal/store"
)

func proofClient(ca *pki.CA) *http.Client {
	return &http.Client{Transport: &http.Transport{TLSClientConfig: pki.ClientTLSConfig(nil, ca.Pool(), "localhost"), ForceAttemptHTTP2: true},
		Timeout: 10 * time.Second}
}

// A control plane proves its store to a caller that holds the same store's identity, and
// to no other.
func TestStoreProof(t *testing.T) {
	b := newSignedBed(t)
	base := strings.Replace(b.url, "127.0.0.1", "localhost", 1)
	hc := proofClient(b.ca)
	id, err := b.st.Identity(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := controlplane.CheckStore(t.Context(), hc, base, id); err != nil {
		t.Fatalf("same store: %v", err)
	}
	// The answer carries a proof, never the identity.
	body := func(res *http.Response) string {
		b, err := io.ReadAll(res.Body)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, base+controlplane.StoreProofPath, nil)
	req.Header.Set(controlplane.StoreChallengeHeader, base64.RawURLEncoding.EncodeToString(make([]byte, 32)))
	res, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if b := body(res); res.StatusCode != http.StatusOK || !strings.Contains(b, `"proof"`) || strings.Contains(strings.ToLower(b), id) {
		t.Errorf("proof answer: HTTP %d %q (identity %s)", res.StatusCode, b, id)
	}
	other, err := store.Open(t.Context(), filepath.Join(t.TempDir(), "other.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	otherID, err := other.Identity(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := controlplane.CheckStore(t.Context(), hc, base, otherID); !errors.Is(err, controlplane.ErrStoreMismatch) {
		t.Fatalf("another store: %v, want ErrStoreMismatch", err)
	}

	// A bad challenge is refused; the answer never carries the identity.
	for _, ch := range []string{"", "short", strings.Repeat("A", 44), strings.Repeat("A", 4096)} {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, base+controlplane.StoreProofPath, nil)
		req.Header.Set(controlplane.StoreChallengeHeader, ch)
		res, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b := body(res)
		res.Body.Close()
		if res.StatusCode != http.StatusBadRequest || strings.Contains(strings.ToLower(b), id) {
			t.Errorf("challenge %.10q: HTTP %d %q, want 400 without the identity", ch, res.StatusCode, b)
		}
	}

	// A proof holds for the TLS connection it was asked on only: a relay that holds a
	// certificate the caller trusts, and asks the control plane on its own connection,
	// gets a proof that does not verify for the caller (same store or not).
	cpURL, _ := url.Parse(base)
	relay := httptest.NewUnstartedServer(&httputil.ReverseProxy{
		Rewrite:   func(r *httputil.ProxyRequest) { r.SetURL(cpURL) },
		Transport: &http.Transport{TLSClientConfig: pki.ClientTLSConfig(nil, b.ca.Pool(), "localhost"), ForceAttemptHTTP2: true},
	})
	cert, err := b.ca.IssueServer("relay", []string{"localhost"}, nil, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	relay.TLS = pki.ServerTLSConfig(cert, b.ca.Pool(), false)
	relay.StartTLS()
	defer relay.Close()
	relayBase := strings.Replace(relay.URL, "127.0.0.1", "localhost", 1)
	if err := controlplane.CheckStore(t.Context(), hc, relayBase, id); !errors.Is(err, controlplane.ErrStoreMismatch) {
		t.Fatalf("relayed proof: %v, want ErrStoreMismatch", err)
	}

	// A control plane that does not know the call (an older release: the path reaches
	// its admin front, which wants an API key) is told apart from one that proves another
	// store; every other answer without the marker is an error, and one with the marker
	// that is not 200 is a refusal.
	serve := func(h http.Handler) string {
		srv := httptest.NewUnstartedServer(h)
		srv.TLS = pki.ServerTLSConfig(cert, b.ca.Pool(), false)
		srv.StartTLS()
		t.Cleanup(srv.Close)
		return strings.Replace(srv.URL, "127.0.0.1", "localhost", 1)
	}
	if err := controlplane.CheckStore(t.Context(), hc, serve(b.svc.AdminFront()), id); !errors.Is(err, controlplane.ErrStoreProofUnsupported) {
		t.Fatalf("older control plane: %v, want ErrStoreProofUnsupported", err)
	}
	noRedirect := proofClient(b.ca)
	noRedirect.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	for name, h := range map[string]http.HandlerFunc{
		"401, another body": func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, `{"code":16,"message":"invalid API key"}`, http.StatusUnauthorized)
		},
		"401, not JSON": func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "missing API key: ", http.StatusUnauthorized)
		},
		"404": http.NotFound,
		"200": func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, `{"proof":"AAAA"}`) },
		"redirect": func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, b.url+controlplane.StoreProofPath, http.StatusFound)
		},
	} {
		err := controlplane.CheckStore(t.Context(), noRedirect, serve(h), id)
		if err == nil || errors.Is(err, controlplane.ErrStoreProofUnsupported) || errors.Is(err, controlplane.ErrStoreMismatch) ||
			errors.Is(err, controlplane.ErrStoreProofRefused) {
			t.Errorf("%s without the marker: %v, want an ordinary error", name, err)
		}
	}
	refusing := serve(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Sandboxd-Store-Proof", "1")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, `{"message":"busy"}`)
	}))
	if err := controlplane.CheckStore(t.Context(), hc, refusing, id); !errors.Is(err, controlplane.ErrStoreProofRefused) ||
		!strings.Contains(err.Error(), `HTTP 503: "busy"`) {
		t.Errorf("refusal with the marker: %v, want ErrStoreProofRefused naming HTTP 503 and the message", err)
	}
}

// A control plane reads its store's identity when it starts, and does not start without it.
func TestStoreProofIdentityAtStart(t *testing.T) {
	st, err := store.Open(t.Context(), filepath.Join(t.TempDir(), "cp.db"))
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	if _, err := controlplane.New(controlplane.Config{Store: st, Auth: auth.NewStoreAuthenticator(st, nil), PlatformOrg: "o1",
		Logger: slog.New(slog.DiscardHandler)}); err == nil || !strings.Contains(err.Error(), "identity") {
		t.Fatalf("New on a closed store: %v, want the identity's error", err)
	}
}

// A gateway's port never forwards the proof to its control plane: it is not an admin path.
func TestStoreProofNotRouted(t *testing.T) {
	cp := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { t.Errorf("forwarded %s", r.URL.Path) })
	gw := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNotFound) })
	rec := httptest.NewRecorder()
	controlplane.Route(cp, gw).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, controlplane.StoreProofPath, nil))
	if rec.Code != http.StatusNotFound {
		t.Fatalf("HTTP %d", rec.Code)
	}
}

package controlplane_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

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
		res.Body.Close()
		if res.StatusCode != http.StatusBadRequest {
			t.Errorf("challenge %.10q: HTTP %d, want 400", ch, res.StatusCode)
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

	// A control plane that does not know the call (an older release: its admin front
	// answers UNAUTHENTICATED) is told apart from one that proves another store.
	old := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, `{"code":"unauthenticated"}`, http.StatusUnauthorized)
	}))
	old.TLS = pki.ServerTLSConfig(cert, b.ca.Pool(), false)
	old.StartTLS()
	defer old.Close()
	if err := controlplane.CheckStore(t.Context(), hc, strings.Replace(old.URL, "127.0.0.1", "localhost", 1), id); !errors.Is(err, controlplane.ErrStoreProofUnsupported) {
		t.Fatalf("older control plane: %v, want ErrStoreProofUnsupported", err)
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

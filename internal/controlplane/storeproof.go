package controlplane

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// A gateway given --control-plane keeps its own store for API keys, the sandbox index and
// the audit log, and forwards the admin API to the control plane, which writes to its
// store. Both must be one store (docs/admin.md "Split deployment"). The gateway checks
// that at start, and again now and then, by asking the control plane to prove it knows
// the store's identity (store.Store.Identity):
//
//	GET StoreProofPath, header StoreChallengeHeader: 32 random bytes (base64url, no padding)
//	→ 200 {"proof": base64url(HMAC-SHA256(identity, label ‖ challenge ‖ exporter))}
//
// exporter is 32 bytes of keying material exported from the TLS connection the request
// came on (RFC 8446 §7.5, label StoreProofExporterLabel), so a proof holds for that
// connection only: it cannot be relayed to, or replayed on, another one. The call needs no
// credential (a gateway has none of its own towards the control plane); the caller learns
// one MAC of a challenge it chose under a 256-bit random key that is used for nothing else,
// which tells nothing about the identity, and it could only check one against an identity
// it already holds. The path is outside what a gateway forwards (Route), so it is served
// on the control plane's own listener only.

// StoreProofPath is where the control plane proves its store's identity.
const StoreProofPath = "/sandboxd.storeproof/Prove"

// StoreChallengeHeader carries the caller's challenge.
const StoreChallengeHeader = "Sandboxd-Store-Challenge"

// storeProofMarker is on every answer of StoreProofPath, errors included: an answer without
// it is not a control plane's answer to the call (the exact answer of a release older than
// the check aside: olderAnswer).
const storeProofMarker = "Sandboxd-Store-Proof"

// StoreProofExporterLabel labels the TLS keying material a proof is bound to (a private
// label: RFC 5705 §4 reserves the EXPERIMENTAL prefix for those).
const StoreProofExporterLabel = "EXPERIMENTAL-sandboxd-store-proof"

const storeProofLabel = "sandboxd store proof v1\x00"

// ErrStoreMismatch: the control plane proved another store than ours.
var ErrStoreMismatch = errors.New("the control plane uses another store")

// ErrStoreProofUnsupported: the control plane does not know StoreProofPath (a release
// from before the check): it gave the exact answer such a release gives to that path
// without an API key (see olderAnswer), and nothing else.
var ErrStoreProofUnsupported = errors.New("the control plane cannot prove its store (a release older than the check)")

// ErrStoreProofRefused: the control plane knows the call but refused it (an answer with
// the marker that is not 200).
var ErrStoreProofRefused = errors.New("the control plane refused the store proof")

// olderAnswer reports whether an answer without the marker is the one a control plane
// of a release before the check gives to StoreProofPath: the path falls through to its
// admin front, which refuses a call without an API key before looking at the path
// (apifront, auth.Check): HTTP 401, application/json, a google.rpc.Status of code 16
// (UNAUTHENTICATED) whose message is auth.Check's for a missing key.
func olderAnswer(res *http.Response, body []byte) bool {
	if res.StatusCode != http.StatusUnauthorized || !strings.HasPrefix(res.Header.Get("Content-Type"), "application/json") {
		return false
	}
	var st struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	return json.Unmarshal(body, &st) == nil && st.Code == 16 && strings.HasPrefix(st.Message, "missing API key: ")
}

func storeProof(identity string, challenge, exporter []byte) []byte {
	m := hmac.New(sha256.New, []byte(identity))
	m.Write([]byte(storeProofLabel))
	m.Write(challenge)
	m.Write(exporter)
	return m.Sum(nil)
}

// readStoreIdentity reads the store's identity once, when the control plane starts (New):
// it never changes, and the unauthenticated proof then never touches the store.
func readStoreIdentity(st interface {
	Identity(context.Context) (string, error)
}) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), storeIdentityTimeout)
	defer cancel()
	id, err := st.Identity(ctx)
	if err != nil {
		return "", fmt.Errorf("controlplane: the store's identity (gateways check it): %w", err)
	}
	return id, nil
}

// storeIdentityTimeout bounds New's read of the store's identity.
const storeIdentityTimeout = 30 * time.Second

// serveStoreProof answers StoreProofPath (see above). Nothing is read from the body.
func (s *Service) serveStoreProof(w http.ResponseWriter, r *http.Request) {
	w.Header().Set(storeProofMarker, "1")
	fail := func(code int, msg string) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_, _ = fmt.Fprintf(w, `{"message":%q}`, msg)
	}
	if r.Method != http.MethodGet {
		fail(http.StatusMethodNotAllowed, "GET only")
		return
	}
	challenge, err := base64.RawURLEncoding.DecodeString(r.Header.Get(StoreChallengeHeader))
	if err != nil || len(challenge) != 32 {
		fail(http.StatusBadRequest, StoreChallengeHeader+": want 32 bytes, base64url without padding")
		return
	}
	if r.TLS == nil {
		fail(http.StatusBadRequest, "TLS only")
		return
	}
	exporter, err := r.TLS.ExportKeyingMaterial(StoreProofExporterLabel, nil, 32)
	if err != nil {
		fail(http.StatusBadRequest, "no TLS keying material: "+err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(struct {
		Proof string `json:"proof"`
	}{base64.RawURLEncoding.EncodeToString(storeProof(s.storeID, challenge, exporter))})
}

// CheckStore asks the control plane at baseURL (https://HOST:PORT) through hc whether it
// uses the store whose identity is identity: nil when it proves so, ErrStoreMismatch when
// it proves another, ErrStoreProofUnsupported when it gives the exact answer of a release
// that does not know the call (olderAnswer), ErrStoreProofRefused when it knows the call
// and refuses it, another error otherwise (unreachable, any other answer). hc should not
// follow redirects: a redirect is then an answer without the marker, an error.
func CheckStore(ctx context.Context, hc *http.Client, baseURL, identity string) error {
	challenge := make([]byte, 32)
	_, _ = rand.Read(challenge)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, baseURL+StoreProofPath, nil)
	if err != nil {
		return err
	}
	req.Header.Set(StoreChallengeHeader, base64.RawURLEncoding.EncodeToString(challenge))
	res, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	body, err := io.ReadAll(io.LimitReader(res.Body, 4<<10))
	if err != nil {
		return err
	}
	if res.Header.Get(storeProofMarker) == "" {
		if olderAnswer(res, body) {
			return fmt.Errorf("%w: HTTP %d", ErrStoreProofUnsupported, res.StatusCode)
		}
		return fmt.Errorf("store proof: HTTP %d without the %s marker (not a control plane's answer to the call)", res.StatusCode, storeProofMarker)
	}
	if res.StatusCode != http.StatusOK {
		var m struct {
			Message string `json:"message"`
		}
		if json.Unmarshal(body, &m) != nil || m.Message == "" {
			m.Message = "(no message)"
		}
		return fmt.Errorf("%w: HTTP %d: %.200q", ErrStoreProofRefused, res.StatusCode, m.Message)
	}
	if res.TLS == nil {
		return errors.New("store proof: not over TLS")
	}
	var got struct {
		Proof string `json:"proof"`
	}
	if err := json.Unmarshal(body, &got); err != nil {
		return fmt.Errorf("store proof: %w", err)
	}
	proof, err := base64.RawURLEncoding.DecodeString(got.Proof)
	if err != nil {
		return fmt.Errorf("store proof: %w", err)
	}
	exporter, err := res.TLS.ExportKeyingMaterial(StoreProofExporterLabel, nil, 32)
	if err != nil {
		return fmt.Errorf("store proof: %w", err)
	}
	if !hmac.Equal(proof, storeProof(identity, challenge, exporter)) {
		return ErrStoreMismatch
	}
	return nil
}

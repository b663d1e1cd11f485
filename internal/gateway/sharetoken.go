package gateway

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"fmt"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/edge"
	"github.com/sandboxd/sandboxd/internal/runner"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// A sandbox with an HTTPS SHARE_TOKEN endpoint has an endpoint share token: the create
// response carries it (and nothing else ever does), the runner's edge accepts it on the
// sandbox's SHARE_TOKEN ports.
//
// The token is derived, not stored: HMAC-SHA256(key, sandbox ID), base64url (256 bits).
// The gateway names the sandbox (createOn) so that it knows the token before the runner
// does, and hands the runner only its SHA-256 (runtime.Spec.ShareTokenHash). A replayed
// create (same request_id) recomputes it, on any gateway replica that has the same key
// (Config.ShareTokenKey), so a client that lost the response can recover the token; the
// store, the index and the runner never see it.

// shareTokenLabel separates these MACs from any other use of the key.
const shareTokenLabel = "sandboxd endpoint share token v1\x00"

// shareTokens derives sandboxes' share tokens from the gateway's key.
type shareTokens struct{ key []byte }

// newShareTokens uses key, or a random key when it is empty (tokens then last as long as
// this process: a replay after a restart gets none, see withShareToken).
func newShareTokens(key []byte) shareTokens {
	if len(key) == 0 {
		key = make([]byte, 32)
		_, _ = rand.Read(key) // never fails (crypto/rand)
	}
	return shareTokens{key: key}
}

// token is sandbox id's share token.
func (k shareTokens) token(id string) string {
	m := hmac.New(sha256.New, k.key)
	m.Write([]byte(shareTokenLabel + id))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// needsShareTokens reports whether s has an HTTPS endpoint with SHARE_TOKEN auth.
func needsShareTokens(s runtime.Spec) bool {
	for _, svc := range s.Services {
		if svc.Endpoint == runtime.EndpointHTTPS && svc.TokenAuth {
			return true
		}
	}
	return false
}

// nameSandbox gives cr a new sandbox ID and, when it needs one, the hash of its share
// token. A new name per attempt: a runner that did create the sandbox after all (its
// answer timed out) never shares a name with the next runner's.
func (s *Server) nameSandbox(cr *runner.CreateRequest) {
	cr.Spec.ID = runner.NewID()
	if needsShareTokens(cr.Spec) {
		cr.Spec.ShareTokenHash = edge.ShareTokenHash(s.shareTokens.token(cr.Spec.ID))
	}
}

// withShareToken puts the share token into p, a create response for sb, when sb's runner
// holds its hash: a token is handed out only if it works. A sandbox created under another
// key (a gateway replica configured with a different one, or a restart without a kept
// key) gets none; the official client then replays the create, maybe on another replica.
func (s *Server) withShareToken(p *sandboxv1.Sandbox, sb runner.Sandbox) *sandboxv1.Sandbox {
	if sb.Spec.ShareTokenHash == "" {
		return p
	}
	if t := s.shareTokens.token(p.GetSandboxId()); edge.ShareTokenHash(t) == sb.Spec.ShareTokenHash {
		p.EndpointShareToken = t
	} else {
		s.log.Warn("a sandbox's share token was made with another key: gateway replicas need the same share-token key",
			"sandbox", p.GetSandboxId())
	}
	return p
}

// shareTokensUnsupported is a runner's refusal of a SHARE_TOKEN endpoint it cannot check.
func shareTokensUnsupported(runnerID string) error {
	return apierr.New(apierr.HTTPSShareTokenNotSupported,
		fmt.Sprintf("runner %s cannot check endpoint share tokens: use auth OPEN or another runner", runnerID),
		map[string]string{"runner_id": runnerID})
}

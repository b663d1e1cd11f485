package enroll

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"sync"
	"time"

	"connectrpc.com/connect"

	controlplanev1 "github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/controlplane/v1/controlplanev1connect"
	"github.com/sandboxd/sandboxd/internal/edge"
	"github.com/sandboxd/sandboxd/internal/pki"
)

// client is a RunnerRegistrationService client authenticated as the runner.
func (id *Identity) client() controlplanev1connect.RunnerRegistrationServiceClient {
	host := id.ControlPlane
	if h, _, err := splitHost(host); err == nil {
		host = h
	}
	cert := id.Cert
	hc := httpClient(pki.ClientTLSConfig(&cert, id.CAs, host))
	return controlplanev1connect.NewRunnerRegistrationServiceClient(hc, "https://"+id.ControlPlane)
}

// EdgeCertificate is the source of the runner edge's wildcard certificate
// *.<runner-id>.<baseDomain>: a key made here, signed by the control plane, renewed once
// half its life is over (the current one is kept while the control plane is away). The
// first certificate is fetched at once, so a misconfiguration shows at start-up.
func EdgeCertificate(ctx context.Context, id *Identity, baseDomain string) (func(*tls.ClientHelloInfo) (*tls.Certificate, error), error) {
	c := id.client()
	get := pki.Renewing(func() (tls.Certificate, error) {
		return signedKey(ctx, "edge", func(ctx context.Context, csrPEM string) (string, error) {
			res, err := c.IssueEdgeCertificate(ctx, connect.NewRequest(&controlplanev1.IssueEdgeCertificateRequest{CsrPem: csrPEM, BaseDomain: baseDomain}))
			if err != nil {
				return "", err
			}
			return res.Msg.GetCertificateChainPem(), nil
		})
	})
	if _, err := get(); err != nil {
		return nil, err
	}
	return func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return get() }, nil
}

// KeyVerifier is an edge Authorize for TOKEN endpoints that asks the control plane whose
// key a token is. Answers are cached (valid keys for keyCacheTTL, invalid ones for
// invalidKeyCacheTTL), so a revoked key may work that much longer; nothing is cached
// while the control plane cannot answer, and the request is refused meanwhile.
func KeyVerifier(id *Identity) func(ctx context.Context, token, org string) error {
	c := id.client()
	type answer struct {
		org     string // "" = not a valid key
		expires time.Time
	}
	var (
		mu    sync.Mutex
		cache = map[[32]byte]answer{}
	)
	return func(ctx context.Context, token, org string) error {
		k := sha256.Sum256([]byte(token))
		mu.Lock()
		a, ok := cache[k]
		mu.Unlock()
		if !ok || time.Now().After(a.expires) {
			ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			res, err := c.VerifyApiKey(ctx, connect.NewRequest(&controlplanev1.VerifyApiKeyRequest{ApiKey: token}))
			switch {
			case connect.CodeOf(err) == connect.CodeUnauthenticated:
				a = answer{expires: time.Now().Add(invalidKeyCacheTTL)}
			case err != nil:
				return fmt.Errorf("cannot check the key now: %w", err)
			default:
				a = answer{org: res.Msg.GetOrganizationId(), expires: time.Now().Add(keyCacheTTL)}
			}
			mu.Lock()
			if len(cache) > 10000 { // bounded: forget everything rather than grow
				clear(cache)
			}
			cache[k] = a
			mu.Unlock()
		}
		switch {
		case a.org == "":
			return fmt.Errorf("%w: not a valid API key", edge.ErrUnauthenticated)
		case a.org != org:
			return errors.New("the key belongs to another organization")
		}
		return nil
	}
}

// How long the edge trusts the control plane's answer about a key.
const (
	keyCacheTTL        = 30 * time.Second
	invalidKeyCacheTTL = 5 * time.Second
)

// DataPlaneCredentials are what the runner's direct data plane needs from the control
// plane: a server certificate for host from the data-plane CA (issue, renewed by the
// caller), and that CA to verify clients by. The first certificate, for host, is
// fetched at once, so a host the control plane does not certify for this runner (a
// tenant organization's runner gets only <runner_id>.<base-domain> and names under it)
// shows at start-up.
func DataPlaneCredentials(ctx context.Context, id *Identity, host string) (issue func(host string) (tls.Certificate, error), clientCAs *x509.CertPool, err error) {
	c := id.client()
	var caPEM string
	issue = func(host string) (tls.Certificate, error) {
		return signedKey(ctx, "data-plane", func(ctx context.Context, csrPEM string) (string, error) {
			res, err := c.IssueDataPlaneCertificate(ctx, connect.NewRequest(&controlplanev1.IssueDataPlaneCertificateRequest{CsrPem: csrPEM, Host: host}))
			if err != nil {
				return "", err
			}
			caPEM = res.Msg.GetCaBundlePem()
			return res.Msg.GetCertificateChainPem(), nil
		})
	}
	if _, err := issue(host); err != nil {
		return nil, nil, err
	}
	clientCAs = x509.NewCertPool()
	if !clientCAs.AppendCertsFromPEM([]byte(caPEM)) {
		return nil, nil, errors.New("data-plane CA from the control plane: no certificate in the reply")
	}
	return issue, clientCAs, nil
}

// signedKey makes a P-256 key and has sign (the control plane) certify it.
func signedKey(ctx context.Context, what string, sign func(ctx context.Context, csrPEM string) (chainPEM string, err error)) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	chain, err := sign(ctx, string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})))
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("%s certificate from the control plane: %w", what, err)
	}
	out := tls.Certificate{PrivateKey: key}
	for rest := []byte(chain); ; {
		var blk *pem.Block
		if blk, rest = pem.Decode(rest); blk == nil {
			break
		}
		out.Certificate = append(out.Certificate, blk.Bytes)
	}
	if len(out.Certificate) == 0 {
		return tls.Certificate{}, fmt.Errorf("%s certificate from the control plane: no certificate in the reply", what)
	}
	if out.Leaf, err = x509.ParseCertificate(out.Certificate[0]); err != nil {
		return tls.Certificate{}, err
	}
	return out, nil
}

// KeyActivity is an edge KeyActive for a registered runner: whether the key of ID keyID
// behind a login session is still active for org, asked of the control plane (the edge
// caches the answer a few seconds, sessionKeyCacheTTL). While the control plane cannot
// answer, the session is refused: a revoked key must not outlive the outage.
func KeyActivity(id *Identity) func(ctx context.Context, keyID, org string) error {
	c := id.client()
	return func(ctx context.Context, keyID, org string) error {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		res, err := c.ApiKeyActive(ctx, connect.NewRequest(&controlplanev1.ApiKeyActiveRequest{KeyId: keyID, OrganizationId: org}))
		if err != nil {
			return fmt.Errorf("cannot check the key now: %w", err)
		}
		if !res.Msg.GetActive() {
			return fmt.Errorf("%w: the key was revoked", edge.ErrUnauthenticated)
		}
		return nil
	}
}

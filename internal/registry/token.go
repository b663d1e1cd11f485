package registry

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Scope is what a platform token allows on its organization's repositories.
type Scope string

const (
	ScopePull Scope = "pull"      // read manifests and blobs
	ScopePush Scope = "pull,push" // also write them (image builds)
)

// tokenPrefix marks a registry token (API keys start with "sbx_").
const tokenPrefix = "sbxreg."

// MaxTokenTTL bounds a token's lifetime: they are for one pull or one build.
const MaxTokenTTL = 24 * time.Hour

// maxTokenBytes bounds what is parsed as a token (ours are ~120 bytes).
const maxTokenBytes = 512

// minKeyBytes is the shortest HMAC key accepted.
const minKeyBytes = 32

// errBadToken covers malformed, forged and expired tokens alike.
var errBadToken = errors.New("invalid or expired registry token")

type tokenClaims struct {
	org    string
	scope  Scope
	expiry time.Time
}

// tokens mints and checks platform tokens: "sbxreg.<payload>.<mac>", payload
// "v1|<org>|<scope>|<expiry unix seconds>" (base64url), mac = HMAC-SHA256(key, payload).
type tokens struct {
	key []byte
	now func() time.Time
}

func (t tokens) mint(org string, scope Scope, ttl time.Duration) (string, error) {
	switch {
	case !orgRE.MatchString(org):
		return "", fmt.Errorf("registry token: organization %q cannot own repositories (must match %s)", org, orgRE)
	case scope != ScopePull && scope != ScopePush:
		return "", fmt.Errorf("registry token: unknown scope %q", scope)
	case ttl <= 0 || ttl > MaxTokenTTL:
		return "", fmt.Errorf("registry token: ttl %v must be in (0, %v]", ttl, MaxTokenTTL)
	}
	payload := strings.Join([]string{"v1", org, string(scope), strconv.FormatInt(t.now().Add(ttl).Unix(), 10)}, "|")
	return tokenPrefix + base64.RawURLEncoding.EncodeToString([]byte(payload)) + "." +
		base64.RawURLEncoding.EncodeToString(t.mac(payload)), nil
}

func (t tokens) mac(payload string) []byte {
	m := hmac.New(sha256.New, t.key)
	m.Write([]byte(payload))
	return m.Sum(nil)
}

// check verifies tok's MAC (constant time) and expiry.
func (t tokens) check(tok string) (tokenClaims, error) {
	if len(tok) > maxTokenBytes {
		return tokenClaims{}, errBadToken
	}
	rest, ok := strings.CutPrefix(tok, tokenPrefix)
	if !ok {
		return tokenClaims{}, errBadToken
	}
	p64, m64, ok := strings.Cut(rest, ".")
	if !ok {
		return tokenClaims{}, errBadToken
	}
	payload, err1 := base64.RawURLEncoding.Strict().DecodeString(p64)
	mac, err2 := base64.RawURLEncoding.Strict().DecodeString(m64)
	if err1 != nil || err2 != nil || !hmac.Equal(mac, t.mac(string(payload))) {
		return tokenClaims{}, errBadToken
	}
	f := strings.Split(string(payload), "|")
	if len(f) != 4 || f[0] != "v1" {
		return tokenClaims{}, errBadToken
	}
	exp, err := strconv.ParseInt(f[3], 10, 64)
	if err != nil {
		return tokenClaims{}, errBadToken
	}
	c := tokenClaims{org: f[1], scope: Scope(f[2]), expiry: time.Unix(exp, 0)}
	if !t.now().Before(c.expiry) || (c.scope != ScopePull && c.scope != ScopePush) || !orgRE.MatchString(c.org) {
		return tokenClaims{}, errBadToken
	}
	return c, nil
}

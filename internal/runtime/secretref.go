package runtime

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
)

// SecretRef is an environment variable whose value is key Key of the orchestrator secret
// Secret in the runner's namespace, granted to the organization's secret store Store
// (docs/secrets.md, "Kubernetes Secrets").
type SecretRef struct {
	EnvVar string `json:"env_var"`
	Store  string `json:"store"`
	Secret string `json:"secret"` // the store reference's path: a Secret's name
	Key    string `json:"key"`    // the reference's field: a key of the Secret's data
}

// ErrSecretRefsUnsupported: the backend cannot take Container.SecretRefs (a local runner).
var ErrSecretRefsUnsupported = errors.New("secrets of a KUBERNETES secret store are read by Kubernetes runners only")

// ErrSecretRefNotGranted: a Container.SecretRefs secret is missing, has no such key, or
// does not grant the organization's store. One error for all three, so a sandbox cannot
// learn which of the runner's secrets exist.
var ErrSecretRefNotGranted = errors.New("no such secret granted to this secret store")

// OrgHash is the label-safe form of an organization ID: 48 hex digits of its SHA-256
// (the value of the grant labels on Kubernetes objects an organization may use).
func OrgHash(org string) string {
	h := sha256.Sum256([]byte(org))
	return hex.EncodeToString(h[:24])
}

// SecretRefChecker is implemented by backends that take Container.SecretRefs.
type SecretRefChecker interface {
	// CheckSecretRefs checks that every SecretRefs entry of spec names a secret that
	// grants the spec's organization's store (ErrSecretRefNotGranted, wrapped with the
	// reference's store, path and field, otherwise). Create checks it again.
	CheckSecretRefs(ctx context.Context, spec *Spec) error
}

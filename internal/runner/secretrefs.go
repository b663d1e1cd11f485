package runner

import (
	"context"
	"errors"
	"fmt"
	"regexp"

	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

var envVarName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,255}$`)

// checkSecretRefs checks the references to a KUBERNETES secret store's secrets
// (runtime.Container.SecretRefs, docs/secrets.md) before anything is made: a backend that
// cannot take them (a local runner) refuses them with the reason, and one that can checks
// that each Secret grants the organization's store. A missing Secret, a missing key and a
// Secret without the grant are the same CWSANDBOX_SECRET_NOT_PROVISIONED.
func (r *Runner) checkSecretRefs(ctx context.Context, spec *runtime.Spec) error {
	var vs []apierr.Violation
	for i, c := range spec.AllContainers() {
		for _, ref := range c.SecretRefs {
			if !envVarName.MatchString(ref.EnvVar) || len(ref.Secret) > 253 || len(ref.Key) > 253 {
				vs = append(vs, apierr.Violation{Field: fmt.Sprintf("spec.containers[%d].secret_stores", i), Description: fmt.Sprintf("env_var %q (a variable name) with a path and field of at most 253 bytes", ref.EnvVar)})
			}
		}
	}
	if len(vs) > 0 {
		return apierr.Invalid(apierr.InvalidRequest, "secret store references: "+vs[0].Description, vs)
	}
	any := false
	for _, c := range spec.AllContainers() {
		any = any || len(c.SecretRefs) > 0
	}
	if !any {
		return nil
	}
	chk, ok := r.backend.(runtime.SecretRefChecker)
	if !ok {
		return apierr.Newf(apierr.SecretStoreProviderUnsupported, "this runner cannot read a KUBERNETES secret store: %v; use a built-in (SANDBOXD) store, or a Kubernetes runner", runtime.ErrSecretRefsUnsupported)
	}
	err := chk.CheckSecretRefs(ctx, spec)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, runtime.ErrSecretRefNotGranted):
		return apierr.WithViolations(apierr.Newf(apierr.SecretNotProvisioned, "%v", err),
			[]apierr.Violation{{Field: "spec.containers.secret_stores", Description: err.Error()}})
	case errors.Is(err, runtime.ErrInvalidSpec):
		return apierr.Newf(apierr.InvalidRequest, "%v", err)
	}
	return fmt.Errorf("secret store references: %w", err)
}

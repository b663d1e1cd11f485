package kubernetes

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// Kubernetes Secrets as a secret store (runtime.Container.SecretRefs, docs/secrets.md):
// the Pod's container takes each variable by valueFrom.secretKeyRef, so the value goes
// from the API server to the kubelet and never through sandboxd.
//
// The runner's namespace holds the runner's own Secrets too (its sandboxes' agent keys,
// pull Secrets, maybe service-account tokens): a sandbox may take a Secret only when the
// Secret grants its organization's store, by two labels its maker (the cluster's admin)
// sets: LabelSecretStoreOrg = runtime.OrgHash(org) and LabelSecretStore = the store's
// name. Anything else (missing Secret, missing key, no grant) is one error,
// runtime.ErrSecretRefNotGranted, so existence does not leak.

const (
	// LabelSecretStoreOrg grants a Secret to an organization (runtime.OrgHash of its ID).
	LabelSecretStoreOrg = "sandboxd.io/secret-store-org"
	// LabelSecretStore names the organization's secret store the Secret is granted to.
	LabelSecretStore = "sandboxd.io/secret-store"
)

var _ runtime.SecretRefChecker = (*Backend)(nil)

// CheckSecretRefs implements runtime.SecretRefChecker.
func (b *Backend) CheckSecretRefs(ctx context.Context, spec *runtime.Spec) error {
	org := spec.Meta[runtime.MetaOrg]
	for _, c := range spec.AllContainers() {
		if len(c.SecretRefs) > 0 && spec.Multi() {
			return fmt.Errorf("%w: container %q: secrets of a KUBERNETES secret store in a multi-container sandbox are not built yet", runtime.ErrInvalidSpec, c.ContainerName())
		}
		for _, r := range c.SecretRefs {
			if err := b.checkSecretRef(ctx, org, r); err != nil {
				return fmt.Errorf("container %q: %w", c.ContainerName(), err)
			}
		}
	}
	return nil
}

func (b *Backend) checkSecretRef(ctx context.Context, org string, r runtime.SecretRef) error {
	notGranted := fmt.Errorf("%w: store %q, path %q, field %q", runtime.ErrSecretRefNotGranted, r.Store, r.Secret, r.Key)
	// Names no Secret can have (a path with '/', which client-go would refuse) are the
	// same answer as a missing Secret.
	if org == "" || len(validation.IsDNS1123Subdomain(r.Secret)) > 0 || len(validation.IsConfigMapKey(r.Key)) > 0 {
		return notGranted
	}
	sec, err := b.cfg.Client.CoreV1().Secrets(b.cfg.Namespace).Get(ctx, r.Secret, metav1.GetOptions{})
	if apierrors.IsNotFound(err) || apierrors.IsInvalid(err) || apierrors.IsBadRequest(err) {
		return notGranted
	}
	if err != nil {
		return fmt.Errorf("secret store %q: read the Secret: %w", r.Store, err)
	}
	if sec.Labels[LabelSecretStoreOrg] != runtime.OrgHash(org) || sec.Labels[LabelSecretStore] != r.Store {
		return notGranted
	}
	if _, ok := sec.Data[r.Key]; !ok {
		if _, ok := sec.StringData[r.Key]; !ok {
			return notGranted
		}
	}
	return nil
}

// applySecretRefs adds the primary's SecretRefs to the main container's env.
func applySecretRefs(pod *corev1.Pod, spec *runtime.Spec) {
	if len(spec.SecretRefs) == 0 {
		return
	}
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		if c.Name != containerMain {
			continue
		}
		for _, r := range spec.SecretRefs {
			c.Env = append(c.Env, corev1.EnvVar{Name: r.EnvVar, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
				LocalObjectReference: corev1.LocalObjectReference{Name: r.Secret}, Key: r.Key,
			}}})
		}
	}
}

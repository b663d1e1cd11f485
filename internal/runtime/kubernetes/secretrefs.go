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

// applySecretRefs adds each container's SecretRefs to its Pod container's env (a
// multi-container spec: every container that names a store; otherwise the primary's).
func applySecretRefs(pod *corev1.Pod, spec *runtime.Spec) {
	byPod := map[string]*runtime.Container{}
	if spec.Multi() {
		for _, m := range members(spec) {
			if len(m.c.SecretRefs) > 0 {
				byPod[m.pod] = m.c
			}
		}
	} else if len(spec.SecretRefs) > 0 {
		byPod[containerMain] = &spec.Container
	}
	if len(byPod) == 0 {
		return
	}
	for _, list := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range list {
			c := &list[i]
			rc := byPod[c.Name]
			if rc == nil || c.Name == containerGate || c.Name == containerInstall {
				continue
			}
			for _, r := range rc.SecretRefs {
				c.Env = append(c.Env, corev1.EnvVar{Name: r.EnvVar, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
					LocalObjectReference: corev1.LocalObjectReference{Name: r.Secret}, Key: r.Key,
				}}})
			}
		}
	}
}

// secretRefNames are the variables of c's SecretRefs: the agent takes them from its
// process environment (agentconfig.Config.EnvFromProcess), so no value is in a file.
func secretRefNames(c *runtime.Container) []string {
	if len(c.SecretRefs) == 0 {
		return nil
	}
	out := make([]string, 0, len(c.SecretRefs))
	for _, r := range c.SecretRefs {
		out = append(out, r.EnvVar)
	}
	return out
}

package kubernetes

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// Image pull Secrets per organization (issue 22 §4: "Kubernetes runners too (image pull
// secret per organization)").
//
// The gateway gives every container whose image is in the platform registry a pull
// token of the sandbox's organization (pull-only, 15 minutes: registry.MintPullToken),
// at every create and with every warm-target send (every 30 s). The backend keeps those
// tokens in one Secret per organization and runner, orgPullSecretName(runner, org), of
// type dockerconfigjson with one entry, the platform registry's host; every Pod of the
// organization (sandboxes and pre-pull Pods) names it. Credentials that are not such a
// token — a caller's or a template's own credentials for any registry, an API key for
// the platform registry, a token of another organization or scope — never go into it:
// they stay in the sandbox's own pull Secret (pullSecretName, owned by its Pod), as
// before, since they belong to a caller, not to the organization.
//
// Isolation: the name is derived from the organization ID and the runner ID alone
// (SHA-256, so any ID gives a valid, fixed-length name); the Secret carries the
// organization in an annotation, checked before every write (a Secret of that name
// for another organization is never overwritten, and its Pod is refused); only a token
// whose own payload names the sandbox's organization (Meta[runtime.MetaOrg]) and the
// scope "pull" is written; the Pod spec is built by the backend from the sandbox's
// organization, so no Pod names another organization's Secret. A token's claims are
// read, not verified (the runner has no key): the registry verifies it at every pull.
//
// Refresh: a token is written when it expires at least orgTokenRefresh later than the
// one the Secret holds (so the Secret holds a token at most that much older than the
// newest the runner saw, and is written at most once per orgTokenRefresh per
// organization), always before the Pod that needs it is created. Between creates the
// warm-target sends keep it fresh for organizations with templates. An expired token in
// the Secret harms nothing: the kubelet reads the Secret only when it pulls, and every
// new Pod's create writes a fresh one first.
//
// Garbage collection: when the runner destroys the last sandbox of an organization, and
// no pre-pull wants a Secret of it, the Secret is deleted (orgSecrets.mu orders this
// against a create of the same organization). Recover sweeps the runner's Secrets left
// by an earlier process the same way.

const (
	// LabelKind tells the backend's objects that are not a sandbox's apart.
	LabelKind = "sandboxd.io/kind"
	// KindOrgPull labels the per-organization pull Secrets, KindPrepull the pre-pull
	// Pods and their Secrets.
	KindOrgPull = "org-pull"
	KindPrepull = "prepull"
	// AnnotationOrg holds the organization ID of an org pull Secret (label values cannot
	// hold every ID).
	AnnotationOrg = "sandboxd.io/org-id"
	// annotationExpiry is the Unix time the Secret's token expires.
	annotationExpiry = "sandboxd.io/token-expiry"

	orgTokenRefresh = time.Minute
	// maxOrgIDLen bounds the organization IDs given a Secret (the registry's own IDs are
	// far shorter).
	maxOrgIDLen = 256
)

// OrgPullSecretName is the name of org's pull Secret of runner: "sbx-org-" and 40 hex
// digits of SHA-256(runner, org).
func OrgPullSecretName(runnerID, org string) string {
	h := sha256.Sum256([]byte(runnerID + "\x00" + org))
	return "sbx-org-" + hex.EncodeToString(h[:20])
}

// platformToken is the claims of a platform registry pull token as it reads
// (registry/token.go: "sbxreg." base64url("v1|<org>|<scope>|<expiry>") "." mac).
type platformToken struct {
	org    string
	expiry time.Time
}

// parsePlatformPullToken reads a pull token's claims; ok is false for anything else
// (API keys, push tokens, malformed ones). The MAC is not checked here.
func parsePlatformPullToken(password string) (platformToken, bool) {
	if len(password) > 512 {
		return platformToken{}, false
	}
	rest, ok := strings.CutPrefix(password, "sbxreg.")
	if !ok {
		return platformToken{}, false
	}
	p64, _, ok := strings.Cut(rest, ".")
	if !ok {
		return platformToken{}, false
	}
	payload, err := base64.RawURLEncoding.Strict().DecodeString(p64)
	if err != nil {
		return platformToken{}, false
	}
	f := strings.Split(string(payload), "|")
	if len(f) != 4 || f[0] != "v1" || f[2] != "pull" || f[1] == "" {
		return platformToken{}, false
	}
	exp, err := strconv.ParseInt(f[3], 10, 64)
	if err != nil {
		return platformToken{}, false
	}
	return platformToken{org: f[1], expiry: time.Unix(exp, 0)}, true
}

// orgPull is a platform registry token of an organization found in a spec.
type orgPull struct {
	org, host string
	creds     runtime.Credentials
	expiry    time.Time
}

// isOrgCreds reports whether creds, for image, are a platform pull token of org for the
// platform registry (host): what goes into org's Secret.
func (b *Backend) isOrgCreds(org, image string, creds *runtime.Credentials) (platformToken, bool) {
	if creds == nil || b.cfg.PlatformRegistry == "" || !validOrgID(org) || registryOf(image) != b.cfg.PlatformRegistry {
		return platformToken{}, false
	}
	tok, ok := parsePlatformPullToken(creds.Password)
	if !ok || tok.org != org {
		return platformToken{}, false
	}
	return tok, true
}

// validOrgID: an organization ID the backend keeps a Secret for (printable, bounded).
func validOrgID(org string) bool {
	if org == "" || len(org) > maxOrgIDLen {
		return false
	}
	for _, r := range org {
		if r < 0x21 || r > 0x7e {
			return false
		}
	}
	return true
}

// splitPullCreds takes the organization's platform tokens out of spec's containers:
// the newest one (nil: none), and a copy of spec whose containers keep only the other
// credentials (for the sandbox's own pull Secret). spec is not changed.
func (b *Backend) splitPullCreds(spec *runtime.Spec) (*orgPull, *runtime.Spec) {
	org := spec.Meta[runtime.MetaOrg]
	var best *orgPull
	rest := *spec
	rest.Sidecars = append([]runtime.Container(nil), spec.Sidecars...)
	rest.InitContainers = append([]runtime.Container(nil), spec.InitContainers...)
	strip := func(c *runtime.Container) {
		tok, ok := b.isOrgCreds(org, c.Image, c.PullCredentials)
		if !ok {
			return
		}
		if best == nil || tok.expiry.After(best.expiry) {
			best = &orgPull{org: org, host: b.cfg.PlatformRegistry, creds: *c.PullCredentials, expiry: tok.expiry}
		}
		c.PullCredentials = nil
	}
	strip(&rest.Container)
	for i := range rest.Sidecars {
		strip(&rest.Sidecars[i])
	}
	for i := range rest.InitContainers {
		strip(&rest.InitContainers[i])
	}
	return best, &rest
}

// orgSecretFor builds org's pull Secret holding p.
func (b *Backend) orgSecretFor(p *orgPull) (*corev1.Secret, error) {
	reg := p.host
	if reg == name.DefaultRegistry {
		reg = "https://index.docker.io/v1/"
	}
	auth := base64.StdEncoding.EncodeToString([]byte(p.creds.Username + ":" + p.creds.Password))
	data, err := json.Marshal(map[string]any{"auths": map[string]any{
		reg: map[string]string{"username": p.creds.Username, "password": p.creds.Password, "auth": auth},
	}})
	if err != nil {
		return nil, err
	}
	lbls := map[string]string{LabelManagedBy: ManagedBy, LabelRunner: b.cfg.RunnerID, LabelKind: KindOrgPull}
	if len(validation.IsValidLabelValue(p.org)) == 0 {
		lbls[LabelOrg] = p.org
	}
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name: OrgPullSecretName(b.cfg.RunnerID, p.org), Namespace: b.cfg.Namespace, Labels: lbls,
			Annotations: map[string]string{AnnotationOrg: p.org, annotationExpiry: strconv.FormatInt(p.expiry.Unix(), 10)},
		},
		Type: corev1.SecretTypeDockerConfigJson,
		Data: map[string][]byte{corev1.DockerConfigJsonKey: data},
	}, nil
}

// ensureOrgSecretLocked makes org's pull Secret hold p's token, or one that expires
// less than orgTokenRefresh earlier, and returns its name. The caller holds b.orgMu.
func (b *Backend) ensureOrgSecretLocked(ctx context.Context, p *orgPull) (string, error) {
	want, err := b.orgSecretFor(p)
	if err != nil {
		return "", err
	}
	secrets := b.cfg.Client.CoreV1().Secrets(b.cfg.Namespace)
	for attempt := 0; ; attempt++ {
		cur, err := secrets.Get(ctx, want.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			_, err := secrets.Create(ctx, want, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) && attempt == 0 {
				continue // raced with another writer: read it
			}
			if err != nil {
				return "", fmt.Errorf("pull secret of organization %q: %w", p.org, err)
			}
			return want.Name, nil
		case err != nil:
			return "", fmt.Errorf("pull secret of organization %q: %w", p.org, err)
		}
		if cur.Annotations[AnnotationOrg] != p.org || cur.Labels[LabelRunner] != b.cfg.RunnerID || cur.Labels[LabelKind] != KindOrgPull {
			// Never another organization's (or anything else's) Secret.
			return "", fmt.Errorf("pull secret %s is not organization %q's of runner %s: refusing it", want.Name, p.org, b.cfg.RunnerID)
		}
		held, _ := strconv.ParseInt(cur.Annotations[annotationExpiry], 10, 64)
		if p.expiry.Unix() < held+int64(orgTokenRefresh/time.Second) && cur.Type == corev1.SecretTypeDockerConfigJson {
			return want.Name, nil // fresh enough
		}
		cur.Type, cur.Data, cur.Annotations, cur.Labels = want.Type, want.Data, want.Annotations, want.Labels
		_, err = secrets.Update(ctx, cur, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) && attempt == 0 {
			continue
		}
		if err != nil {
			return "", fmt.Errorf("refresh pull secret of organization %q: %w", p.org, err)
		}
		b.log.Debug("refreshed the pull secret of an organization", "org", p.org, "secret", want.Name, "expires", p.expiry.UTC().Format(time.RFC3339))
		return want.Name, nil
	}
}

// ensureOrgSecret is ensureOrgSecretLocked under b.orgMu.
func (b *Backend) ensureOrgSecret(ctx context.Context, p *orgPull) (string, error) {
	b.orgMu.Lock()
	defer b.orgMu.Unlock()
	return b.ensureOrgSecretLocked(ctx, p)
}

// orgInUseLocked reports whether a sandbox of org is known to the backend or a pre-pull
// wants org's Secret. The caller holds b.orgMu.
func (b *Backend) orgInUseLocked(org string) bool {
	b.mu.Lock()
	for _, s := range b.sandboxes {
		if s.spec.Meta[runtime.MetaOrg] == org {
			b.mu.Unlock()
			return true
		}
	}
	b.mu.Unlock()
	return b.prepull != nil && b.prepull.wantsOrg(org)
}

// gcOrgSecret deletes org's pull Secret when nothing of org remains.
func (b *Backend) gcOrgSecret(ctx context.Context, org string) {
	if !validOrgID(org) || b.cfg.PlatformRegistry == "" {
		return
	}
	b.orgMu.Lock()
	defer b.orgMu.Unlock()
	if b.orgInUseLocked(org) {
		return
	}
	b.deleteOrgSecretLocked(ctx, org)
}

func (b *Backend) deleteOrgSecretLocked(ctx context.Context, org string) {
	n := OrgPullSecretName(b.cfg.RunnerID, org)
	err := b.cfg.Client.CoreV1().Secrets(b.cfg.Namespace).Delete(ctx, n, metav1.DeleteOptions{})
	switch {
	case err == nil:
		b.log.Info("deleted the pull secret of an organization without sandboxes", "org", org, "secret", n)
	case !apierrors.IsNotFound(err):
		b.log.Warn("delete the pull secret of an organization", "org", org, "secret", n, "err", err)
	}
}

// sweepOrgSecrets deletes the runner's org pull Secrets whose organization has no
// sandbox and no pre-pull (after Recover: Secrets of an earlier process).
func (b *Backend) sweepOrgSecrets(ctx context.Context) {
	list, err := b.cfg.Client.CoreV1().Secrets(b.cfg.Namespace).List(ctx, metav1.ListOptions{
		LabelSelector: LabelManagedBy + "=" + ManagedBy + "," + LabelRunner + "=" + b.cfg.RunnerID + "," + LabelKind + "=" + KindOrgPull,
	})
	if err != nil {
		b.log.Warn("list organization pull secrets", "err", err)
		return
	}
	b.orgMu.Lock()
	defer b.orgMu.Unlock()
	for i := range list.Items {
		sec := &list.Items[i]
		org := sec.Annotations[AnnotationOrg]
		if !validOrgID(org) || sec.Name != OrgPullSecretName(b.cfg.RunnerID, org) {
			continue // not one the backend made: left alone
		}
		if !b.orgInUseLocked(org) {
			b.deleteOrgSecretLocked(ctx, org)
		}
	}
}

package kubernetes

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/sandboxd/sandboxd/internal/nodeagent/hibernate"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes/gate"
)

// What a paused sandbox's Secret records of its paused Pod, so that a restarted runner
// takes the sandbox over and resumes it as the runner that paused it would have
// (checkpoint.go): annotationPausedPod, a versioned JSON object (pausedPod), beside the
// checkpoint's annotations.
//
// A Secret can be read and written by anyone with rights in the namespace: its content
// is never trusted. readPauseState bounds its size and shape and checks each field
// against what this runner makes for the sandbox's spec (securityFor, the sandbox's own
// and its organization's pull Secrets, the containers and pull policies of buildPod, the
// image repository of the spec with only a digest taken from the record); a record that
// fails ends the sandbox with Reason CheckpointLost, naming the field. A security context
// or pull policy that is not this runner's (its configuration changed since the pause) is
// replaced by this runner's, not refused. The checkpoint ID is tied to the sandbox by its
// node agent (checkpoint.go: ownCheckpoint).

const (
	annotationPausedPod = "sandboxd.io/paused-pod"
	// pausedPodVersion is the version of pausedPod this runner writes and reads.
	pausedPodVersion = 1
	// maxPausedPodBytes bounds annotationPausedPod (what this runner writes is far smaller).
	maxPausedPodBytes = 8 << 10
	// maxPausedPodEntries bounds each list and map of a pausedPod (a paused Pod has a gate
	// and a main container, and at most the sandbox's and its organization's pull Secrets).
	maxPausedPodEntries = 4
)

// pausedPod is what the resumed Pod takes from the paused one (the rest comes from the
// spec, as at Create: buildPod).
type pausedPod struct {
	V int `json:"v"`
	// PullSecrets: the paused Pod's pull Secrets that are not the policy's (the policy's
	// are added again by applyPodSettings).
	PullSecrets []string `json:"pull_secrets,omitempty"`
	// SecurityContext: the main container's (securityFor's, with the image's user).
	SecurityContext *corev1.SecurityContext `json:"security_context,omitempty"`
	// PullPolicy: each container's image pull policy.
	PullPolicy map[string]corev1.PullPolicy `json:"pull_policy,omitempty"`
	// Pinned: for each container the paused Pod pulled every time (PullAlways: its image
	// needs the sandbox's pull credentials, which may have expired by the resume), the
	// digest of the image it ran ("sha256:<64 hex>"); the resumed Pod runs the spec's
	// repository at that digest, IfNotPresent (it is pinned to the same node, where the
	// image is).
	Pinned map[string]string `json:"pinned,omitempty"`
	// WarmClaimed: the paused Pod's annotationWarmClaimed (the sandbox's start).
	WarmClaimed string `json:"warm_claimed,omitempty"`
	// StartedAt and ImageDigest: the sandbox's runtime.Info while paused.
	StartedAt   time.Time `json:"started_at,omitzero"`
	ImageDigest string    `json:"image_digest,omitempty"`
}

// validImageDigest: d is "sha256:" and 64 lower-case hex digits.
func validImageDigest(d string) bool {
	h, ok := strings.CutPrefix(d, "sha256:")
	if !ok || len(h) != 64 || strings.ToLower(h) != h {
		return false
	}
	_, err := hex.DecodeString(h)
	return err == nil
}

// pinnedRef is image (a container's, as buildPod makes it) at digest: its repository
// as the spec names it, tag or digest replaced. An image that names a digest must name
// that one.
func pinnedRef(image, digest string) (string, error) {
	if !validImageDigest(digest) {
		return "", fmt.Errorf("image digest %q is not sha256:<64 hex>", digest)
	}
	ref, err := name.ParseReference(image)
	if err != nil {
		return "", fmt.Errorf("image %q: %w", image, err)
	}
	switch r := ref.(type) {
	case name.Digest:
		if r.DigestStr() != digest {
			return "", fmt.Errorf("image %q is pinned to another digest than the paused Pod's (%s)", image, digest)
		}
		return image, nil
	case name.Tag:
		repo := strings.TrimSuffix(image, ":"+r.TagStr())
		if i := strings.LastIndex(repo, "/"); strings.Contains(repo[i+1:], ":") {
			return "", fmt.Errorf("image %q: cannot take its tag off", image)
		}
		return repo + "@" + digest, nil
	}
	return "", fmt.Errorf("image %q: not a tag or digest reference", image)
}

// pausedPodOf records what the resumed Pod of s takes from its paused Pod pod (nil:
// pinnedImages refuses it). Called with Backend.mu held.
func pausedPodOf(s *sandbox, pod *corev1.Pod) (pausedPod, string) {
	pp := pausedPod{V: pausedPodVersion, WarmClaimed: pod.Annotations[annotationWarmClaimed], PullPolicy: map[string]corev1.PullPolicy{}}
	for _, c := range pod.Spec.Containers {
		pp.PullPolicy[c.Name] = c.ImagePullPolicy
		if c.Name == containerMain && c.SecurityContext != nil {
			pp.SecurityContext = c.SecurityContext.DeepCopy()
		}
	}
	for _, r := range pod.Spec.ImagePullSecrets {
		if s.spec.Pod == nil || !slices.Contains(s.spec.Pod.ImagePullSecrets, r.Name) {
			pp.PullSecrets = append(pp.PullSecrets, r.Name)
		}
	}
	pinned, why := pinnedImages(pod)
	if why != "" {
		return pausedPod{}, why
	}
	if len(pinned) > 0 {
		pp.Pinned = pinned
	}
	info := infoOf(s)
	pp.StartedAt = info.StartedAt
	if validImageDigest(info.ImageDigest) {
		pp.ImageDigest = info.ImageDigest
	}
	return pp, ""
}

// marshalPausedPod is annotationPausedPod's value.
func marshalPausedPod(pp *pausedPod) (string, error) {
	b, err := json.Marshal(pp)
	if err != nil {
		return "", err
	}
	if len(b) > maxPausedPodBytes {
		return "", fmt.Errorf("the paused Pod's record is %d bytes, more than %d", len(b), maxPausedPodBytes)
	}
	return string(b), nil
}

// errPauseRecord: a paused sandbox's Secret does not hold a record this runner can
// resume it from.
var errPauseRecord = errors.New("the paused sandbox's record in its Secret is unusable")

// readPauseState reads, and checks, the paused state of sandbox s (read from its Secret
// sec: sandboxFromSecret) from sec's marks. Errors wrap errPauseRecord and name the
// field.
func (b *Backend) readPauseState(s *sandbox, sec *corev1.Secret) (*pauseState, error) {
	bad := func(format string, a ...any) (*pauseState, error) {
		return nil, fmt.Errorf("%w: %s", errPauseRecord, fmt.Sprintf(format, a...))
	}
	a := sec.Annotations
	ps := &pauseState{CheckpointID: a[annotationPausedCkpt], Node: a[annotationPausedNode], untrusted: true}
	if err := hibernate.ValidCheckpointID(ps.CheckpointID); err != nil {
		return bad("%s: %v", annotationPausedCkpt, err)
	}
	if errs := validation.IsDNS1123Subdomain(ps.Node); len(errs) > 0 {
		return bad("%s %q: %s", annotationPausedNode, ps.Node, strings.Join(errs, "; "))
	}
	at, err := time.Parse(time.RFC3339, a[annotationPausedAt])
	if err != nil {
		return bad("%s: %v", annotationPausedAt, err)
	}
	ps.At = at.UTC()
	if ps.Bytes, err = strconv.ParseInt(a[annotationPausedBytes], 10, 64); err != nil || ps.Bytes < 0 {
		return bad("%s %q: not a size", annotationPausedBytes, a[annotationPausedBytes])
	}
	raw := a[annotationPausedPod]
	switch {
	case raw == "":
		return bad("no %s (paused by a runner that did not record its Pod)", annotationPausedPod)
	case len(raw) > maxPausedPodBytes:
		return bad("%s is %d bytes, more than %d", annotationPausedPod, len(raw), maxPausedPodBytes)
	}
	dec := json.NewDecoder(bytes.NewReader([]byte(raw)))
	dec.DisallowUnknownFields()
	var pp pausedPod
	if err := dec.Decode(&pp); err != nil {
		return bad("%s: %v", annotationPausedPod, err)
	}
	if dec.More() {
		return bad("%s: data after the object", annotationPausedPod)
	}
	if pp.V != pausedPodVersion {
		return bad("%s: version %d, this runner reads %d", annotationPausedPod, pp.V, pausedPodVersion)
	}
	if len(pp.PullSecrets) > maxPausedPodEntries || len(pp.PullPolicy) > maxPausedPodEntries || len(pp.Pinned) > maxPausedPodEntries {
		return bad("%s: more than %d pull Secrets, pull policies or pinned images", annotationPausedPod, maxPausedPodEntries)
	}
	if pp.WarmClaimed != "" {
		if _, err := time.Parse(time.RFC3339Nano, pp.WarmClaimed); err != nil {
			return bad("%s: warm_claimed: %v", annotationPausedPod, err)
		}
	}
	if pp.StartedAt.After(ps.At) {
		return bad("%s: started_at %s after the pause (%s)", annotationPausedPod, pp.StartedAt, ps.At)
	}
	if pp.ImageDigest != "" && !validImageDigest(pp.ImageDigest) {
		return bad("%s: image_digest %q is not sha256:<64 hex>", annotationPausedPod, pp.ImageDigest)
	}
	ps.pod = pp
	// The rest is checked against the Pod this runner makes for the sandbox (as Resume).
	if _, err := b.resumePod(s, ps); err != nil {
		return nil, err
	}
	return ps, nil
}

// checkPausedPod checks pp against pod, the resumed Pod buildPod made for sandbox s
// before pp's pull policies and images are applied to it (build makes it with another
// main container security context): pull Secrets are the sandbox's own or its
// organization's, and each name is one of the Pod's containers. It returns the main
// container's security context the resumed Pod is built with: pp's when it is one Create
// makes for the sandbox's spec under this runner's configuration, else (the runner's
// configuration changed since the pause, or the record was altered) the one this runner
// makes — never one the spec does not give. A pull policy that is neither the Pod's nor
// Always is dropped from pp (the Pod's is taken), for the same reasons. A configuration
// change never ends a paused sandbox (nor deletes its checkpoint).
func (b *Backend) checkPausedPod(s *sandbox, pp *pausedPod, pod *corev1.Pod, build func(*corev1.SecurityContext) *corev1.Pod) (*corev1.SecurityContext, error) {
	bad := func(format string, a ...any) (*corev1.SecurityContext, error) {
		return nil, fmt.Errorf("%w: %s: %s", errPauseRecord, annotationPausedPod, fmt.Sprintf(format, a...))
	}
	allowed := []string{pullSecretName(s.id)}
	if org := s.spec.Meta[runtime.MetaOrg]; validOrgID(org) {
		allowed = append(allowed, OrgPullSecretName(b.cfg.RunnerID, org))
	}
	for i, n := range pp.PullSecrets {
		if !slices.Contains(allowed, n) || slices.Contains(pp.PullSecrets[:i], n) {
			return bad("pull Secret %q is not the sandbox's own or its organization's", n)
		}
	}
	// The image's user decides only whether agentCaps are added (a non-root user with
	// capability drops): either is what Create makes for this spec, as the Pod has it
	// (buildPod changes it: dropNetRaw). Neither matching, the record's added
	// capabilities choose which.
	var use *corev1.SecurityContext
	for _, imageUser := range []string{"", "65534"} {
		sc, _ := securityFor(s.spec.Security, imageUser)
		if pp.SecurityContext != nil && apiequality.Semantic.DeepEqual(pp.SecurityContext, mainSecurityContext(build(sc))) {
			use = pp.SecurityContext
			break
		}
	}
	if use == nil {
		user := ""
		if rec := pp.SecurityContext; rec != nil && rec.Capabilities != nil && !slices.ContainsFunc(agentCaps, func(c corev1.Capability) bool {
			return !slices.Contains(rec.Capabilities.Add, c)
		}) {
			user = "65534"
		}
		use, _ = securityFor(s.spec.Security, user)
		b.log.Warn("resume: the paused Pod's security context is not the one this runner makes for the sandbox's spec: this runner's taken", "sandbox", s.id)
	}
	container := func(n string) *corev1.Container {
		for i := range pod.Spec.Containers {
			if pod.Spec.Containers[i].Name == n {
				return &pod.Spec.Containers[i]
			}
		}
		return nil
	}
	for n, p := range pp.PullPolicy {
		c := container(n)
		if c == nil {
			return bad("pull policy of container %q, which the sandbox's Pod does not have", n)
		}
		if p != c.ImagePullPolicy && p != corev1.PullAlways && pp.Pinned[n] == "" {
			b.log.Warn("resume: the paused Pod's pull policy is not this runner's: this runner's taken", "sandbox", s.id, "container", n, "recorded", p, "now", c.ImagePullPolicy)
			delete(pp.PullPolicy, n)
		}
	}
	for n, d := range pp.Pinned {
		c := container(n)
		if c == nil {
			return bad("pinned image of container %q, which the sandbox's Pod does not have", n)
		}
		if pp.PullPolicy[n] != corev1.PullAlways {
			return bad("container %q: a pinned image, yet not pulled every time", n)
		}
		if _, err := pinnedRef(c.Image, d); err != nil {
			return bad("container %q: %v", n, err)
		}
	}
	return use, nil
}

// mainSecurityContext is the security context of pod's main container (nil: none).
func mainSecurityContext(pod *corev1.Pod) *corev1.SecurityContext {
	for _, c := range pod.Spec.Containers {
		if c.Name == containerMain {
			return c.SecurityContext
		}
	}
	return nil
}

// recoverHelloKey is s's gate hello key from its Secret (as Create gave it to the Pod,
// so that the resumed Pod's gate is the paused one's); nil without hellos.
func (b *Backend) recoverHelloKey(s *sandbox, sec *corev1.Secret) {
	if k := sec.Data[gate.HelloKeyFile]; b.hello != nil && !s.spec.Multi() && len(k) == gate.HelloKeyLen {
		s.helloKey = k
	}
}

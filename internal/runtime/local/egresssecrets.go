package local

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/internal/egress"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// Egress secrets (docs/secrets.md, "Secrets that never enter the sandbox"): a sandbox
// whose host-name rules carry secrets gets a CA of its own (egress.NewSandboxSecrets:
// the key stays in the runner's memory), whose certificate is mounted read-only at
// EgressCAMount in every container, and placeholders in every container's environment
// (a group's containers share one network attachment: the proxy knows them by its
// address); the network's egress proxy gets the values and the CA to terminate TLS to
// those hosts.

const (
	// EgressCAMount is where a sandbox with egress secrets finds its CA (egress.CAMount).
	EgressCAMount = egress.CAMount
	dirEgressCA   = "egress-ca" // in the sandbox dir: what EgressCAMount shows
)

// EgressSecretsSetter is what a Network offers to serve egress secrets (the stack's
// adapter of *network.Manager): SetEgressSecrets hands the egress proxy a sandbox's
// secrets by its attachment id; Teardown forgets them.
type EgressSecretsSetter interface {
	SetEgressSecrets(id string, ss *egress.SandboxSecrets) error
}

// errEgressSecretsUnsupported: why a sandbox with egress secrets cannot be made here.
func (b *Backend) egressSecretsUnsupported(spec *runtime.Spec, fork *forkParams) string {
	if _, ok := b.cfg.Network.(EgressSecretsSetter); !ok {
		return "this runner has no egress proxy to inject egress secrets (no sandbox network)"
	}
	switch {
	case fork != nil && fork.egress == nil:
		return "a fork or move without its source's egress CA and placeholders (its checkpoint came without them, or this runner restarted since the source's create) cannot take egress secrets: recreate the sandbox"
	case spec.Engine != nil:
		return "a container-engine sandbox cannot take egress secrets"
	}
	return ""
}

// prepareEgressSecrets makes s's CA and placeholders for spec (which it changes: every
// container's secret environment, init containers and sidecars included, gets the
// placeholders and the CA variables; the CA dir is mounted into each of them). The
// containers of a sandbox share its network attachment, so the proxy serves them all by
// the one source address; what differs per container is only what its environment and
// mounts show, and no container is shown the value.
//
// A fork (from, the source's secrets, on this runner) keeps the source's CA and
// placeholders (its restored processes hold them) with the values the fork's spec brings,
// resolved again for it.
func (b *Backend) prepareEgressSecrets(s *sandbox, spec *runtime.Spec, from *egress.SandboxSecrets) error {
	rules := spec.Network.EgressSecrets()
	placeholders := map[string]string{}
	var ss *egress.SandboxSecrets
	if from != nil {
		var err error
		if ss, err = from.Fork(s.id, spec.Meta[runtime.MetaOrg], spec.EgressSecretValues, lifetimeEnd(spec.Meta)); err != nil {
			return fmt.Errorf("%w: sandbox %s: egress secrets of its source: %w", runtime.ErrInvalidSpec, s.id, err)
		}
		for _, r := range rules {
			sec := r.Secret
			i := slices.IndexFunc(ss.Injections, func(in egress.Injection) bool {
				return in.Secret == sec.Key() && in.Host == r.DNSName && strings.EqualFold(in.Header, sec.HeaderName())
			})
			if i < 0 {
				return fmt.Errorf("%w: sandbox %s: egress secret %s of %s is not its source's", runtime.ErrInvalidSpec, s.id, sec.Key(), r.DNSName)
			}
			placeholders[sec.EnvVar] = ss.Injections[i].Placeholder
		}
	} else {
		var egRules []egress.Rule
		for _, r := range rules {
			sec := r.Secret
			egRules = append(egRules, egress.Rule{Host: r.DNSName, Header: sec.HeaderName(), Secret: sec.Key(), EnvVar: sec.EnvVar})
		}
		var err error
		if ss, placeholders, err = egress.Build(s.id, spec.Meta[runtime.MetaOrg], egRules, spec.EgressSecretValues); errors.Is(err, egress.ErrNoValue) {
			return fmt.Errorf("%w: %w", runtime.ErrInvalidSpec, err)
		} else if err != nil {
			return err
		}
	}
	dir := filepath.Join(s.dir, dirEgressCA)
	if err := os.Mkdir(dir, 0o755); err != nil {
		return fmt.Errorf("sandbox %s: %w", s.id, err)
	}
	caPEM := ss.CACertPEM()
	roots, err := b.egressRoots()
	if err != nil {
		return fmt.Errorf("sandbox %s: egress CA bundle: %w", s.id, err)
	}
	bundle := egress.Bundle(roots, caPEM)
	if err := os.WriteFile(filepath.Join(dir, "ca.pem"), caPEM, 0o644); err != nil {
		return fmt.Errorf("sandbox %s: %w", s.id, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "bundle.pem"), bundle, 0o644); err != nil {
		return fmt.Errorf("sandbox %s: %w", s.id, err)
	}
	if from == nil {
		for _, c := range spec.AllContainers() {
			c.SecretEnv = egressEnv(c, placeholders)
		}
	}
	// A fork's agents are restored with the source's configuration in memory (these
	// placeholders and trust variables among it): nothing to hand them.
	s.egress, s.egressCADir = ss, dir
	return nil
}

// lifetimeEnd is when a sandbox whose Meta is meta ends (runtime.MetaCreatedAt plus
// runtime.MetaLifetime, as its runner wrote them); zero when they do not say.
func lifetimeEnd(meta map[string]string) time.Time {
	at, err := time.Parse(time.RFC3339Nano, meta[runtime.MetaCreatedAt])
	if err != nil {
		return time.Time{}
	}
	d, err := time.ParseDuration(meta[runtime.MetaLifetime])
	if err != nil || d <= 0 {
		return time.Time{}
	}
	return at.Add(d)
}

// EgressCAExpiry implements runtime.EgressCAExpirer: when the egress CA of sandbox id,
// which its forks keep, expires (false: it has none here, or its secrets are lost).
func (b *Backend) EgressCAExpiry(id string) (time.Time, bool) {
	b.mu.Lock()
	s := b.sandboxes[id]
	b.mu.Unlock()
	if s == nil {
		return time.Time{}, false
	}
	s.opMu.Lock()
	ss := s.egress
	s.opMu.Unlock()
	if ss == nil || ss.Lost || ss.CACert() == nil {
		return time.Time{}, false
	}
	return ss.CACert().NotAfter, true
}

// egressEnv is c's secret environment with the placeholders (variable: placeholder) and
// the trust variables the container does not set itself (egress.ContainerEnv).
func egressEnv(c *runtime.Container, placeholders map[string]string) map[string]string {
	return egress.ContainerEnv(c.SecretEnv, func(k string) bool { _, set := c.Env[k]; return set }, placeholders)
}

// egressRoots is the host bundle bundle.pem starts with (Config.EgressRootsFile or the
// first of egress.DefaultRootsFiles; none: empty).
func (b *Backend) egressRoots() ([]byte, error) { return egress.ReadRoots(b.cfg.EgressRootsFile) }

// registerEgressSecrets hands s's secrets to the network's proxy (attachment cid).
func (b *Backend) registerEgressSecrets(s *sandbox, cid string) error {
	if s.egress == nil {
		return nil
	}
	set, ok := b.cfg.Network.(EgressSecretsSetter)
	if !ok {
		return fmt.Errorf("sandbox %s: egress secrets: the network has no egress proxy", s.id)
	}
	if err := set.SetEgressSecrets(cid, s.egress); err != nil {
		return fmt.Errorf("sandbox %s: egress secrets: %w", s.id, err)
	}
	return nil
}

// egressStateOf is ss as the runner wire carries it to another runner (no values).
func egressStateOf(ss *egress.SandboxSecrets) (*runtime.EgressState, error) {
	cert, key, injs, err := ss.Export()
	if err != nil {
		return nil, err
	}
	st := &runtime.EgressState{CACert: cert, CAKey: key}
	for _, in := range injs {
		st.Injections = append(st.Injections, runtime.EgressInjection{Host: in.Host, Header: in.Header, Placeholder: in.Placeholder, Secret: in.Secret})
	}
	return st, nil
}

// egressFromState is the egress secrets (no values: each fork's spec brings them) that
// sandboxes made of spec from another runner's checkpoint keep, from st as the runner
// wire brought it: nil when spec has no egress secrets (st must be nil then); checked
// (egress.Restore) and matched to spec's rules one to one.
func egressFromState(spec *runtime.Spec, st *runtime.EgressState) (*egress.SandboxSecrets, error) {
	rules := spec.Network.EgressSecrets()
	switch {
	case len(rules) == 0 && st == nil:
		return nil, nil
	case len(rules) == 0:
		return nil, errors.New("the checkpoint came with egress secret state, and its sandbox has no egress secrets")
	case st == nil:
		return nil, errors.New("the checkpoint came without its egress CA and placeholders (a runner or gateway that does not carry them): a sandbox with egress secrets is not made without them")
	case len(st.Injections) != len(rules):
		return nil, fmt.Errorf("the checkpoint's egress state has %d injections, its sandbox %d egress secrets", len(st.Injections), len(rules))
	}
	injs := make([]egress.Injection, len(st.Injections))
	for i, in := range st.Injections {
		injs[i] = egress.Injection{Host: in.Host, Header: in.Header, Placeholder: in.Placeholder, Secret: in.Secret}
	}
	ss, err := egress.Restore(spec.ID, spec.Meta[runtime.MetaOrg], st.CACert, st.CAKey, injs, time.Now())
	if err != nil {
		return nil, err
	}
	for _, r := range rules {
		sec := r.Secret
		if !slices.ContainsFunc(ss.Injections, func(in egress.Injection) bool {
			return in.Secret == sec.Key() && in.Host == r.DNSName && strings.EqualFold(in.Header, sec.HeaderName())
		}) {
			return nil, fmt.Errorf("the checkpoint's egress state has no injection for secret %s of %s", sec.Key(), r.DNSName)
		}
	}
	return ss, nil
}

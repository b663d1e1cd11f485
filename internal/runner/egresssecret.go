package runner

import (
	"fmt"
	"path"
	"regexp"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/internal/egress"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/textclip"
)

// Egress secrets (runtime.EgressSecret; docs/secrets.md "Secrets that never enter the
// sandbox"): the shape rules shared by the gateway (internal/spec) and the runner.

var (
	egressSecretStore  = regexp.MustCompile(`^[a-z0-9]([a-z0-9_-]{0,61}[a-z0-9])?$`)
	egressSecretPath   = regexp.MustCompile(`^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*$`)
	egressSecretField  = regexp.MustCompile(`^[A-Za-z0-9._-]{1,128}$`)
	egressSecretEnvVar = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,254}$`)
)

// egressSecretForbiddenHeaders are headers an egress secret may not fill: they frame
// the request or route it, and a secret in them could redirect or split it.
var egressSecretForbiddenHeaders = map[string]bool{
	"host": true, "content-length": true, "transfer-encoding": true, "connection": true,
	"upgrade": true, "te": true, "trailer": true, "keep-alive": true, "proxy-connection": true,
	"expect": true,
}

// MaxEgressSecretHeader bounds an egress secret's header name.
const MaxEgressSecretHeader = 64

// ValidateEgressSecret checks the secret of an egress rule at field f (….egress[i]).
func ValidateEgressSecret(f string, r runtime.EgressRule, add func(field, format string, args ...any)) {
	s := r.Secret
	if s == nil {
		return
	}
	sf := f + ".sandboxd_secret"
	switch {
	case r.DNSName == "":
		add(sf, "a secret can only be attached to an https_hostname rule")
	case strings.HasPrefix(r.DNSName, "*."):
		add(sf, "a secret needs an exact host name, not the wildcard %s: the proxy must know the one host it sends the secret to", textclip.Clip(r.DNSName, 64))
	}
	if !egressSecretStore.MatchString(s.Store) {
		add(sf+".store_name", "%q must be 1-63 of a-z, 0-9, '-' and '_', starting and ending with a letter or digit", textclip.Clip(s.Store, 64))
	}
	if len(s.Path) > 256 || !egressSecretPath.MatchString(s.Path) || strings.Contains("/"+s.Path+"/", "/./") || strings.Contains("/"+s.Path+"/", "/../") {
		add(sf+".path", "%q must be segments of A-Z, a-z, 0-9, '.', '_' and '-' joined by '/' (at most 256 bytes, no '.' or '..' segment)", textclip.Clip(s.Path, 64))
	}
	if s.Field != "" && !egressSecretField.MatchString(s.Field) {
		add(sf+".field", "%q must be 1-128 of A-Z, a-z, 0-9, '.', '_' and '-' (or empty)", textclip.Clip(s.Field, 64))
	}
	if h := s.Header; h != "" {
		switch {
		case len(h) > MaxEgressSecretHeader || !isHeaderToken(h):
			add(sf+".header", "%q must be an HTTP header name (letters, digits and !#$%%&'*+-.^_`|~, at most %d)", textclip.Clip(h, 64), MaxEgressSecretHeader)
		case egressSecretForbiddenHeaders[strings.ToLower(h)]:
			add(sf+".header", "%s frames or routes the request and cannot carry a secret", h)
		}
	}
	if !egressSecretEnvVar.MatchString(s.EnvVar) {
		add(sf+".env_var", "%q must be a variable name: a letter or '_', then letters, digits and '_'", textclip.Clip(s.EnvVar, 64))
	}
}

// ValidateEgressSecrets checks what spans the rules and containers: one rule per
// (host, header), each placeholder variable set once and by nothing else, and a value
// for every secret (values: the runtime spec's EgressSecretValues).
// Without values (the gateway, before resolving), only the shape across rules.
func ValidateEgressSecrets(spec *runtime.Spec, values bool, add func(field, format string, args ...any)) {
	if spec.Network == nil {
		if values && len(spec.EgressSecretValues) > 0 {
			add("spec.network", "egress secret values without egress secrets")
		}
		return
	}
	vars := map[string]string{}
	hostHeader := map[string]string{}
	n := 0
	for i, r := range spec.Network.Egress {
		s := r.Secret
		if s == nil {
			continue
		}
		n++
		f := fmt.Sprintf("spec.network.egress[%d].sandboxd_secret", i)
		if prev, ok := vars[s.EnvVar]; ok {
			add(f+".env_var", "%s is already the placeholder variable of %s", s.EnvVar, prev)
		}
		vars[s.EnvVar] = f
		// Every container (init containers and sidecars too) gets the placeholder.
		for _, c := range spec.AllContainers() {
			if _, ok := c.Env[s.EnvVar]; ok {
				add(f+".env_var", "%s is also set by environment_variables of container %q", s.EnvVar, c.ContainerName())
			}
			if _, ok := c.SecretEnv[s.EnvVar]; ok {
				add(f+".env_var", "%s is also set by secret_stores of container %q", s.EnvVar, c.ContainerName())
			}
		}
		k := r.DNSName + "\x00" + strings.ToLower(s.HeaderName())
		if prev, ok := hostHeader[k]; ok {
			add(f+".header", "%s of %s is already filled by %s", s.HeaderName(), r.DNSName, prev)
		}
		hostHeader[k] = f
		if _, ok := spec.EgressSecretValues[s.Key()]; values && !ok {
			add(f, "the value of secret %s was not resolved", s.Key())
		}
	}
	if n > runtime.MaxSecretEnvVars {
		add("spec.network.egress", "%d egress secrets, at most %d", n, runtime.MaxSecretEnvVars)
	}
	if n > 0 {
		egressCAPathReserved(spec, add)
	}
	if values {
		keys := map[string]bool{}
		for _, r := range spec.Network.EgressSecrets() {
			keys[r.Secret.Key()] = true
		}
		for k := range spec.EgressSecretValues {
			if !keys[k] {
				add("spec.egress_secret_values", "a value for %s, which no egress rule names", textclip.Clip(k, 64))
			}
		}
	}
}

func isHeaderToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0 {
			continue
		}
		return false
	}
	return true
}

// checkEgressSecrets is validateEgressSecrets as a *ValidationError (nil: fine).
func checkEgressSecrets(spec *runtime.Spec) error {
	var vs violations
	ValidateEgressSecrets(spec, true, vs.add)
	return vs.err()
}

// checkEgressState checks the egress-secret state an import was handed (ref.egress: the
// exporting runner's, over the wire) against spec, the checkpoint's: present exactly
// when spec has egress secrets, bounded, a valid CA with its key (egress.Restore), one
// injection per rule. It returns when the CA expires (zero: no state).
func checkEgressState(spec *runtime.Spec, st *runtime.EgressState) (time.Time, error) {
	var vs violations
	rules := spec.Network.EgressSecrets()
	switch {
	case st == nil && len(rules) == 0:
		return time.Time{}, nil
	case st == nil:
		vs.add("ref.egress", "the sandbox has %d egress secrets, and the checkpoint came without their CA and placeholders (its runner or the gateway does not carry them)", len(rules))
		return time.Time{}, vs.err()
	case len(rules) == 0:
		vs.add("ref.egress", "the sandbox has no egress secrets")
		return time.Time{}, vs.err()
	case len(st.Injections) != len(rules):
		vs.add("ref.egress.injections", "%d injections, the sandbox has %d egress secrets", len(st.Injections), len(rules))
		return time.Time{}, vs.err()
	}
	injs := make([]egress.Injection, len(st.Injections))
	for i, in := range st.Injections {
		injs[i] = egress.Injection{Host: in.Host, Header: in.Header, Placeholder: in.Placeholder, Secret: in.Secret}
	}
	ss, err := egress.Restore(spec.ID, "", st.CACert, st.CAKey, injs, time.Now())
	if err != nil {
		vs.add("ref.egress", "%v", err)
		return time.Time{}, vs.err()
	}
	for i, r := range spec.Network.Egress {
		sec := r.Secret
		if sec == nil {
			continue
		}
		found := false
		for _, in := range ss.Injections {
			found = found || in.Secret == sec.Key() && in.Host == r.DNSName && strings.EqualFold(in.Header, sec.HeaderName())
		}
		if !found {
			vs.add("ref.egress.injections", "none for egress[%d]'s secret %s of %s", i, sec.Key(), textclip.Clip(r.DNSName, 64))
		}
	}
	if err := vs.err(); err != nil {
		return time.Time{}, err
	}
	return ss.CACert().NotAfter, nil
}

// egressCAPathReserved refuses a volume mount or a file at or below egress.CAMount in a
// sandbox with egress secrets: the runner mounts the sandbox's CA there (read-only, in
// every container), and a user's volume or file would shadow or fight it.
func egressCAPathReserved(spec *runtime.Spec, add func(field, format string, args ...any)) {
	under := func(p string) bool {
		p = path.Clean("/" + p)
		return p == egress.CAMount || strings.HasPrefix(p, egress.CAMount+"/")
	}
	for i, c := range spec.AllContainers() {
		prefix := "spec.containers[0]"
		switch {
		case i < len(spec.InitContainers):
			prefix = fmt.Sprintf("spec.init_containers[%d]", i)
		case c != &spec.Container:
			prefix = fmt.Sprintf("spec.containers[%d]", i-len(spec.InitContainers))
		}
		for j, m := range c.VolumeMounts {
			if under(m.Path) {
				add(fmt.Sprintf("%s.volume_mounts[%d].path", prefix, j), "%s is reserved for the sandbox's egress CA in a sandbox with egress secrets; mount the volume elsewhere", egress.CAMount)
			}
		}
		for j, f := range c.Files {
			if under(f.Path) {
				add(fmt.Sprintf("%s.files[%d].path", prefix, j), "%s is reserved for the sandbox's egress CA in a sandbox with egress secrets; put the file elsewhere", egress.CAMount)
			}
		}
	}
}

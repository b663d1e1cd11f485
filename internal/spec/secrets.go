package spec

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"

	sandboxv1 "github.com/sandboxd/sandboxd/gen/coreweave/sandbox/v1"
	"github.com/sandboxd/sandboxd/internal/apierr"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/textclip"
)

// Secrets from secret stores (docs/secrets.md): Container.secret_stores become
// environment variables of their container, and image_pull_credentials the credentials
// of its image's pull. The spec keeps the references; the values are resolved at create
// (Options.Secrets) into the runtime spec's SecretEnv and PullCredentials, which no
// record keeps.

// SecretRef names one secret of the caller's organization.
type SecretRef struct {
	Store, Path, Field string
}

// SecretResolver returns a secret's value. An unknown store is
// CWSANDBOX_SECRET_STORE_NOT_PROVISIONED, an unknown path or field
// CWSANDBOX_SECRET_NOT_PROVISIONED (field is the reference's request field, for the
// violation); other errors are returned as they are.
type SecretResolver func(field string, ref SecretRef) (string, error)

// ErrByReference is what a SecretResolver returns for a secret the runner resolves (a
// KUBERNETES store's): the container gets a runtime.SecretRef instead of a value.
var ErrByReference = errors.New("resolved by the runner")

// Shape rules of secret store names, secret paths and fields (the built-in store's; a
// reference to a name outside them cannot exist).
var (
	secretStoreName  = regexp.MustCompile(`^[a-z0-9]([a-z0-9_-]{0,61}[a-z0-9])?$`)
	secretPathSeg    = regexp.MustCompile(`^[A-Za-z0-9._-]+$`)
	secretFieldName  = regexp.MustCompile(`^[A-Za-z0-9._-]{1,128}$`)
	secretEnvVarName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

// MaxSecretPath bounds a secret's path (bytes).
const MaxSecretPath = 256

// SecretStoreNameViolation describes what is wrong with a store name ("" when nothing).
func SecretStoreNameViolation(s string) string {
	if s == "" {
		return "is required"
	}
	if !secretStoreName.MatchString(s) {
		return fmt.Sprintf("%q must be 1-63 of a-z, 0-9, '-' and '_', starting and ending with a letter or digit", textclip.Clip(s, 64))
	}
	return ""
}

// SecretPathViolation describes what is wrong with a secret's path ("" when nothing).
func SecretPathViolation(p string) string {
	switch {
	case p == "":
		return "is required"
	case len(p) > MaxSecretPath:
		return fmt.Sprintf("is %d bytes, at most %d allowed", len(p), MaxSecretPath)
	}
	for seg := range strings.SplitSeq(p, "/") {
		if seg == "." || seg == ".." || !secretPathSeg.MatchString(seg) {
			return fmt.Sprintf("%q must be segments of A-Z, a-z, 0-9, '.', '_' and '-' joined by '/' (no empty, '.' or '..' segment)", textclip.Clip(p, 64))
		}
	}
	return ""
}

// SecretFieldViolation describes what is wrong with a secret's field ("" is the path's
// default field).
func SecretFieldViolation(f string) string {
	if f != "" && !secretFieldName.MatchString(f) {
		return fmt.Sprintf("%q must be 1-128 of A-Z, a-z, 0-9, '.', '_' and '-' (or empty: the path's default field)", textclip.Clip(f, 64))
	}
	return ""
}

// secretUse is one resolved reference's place: an environment variable of a container
// (env set), or a container's pull credentials.
type secretUse struct {
	field string // the reference's request field
	ref   SecretRef
	env   string
}

// containerSecrets checks the shape of c's secret references (c at field f) and returns
// its environment uses and, when it has image_pull_credentials, that reference.
func containerSecrets(c *sandboxv1.Container, f string) (uses []secretUse, pull *secretUse, vs []apierr.Violation) {
	add := func(field, format string, args ...any) {
		vs = append(vs, apierr.Violation{Field: field, Description: fmt.Sprintf(format, args...)})
	}
	seen := map[string]string{}
	for i, st := range c.GetSecretStores() {
		sf := fmt.Sprintf("%s.secret_stores[%d]", f, i)
		if d := SecretStoreNameViolation(st.GetStoreName()); d != "" {
			add(sf+".store_name", "%s", d)
		}
		if len(st.GetSecrets()) == 0 {
			add(sf+".secrets", "at least one secret is required")
		}
		for j, m := range st.GetSecrets() {
			if len(uses) > runtime.MaxSecretEnvVars {
				break // refused below; bounded work on untrusted input
			}
			mf := fmt.Sprintf("%s.secrets[%d]", sf, j)
			if d := SecretPathViolation(m.GetPath()); d != "" {
				add(mf+".path", "%s", d)
			}
			if d := SecretFieldViolation(m.GetField()); d != "" {
				add(mf+".field", "%s", d)
			}
			ev := m.GetEnvVar()
			switch {
			case ev == "":
				add(mf+".env_var", "is required")
			case len(ev) > runtime.MaxEnvKeyLen || !secretEnvVarName.MatchString(ev):
				add(mf+".env_var", "%q must be a variable name: a letter or '_', then letters, digits and '_' (at most %d)", textclip.Clip(ev, 64), runtime.MaxEnvKeyLen)
			case seen[ev] != "":
				add(mf+".env_var", "%s is already set by %s", ev, seen[ev])
			default:
				if _, ok := c.GetEnvironmentVariables()[ev]; ok {
					add(mf+".env_var", "%s is also set by environment_variables; a secret's variable must be the only source of its value", ev)
				}
				seen[ev] = mf
			}
			uses = append(uses, secretUse{field: mf, ref: SecretRef{Store: st.GetStoreName(), Path: m.GetPath(), Field: m.GetField()}, env: ev})
		}
	}
	if ipc := c.GetImagePullCredentials(); ipc != nil {
		pf := f + ".image_pull_credentials"
		reg := ipc.GetRegistry()
		switch {
		case reg == "":
			add(pf+".registry", "is required")
		case validRegistryHost(reg) != nil:
			add(pf+".registry", "%q must be a registry host[:port] without scheme or path", textclip.Clip(reg, 64))
		default:
			if r, err := name.ParseReference(c.GetImage()); err == nil && canonicalRegistry(r.Context().RegistryStr()) != canonicalRegistry(reg) {
				add(pf+".registry", "is %s, but image %s is pulled from %s: the credentials would be sent to another registry than they are for",
					textclip.Clip(reg, 64), textclip.Clip(c.GetImage(), 128), r.Context().RegistryStr())
			}
		}
		cr := ipc.GetCredentials()
		if cr == nil {
			add(pf+".credentials", "is required")
		} else {
			if d := SecretStoreNameViolation(cr.GetStoreName()); d != "" {
				add(pf+".credentials.store_name", "%s", d)
			}
			if d := SecretPathViolation(cr.GetPath()); d != "" {
				add(pf+".credentials.path", "%s", d)
			}
			if d := SecretFieldViolation(cr.GetField()); d != "" {
				add(pf+".credentials.field", "%s", d)
			}
			pull = &secretUse{field: pf + ".credentials", ref: SecretRef{Store: cr.GetStoreName(), Path: cr.GetPath(), Field: cr.GetField()}}
		}
	}
	return uses, pull, vs
}

func validRegistryHost(h string) error {
	if strings.Contains(h, "://") || strings.ContainsAny(h, "/ \t@") {
		return fmt.Errorf("not a host")
	}
	_, err := name.NewRegistry(h)
	return err
}

// canonicalRegistry maps the names Docker Hub goes by to one.
func canonicalRegistry(host string) string {
	host = strings.ToLower(host)
	switch host {
	case "docker.io", "registry-1.docker.io", name.DefaultRegistry:
		return name.DefaultRegistry
	}
	return host
}

// resolveSecrets resolves every secret of the containers (cs at fields fields; outs their
// runtime containers) with resolve, setting SecretEnv and PullCredentials. All problems
// come back at once: an unknown store wins the reason.
func resolveSecrets(cs []*sandboxv1.Container, fields []string, outs []*runtime.Container, resolve SecretResolver) error {
	var (
		vs         []apierr.Violation
		storeGone  bool
		firstOther error
	)
	note := func(err error) {
		switch apierr.Reason(err) {
		case apierr.SecretStoreNotProvisioned:
			storeGone = true
			vs = append(vs, apierr.Violations(err)...)
		case apierr.SecretNotProvisioned:
			vs = append(vs, apierr.Violations(err)...)
		default:
			if firstOther == nil {
				firstOther = err
			}
		}
	}
	for i, c := range cs {
		uses, pull, _ := containerSecrets(c, fields[i])
		for _, u := range uses {
			v, err := resolve(u.field, u.ref)
			if errors.Is(err, ErrByReference) {
				outs[i].SecretRefs = append(outs[i].SecretRefs, runtime.SecretRef{EnvVar: u.env, Store: u.ref.Store, Secret: u.ref.Path, Key: u.ref.Field})
				continue
			}
			if err != nil {
				note(err)
				continue
			}
			if outs[i].SecretEnv == nil {
				outs[i].SecretEnv = map[string]string{}
			}
			outs[i].SecretEnv[u.env] = v
		}
		if pull == nil {
			continue
		}
		user, pass, err := resolvePull(*pull, resolve)
		if err != nil {
			note(err)
			continue
		}
		outs[i].PullCredentials = &runtime.Credentials{Username: user, Password: pass}
	}
	if firstOther != nil {
		return firstOther
	}
	if len(vs) == 0 {
		return nil
	}
	reason := apierr.SecretNotProvisioned
	if storeGone {
		reason = apierr.SecretStoreNotProvisioned
	}
	return apierr.WithViolations(apierr.Newf(reason, "secrets cannot be resolved: %s", apierr.Describe(vs)), vs)
}

// resolvePull resolves image pull credentials: the secret's value ("username:password"
// or JSON); with no field and no default field at the path, its fields "username" and
// "password".
func resolvePull(u secretUse, resolve SecretResolver) (string, string, error) {
	v, err := resolve(u.field, u.ref)
	if errors.Is(err, ErrByReference) {
		vs := []apierr.Violation{{Field: u.field, Description: fmt.Sprintf("secret store %s is a KUBERNETES store: image pull credentials from one are not built (use a built-in store)", u.ref.Store)}}
		return "", "", apierr.Invalid(apierr.InvalidRequest, apierr.Describe(vs), vs)
	}
	if err != nil {
		if u.ref.Field != "" || apierr.Reason(err) != apierr.SecretNotProvisioned {
			return "", "", err
		}
		user, uerr := resolve(u.field, SecretRef{Store: u.ref.Store, Path: u.ref.Path, Field: "username"})
		pass, perr := resolve(u.field, SecretRef{Store: u.ref.Store, Path: u.ref.Path, Field: "password"})
		if uerr != nil || perr != nil || user == "" || pass == "" {
			return "", "", err // the default field's violation
		}
		return user, pass, nil
	}
	user, pass, perr := ParsePullCredentials(v)
	if perr != nil {
		vs := []apierr.Violation{{Field: u.field, Description: fmt.Sprintf("secret %s of store %s %v", refName(u.ref), u.ref.Store, perr)}}
		return "", "", apierr.WithViolations(apierr.Newf(apierr.SecretNotProvisioned, "image pull credentials: %s", apierr.Describe(vs)), vs)
	}
	return user, pass, nil
}

// refName is path or path#field.
func refName(r SecretRef) string {
	if r.Field == "" {
		return r.Path
	}
	return r.Path + "#" + r.Field
}

// ParsePullCredentials reads registry credentials from a secret's value: JSON
// {"username": …, "password": …} or "username:password". Errors never quote the value.
func ParsePullCredentials(v string) (user, pass string, err error) {
	if t := strings.TrimSpace(v); strings.HasPrefix(t, "{") {
		var c struct {
			Username string `json:"username"`
			Password string `json:"password"`
		}
		if json.Unmarshal([]byte(t), &c) != nil {
			return "", "", fmt.Errorf(`is not valid JSON {"username": …, "password": …}`)
		}
		if c.Username == "" || c.Password == "" {
			return "", "", fmt.Errorf(`needs both "username" and "password"`)
		}
		return c.Username, c.Password, nil
	}
	user, pass, ok := strings.Cut(v, ":")
	if !ok || user == "" || pass == "" {
		return "", "", fmt.Errorf(`must be "username:password" or JSON {"username": …, "password": …}`)
	}
	return user, pass, nil
}

// ResolveEgressSecrets is resolveEgressSecrets for a sandbox made from another (a fork:
// its values are resolved again, as at create).
func ResolveEgressSecrets(spec *runtime.Spec, resolve SecretResolver) error {
	return resolveEgressSecrets(spec, resolve)
}

// resolveEgressSecrets resolves the secrets of spec's egress rules into
// spec.EgressSecretValues (docs/secrets.md, "Secrets that never enter the sandbox"). All
// problems come back at once, as resolveSecrets does.
func resolveEgressSecrets(spec *runtime.Spec, resolve SecretResolver) error {
	var (
		vs         []apierr.Violation
		storeGone  bool
		firstOther error
	)
	for i, r := range spec.Network.Egress {
		sec := r.Secret
		if sec == nil {
			continue
		}
		if _, ok := spec.EgressSecretValues[sec.Key()]; ok {
			continue
		}
		f := fmt.Sprintf("%segress[%d].sandboxd_secret", networkField, i)
		v, err := resolve(f, SecretRef{Store: sec.Store, Path: sec.Path, Field: sec.Field})
		if errors.Is(err, ErrByReference) {
			vs = append(vs, apierr.Violation{Field: f, Description: fmt.Sprintf("secret store %s is a KUBERNETES store: the egress proxy injects values of built-in stores only", sec.Store)})
			continue
		}
		switch apierr.Reason(err) {
		case "":
			if err != nil {
				if firstOther == nil {
					firstOther = err
				}
				continue
			}
			if spec.EgressSecretValues == nil {
				spec.EgressSecretValues = map[string]string{}
			}
			spec.EgressSecretValues[sec.Key()] = v
		case apierr.SecretStoreNotProvisioned:
			storeGone = true
			vs = append(vs, apierr.Violations(err)...)
		case apierr.SecretNotProvisioned:
			vs = append(vs, apierr.Violations(err)...)
		default:
			if firstOther == nil {
				firstOther = err
			}
		}
	}
	if firstOther != nil {
		return firstOther
	}
	if len(vs) == 0 {
		return nil
	}
	reason := apierr.SecretNotProvisioned
	if storeGone {
		reason = apierr.SecretStoreNotProvisioned
	}
	return apierr.WithViolations(apierr.Newf(reason, "egress secrets cannot be resolved: %s", apierr.Describe(vs)), vs)
}

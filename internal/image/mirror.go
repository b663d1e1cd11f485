package image

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
)

// Mirror is a registry that serves the same repositories as the registry it mirrors,
// like a "host" entry in containerd's hosts.toml (used for pulls only).
type Mirror struct {
	Host string // "host[:port]", no scheme and no path: the repository path is the original's
	// Insecure allows plain HTTP to Host when it is used as this mirror. It does not make
	// references naming Host directly insecure (Options.Insecure does that).
	Insecure bool
}

// mirror is a validated Mirror with its own transport (the plain-HTTP guard
// extended by Insecure for this host only).
type mirror struct {
	Mirror
	transport http.RoundTripper
}

// canonicalRegistry maps the names Docker Hub goes by to name.DefaultRegistry.
func canonicalRegistry(host string) string {
	host = strings.ToLower(host)
	switch host {
	case "docker.io", "registry-1.docker.io", name.DefaultRegistry:
		return name.DefaultRegistry
	}
	return host
}

func validHost(h string) error {
	if h == "" || strings.Contains(h, "://") || strings.ContainsAny(h, "/ \t") {
		return errors.New("want host[:port] without scheme or path")
	}
	_, err := name.NewRegistry(h)
	return err
}

// initMirrors validates opts.Mirrors and indexes them by canonical registry host.
func (s *Store) initMirrors(base http.RoundTripper) error {
	s.mirrors = map[string][]mirror{}
	for reg, ms := range s.opts.Mirrors {
		if err := validHost(reg); err != nil {
			return fmt.Errorf("image store: mirrors: registry %q: %w", reg, err)
		}
		key := canonicalRegistry(reg)
		if _, dup := s.mirrors[key]; dup {
			return fmt.Errorf("image store: mirrors: %q and another key both name registry %s", reg, key)
		}
		list := make([]mirror, 0, len(ms))
		for _, m := range ms {
			if err := validHost(m.Host); err != nil {
				return fmt.Errorf("image store: mirrors: %s: mirror host %q: %w", reg, m.Host, err)
			}
			insecure := s.isInsecure
			if m.Insecure {
				h := m.Host
				insecure = func(host string) bool { return strings.EqualFold(host, h) || s.isInsecure(host) }
			}
			list = append(list, mirror{Mirror: m, transport: &guardTransport{base: base, insecure: insecure}})
		}
		s.mirrors[key] = list
	}
	return nil
}

// mirrorRef is r (same repository path, tag or digest) at the mirror's host.
func (s *Store) mirrorRef(r name.Reference, m mirror) (name.Reference, error) {
	sep := ":"
	if _, ok := r.(name.Digest); ok {
		sep = "@"
	}
	var opts []name.Option
	if m.Insecure || s.isInsecure(m.Host) {
		opts = append(opts, name.Insecure)
	}
	src, err := name.ParseReference(m.Host+"/"+r.Context().RepositoryStr()+sep+r.Identifier(), opts...)
	if err != nil {
		return nil, fmt.Errorf("%w: %s at mirror %s: %w", ErrInvalidReference, r.Name(), m.Host, err)
	}
	return src, nil
}

// mirrorAuth: a mirror gets only credentials configured for its own host, never
// the upstream's (nor per-pull credentials meant for the upstream).
func (s *Store) mirrorAuth(m mirror) authn.Authenticator {
	if c, ok := s.opts.Auth[m.Host]; ok {
		return &authn.Basic{Username: c.Username, Password: c.Password}
	}
	return authn.Anonymous
}

// pullMirrored tries r's mirrors in order, then r's own registry. Any failure at a
// mirror (not found, unreachable, refused, bad content) falls through to the next;
// the upstream's error is returned as usual, prefixed by what the mirrors said.
func (s *Store) pullMirrored(ctx context.Context, r name.Reference, auth authn.Authenticator) (*Image, error) {
	ms := s.mirrors[canonicalRegistry(r.Context().RegistryStr())]
	var tried []string
	for _, m := range ms {
		src, err := s.mirrorRef(r, m)
		if err == nil {
			var img *Image
			img, err = s.pullFrom(ctx, r, src, s.mirrorAuth(m), m.transport)
			if err == nil {
				return img, nil
			}
		}
		if ctx.Err() != nil {
			return nil, err
		}
		tried = append(tried, fmt.Sprintf("mirror %s (%v)", m.Host, err))
	}
	img, err := s.pullFrom(ctx, r, r, auth, s.transport)
	if err != nil && len(tried) > 0 {
		return nil, fmt.Errorf("pull %s: tried %s, then %s: %w", r.Name(), strings.Join(tried, ", "), r.Context().RegistryStr(), err)
	}
	return img, err
}

package main

import (
	"errors"
	"flag"
	"slices"
	"strings"

	"github.com/sandboxd/sandboxd/internal/image"
	"github.com/sandboxd/sandboxd/internal/stack"
)

// mirrorFlags are a runner's registry mirrors (local backend): pulls from a registry try
// its mirrors first, in the order given, like a "host" of containerd's hosts.toml.
type mirrorFlags []struct{ registry, host string }

func (m *mirrorFlags) register(fs *flag.FlagSet) {
	fs.Var(m, "registry-mirror", "REGISTRY=HOST[:PORT]: pull REGISTRY's images from the mirror HOST first (repeatable, tried in order; plain HTTP only if --insecure-registry names HOST too)")
}

func (m *mirrorFlags) String() string {
	var s []string
	for _, e := range *m {
		s = append(s, e.registry+"="+e.host)
	}
	return strings.Join(s, ",")
}

func (m *mirrorFlags) Set(v string) error {
	registry, host, _ := strings.Cut(v, "=")
	if registry == "" || host == "" {
		return errors.New("want REGISTRY=HOST[:PORT], e.g. docker.io=mirror.example.com")
	}
	*m = append(*m, struct{ registry, host string }{registry, host})
	return nil
}

// apply adds the mirrors to cfg (whose InsecureRegistries are set); the image store
// checks each registry and host when it starts.
func (m mirrorFlags) apply(cfg *stack.Config) {
	for _, e := range m {
		if cfg.Mirrors == nil {
			cfg.Mirrors = map[string][]image.Mirror{}
		}
		cfg.Mirrors[e.registry] = append(cfg.Mirrors[e.registry], image.Mirror{Host: e.host, Insecure: slices.Contains(cfg.InsecureRegistries, e.host)})
	}
}

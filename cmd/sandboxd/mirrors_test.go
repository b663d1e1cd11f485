package main

import (
	"flag"
	"io"
	"reflect"
	"testing"

	"github.com/sandboxd/sandboxd/internal/image"
	"github.com/sandboxd/sandboxd/internal/stack"
)

// TestRegistryMirrorFlag: --registry-mirror is repeatable, keeps the order per registry,
// reaches a mirror over plain HTTP only when --insecure-registry names it, and refuses
// what is not REGISTRY=HOST.
func TestRegistryMirrorFlag(t *testing.T) {
	var m mirrorFlags
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	m.register(fs)
	if err := fs.Parse([]string{"--registry-mirror", "docker.io=10.1.2.3:5000", "--registry-mirror", "ghcr.io=m.example",
		"--registry-mirror", "docker.io=mirror.example.com"}); err != nil {
		t.Fatal(err)
	}
	cfg := stack.Config{InsecureRegistries: []string{"10.1.2.3:5000"}}
	m.apply(&cfg)
	want := map[string][]image.Mirror{
		"docker.io": {{Host: "10.1.2.3:5000", Insecure: true}, {Host: "mirror.example.com"}},
		"ghcr.io":   {{Host: "m.example"}},
	}
	if !reflect.DeepEqual(cfg.Mirrors, want) {
		t.Errorf("Mirrors = %v, want %v", cfg.Mirrors, want)
	}
	for _, bad := range []string{"docker.io", "=mirror.example.com", "docker.io="} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		(&mirrorFlags{}).register(fs)
		if err := fs.Parse([]string{"--registry-mirror", bad}); err == nil {
			t.Errorf("--registry-mirror %q accepted", bad)
		}
	}
}

package runner

import (
	"context"
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimetest"
)

// secretEnvBackend is a Fake that records each container's secret environment.
type secretEnvBackend struct {
	*runtimetest.Fake
	mu  sync.Mutex
	got map[string]map[string]string
}

func (b *secretEnvBackend) Create(ctx context.Context, spec *runtime.Spec) (runtime.Info, error) {
	b.mu.Lock()
	for _, c := range spec.AllContainers() {
		b.got[c.ContainerName()] = c.SecretEnv
	}
	b.mu.Unlock()
	return b.Fake.Create(ctx, spec)
}

// TestSecretEnvNeverKept: each container's secret environment reaches the backend's
// Create; no snapshot (Create's, Get's, List's) and no file of the runner's data dir
// carries it; a bad or oversized one is refused naming variables, never values.
func TestSecretEnvNeverKept(t *testing.T) {
	const value = "runner-secret-value-91c2"
	be := &secretEnvBackend{Fake: runtimetest.NewFake(), got: map[string]map[string]string{}}
	t.Cleanup(be.Close)
	dir := t.TempDir()
	r, err := New(context.Background(), Config{Backend: be, DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	spec := groupSpec()
	spec.SecretEnv = map[string]string{"APP_TOKEN": value}
	spec.Sidecars[0].SecretEnv = map[string]string{"DB_PASSWORD": value + "-db"}
	sb, err := r.Create(context.Background(), CreateRequest{Spec: spec})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the backend's create", func() bool {
		be.mu.Lock()
		defer be.mu.Unlock()
		return be.got[spec.ContainerName()]["APP_TOKEN"] == value && be.got[spec.Sidecars[0].ContainerName()]["DB_PASSWORD"] == value+"-db"
	})
	g, err := r.Get(sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range append([]Sandbox{sb, g}, r.List()...) {
		b, _ := json.Marshal(s)
		if strings.Contains(string(b), value) {
			t.Fatalf("snapshot of %s carries a secret: %s", s.ID, b)
		}
		for _, c := range s.Spec.AllContainers() {
			if c.SecretEnv != nil {
				t.Fatalf("snapshot of %s: container %s keeps its secret env", s.ID, c.ContainerName())
			}
		}
	}
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if b, _ := os.ReadFile(p); strings.Contains(string(b), value) {
				t.Errorf("%s holds a secret", p)
			}
		}
		return nil
	})
	// Refusals: > MaxSecretEnvVars in all, a bad name, a NUL in a value; no value quoted.
	many := map[string]string{}
	for i := range runtime.MaxSecretEnvVars + 1 {
		many["V"+strings.Repeat("X", i)] = value
	}
	for name, env := range map[string]map[string]string{
		"too many": many,
		"bad name": {"A=B": value},
		"nul":      {"A": value + "\x00"},
	} {
		s := groupSpec()
		s.SecretEnv = env
		_, err := r.Create(context.Background(), CreateRequest{Spec: s})
		if err == nil || strings.Contains(err.Error(), value) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

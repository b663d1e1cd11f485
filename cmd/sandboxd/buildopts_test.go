package main

import (
	"bytes"
	"path/filepath"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/registry"
	"github.com/sandboxd/sandboxd/internal/store"
)

// TestBuildOptions: with the registry (dev and the split gateway alike, whose API port is
// plain HTTP) builds push to its host insecurely, with its tokens, and bind the bases'
// pull token to it; without one, builds are off.
func TestBuildOptions(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	st, err := store.Open(ctx, filepath.Join(dir, storeFile))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if o := buildOptions(st, nil, "127.0.0.1:7443", buildFlags{}); o.RegistryHost != "" || o.MintPushToken != nil || o.MintPullToken != nil || o.PushInsecure || o.Store == nil {
		t.Errorf("without a registry: %+v", o)
	}
	reg, err := registry.New(ctx, registry.Config{Dir: filepath.Join(dir, "registry"), Auth: oneKey{}, TokenKey: bytes.Repeat([]byte("k"), 32), Host: "gw.example:8080"})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	o := buildOptions(st, reg, "gw.example:8080", buildFlags{})
	if o.RegistryHost != "gw.example:8080" || !o.PushInsecure || o.MintPushToken == nil || o.MintPullToken == nil {
		t.Fatalf("with a registry: %+v", o)
	}
	if tok, err := o.MintPullToken("org-a", time.Minute); err != nil || tok == "" {
		t.Errorf("pull token: %q %v", tok, err)
	}
}

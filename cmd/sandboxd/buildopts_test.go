package main

import (
	"bytes"
	"flag"
	"io"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/gateway"
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
	if o, _ := buildOptions(st, nil, "127.0.0.1:7443", buildFlags{}); o.RegistryHost != "" || o.MintPushToken != nil || o.MintPullToken != nil || o.PushInsecure || o.Store == nil {
		t.Errorf("without a registry: %+v", o)
	}
	reg, err := registry.New(ctx, registry.Config{Dir: filepath.Join(dir, "registry"), Auth: oneKey{}, TokenKey: bytes.Repeat([]byte("k"), 32), Host: "gw.example:8080"})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	o, err := buildOptions(st, reg, "gw.example:8080", buildFlags{})
	if err != nil {
		t.Fatal(err)
	}
	if o.RegistryHost != "gw.example:8080" || !o.PushInsecure || o.MintPushToken == nil || o.MintPullToken == nil {
		t.Fatalf("with a registry: %+v", o)
	}
	if tok, err := o.MintPullToken("org-a", time.Minute); err != nil || tok == "" {
		t.Errorf("pull token: %q %v", tok, err)
	}
}

// TestBuildStorageEndpointsFlag: --build-storage-endpoints reaches BuildOptions after the
// command's validate (which runs on a copy of the configuration), for dev and gateway.
func TestBuildStorageEndpointsFlag(t *testing.T) {
	ctx := t.Context()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), storeFile))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	want := []gateway.BuildStorageEndpoint{{Host: "127.0.0.1:9000", Insecure: true, Region: "eu-1"}, {Host: "s3.example.com"}}
	for name, cfg := range map[string]interface {
		validator
		buildFlagsOf() buildFlags
	}{"dev": new(devConfig), "gateway": new(gatewayConfig)} {
		args := []string{"--build-storage-endpoints", "http://127.0.0.1:9000=eu-1,s3.example.com"}
		if name == "gateway" {
			args = append(args, "--runner", "r1=127.0.0.1:7443")
		}
		fs := flag.NewFlagSet(name, flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		cfg.bind(fs)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		if err := cfg.validate(); err != nil {
			t.Fatalf("%s: validate: %v", name, err)
		}
		o, err := buildOptions(st, nil, "", cfg.buildFlagsOf())
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(o.StorageEndpoints, want) {
			t.Errorf("%s: StorageEndpoints %+v, want %+v", name, o.StorageEndpoints, want)
		}
	}
	if _, err := buildOptions(st, nil, "", buildFlags{endpointsFlag: "a:b:c"}); err == nil || !strings.Contains(err.Error(), "--build-storage-endpoints") {
		t.Errorf("a bad endpoint: %v", err)
	}
}

func (c *devConfig) buildFlagsOf() buildFlags     { return c.builds }
func (c *gatewayConfig) buildFlagsOf() buildFlags { return c.builds }

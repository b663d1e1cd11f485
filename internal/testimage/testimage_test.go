package testimage

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/image"
	"github.com/sandboxd/sandboxd/internal/testenv"
)

func TestBuildCachesLayout(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(Dir(), "busybox.tar")
	if _, err := os.Stat(src); err != nil {
		t.Skipf("%v (%s)", ErrNoTestImages, src)
	}
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	tarPath := filepath.Join(dir, "bb.tar")
	if err := os.WriteFile(tarPath, b, 0o644); err != nil {
		t.Fatal(err)
	}
	img1, err := Build(tarPath, image.Config{Cmd: []string{"/bin/sh"}})
	if err != nil {
		t.Fatal(err)
	}
	key := filepath.Join(dir, "bb.oci", sourceKeyFile)
	fi1, err := os.Stat(key)
	if err != nil {
		t.Fatalf("no layout cache: %v", err)
	}
	img2, err := Build(tarPath, image.Config{Cmd: []string{"/bin/echo"}})
	if err != nil {
		t.Fatal(err)
	}
	fi2, _ := os.Stat(key)
	if !fi1.ModTime().Equal(fi2.ModTime()) {
		t.Fatal("layout rebuilt although the tarball did not change")
	}
	l1, _ := img1.Layers()
	l2, _ := img2.Layers()
	d1, _ := l1[0].Digest()
	d2, _ := l2[0].Digest()
	if d1 != d2 {
		t.Fatal("layer digest changed")
	}
	m1, _ := img1.Digest()
	m2, _ := img2.Digest()
	if m1 == m2 {
		t.Fatal("config not applied")
	}
	// touching the tarball invalidates the cache
	later := time.Now().Add(time.Minute)
	os.Chtimes(tarPath, later, later)
	if _, err := Build(tarPath, image.Config{}); err != nil {
		t.Fatal(err)
	}
	if fi3, _ := os.Stat(key); fi3.ModTime().Equal(fi1.ModTime()) {
		t.Fatal("layout not rebuilt after the tarball changed")
	}
}

func TestStandardAndAuthRegistry(t *testing.T) {
	testenv.RequireRoot(t, "root made the test images and owns their cache")
	ctx := context.Background()
	host, _, _ := Standard(ctx, t)
	if host == "" {
		t.Fatal("no host")
	}
	c := image.Credentials{Username: "u", Password: "p"}
	ahost, stop, err := StartRegistryWith(ctx, RegistryOptions{BasicAuth: &c})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	imgs, _ := StandardImages()
	if _, err := Push(ahost, Busybox, imgs.Busybox); err == nil {
		t.Fatal("anonymous push to an auth registry succeeded")
	}
	if _, err := PushAuth(ahost, Busybox, imgs.Busybox, &c); err != nil {
		t.Fatal(err)
	}
}

// TestEngineImageAbsent: without the engine image, a local run is told to build it
// (ErrNoTestImages: callers skip), while CI (SANDBOXD_ENGINE_IMAGE=1) waits for it and
// then gets an error that is no ErrNoTestImages (callers fail), naming the build log.
func TestEngineImageAbsent(t *testing.T) {
	dir := t.TempDir()
	if _, err := engineImage(dir, false, 0); !errors.Is(err, ErrNoTestImages) || !strings.Contains(err.Error(), "engine") {
		t.Errorf("local: %v, want ErrNoTestImages naming the engine image", err)
	}
	start := time.Now()
	_, err := engineImage(dir, true, 50*time.Millisecond)
	if err == nil || errors.Is(err, ErrNoTestImages) || !strings.Contains(err.Error(), "build-engine-image.log") {
		t.Errorf("CI: %v, want a failure naming the build log", err)
	}
	if time.Since(start) < 50*time.Millisecond {
		t.Errorf("CI: gave up after %v, before its wait", time.Since(start))
	}
}

// TestBuilderTar: the builder image follows the engine image's rules under its own name
// and variable: skip locally until builder.inputs exists, fail under
// SANDBOXD_BUILDER_IMAGE=1 naming its build log.
func TestBuilderTar(t *testing.T) {
	dir := t.TempDir()
	if _, err := optionalTar(dir, "builder", "SANDBOXD_BUILDER_IMAGE", false, 0); !errors.Is(err, ErrNoTestImages) || !strings.Contains(err.Error(), Script+" builder") {
		t.Errorf("local: %v, want ErrNoTestImages telling to build the builder image", err)
	}
	_, err := optionalTar(dir, "builder", "SANDBOXD_BUILDER_IMAGE", true, 10*time.Millisecond)
	if err == nil || errors.Is(err, ErrNoTestImages) || !strings.Contains(err.Error(), "build-builder-image.log") || !strings.Contains(err.Error(), "SANDBOXD_BUILDER_IMAGE=1") {
		t.Errorf("CI: %v, want a failure naming the variable and the build log", err)
	}
	for _, f := range []string{"builder.tar", "builder.inputs"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if p, err := optionalTar(dir, "builder", "SANDBOXD_BUILDER_IMAGE", true, 0); err != nil || p != filepath.Join(dir, "builder.tar") {
		t.Errorf("built: %q, %v", p, err)
	}
}

// TestEngineImageIfBuiltNeverWaits: with SANDBOXD_ENGINE_IMAGE=1 and no finished build,
// EngineImageIfBuilt answers ErrNoTestImages at once (sandboxd dev must not hold its
// start-up for it), where EngineTar would wait.
func TestEngineImageIfBuiltNeverWaits(t *testing.T) {
	t.Setenv("SANDBOXD_CACHE", t.TempDir())
	t.Setenv("SANDBOXD_ENGINE_IMAGE", "1")
	start := time.Now()
	if _, err := EngineImageIfBuilt(); !errors.Is(err, ErrNoTestImages) {
		t.Fatalf("EngineImageIfBuilt without a build: %v, want ErrNoTestImages", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("EngineImageIfBuilt took %v: it waited", d)
	}
}
